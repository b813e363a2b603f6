// The decoder folder (runtime/native/common/gpt.mjs re-exports it): manifest.json (kind "decoder", or "gpt" before it
// was named so; format 1), every file used checked against its size and sha256 before it is parsed, the decoder forms
// it lists, and the contract a session's inputs and outputs must match. It knows no architecture: every shape is the
// manifest's contract.shapes (manifest.shapes; a folder exported before them: legacyShapes), and the manifest's
// config is carried, never read.
import { ArtifactError, ContractError, CONCAT_FORM, DECODER_KIND, GPT_MANIFEST_FORMAT, INPLACE_FORM, LOSSY_FORMS,
  firstLine, isObject, plainName } from './base.mjs';
import { kindOf } from '../rules.mjs';
// Most eos ids a folder holds (runtime/mha_runtime/decoder/manifest.py MAX_EOS_IDS, the C runner's array).
const MAX_EOS_IDS = 64;

const FORM_KIND = { [CONCAT_FORM]: 'concat', [INPLACE_FORM]: 'inplace', [LOSSY_FORMS[0]]: 'inplace',
  [LOSSY_FORMS[1]]: 'inplace' };
// contract.shapes' bounds (runtime/mha_runtime/decoder/shapes.py), and one layer's cache at most the largest
// Float32Array these runners allocate.
const MAX_CONTEXT = 2 ** 20, MAX_HEADS = 256, MAX_DIM = 2 ** 24, MAX_CACHE = 2 ** 31;
const SHAPE_KEYS = ['n_layers', 'n_heads', 'kv_heads', 'head_dim', 'vocab_size', 'context_length'];

// What every shape must satisfy, whoever read it: the bounds, kv_heads dividing n_heads, the cache's size.
function fitShapes(s, where) {
  if (s.n_heads > MAX_HEADS || s.context_length > MAX_CONTEXT) {
    throw new ArtifactError(`${where}: expected n_heads <= ${MAX_HEADS} and context_length <= ${MAX_CONTEXT}, got ${s.n_heads} and ${s.context_length}`);
  }
  if (s.n_heads % s.kv_heads) throw new ArtifactError(`${where}: n_heads ${s.n_heads} is not a multiple of kv_heads ${s.kv_heads}`);
  if (s.kv_heads * s.context_length * s.head_dim > MAX_CACHE) {
    throw new ArtifactError(`${where}: a cache of [1, ${s.kv_heads}, ${s.context_length}, ${s.head_dim}] floats per layer is over the runner's bound of ${MAX_CACHE}`);
  }
  return s;
}

const isCount = (v) => Number.isInteger(v) && v >= 1 && v <= MAX_DIM;

// contract.shapes, every field checked (the Python reader's rules, DecoderShapes.from_dict).
function readShapes(shapes, where) {
  if (!isObject(shapes)) throw new ArtifactError(`${where}: expected an object of arch and the shapes, got ${JSON.stringify(shapes)}`);
  if (typeof shapes.arch !== 'string' || shapes.arch === '') {
    throw new ArtifactError(`${where}: 'arch': expected an architecture name, got ${JSON.stringify(shapes.arch)}`);
  }
  const bad = SHAPE_KEYS.find((k) => !isCount(shapes[k]));
  if (bad) throw new ArtifactError(`${where}: '${bad}': expected a positive integer, got ${JSON.stringify(shapes[bad])}`);
  const extra = Object.keys(shapes).filter((k) => !['arch', ...SHAPE_KEYS, 'cache_lengths'].includes(k)).sort();
  if (extra.length) throw new ArtifactError(`${where}: unknown key '${extra[0]}'`);
  const out = fitShapes(Object.fromEntries(['arch', ...SHAPE_KEYS].map((k) => [k, shapes[k]])), where);
  // cache_lengths: per layer its in-place cache rows where a layer keeps only its sliding window (absent: context_length)
  const lengths = shapes.cache_lengths ?? null;
  if (lengths !== null && (!Array.isArray(lengths) || lengths.length !== out.n_layers
      || !lengths.every((v) => Number.isInteger(v) && v >= 1 && v <= out.context_length))) {
    throw new ArtifactError(`${where}: 'cache_lengths': expected ${out.n_layers} integers from 1 to context_length `
      + `${out.context_length} (one per layer), got ${JSON.stringify(lengths).slice(0, 80)}`);
  }
  return lengths === null ? out : { ...out, cache_lengths: lengths };
}

