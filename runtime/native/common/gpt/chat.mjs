// A decoder folder's chat (runtime/native/common/gpt.mjs re-exports it): its chat template rendered with the caller's
// Template class (@huggingface/jinja, the library transformers.js renders templates with), to the text transformers'
// apply_chat_template(messages, add_generation_prompt=True, tokenize=False) gives, and the ids a reply ends at. The
// rules are Python's (runtime/mha_runtime/decoder/chat/folder.py and template.py), in their words:
// - the template: chat_template.jinja when the manifest lists one, else tokenizer_config.json's "chat_template" (a
//   string, or the "default" of a list of {name, template});
// - the variables: messages, tools and documents null, add_generation_prompt true, and the named special tokens of
//   tokenizer_config.json (a string or an AddedToken's content; extra_special_tokens only when a dict names them);
// - the stop ids: the end-of-turn ids the export recorded in the manifest (contract.chat.end_of_turn_ids, defined in
//   runtime/mha_runtime/decoder/contract.py, found by chat/turns.py); a folder exported before that field is refused
//   for a chat in one line (re-export it).
// @huggingface/jinja's Template is transformers' environment already: lstrip_blocks and trim_blocks, one trailing
// newline dropped, {% generation %} rendered as its body, raise_exception, strftime_now, namespace and tojson. Three
// differences from jinja2 remain in 0.5.13 (transformers.js has them too): a boolean prints as true/false (Python:
// True/False), there is no dict() global, and what a loop's iteration wrote before its {% break %} or {% continue %}
// is dropped (jinja2 keeps it).
import { ArtifactError, ContractError, TOKENIZER_CONFIG, firstLine, isObject } from './base.mjs';
import { verifiedBytes, verifiedJson } from './folder.mjs';

export const CHAT_TEMPLATE_FILE = 'chat_template.jinja';
const END_OF_TURN = 'end_of_turn_ids';
const NAMED_TOKENS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];
const cut = (text, limit = 40) => (text.length <= limit ? text : `${text.slice(0, limit)}...`);

// The named special tokens of a tokenizer_config.json, as transformers' special_tokens_map gives them.
export function namedTokens(config) {
  const named = Object.fromEntries(NAMED_TOKENS.map((k) => [k, config[k]]));
  if (isObject(config.extra_special_tokens)) Object.assign(named, config.extra_special_tokens);
  const tokens = {};
  for (const [name, value] of Object.entries(named)) {
    const text = isObject(value) ? value.content : value;
    if (typeof text === 'string') tokens[name] = text;
  }
  return tokens;
}

// A conversation as a list of {role, content} strings (no other key), or one ContractError line.
export function checkMessages(messages, where = 'messages') {
  if (!Array.isArray(messages) || !messages.length) {
    throw new ContractError(`${where}: expected a non-empty list of {"role", "content"} objects, got ${cut(String(JSON.stringify(messages)))}`);
  }
  messages.forEach((m, i) => {
    const keys = isObject(m) ? Object.keys(m).sort() : [];
    if (keys.join() !== 'content,role' || typeof m.role !== 'string' || typeof m.content !== 'string') {
      throw new ContractError(`${where}[${i}]: expected an object of a 'role' string and a 'content' string, got ${cut(String(JSON.stringify(m)))}`);
    }
  });
  return messages.map((m) => ({ role: m.role, content: m.content }));
}

// (the folder's template or null, its tokenizer_config.json or {}), each file checked against the manifest.
export async function templateSource(io, manifest) {
  const config = Object.hasOwn(manifest.files, TOKENIZER_CONFIG) ? await verifiedJson(io, manifest, TOKENIZER_CONFIG) : {};
  if (!isObject(config)) throw new ArtifactError(`${io.where}/${TOKENIZER_CONFIG}: expected a JSON object`);
  if (Object.hasOwn(manifest.files, CHAT_TEMPLATE_FILE)) {
    const bytes = await verifiedBytes(io, manifest, CHAT_TEMPLATE_FILE);
    try {
      return { source: new TextDecoder('utf-8', { fatal: true }).decode(bytes), config };
    } catch {
      throw new ArtifactError(`${io.where}/${CHAT_TEMPLATE_FILE}: expected UTF-8 text`);
    }
  }
  let listed = config.chat_template ?? null;
  if (Array.isArray(listed)) listed = listed.find((t) => isObject(t) && t.name === 'default')?.template ?? null;
  if (listed !== null && typeof listed !== 'string') {
    throw new ArtifactError(`${io.where}/${TOKENIZER_CONFIG}: 'chat_template': expected a string or a list of {name, template} with a 'default', got ${typeof listed}`);
  }
  return { source: listed, config };
}

// The template compiled by the caller's Template class; one that cannot be parsed is one ArtifactError.
export function compileTemplate(Template, source) {
  try {
    return new Template(source);
  } catch (e) {
    throw new ArtifactError(`chat template: @huggingface/jinja cannot parse it (${firstLine(e)})`);
  }
}

// apply_chat_template's variables (add_generation_prompt true); what the template refuses is one ContractError.
export function renderChat(template, messages, tokens) {
  try {
    return template.render({ messages, tools: null, documents: null, add_generation_prompt: true, ...tokens });
  } catch (e) {
    throw new ContractError(`chat template: ${firstLine(e)}`);
  }
}

// The folder's chat { source, tokens, stopIds, render(messages), encode(messages) }, or null when it has no template;
// encode adds no special tokens (apply_chat_template's add_special_tokens=False: the template writes them).
export async function loadChat(io, manifest, tokenizer, Template) {
  const { source, config } = await templateSource(io, manifest);
  if (source === null) return null;
  if (!tokenizer) {
    throw new ContractError(`${io.where}: this folder has a chat template but no tokenizer (exported without --tokenizer); a chat needs one`);
  }
  const stopIds = endOfTurn(io, manifest);
  const template = compileTemplate(Template, source);
  const tokens = namedTokens(config);
  const render = (messages, where = 'messages') => renderChat(template, checkMessages(messages, where), tokens);
  return { source, tokens, stopIds, render, encode: (messages, where) => tokenizer.encode(render(messages, where), false) };
}

// contract.chat.end_of_turn_ids (Python's read_end_of_turn and folder_chat, in their words): the ids a reply ends at.
export function endOfTurn(io, manifest) {
  const chat = manifest.contract.chat;
  if (chat === undefined || chat === null) {
    throw new ArtifactError(`${io.where}: the manifest records no end-of-turn ids (contract.chat.${END_OF_TURN}: the folder was exported before it); re-export it to chat with it, or give a prompt`);
  }
  const ids = isObject(chat) ? chat[END_OF_TURN] : undefined;
  const vocab = manifest.shapes.vocab_size;
  if (!Array.isArray(ids) || !ids.every((i) => Number.isInteger(i) && i >= 0 && i < vocab)) {
    throw new ArtifactError(`${io.where}/manifest.json: contract.chat.${END_OF_TURN}: expected a list of token ids below vocab_size ${vocab}, got ${String(JSON.stringify(ids)).slice(0, 60)}`);
  }
  return ids;
}

// The one line for a chat asked of a folder without a template (`mha generate --chat`'s words).
export function noChat(where) {
  return new ContractError(`${where}: this folder has no chat template (no chat_template in its ${TOKENIZER_CONFIG}, no ${CHAT_TEMPLATE_FILE}); give a prompt instead`);
}
