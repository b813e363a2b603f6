// The GPT generation contract in JavaScript, written once for every JavaScript runner: runtime/native/node (Node.js,
// onnxruntime-node: it require()s this file), runtime/native/web/check.mjs (onnxruntime-web's wasm backend in Node.js)
// and the browser page runtime/native/web/gpt.html. Plain ES module with no imports but rules.mjs: the caller passes
// `ort` (onnxruntime-node or onnxruntime-web, the same Tensor/InferenceSession API), an `io` object and the tokenizer
// class, so the same code runs in Node.js and in a browser without a bundler:
//   io.where: the folder, for messages; io.bytes(rel) -> Promise<Uint8Array> (an ArtifactError when missing);
//   io.sha256(Uint8Array) -> Promise<lowercase hex>.
// What is here, each the rule of the Python runtime (runtime/mha_runtime/gpt/*.py):
// - the manifest (kind "gpt", format 1) and every file used, checked against its size and sha256 before it is parsed;
// - the contract: a session's input and output names must be those of manifest.contract[kind].signature;
// - the two decoder forms (gpt.onnx: Optimum names, a Concat-grown cache; gpt.inplace.onnx: one [1, H, C, D] buffer per
//   layer and key/value, bound as past and present), batch 1, prefill then one token per step;
// - the sampling rule (top-k, / temperature, float32 softmax, the inverse-CDF draw) and numpy's random generator:
//   PCG64 seeded through SeedSequence, random() = (next 64-bit output >> 11) * 2**-53, bit for bit numpy's;
// - the stop rule (max_new_tokens, eos, context_length), the streamed text, and the golden generations check.
import { compare } from './rules.mjs';

export { compare };

export class ArtifactError extends Error {}
export class ContractError extends Error {}

export const GPT_KIND = 'gpt';
export const GPT_MANIFEST_FORMAT = 1;
export const GENERATIONS_FILE = 'golden/generations.json';
export const CONCAT_FORM = 'gpt.onnx';
export const INPLACE_FORM = 'gpt.inplace.onnx';
export const TOKENIZER_FILE = 'tokenizer.json';
export const TOKENIZER_CONFIG = 'tokenizer_config.json';
// The fp32 forms the golden generations (golden/generations.json) are checked on (as `mha check`), in that order;
// the lossy forms (MatMulNBits) reproduce their own golden generations (the manifest entry's "generations"),
// checked where the runner asks for them (`lossy`: Node runs them; onnxruntime-web's kernels are not the ones they
// were recorded with).
export const FP32_FORMS = [CONCAT_FORM, INPLACE_FORM];
export const LOSSY_FORMS = ['gpt.inplace.int8.onnx', 'gpt.inplace.int4.onnx'];
const FORM_KIND = { [CONCAT_FORM]: 'concat', [INPLACE_FORM]: 'inplace', [LOSSY_FORMS[0]]: 'inplace',
  [LOSSY_FORMS[1]]: 'inplace' };
const MAX_CONTEXT = 4096, MAX_HEADS = 256, MAX_DIM = 2 ** 24;

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const firstLine = (e) => String((e && e.message) || e).split('\n')[0];

// A file name inside the folder: no absolute path, no '.', '..' or empty part, no backslash.
export function plainName(name) {
  return typeof name === 'string' && name !== '' && !name.startsWith('/') && !name.includes('\\')
    && name.split('/').every((p) => p !== '' && p !== '.' && p !== '..');
}

// ---- numpy's random generator: SeedSequence(seed) -> PCG64 -> random() --------------------------------------------
// numpy/random/bit_generator.pyx (SeedSequence: pool of 4 uint32 words, hashmix/mix with these constants) and
// numpy/random/src/pcg64 (pcg64_set_seed: state words [0:2] as (high, low), increment words [2:4]; XSL-RR 128/64,
// the state stepped before each output). 32-bit words with Math.imul, the 128-bit state with BigInt.
const INIT_A = 0x43b0d7e5, MULT_A = 0x931e8875, INIT_B = 0x8b51f9dd, MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd, MIX_MULT_R = 0x4973f715, XSHIFT = 16, POOL_SIZE = 4;
const MASK64 = (1n << 64n) - 1n, MASK128 = (1n << 128n) - 1n;
const PCG_MULT = (2549297995355413924n << 64n) + 4865540595714422341n;