// Each layer's in-place cache rows: contract.shapes.cache_lengths, or context_length (shapes.py cache_rows).
export function cacheRows(s) {
  return s.cache_lengths ?? Array.from({ length: s.n_layers }, () => s.context_length);
}

// The one place the JavaScript runners read an architecture's config keys: a folder exported before issue 57 has no
// contract.shapes, and then only the book's GPT-2 (vocab_size, context_length, emb_dim, n_heads, n_layers; one
// key/value head per query head).
function legacyShapes(config, where) {
  if (!isObject(config)) throw new ArtifactError(`${where}: expected a config object, got ${JSON.stringify(config)}`);
  const bad = ['vocab_size', 'context_length', 'emb_dim', 'n_heads', 'n_layers'].find((k) => !isCount(config[k]));
  if (bad) throw new ArtifactError(`${where}: no contract.shapes (a folder exported before them) and '${bad}' is not a positive integer of the book's GPT config (${JSON.stringify(config[bad])}); re-export it`);
  if (config.emb_dim % config.n_heads) throw new ArtifactError(`${where}: emb_dim ${config.emb_dim} is not divisible by n_heads ${config.n_heads}`);
  return fitShapes({ arch: 'gpt2', n_layers: config.n_layers, n_heads: config.n_heads, kv_heads: config.n_heads,
    head_dim: config.emb_dim / config.n_heads, vocab_size: config.vocab_size, context_length: config.context_length }, where);
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
  if (kindOf(doc) !== DECODER_KIND || doc.format !== GPT_MANIFEST_FORMAT) {
    throw new ArtifactError(`${where}: expected a decoder manifest (kind '${DECODER_KIND}', format ${GPT_MANIFEST_FORMAT}), got kind `
      + `${JSON.stringify(doc.kind)}, format ${JSON.stringify(doc.format)} (export decoder folders with \`mha export --gpt\`)`);
  }
  if (!isObject(doc.config)) throw new ArtifactError(`${where}: expected a 'config' object, got ${JSON.stringify(doc.config)}`);
  if (!isObject(doc.contract)) throw new ArtifactError(`${where}: expected a 'contract' object`);
  const shapes = Object.hasOwn(doc.contract, 'shapes') ? readShapes(doc.contract.shapes, `${where}: contract.shapes`)
    : legacyShapes(doc.config, `${where}: config`);
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
  if (!isObject(doc.artifacts)) throw new ArtifactError(`${where}: expected an 'artifacts' object`);
  const eos = doc.eos_id ?? null;
  if (eos !== null && (!Number.isInteger(eos) || eos < 0 || eos >= shapes.vocab_size)) {
    throw new ArtifactError(`${where}: 'eos_id' must be a token id below vocab_size or null, got ${JSON.stringify(eos)}`);
  }
  // eos_ids: every id generation stops at (a checkpoint may give several); absent in a folder made before it, whose
  // one eos_id is then the list. The same rule as Python's GPTManifest.stop_ids and the C runner's.
  const listed = doc.eos_ids ?? null;
  const isId = (i) => Number.isInteger(i) && i >= 0 && i < shapes.vocab_size;
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
  return { ...doc, shapes, eos_id: eos, eos_ids: listed, stop_ids: stopIds, tokenizer: doc.tokenizer ?? null };
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
  if (!Object.hasOwn(FORM_KIND, form)) throw new ArtifactError(`${form}: not a decoder form (expected one of ${Object.keys(FORM_KIND).join(', ')})`);
  return FORM_KIND[form];
}

