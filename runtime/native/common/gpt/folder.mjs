// The GPT folder (runtime/native/common/gpt.mjs re-exports it): manifest.json (kind "gpt", format 1), every file used
// checked against its size and sha256 before it is parsed, the decoder forms it lists, and the contract a session's
// input and output names must match (manifest.contract[kind].signature).
import { ArtifactError, ContractError, CONCAT_FORM, GPT_KIND, GPT_MANIFEST_FORMAT, INPLACE_FORM, LOSSY_FORMS, firstLine,
  isObject, plainName } from './base.mjs';
// Most eos ids a folder holds (runtime/mha_runtime/decoder/manifest.py MAX_EOS_IDS, the C runner's array).
const MAX_EOS_IDS = 64;

const FORM_KIND = { [CONCAT_FORM]: 'concat', [INPLACE_FORM]: 'inplace', [LOSSY_FORMS[0]]: 'inplace',
  [LOSSY_FORMS[1]]: 'inplace' };
const MAX_CONTEXT = 4096, MAX_HEADS = 256, MAX_DIM = 2 ** 24;

const CONFIG_KEYS = ['vocab_size', 'context_length', 'emb_dim', 'n_heads', 'n_layers'];

function checkConfig(config, where) {
  if (!isObject(config)) throw new ArtifactError(`${where}: expected a config object, got ${JSON.stringify(config)}`);
  for (const key of CONFIG_KEYS) {
    const v = config[key];
    if (!Number.isInteger(v) || v < 1 || v > MAX_DIM) {
      throw new ArtifactError(`${where}: gpt config field '${key}': expected a positive integer, got ${JSON.stringify(v)}`);
    }
  }
  if (config.emb_dim % config.n_heads) throw new ArtifactError(`${where}: emb_dim ${config.emb_dim} is not divisible by n_heads ${config.n_heads}`);
  if (config.context_length > MAX_CONTEXT) throw new ArtifactError(`${where}: context_length: expected at most ${MAX_CONTEXT}, got ${config.context_length}`);
  if (config.n_heads > MAX_HEADS) throw new ArtifactError(`${where}: n_heads: expected at most ${MAX_HEADS}, got ${config.n_heads}`);
  return { ...config, head_dim: config.emb_dim / config.n_heads };
}

// manifest.json of a GPT folder (made by `mha export --gpt`), every field used checked before use.
export async function readGptManifest(io) {
  const where = `${io.where}/manifest.json`;
  const raw = await io.bytes('manifest.json', 'a manifest (made by `mha export --gpt`)');
  let doc;
  try {
    doc = JSON.parse(new TextDecoder().decode(raw));
  } catch (e) {
    throw new ArtifactError(`${where}: expected JSON, got a parse error (${firstLine(e)})`);
  }
  if (!isObject(doc)) throw new ArtifactError(`${where}: expected a JSON object`);
  if (doc.kind !== GPT_KIND || doc.format !== GPT_MANIFEST_FORMAT) {
    throw new ArtifactError(`${where}: expected a GPT manifest (kind '${GPT_KIND}', format ${GPT_MANIFEST_FORMAT}), got kind `
      + `${JSON.stringify(doc.kind)}, format ${JSON.stringify(doc.format)} (export GPT folders with \`mha export --gpt\`)`);
  }
  const config = checkConfig(doc.config, `${where}: config`);
  if (!isObject(doc.files)) throw new ArtifactError(`${where}: expected a 'files' object`);
  for (const [name, entry] of Object.entries(doc.files)) {
    if (!plainName(name)) throw new ArtifactError(`${where}: files: expected a file name inside the folder, got '${name}'`);
    if (!isObject(entry) || !Number.isSafeInteger(entry.size) || entry.size < 0) {
      throw new ArtifactError(`${where}: files.${name}: expected 'size' an integer >= 0, got ${JSON.stringify(entry?.size)}`);
    }
    if (typeof entry.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(entry.sha256)) {
      throw new ArtifactError(`${where}: files.${name}: expected 'sha256' of 64 lowercase hex digits, got ${JSON.stringify(entry.sha256)}`);
    }
  }
  if (!isObject(doc.contract)) throw new ArtifactError(`${where}: expected a 'contract' object`);
  if (!isObject(doc.artifacts)) throw new ArtifactError(`${where}: expected an 'artifacts' object`);
  const eos = doc.eos_id ?? null;
  if (eos !== null && (!Number.isInteger(eos) || eos < 0 || eos >= config.vocab_size)) {
    throw new ArtifactError(`${where}: 'eos_id' must be a token id below vocab_size or null, got ${JSON.stringify(eos)}`);
  }
  // eos_ids: every id generation stops at (a checkpoint may give several); absent in a folder made before it, whose
  // one eos_id is then the list. The same rule as Python's GPTManifest.stop_ids and the C runner's.
  const listed = doc.eos_ids ?? null;
  const isId = (i) => Number.isInteger(i) && i >= 0 && i < config.vocab_size;
  if (listed !== null && (!Array.isArray(listed) || listed.length > MAX_EOS_IDS || !listed.every(isId))) {
    throw new ArtifactError(`${where}: 'eos_ids' must be a list of at most ${MAX_EOS_IDS} token ids below vocab_size, got ${JSON.stringify(listed).slice(0, 60)}`);
  }
  if (listed !== null && eos !== (listed.length ? listed[0] : null)) {
    throw new ArtifactError(`${where}: 'eos_id' ${JSON.stringify(eos)} is not the first of 'eos_ids' ${JSON.stringify(listed.slice(0, 4))}`);
  }
  if (doc.tokenizer !== null && doc.tokenizer !== undefined && !isObject(doc.tokenizer)) {
    throw new ArtifactError(`${where}: 'tokenizer' must be an object or null`);
  }
  const stopIds = listed ?? (eos === null ? [] : [eos]);
  return { ...doc, config, eos_id: eos, eos_ids: listed, stop_ids: stopIds, tokenizer: doc.tokenizer ?? null };
}