// A seed as numpy takes it: an integer >= 0 of any size (a number that is a safe integer, a BigInt, or a decimal
// string) -> BigInt; anything else is refused.
export function seedValue(seed) {
  let v = null;
  if (typeof seed === 'bigint') v = seed;
  else if (typeof seed === 'number' && Number.isSafeInteger(seed)) v = BigInt(seed);
  else if (typeof seed === 'string' && /^[0-9]+$/.test(seed)) v = BigInt(seed);
  if (v === null || v < 0n) throw new ContractError(`seed: expected an integer >= 0, got ${JSON.stringify(String(seed)).slice(0, 40)}`);
  return v;
}

// numpy's _int_to_uint32_array: the lowest 32 bits first; 0 is one word.
function uint32Words(n) {
  if (n === 0n) return [0];
  const words = [];
  for (let v = n; v > 0n; v >>= 32n) words.push(Number(v & 0xffffffffn));
  return words;
}

function hashmix(value, hash) {
  let v = (value ^ hash.c) >>> 0;
  hash.c = Math.imul(hash.c, MULT_A) >>> 0;
  v = Math.imul(v, hash.c) >>> 0;
  return (v ^ (v >>> XSHIFT)) >>> 0;
}

function mix(x, y) {
  const r = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
  return (r ^ (r >>> XSHIFT)) >>> 0;
}

// SeedSequence(seed).pool: mix_entropy over the seed's words (no spawn key).
export function seedSequencePool(seed) {
  const entropy = uint32Words(seedValue(seed));
  const pool = new Array(POOL_SIZE);
  const hash = { c: INIT_A };
  for (let i = 0; i < POOL_SIZE; i++) pool[i] = hashmix(i < entropy.length ? entropy[i] : 0, hash);
  for (let src = 0; src < POOL_SIZE; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash));
  }
  for (let src = POOL_SIZE; src < entropy.length; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash));
  }
  return pool;
}

// SeedSequence(seed).generate_state(n, uint64): 2n uint32 words viewed as n little-endian uint64 words (BigInt).
export function generateState64(seed, n) {
  const pool = seedSequencePool(seed);
  let hashConst = INIT_B;
  const words = [];
  for (let i = 0; i < 2 * n; i++) {
    let v = (pool[i % POOL_SIZE] ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_B) >>> 0;
    v = Math.imul(v, hashConst) >>> 0;
    words.push((v ^ (v >>> XSHIFT)) >>> 0);
  }
  return Array.from({ length: n }, (_, j) => BigInt(words[2 * j]) | (BigInt(words[2 * j + 1]) << 32n));
}

// numpy.random.PCG64(seed): next64() and random() as numpy.random.Generator(PCG64(seed)).random() gives them.
export class PCG64 {
  constructor(seed) {
    const [s0, s1, i0, i1] = generateState64(seed, 4);
    const initState = (s0 << 64n) | s1, initSeq = (i0 << 64n) | i1;
    this.state = 0n;
    this.inc = ((initSeq << 1n) | 1n) & MASK128;
    this.step();
    this.state = (this.state + initState) & MASK128;
    this.step();
  }

  step() { this.state = (this.state * PCG_MULT + this.inc) & MASK128; }

  next64() {
    this.step();
    const rot = this.state >> 122n;
    const x = ((this.state >> 64n) ^ this.state) & MASK64;
    return ((x >> rot) | (x << ((64n - rot) & 63n))) & MASK64;
  }

  random() { return Number(this.next64() >> 11n) * 2 ** -53; }
}

// ---- the sampling rule (runtime/mha_runtime/gpt/sampling.py) --------------------------------------------------
// Temperatures besides 0: float32 division overflows below the range and is inf above it (NaN probabilities).
export const TEMPERATURE_MIN = 1e-4, TEMPERATURE_MAX = 1e4;
export const TEMPERATURE_RULE = '0 (greedy) or a number in 0.0001..10000';

export function checkSampling(temperature, topK, vocabSize) {
  if (typeof temperature !== 'number' || !(temperature === 0 || (temperature >= TEMPERATURE_MIN && temperature <= TEMPERATURE_MAX))) {
    throw new ContractError(`temperature: expected ${TEMPERATURE_RULE}, got ${JSON.stringify(temperature)}`);
  }
  if (topK !== null && topK !== undefined && (!Number.isInteger(topK) || topK < 1 || topK > vocabSize)) {
    throw new ContractError(`top_k: expected an integer in 1..${vocabSize}, got ${JSON.stringify(topK)}`);
  }
}

// The first maximum (torch.argmax, np.argmax).
export function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

// Everything below the k-th largest set to -inf (ties at the k-th value stay); null keeps all.
export function filteredLogits(logits, topK) {
  const x = Float32Array.from(logits);
  if (topK === null || topK === undefined) return x;
  const kth = Float32Array.from(x).sort()[x.length - topK];  // ascending: the k-th largest
  for (let i = 0; i < x.length; i++) if (x[i] < kth) x[i] = -Infinity;
  return x;
}