// The contract's signature of a form's kind for `shapes` (runtime/mha_runtime/decoder/contract.py): its inputs, then
// its outputs, name -> [dtype, axes], null for a symbolic axis.
function contractPorts(kind, s) {
  const rows = cacheRows(s);
  const cache = (i) => ['float32', [null, s.kv_heads, kind === 'inplace' ? rows[i] : null, s.head_dim]];
  const ids = ['int64', [null, null]];
  const layers = (prefix, keys) => Object.fromEntries(Array.from({ length: s.n_layers }, (_, i) => keys.map((kv) => [`${prefix}.${i}.${kv}`, cache(i)])).flat());
  const inputs = kind === 'inplace' ? { input_ids: ids, past_tokens: ['int32', [null]] }
    : { input_ids: ids, attention_mask: ids, position_ids: ids };
  const logits = kind === 'inplace' ? { next_token_logits: ['float32', [null, s.vocab_size]] } : { logits: ['float32', [null, null, s.vocab_size]] };
  return { ...inputs, ...layers('past_key_values', ['key', 'value']), ...logits, ...layers('present', ['key', 'value']) };
}

const shown = ([dtype, axes]) => `${dtype} [${axes.map((a) => (a === null ? '*' : a)).join(', ')}]`;

// Whether [dtype, axes] (the manifest's signature, or the model's own metadata) is the contract's `want`: the same
// dtype and rank, and the fixed axes (a symbolic one only where the contract has one).
function agrees(want, got) {
  const [dtype, axes] = want;
  return Array.isArray(got) && got[0] === dtype && Array.isArray(got[1]) && got[1].length === axes.length
    && axes.every((a, i) => (a === null ? typeof got[1][i] !== 'number' : got[1][i] === a));
}

// The session's inputs and outputs against the contract for the manifest's shapes, by name and order, and by dtype
// and fixed axes both in the manifest's signature and in the model itself (its input and output metadata, where the
// runtime reports it): a file or manifest that is not the contract's is refused in one line before anything runs.
export function checkContract(session, manifest, form) {
  const kind = formKind(form);
  const spec = manifest.contract[kind];
  const where = `${form}`;
  if (!isObject(spec) || !isObject(spec.signature)) throw new ArtifactError(`${where}: the manifest has no '${kind}' contract`);
  const want = contractPorts(kind, manifest.shapes);
  const names = [...session.inputNames, ...session.outputNames];
  for (const [what, listed] of [['the model', names], ['the manifest\'s signature', Object.keys(spec.signature)]]) {
    if (JSON.stringify(listed) !== JSON.stringify(Object.keys(want))) {
      throw new ContractError(`${where}: expected the ${kind} contract's ${Object.keys(want).length} inputs and outputs for `
        + `n_layers=${manifest.shapes.n_layers} (the manifest's contract.shapes), ${what} has ${listed.length}: `
        + `${listed.slice(0, 3).join(', ')}, ...`);
    }
  }
  const own = [...(session.inputMetadata ?? []), ...(session.outputMetadata ?? [])];
  const model = Object.fromEntries(own.filter((m) => m.isTensor).map((m) => [m.name, [m.type, m.shape]]));
  for (const [name, port] of Object.entries(want)) {
    for (const [what, got] of [['the manifest\'s signature', spec.signature[name]], ['the model', model[name]]]) {
      if (what === 'the model' && !Object.hasOwn(model, name)) continue;  // a runtime that reports no metadata
      if (!agrees(port, got)) {
        throw new ContractError(`${where}: '${name}': expected ${shown(port)} (the manifest's contract.shapes), ${what} `
          + `has ${Array.isArray(got) && Array.isArray(got[1]) ? shown([got[0], got[1].map((a) => (typeof a === 'number' ? a : null))]) : JSON.stringify(got)}`);
      }
    }
  }
}