function checkListedSize(io, name, entry, length) {
  if (length !== entry.size) {
    throw new ArtifactError(`${io.where}/${name}: expected ${entry.size} bytes (manifest), found ${length}; file truncated or replaced`);
  }
}

// A listed file's bytes, only if its size and sha256 are the manifest's (verify before parse). An io with
// size(rel) (the Node ones) has a file of another size refused by stat, before a byte of it is read.
export async function verifiedBytes(io, manifest, name) {
  const entry = Object.hasOwn(manifest.files, name) ? manifest.files[name] : null;
  if (!entry) throw new ArtifactError(`${name}: expected it listed in ${io.where}/manifest.json, found no entry`);
  checkListedSize(io, name, entry, await io.size?.(name) ?? entry.size);  // where io can stat: not read if wrong
  const bytes = await io.bytes(name);
  checkListedSize(io, name, entry, bytes.length);
  const digest = await io.sha256(bytes);
  if (digest !== entry.sha256) {
    throw new ArtifactError(`${io.where}/${name}: sha256 ${digest.slice(0, 12)}... differs from the manifest's `
      + `${entry.sha256.slice(0, 12)}...; the file was altered: re-export it with \`mha export --gpt\``);
  }
  return bytes;
}

export async function verifiedJson(io, manifest, name) {
  const bytes = await verifiedBytes(io, manifest, name);
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (e) {
    throw new ArtifactError(`${io.where}/${name}: expected JSON, got a parse error (${firstLine(e)})`);
  }
}

// The decoder files the manifest lists, in the order of FP32_FORMS, then any other it names.
export function listedForms(manifest) {
  return Object.keys(FORM_KIND).filter((f) => Object.hasOwn(manifest.artifacts, f) && Object.hasOwn(manifest.files, f));
}

export function formKind(form) {
  if (!Object.hasOwn(FORM_KIND, form)) throw new ArtifactError(`${form}: not a GPT decoder form (expected one of ${Object.keys(FORM_KIND).join(', ')})`);
  return FORM_KIND[form];
}

// The session's names against the contract's signature (its inputs, then its outputs), and the signature's cache
// axes against the config: a file that is not the contract's is refused before it runs.
export function checkContract(session, manifest, form) {
  const kind = formKind(form);
  const spec = manifest.contract[kind];
  const where = `${form}`;
  if (!isObject(spec) || !isObject(spec.signature)) throw new ArtifactError(`${where}: the manifest has no '${kind}' contract`);
  const { n_heads: h, head_dim: d, context_length: c, n_layers: layers, vocab_size: v } = manifest.config;
  const names = [...session.inputNames, ...session.outputNames];
  const want = Object.keys(spec.signature);
  if (JSON.stringify(names) !== JSON.stringify(want)) {
    throw new ContractError(`${where}: expected the contract's inputs and outputs ${want.slice(0, 3).join(', ')}, ... (${want.length}), `
      + `got ${names.slice(0, 3).join(', ')}, ... (${names.length})`);
  }
  const cacheAxes = kind === 'inplace' ? [h, c, d] : [h, d];
  for (let i = 0; i < layers; i++) {
    for (const kv of ['key', 'value']) {
      const [dtype, shape] = spec.signature[`past_key_values.${i}.${kv}`] || [];
      const axes = kind === 'inplace' ? [shape?.[1], shape?.[2], shape?.[3]] : [shape?.[1], shape?.[3]];
      if (dtype !== 'float32' || JSON.stringify(axes) !== JSON.stringify(cacheAxes)) {
        throw new ContractError(`${where}: past_key_values.${i}.${kv}: expected float32 [batch, ${h}, ${kind === 'inplace' ? c : 'past'}, ${d}], got ${JSON.stringify(spec.signature[`past_key_values.${i}.${kv}`])}`);
      }
    }
  }
  const out = spec.signature[kind === 'inplace' ? 'next_token_logits' : 'logits'];
  if (!out || out[1][out[1].length - 1] !== v) throw new ContractError(`${where}: expected logits over vocab_size ${v}, got ${JSON.stringify(out)}`);
}