const f32 = Math.fround;

// numpy's float32 add.reduce along a contiguous axis: 0 + its pairwise sum (8 accumulators, blocks of 128).
function pairwiseSum(a, lo, n) {
  if (n < 8) {
    let r = 0;
    for (let i = 0; i < n; i++) r = f32(r + a[lo + i]);
    return r;
  }
  if (n <= 128) {
    const r = [];
    for (let j = 0; j < 8; j++) r.push(a[lo + j]);
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] = f32(r[j] + a[lo + i + j]);
    let res = f32(f32(f32(r[0] + r[1]) + f32(r[2] + r[3])) + f32(f32(r[4] + r[5]) + f32(r[6] + r[7])));
    for (; i < n; i++) res = f32(res + a[lo + i]);
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return f32(pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2));
}

// float32 probabilities for temperature > 0: top-k, / temperature, softmax, each operation rounded to float32 as
// numpy does it (the sum is numpy's pairwise sum). exp is the one step that may differ from numpy's in the last bit
// (numpy's float32 exp is its own SIMD polynomial, and differs by CPU); a draw changes only if u lands within that
// rounding of a boundary.
export function probabilities(logits, temperature, topK) {
  const t = f32(temperature);
  const x = filteredLogits(logits, topK);
  let max = -Infinity;
  for (let i = 0; i < x.length; i++) {
    x[i] = f32(x[i] / t);
    if (x[i] > max) max = x[i];
  }
  for (let i = 0; i < x.length; i++) x[i] = f32(Math.exp(f32(x[i] - max)));
  const total = f32(0 + pairwiseSum(x, 0, x.length));
  for (let i = 0; i < x.length; i++) x[i] = f32(x[i] / total);
  return x;
}

// The first id whose float64 cumulative probability exceeds u * total (np.searchsorted(cdf, u * cdf[-1], 'right')).
export function draw(probs, u) {
  const cdf = new Float64Array(probs.length);
  let acc = 0;
  for (let i = 0; i < probs.length; i++) cdf[i] = acc += probs[i];
  const target = u * cdf[cdf.length - 1];
  let lo = 0, hi = cdf.length;  // the count of cdf values <= target
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cdf[mid] <= target) lo = mid + 1; else hi = mid;
  }
  return Math.min(lo, probs.length - 1);
}

// A random seed when none is given, as Python's (a 63-bit integer), from the platform's crypto.
function freshSeed() {
  const w = new Uint32Array(2);
  globalThis.crypto.getRandomValues(w);
  return ((BigInt(w[0]) << 32n) | BigInt(w[1])) & ((1n << 63n) - 1n);
}

// The next id of one generation: argmax at temperature 0 (no draw), else one draw u = PCG64(seed).random() per token.
export class Sampler {
  constructor({ temperature = 0, topK = null, seed = null, vocabSize }) {
    checkSampling(temperature, topK, vocabSize);
    this.temperature = temperature;
    this.topK = topK ?? null;
    this.seed = seed === null || seed === undefined ? freshSeed() : seedValue(seed);
    this.stream = new PCG64(this.seed);
  }

  next(logits) {
    if (this.temperature === 0) return argmax(logits);
    return draw(probabilities(logits, this.temperature, this.topK), this.stream.random());
  }
}

// ---- the folder: manifest, verified files, contract ----------------------------------------------------------
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
  if (doc.tokenizer !== null && doc.tokenizer !== undefined && !isObject(doc.tokenizer)) {
    throw new ArtifactError(`${where}: 'tokenizer' must be an object or null`);
  }
  return { ...doc, config, eos_id: eos, tokenizer: doc.tokenizer ?? null };
}

// A listed file's bytes, only if its size and sha256 are the manifest's (verify before parse).
export async function verifiedBytes(io, manifest, name) {
  const entry = Object.hasOwn(manifest.files, name) ? manifest.files[name] : null;
  if (!entry) throw new ArtifactError(`${name}: expected it listed in ${io.where}/manifest.json, found no entry`);
  const bytes = await io.bytes(name);
  if (bytes.length !== entry.size) {
    throw new ArtifactError(`${io.where}/${name}: expected ${entry.size} bytes (manifest), found ${bytes.length}; file truncated or replaced`);
  }
  const digest = await io.sha256(bytes);
  if (digest !== entry.sha256) {
    throw new ArtifactError(`${io.where}/${name}: sha256 ${digest.slice(0, 12)}... differs from the manifest's `
      + `${entry.sha256.slice(0, 12)}...; the file was altered: re-export it with \`mha export --gpt\``);
  }
  return bytes;
}

