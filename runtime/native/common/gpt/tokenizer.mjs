// The tokenizer of a GPT folder (runtime/native/common/gpt.mjs re-exports it) and the streamed text of a generation.
import { ArtifactError, TOKENIZER_CONFIG, TOKENIZER_FILE, firstLine } from './base.mjs';
import { verifiedJson } from './folder.mjs';

// What in tokenizer.json makes Python's encode not the text's ids alone, or null: padding, truncation and BPE dropout,
// which this library ignores and Python's `tokenizers` applies (a resealed edit made the two encode differently). As
// setting_problem in runtime/mha_runtime/decoder/tokenizer.py, in its words.
function settingProblem(json) {
  const padding = json?.padding, truncation = json?.truncation, dropout = json?.model?.dropout;
  if (padding != null) {
    const to = padding?.strategy?.Fixed != null ? `length ${padding.strategy.Fixed}` : 'the longest of a batch';
    return `it pads what it encodes (padding to ${to}); expected no padding, which would add pad ids to prompts`;
  }
  if (truncation != null) {
    return `it truncates what it encodes (max_length ${truncation?.max_length}); expected no truncation, which would `
      + 'cut long prompts silently';
  }
  if (dropout) {
    return `its BPE drops merges at random (dropout ${dropout}); expected no dropout, which would encode a prompt `
      + 'differently on each run';
  }
  return null;
}

// tokenizer.json (and tokenizer_config.json when listed), sha256-checked, through the caller's Tokenizer class
// (@huggingface/tokenizers); a vocabulary of another size than the model's is refused.
export async function loadTokenizer(io, manifest, Tokenizer) {
  if (!manifest.tokenizer) return null;
  const file = manifest.tokenizer.file || TOKENIZER_FILE;
  const json = await verifiedJson(io, manifest, file);
  const config = Object.hasOwn(manifest.files, TOKENIZER_CONFIG) ? await verifiedJson(io, manifest, TOKENIZER_CONFIG) : {};
  const ids = new Set(Object.values(json?.model?.vocab || {}));
  for (const t of json?.added_tokens || []) ids.add(t.id);
  if (ids.size !== manifest.shapes.vocab_size) {
    throw new ArtifactError(`${io.where}/${file}: a vocabulary of ${ids.size} tokens, expected the model's vocab_size ${manifest.shapes.vocab_size}`);
  }
  const problem = settingProblem(json);
  if (problem) throw new ArtifactError(`${io.where}/${file}: ${problem}`);
  let tok;
  try {
    tok = new Tokenizer(json, config);
  } catch (e) {
    throw new ArtifactError(`${io.where}/${file}: not a tokenizers JSON file (${firstLine(e)})`);
  }
  // Decoded as Python's `tokenizers` decodes: without transformers' clean-up of spaces, which the JS library applies
  // unless told not to (it made ' .' '.' and "n't" of " n't", and TextStream, slicing the shrunk text, lost pieces).
  const decoding = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
  // encode(text) puts around a prompt what tokenizer.json's own post-processor does (a BOS where it puts one,
  // nothing where it has none), as Python's GPTTokenizer.encode; encode(text, false) for a rendered chat template.
  return {
    encode: (text, specials = true) => Array.from(tok.encode(text, { add_special_tokens: specials }).ids),
    decode: (ids) => (ids.length ? tok.decode(Array.from(ids), decoding) : ''),
  };
}

// The text of a growing id list, piece by piece: a piece that ends inside a UTF-8 character waits.
export class TextStream {
  constructor(tokenizer) { this.tokenizer = tokenizer; this.ids = []; this.sent = 0; }

  push(token) {
    this.ids.push(token);
    const text = this.tokenizer.decode(this.ids);
    if (text.endsWith('\ufffd')) return '';
    const piece = text.slice(this.sent);
    this.sent = text.length;
    return piece;
  }

  // What push held back when the ids end inside a UTF-8 character: the decode's U+FFFD, so the streamed text is the
  // whole decode of the ids (it was left out).
  end() {
    const text = this.tokenizer.decode(this.ids);
    const piece = text.slice(this.sent);
    this.sent = text.length;
    return piece;
  }
}