async function verifiedJson(io, manifest, name) {
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

// ---- the tokenizer ------------------------------------------------------------------------------------------
// tokenizer.json (and tokenizer_config.json when listed), sha256-checked, through the caller's Tokenizer class
// (@huggingface/tokenizers); a vocabulary of another size than the model's is refused.
export async function loadTokenizer(io, manifest, Tokenizer) {
  if (!manifest.tokenizer) return null;
  const file = manifest.tokenizer.file || TOKENIZER_FILE;
  const json = await verifiedJson(io, manifest, file);
  const config = Object.hasOwn(manifest.files, TOKENIZER_CONFIG) ? await verifiedJson(io, manifest, TOKENIZER_CONFIG) : {};
  const ids = new Set(Object.values(json?.model?.vocab || {}));
  for (const t of json?.added_tokens || []) ids.add(t.id);
  if (ids.size !== manifest.config.vocab_size) {
    throw new ArtifactError(`${io.where}/${file}: a vocabulary of ${ids.size} tokens, expected the model's vocab_size ${manifest.config.vocab_size}`);
  }
  let tok;
  try {
    tok = new Tokenizer(json, config);
  } catch (e) {
    throw new ArtifactError(`${io.where}/${file}: not a tokenizers JSON file (${firstLine(e)})`);
  }
  return {
    encode: (text) => (text === '' ? [] : Array.from(tok.encode(text, { add_special_tokens: false }).ids)),
    decode: (ids) => (ids.length ? tok.decode(Array.from(ids), { skip_special_tokens: false }) : ''),
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
}

// ---- the decoders (batch 1): prefill(ids) -> Float32Array [V] of the last token, step(id) -> the next ---------
const int64 = (ort, ids) => new ort.Tensor('int64', BigInt64Array.from(ids, (v) => BigInt(v)), [1, ids.length]);

function runtimeError(where, e) {
  return new ArtifactError(`${where}: ONNX Runtime failed (${firstLine(e)})`);
}

// gpt.onnx: past_key_values.{i}.* [1, H, P, D] in, present.{i}.* [1, H, P + T, D] out (fed to the next step),
// attention_mask all ones and position_ids P .. P + T - 1.
export class ConcatDecoder {
  constructor(ort, session, config, where = CONCAT_FORM) {
    Object.assign(this, { ort, session, config, where, length: 0, past: null });
  }

  async run(ids) {
    const { ort, config } = this;
    const p = this.length, t = ids.length;
    const feeds = {
      input_ids: int64(ort, ids),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(p + t).fill(1n), [1, p + t]),
      position_ids: new ort.Tensor('int64', BigInt64Array.from({ length: t }, (_, i) => BigInt(p + i)), [1, t]),
    };
    const empty = new ort.Tensor('float32', new Float32Array(0), [1, config.n_heads, 0, config.head_dim]);
    for (let i = 0; i < config.n_layers; i++) {
      feeds[`past_key_values.${i}.key`] = this.past ? this.past[`present.${i}.key`] : empty;
      feeds[`past_key_values.${i}.value`] = this.past ? this.past[`present.${i}.value`] : empty;
    }
    let out;
    try {
      out = await this.session.run(feeds);
    } catch (e) {
      throw runtimeError(this.where, e);
    }
    this.past = out;
    this.length = p + t;
    const v = config.vocab_size;
    return out.logits.data.slice((t - 1) * v, t * v);
  }

  async prefill(ids) { this.length = 0; this.past = null; return this.run(ids); }

  async step(token) { return this.run([token]); }
}

// gpt.inplace.onnx: one [1, H, C, D] buffer per layer and key/value, zeroed, fed as past_key_values.{i}.* with
// past_tokens = the tokens already in it. alias: true (onnxruntime-node) passes the same tensors as the preallocated
// present.{i}.* outputs, so GroupQueryAttention writes only the new rows into them, in place; the first run checks
// that the rows landed there. alias: false (onnxruntime-web: its wasm backend copies tensors into its own memory and
// leaves preallocated outputs unwritten) feeds each run's present.{i}.* back as the next run's past.
export class InPlaceDecoder {
  constructor(ort, session, config, { alias, where = INPLACE_FORM } = {}) {
    Object.assign(this, { ort, session, config, where, alias: Boolean(alias), length: 0, checked: false });
    const { n_heads: h, context_length: c, head_dim: d, n_layers: layers, vocab_size: v } = config;
    this.buffers = {};
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value']) this.buffers[`${i}.${kv}`] = new ort.Tensor('float32', new Float32Array(h * c * d), [1, h, c, d]);
    }
    this.logits = new ort.Tensor('float32', new Float32Array(v), [1, v]);
  }

  async run(ids) {
    const { ort, config } = this;
    const p = this.length, t = ids.length;
    if (p + t > config.context_length) throw new ContractError(`input_ids: ${p + t} tokens, longer than context_length ${config.context_length}`);
    const feeds = { input_ids: int64(ort, ids), past_tokens: new ort.Tensor('int32', Int32Array.of(p), [1]) };
    const fetches = this.alias ? { next_token_logits: this.logits } : undefined;
    for (const [name, buffer] of Object.entries(this.buffers)) {
      feeds[`past_key_values.${name}`] = buffer;
      if (this.alias) fetches[`present.${name}`] = buffer;
    }
    let out;
    try {
      out = fetches ? await this.session.run(feeds, fetches) : await this.session.run(feeds);
    } catch (e) {
      throw runtimeError(this.where, e);
    }
    if (this.alias && !this.checked) {  // the new rows of every buffer are the ones the run returned
      const { n_heads: h, context_length: c, head_dim: d } = config;
      for (const name of Object.keys(this.buffers)) {
        const mine = this.buffers[name].data, theirs = out[`present.${name}`].data;
        for (let head = 0; head < h; head++) {
          const from = (head * c + p) * d, to = from + t * d;
          for (let k = from; k < to; k++) {
            if (!Object.is(mine[k], theirs[k])) {
              throw new ArtifactError(`${this.where}: expected ONNX Runtime to write present.${name} into the buffer bound as `
                + 'its past (the in-place cache), it wrote elsewhere');
            }
          }
        }
      }
      this.checked = true;
    }
    if (!this.alias) for (const name of Object.keys(this.buffers)) this.buffers[name] = out[`present.${name}`];
    this.length = p + t;
    return Float32Array.from(out.next_token_logits.data);
  }

  async prefill(ids) { this.length = 0; return this.run(ids); }

  async step(token) { return this.run([token]); }
}

export function makeDecoder(ort, session, manifest, form, { alias = false } = {}) {
  checkContract(session, manifest, form);
  return formKind(form) === 'inplace' ? new InPlaceDecoder(ort, session, manifest.config, { alias, where: form })
    : new ConcatDecoder(ort, session, manifest.config, form);
}

// ---- generation --------------------------------------------------------------------------------------------
export function checkPrompt(prompt, config) {
  if (!Array.isArray(prompt) || !prompt.length) throw new ContractError('prompt: expected at least one token id, got an empty prompt');
  const bad = prompt.find((t) => !Number.isInteger(t));
  if (bad !== undefined) throw new ContractError(`prompt: expected integer token ids, got ${JSON.stringify(bad)}`);
  const out = prompt.find((t) => t < 0 || t >= config.vocab_size);
  if (out !== undefined) throw new ContractError(`prompt: token id ${out} is outside the vocabulary (0..${config.vocab_size - 1})`);
  if (prompt.length > config.context_length) {
    throw new ContractError(`prompt: ${prompt.length} tokens, longer than context_length ${config.context_length}`);
  }
}

export function checkRequest(prompt, config, { maxNewTokens, temperature = 0, topK = null, eosId = null }) {
  checkPrompt(prompt, config);
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) throw new ContractError(`max_new_tokens: expected an integer >= 1, got ${JSON.stringify(maxNewTokens)}`);
  checkSampling(temperature, topK, config.vocab_size);
  if (eosId !== null && (!Number.isInteger(eosId) || eosId < 0 || eosId >= config.vocab_size)) {
    throw new ContractError(`eos_id: expected a token id below ${config.vocab_size}, got ${eosId}`);
  }
}

// Append the next token unless it is eos; why the generation stops now ('' if it goes on). As Python's take_token.
export function takeToken(ids, token, { promptTokens, maxNewTokens, eosId, contextLength }) {
  if (eosId !== null && eosId !== undefined && token === eosId) return 'eos';
  ids.push(token);
  if (ids.length >= maxNewTokens) return 'max_new_tokens';
  if (promptTokens + ids.length >= contextLength) return 'context_length';
  return '';
}

const clock = () => (globalThis.performance ? performance.now() : Date.now());

// One generation: prefill, then a step per token. onToken(id) after each new id (awaited: the page paints there).
// Returns { ids, stop, seed (a decimal string), first_logits, time_to_first_token_s, seconds, tokens_per_s } where
// tokens_per_s counts the tokens after the first over the time after it (the decode speed, as Python's).
export async function generate(decoder, prompt, { maxNewTokens, temperature = 0, topK = null, seed = null, eosId = null,
  onToken = null, now = clock } = {}) {
  const config = decoder.config;
  checkRequest(prompt, config, { maxNewTokens, temperature, topK, eosId });
  const sampler = new Sampler({ temperature, topK, seed, vocabSize: config.vocab_size });
  const ids = [];
  const t0 = now();
  let logits = await decoder.prefill(prompt);
  const firstLogits = logits;
  let ttft = null, stop = '';
  for (;;) {
    const token = sampler.next(logits);
    stop = takeToken(ids, token, { promptTokens: prompt.length, maxNewTokens, eosId, contextLength: config.context_length });
    if (ttft === null) ttft = (now() - t0) / 1000;
    if (stop !== 'eos' && onToken) await onToken(token);
    if (stop) break;
    logits = await decoder.step(token);
  }
  const seconds = (now() - t0) / 1000;
  const later = ids.length - (ids.length ? 1 : 0);
  return { ids, stop, seed: String(sampler.seed), first_logits: firstLogits, time_to_first_token_s: ttft, seconds,
    tokens_per_s: seconds > ttft && later > 0 ? later / (seconds - ttft) : 0 };
}

// ---- the golden generations (runtime/mha_runtime/gpt/golden.py) -----------------------------------------------
export async function loadGenerations(io, manifest, file = GENERATIONS_FILE) {
  const where = `${io.where}/${file}`;
  if (!plainName(file) || !Object.hasOwn(manifest.files, file)) {
    throw new ArtifactError(`${where}: the manifest lists no golden generations (re-export with this version)`);
  }
  const doc = await verifiedJson(io, manifest, file);
  if (!isObject(doc) || doc.kind !== 'gpt-generations' || doc.format !== 1 || !Array.isArray(doc.cases)) {
    throw new ArtifactError(`${where}: expected kind 'gpt-generations' format 1 with a 'cases' list`);
  }
  const tol = doc.tolerance;
  const num = (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0;
  if (!isObject(tol) || !num(tol.atol) || !num(tol.rtol) || !(tol.rel_l2 === null || tol.rel_l2 === undefined || num(tol.rel_l2))) {
    throw new ArtifactError(`${where}: expected a tolerance {atol, rtol, rel_l2} of numbers >= 0, got ${JSON.stringify(tol)}`);
  }
  doc.cases.forEach((c, i) => {
    const at = `${where}: cases[${i}]`;
    if (!isObject(c) || typeof c.name !== 'string') throw new ArtifactError(`${at}: expected a case object with a name`);
    const ints = (v) => Array.isArray(v) && v.every(Number.isInteger);
    if (!ints(c.prompt_ids) || !ints(c.ids)) throw new ArtifactError(`${at}: expected integer lists 'prompt_ids' and 'ids'`);
    if (!Number.isInteger(c.max_new_tokens) || typeof c.temperature !== 'number') throw new ArtifactError(`${at}: expected 'max_new_tokens' and 'temperature'`);
    if (!plainName(c.first_logits_bin)) throw new ArtifactError(`${at}: expected a file name 'first_logits_bin', got ${JSON.stringify(c.first_logits_bin)}`);
  });
  return doc;
}

// Little-endian float32 values, exactly `count` of them.
export function floats(bytes, count, where) {
  if (bytes.byteLength !== 4 * count) throw new ArtifactError(`${where}: expected ${4 * count} bytes (${count} float32), got ${bytes.byteLength}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

const finite = (v) => (Number.isFinite(v) ? v : null);
const g3 = (v) => (v === null ? 'inf' : Number(v).toPrecision(3));

export function caseLine(file, r) {
  const head = `${r.ok ? 'ok  ' : 'FAIL'} ${file.padEnd(16)} ${r.name.padEnd(16)} ${JSON.stringify(r.shape).padEnd(8)}`;
  return r.error ? `${head} ${r.error}` : `${head} max_abs=${g3(r.max_abs)} rel_l2=${g3(r.rel_l2)} atol=${r.tolerance.atol}`;
}

// One golden case on one decoder: the text prompt through the tokenizer (when both are there), the new ids exactly,
// the first-step logits within the tolerance. -> the case's result object of the check format.
export async function checkCase(decoder, c, want, tolerance, tokenizer) {
  const result = { name: c.name, shape: [1, c.prompt_ids.length], ok: false, error: null, max_abs: null, rel_l2: null,
    tolerance, new_tokens: 0, tokens_per_s: null };
  try {
    if (typeof c.prompt_text === 'string' && tokenizer) {
      const encoded = tokenizer.encode(c.prompt_text);
      if (JSON.stringify(encoded) !== JSON.stringify(c.prompt_ids)) {
        throw new ContractError(`the tokenizer encodes ${JSON.stringify(c.prompt_text)} to ${JSON.stringify(encoded)}, golden ${JSON.stringify(c.prompt_ids)}`);
      }
    }
    const out = await generate(decoder, c.prompt_ids, { maxNewTokens: c.max_new_tokens, temperature: c.temperature,
      topK: c.top_k ?? null, seed: c.seed ?? null, eosId: null });
    const cmp = compare(out.first_logits, want, tolerance);
    Object.assign(result, { max_abs: finite(cmp.maxAbs), rel_l2: finite(cmp.relL2), new_tokens: out.ids.length,
      tokens_per_s: out.tokens_per_s });
    if (JSON.stringify(out.ids) !== JSON.stringify(c.ids)) {
      const at = out.ids.findIndex((v, i) => v !== c.ids[i]);
      const i = at < 0 ? Math.min(out.ids.length, c.ids.length) : at;
      result.error = `ids differ from token ${i}: got ${JSON.stringify(out.ids.slice(i, i + 4))}, golden ${JSON.stringify(c.ids.slice(i, i + 4))}`;
    } else if (!cmp.ok) {
      result.error = `first-step logits beyond tolerance (max abs ${g3(finite(cmp.maxAbs))})`;
    } else {
      result.ok = true;
    }
  } catch (e) {
    result.error = firstLine(e);
  }
  return result;
}

// Every golden generation on every fp32 form the folder lists (gpt.onnx, gpt.inplace.onnx; with `lossy`, the lossy
// forms too, each against its own generations), in the check format
// every runner writes ({passed, failed, not_loadable, artifacts: [{file, not_loadable, error, passed, failed,
// cases}]}). openSession(bytes, form) -> a session (it may throw: the runtime's reason is the form's not_loadable);
// alias: whether preallocated outputs may alias inputs (onnxruntime-node). The manifest, the golden files and the
// tokenizer are checked first: a tampered one stops the check before anything runs (an ArtifactError).
export async function checkGenerations(ort, io, { openSession, alias = false, Tokenizer = null, onLine = () => {},
  forms = null, lossy = false } = {}) {
  const manifest = await readGptManifest(io);
  const tokenizer = Tokenizer ? await loadTokenizer(io, manifest, Tokenizer) : null;
  const goldens = {};  // generations file -> {golden, wants}: every one read and checked before anything runs
  const generationsOf = (form) => manifest.artifacts[form]?.generations ?? GENERATIONS_FILE;
  const chosen = forms || [...FP32_FORMS, ...(lossy ? LOSSY_FORMS : [])].filter((f) => listedForms(manifest).includes(f));
  for (const file of new Set([GENERATIONS_FILE, ...chosen.map(generationsOf)])) {
    const golden = await loadGenerations(io, manifest, file);
    const wants = {};
    for (const c of golden.cases) {
      wants[c.name] = floats(await verifiedBytes(io, manifest, `golden/${c.first_logits_bin}`), manifest.config.vocab_size,
        `${io.where}/golden/${c.first_logits_bin}`);
    }
    goldens[file] = { golden, wants };
  }
  let passed = 0, failed = 0;
  const artifacts = [];
  for (const form of chosen) {
    const { golden, wants } = goldens[generationsOf(form)];
    const record = { file: form, runtime: formKind(form), sha256: manifest.files[form]?.sha256 ?? null, not_loadable: null,
      error: null, passed: 0, failed: 0, cases: [] };
    artifacts.push(record);
    let decoder = null, error = null;
    try {
      const bytes = await verifiedBytes(io, manifest, form);
      let session;
      try {
        session = await openSession(bytes, form);
      } catch (e) {
        record.not_loadable = firstLine(e);
        throw e;
      }
      decoder = makeDecoder(ort, session, manifest, form, { alias });
    } catch (e) {
      error = firstLine(e);
      if (!record.not_loadable) record.error = error;
    }
    for (const c of golden.cases) {
      const r = error ? { name: c.name, shape: [1, c.prompt_ids.length], ok: false, error, max_abs: null, rel_l2: null,
        tolerance: golden.tolerance } : await checkCase(decoder, c, wants[c.name], golden.tolerance, tokenizer);
      record.cases.push(r);
      if (r.ok) { record.passed++; passed++; } else { record.failed++; failed++; }
      onLine(caseLine(form, r));
    }
    if (decoder?.session?.release) await decoder.session.release();
  }
  return { name: manifest.name, kind: GPT_KIND, config: manifest.config, tokenizer: Boolean(tokenizer), passed, failed,
    not_loadable: artifacts.filter((a) => a.not_loadable).map((a) => ({ file: a.file, reason: a.not_loadable })), artifacts };
}

// ---- the command line of `generate` (Node and wasm-in-Node share it) -------------------------------------------
// generate DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]
//          [--no-eos] [--form FILE] [--threads N] [--warmup N] [--json] [--text]; null when it is not that form.
// --warmup N: N untimed generations of the same request first (a fresh process's first one includes the runtime's
// own start: V8 runs onnxruntime-web's wasm on its baseline compiler until the optimizing tier has compiled it).
export function parseGenerateArgs(argv) {
  const o = { dir: null, promptIds: null, prompt: null, maxNewTokens: 32, temperature: 0, topK: null, seed: null,
    eos: true, form: null, threads: null, warmup: 0, json: false, text: false };
  const number = (flag, text) => {
    const v = /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/.test(text) ? Number(text) : NaN;
    if (!Number.isFinite(v)) throw new ContractError(`${flag}: expected a number, got '${text.slice(0, 30)}'`);
    return v;
  };
  const integer = (flag, text) => {
    if (!/^-?[0-9]+$/.test(text) || !Number.isSafeInteger(Number(text))) throw new ContractError(`${flag}: expected an integer, got '${text.slice(0, 30)}'`);
    return Number(text);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], next = argv[i + 1];
    const value = () => {
      if (next === undefined) throw new ContractError(`${a}: expected a value`);
      i++;
      return next;
    };
    if (a === '--prompt-ids') o.promptIds = parseIds(value());
    else if (a === '--prompt') o.prompt = value();
    else if (a === '--max-new-tokens') o.maxNewTokens = integer(a, value());
    else if (a === '--temperature') o.temperature = number(a, value());
    else if (a === '--top-k') o.topK = integer(a, value());
    else if (a === '--seed') o.seed = seedValue(value());
    else if (a === '--form') o.form = value();
    else if (a === '--threads') o.threads = integer(a, value());
    else if (a === '--warmup') o.warmup = integer(a, value());
    else if (a === '--no-eos') o.eos = false;
    else if (a === '--eos') o.eos = true;
    else if (a === '--json') o.json = true;
    else if (a === '--text') o.text = true;
    else if (!a.startsWith('--') && o.dir === null) o.dir = a;
    else return null;
  }
  if (o.dir === null) return null;
  if ((o.promptIds === null) === (o.prompt === null)) {
    throw new ContractError('give the prompt as --prompt TEXT or as --prompt-ids 1,2,3 (one of the two)');
  }
  if (o.threads !== null && o.threads < 1) throw new ContractError(`--threads: expected an integer >= 1, got ${o.threads}`);
  if (o.warmup < 0 || o.warmup > 100) throw new ContractError(`--warmup: expected an integer from 0 to 100, got ${o.warmup}`);
  return o;
}

// '1,2,3' -> [1, 2, 3]; anything else is one line naming the bad piece (as `mha generate`).
export function parseIds(text) {
  if (!text.trim()) throw new ContractError('--prompt-ids: expected comma-separated token ids, got an empty prompt');
  return text.split(',').map((p) => {
    const piece = p.trim();
    if (!/^[-+]?[0-9]+$/.test(piece) || !Number.isSafeInteger(Number(piece))) {
      throw new ContractError(`--prompt-ids: expected comma-separated integers, got '${piece.slice(0, 30)}'`);
    }
    return Number(piece);
  });
}

// One generation from parsed arguments on an open folder: the prompt (ids, or text through the tokenizer), the
// checks before anything runs, then the run. -> { prompt_ids, ...generate()'s result without first_logits, text? }
export async function runGenerate(decoder, manifest, tokenizer, o, { onToken = null } = {}) {
  let prompt = o.promptIds;
  if (o.prompt !== null) {
    if (!tokenizer) throw new ContractError(`${manifest.name}: this folder has no tokenizer (exported without --tokenizer); give token ids (--prompt-ids)`);
    prompt = tokenizer.encode(o.prompt);
  }
  const eosId = o.eos ? manifest.eos_id : null;
  const request = { maxNewTokens: o.maxNewTokens, temperature: o.temperature, topK: o.topK, seed: o.seed, eosId };
  for (let w = 0; w < (o.warmup || 0); w++) await generate(decoder, prompt, request);
  const out = await generate(decoder, prompt, { ...request, onToken });
  delete out.first_logits;
  return { prompt_ids: prompt, ...out, text: tokenizer ? tokenizer.decode(out.ids) : null };
}
