// The attention runner, written once for both JavaScript hosts: runtime/native/node/mha.js (onnxruntime-node; it
// require()s this file) and runtime/native/web/core.mjs (onnxruntime-web's wasm backend, in Node.js and in the browser
// page). Plain ES module with no imports but rules.mjs: the host opens the ONNX Runtime session (from a manifest-checked
// file) and passes its `ort` module (both have the same Tensor/InferenceSession API), so the same code runs in Node.js
// and in a browser without a bundler. What is here:
// - the input contract (the messages of the C runner): checkInput for a caller's data, checkShape for dims alone;
// - the three forms of mha-export's ONNX artifacts: PlainSession (mha.onnx and its variants: x -> context),
//   DecodeSession (mha.decode.onnx: a Concat-grown cache fed back) and InPlaceDecodeSession (mha.decode-inplace.onnx:
//   one key and one value buffer of [batch, heads, context_length, d_out] with past_tokens). Each has a checked entry
//   (run/step: the contract first, the refusals of mha.js's public API) and forward(data, dims), the same run for a
//   caller that validated the whole case before (the wasm check);
// - the manifest's size and sha256 refusals, and little-endian float32 decoding, in the words every runner uses.
import { checkSchedule, compare } from './rules.mjs';

export { checkSchedule, compare };

export class ContractError extends Error {}
export class ArtifactError extends Error {}

export const ONNX_RUNTIME = 'onnxruntime';
export const DECODE_RUNTIME = 'onnxruntime-decode';
export const DECODE_INPLACE_RUNTIME = 'onnxruntime-decode-inplace';
export const RUNTIMES = [ONNX_RUNTIME, DECODE_RUNTIME, DECODE_INPLACE_RUNTIME];  // the cases.json runtimes the checks run
export const INPLACE_INPUTS = ['x', 'past_key', 'past_value', 'past_tokens'];

export const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// A file name inside the artifact folder: no absolute path, no '.', '..' or empty part, no backslash.
export function plainName(name) {
  return typeof name === 'string' && name !== '' && !name.startsWith('/') && !name.includes('\\')
    && name.split('/').every((p) => p !== '' && p !== '.' && p !== '..');
}

// A case's tolerance {atol, rtol, rel_l2 (null or absent)}, numbers >= 0; otherwise one line (Node's and wasm's words).
export function checkTolerance(tol, where) {
  const number = (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0;
  if (!isObject(tol) || !number(tol.atol) || !number(tol.rtol) || !(tol.rel_l2 === null || tol.rel_l2 === undefined || number(tol.rel_l2))) {
    throw new ArtifactError(`${where}: expected a tolerance {atol, rtol, rel_l2} of numbers >= 0, got ${JSON.stringify(tol)}`);
  }
}

// A case's name, printed in every result line: text without control characters (as the C runner), else one line.
export function checkName(name) {
  if (typeof name !== 'string' || !name || /[\u0000-\u001f\u007f-\u009f]/.test(name)) {
    throw new ArtifactError(`name: expected printable text, got ${JSON.stringify(name)}`);
  }
}

// How a message names a value that is not finite.
export const nonFinite = (v) => (v > 0 ? 'inf' : v < 0 ? '-inf' : 'nan');

// Raw little-endian float32, whatever the host's byte order.
export function f32(bytes, where) {
  if (bytes.byteLength % 4) throw new ArtifactError(`${where}: ${bytes.byteLength} bytes is not a whole number of float32 values`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

// A listed file's bytes against its manifest entry: the size first, then the sha256 (label: the file, for messages).
export function checkSize(label, entry, bytes) {
  if (bytes.length !== entry.size) {
    throw new ArtifactError(`${label}: expected ${entry.size} bytes (manifest), found ${bytes.length}; file truncated or replaced`);
  }
}

export function checkDigest(label, entry, digest) {
  if (digest !== entry.sha256) {
    throw new ArtifactError(`${label}: sha256 ${digest.slice(0, 12)}... differs from the manifest's `
      + `${entry.sha256.slice(0, 12)}...; the file was altered: re-export it with \`mha export\``);
  }
}

// dims [batch, tokens, d_in] against the contract, after pastTokens tokens of cache. `Err`: the caller's error class.
export function checkShape(dims, config, pastTokens = 0, Err = ContractError) {
  if (dims.length !== 3) throw new Err(`input 'x': expected rank 3 [batch, tokens, ${config.d_in}], got rank ${dims.length}`);
  const [batch, tokens, dIn] = dims;
  const maxTokens = config.context_length - pastTokens;
  if (dIn !== config.d_in) throw new Err(`input 'x': expected last axis d_in=${config.d_in}, got ${dIn}`);
  if (batch < 1) throw new Err(`input 'x': expected batch >= 1, got ${batch}`);
  if (tokens < 1 || tokens > maxTokens) {
    const limit = pastTokens ? `context_length - past_tokens = ${maxTokens}` : `context_length=${config.context_length}`;
    throw new Err(`input 'x': expected 1 <= tokens <= ${limit}, got ${tokens}`);
  }
}

// Refuse what breaks the contract before ONNX Runtime sees it. dims: [batch, tokens, d_in].
export function checkInput(data, dims, config, pastTokens = 0) {
  if (!(data instanceof Float32Array)) throw new ContractError(`input 'x': expected a Float32Array, got ${data?.constructor?.name}`);
  if (!Array.isArray(dims) || dims.length !== 3) throw new ContractError(`input 'x': expected rank 3 [batch, tokens, ${config.d_in}], got rank ${dims?.length}`);
  if (!dims.every(Number.isSafeInteger)) throw new ContractError(`input 'x': expected integer dims [batch, tokens, d_in], got ${JSON.stringify(dims)}`);
  checkShape(dims, config, pastTokens);
  const [batch, tokens, dIn] = dims;
  if (data.length !== batch * tokens * dIn) throw new ContractError(`input 'x': expected ${batch * tokens * dIn} values for ${JSON.stringify(dims)}, got ${data.length}`);
  const bad = data.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) throw new ContractError(`input 'x': expected finite float32 values, found ${nonFinite(data[bad])} at index ${bad}`);
}

// The plain forms: x [batch, tokens, d_in] -> context [batch, tokens, heads * d_out].
export class PlainSession {
  constructor(ort, session, config, file) {
    Object.assign(this, { ort, session, config, file });
  }

  // x: Float32Array of [batch, tokens, d_in] -> { data: Float32Array, dims: [batch, tokens, heads * d_out] }
  async run(data, dims) {
    checkInput(data, dims, this.config);
    return this.forward(data, dims);
  }

  async forward(data, dims) {
    const out = await this.session.run({ x: new this.ort.Tensor('float32', data, dims) });
    return { data: out.context.data, dims: out.context.dims };
  }
}

// The decode form: each step's present_key/present_value are the next step's past (an empty cache first).
export class DecodeSession {
  constructor(ort, session, config, file) {
    Object.assign(this, { ort, session, config, file });
    this.reset();
  }

  reset() { this.pastKey = null; this.pastValue = null; }

  get pastTokens() { return this.pastKey ? this.pastKey.dims[2] : 0; }

  // Feed new tokens; the cache grows only when the step succeeds.
  async step(data, dims) {
    checkInput(data, dims, this.config, this.pastTokens);
    if (this.pastKey && this.pastKey.dims[0] !== dims[0]) {
      throw new ContractError(`input 'x': expected batch ${this.pastKey.dims[0]} (the cache's), got ${dims[0]}`);
    }
    return this.forward(data, dims);
  }

  async forward(data, dims) {
    const { ort } = this;
    const { num_heads: h, d_out: d } = this.config;
    const empty = new ort.Tensor('float32', new Float32Array(0), [dims[0], h, 0, d]);
    const out = await this.session.run({
      x: new ort.Tensor('float32', data, dims), past_key: this.pastKey || empty, past_value: this.pastValue || empty,
    });
    this.pastKey = out.present_key;
    this.pastValue = out.present_value;
    return { data: out.context.data, dims: out.context.dims };
  }
}

// The in-place decode form (mha.decode-inplace.onnx): one key and one value buffer of [batch, heads, context_length,
// d_out], zeroed, fed as past_key/past_value; past_tokens ([batch] int32) says how many rows hold a past; rows after
// it are never read. A chunk of more than one token after a past only at batch 1 (ONNX Runtime's GroupQueryAttention).
// alias: true (onnxruntime-node) passes the same buffers to the run as the preallocated present_key/present_value
// outputs (run(feeds, fetches)): onnxruntime-node writes its outputs into the tensors it is given, over their own
// memory, so GroupQueryAttention sees one buffer and writes only the new rows into it. onnxruntime-node also returns
// copies of the outputs: forward() checks that the context and the new cache rows landed in its buffers.
// alias: false (onnxruntime-web: its wasm backend copies tensors into and out of its own memory and leaves
// preallocated outputs unwritten) feeds each step's present_key/present_value back as the next step's past, and
// reset() starts again from zeroed buffers.
export class InPlaceDecodeSession {
  constructor(ort, session, config, file, { alias = false } = {}) {
    Object.assign(this, { ort, session, config, file, alias: Boolean(alias) });
    this.batch = 0;
    this.pastTokens = 0;
  }

  // The session's inputs are the in-place form's (the Node host refuses another file before it runs).
  static checkForm(session, file) {
    if (JSON.stringify(session.inputNames) !== JSON.stringify(INPLACE_INPUTS)) {
      throw new ContractError(`${file}: expected the in-place decode form with inputs ${JSON.stringify(INPLACE_INPUTS)}, `
        + `got ${JSON.stringify(session.inputNames)}`);
    }
  }

  // Forget every past token (with alias, the buffers stay allocated).
  reset() {
    this.pastTokens = 0;
    if (!this.alias) this.batch = 0;
  }

  allocate(batch) {
    const { ort } = this;
    const { num_heads: h, context_length: ctx, d_out: d } = this.config;
    const dims = [batch, h, ctx, d];
    this.key = new ort.Tensor('float32', new Float32Array(batch * h * ctx * d), dims);
    this.value = new ort.Tensor('float32', new Float32Array(batch * h * ctx * d), dims);
    this.batch = batch;
  }

  // Feed new tokens; past_tokens moves on only when the step succeeds.
  async step(data, dims) {
    checkInput(data, dims, this.config, this.pastTokens);
    const [batch, tokens] = dims;
    if (this.pastTokens && batch !== this.batch) {
      throw new ContractError(`input 'x': expected batch ${this.batch} (the cache's), got ${batch}; call reset() to start a new sequence`);
    }
    if (this.pastTokens && tokens > 1 && batch > 1) {
      throw new ContractError(`input 'x': a chunk of ${tokens} tokens after a past of ${this.pastTokens} needs batch 1 `
        + `(ONNX Runtime's GroupQueryAttention), got batch ${batch}: feed single tokens`);
    }
    return this.forward(data, dims);
  }

  async forward(data, dims) {
    const { ort } = this;
    const [batch, tokens] = dims;
    if (batch !== this.batch) this.allocate(batch);
    const feeds = {
      x: new ort.Tensor('float32', data, dims), past_key: this.key, past_value: this.value,
      past_tokens: new ort.Tensor('int32', new Int32Array(batch).fill(this.pastTokens), [batch]),
    };
    if (!this.alias) {
      const out = await this.session.run(feeds);
      this.key = out.present_key;
      this.value = out.present_value;
      this.pastTokens += tokens;
      return { data: out.context.data, dims: out.context.dims };
    }
    const { num_heads: h, context_length: ctx, d_out: d } = this.config;
    const width = h * d;
    const context = new ort.Tensor('float32', new Float32Array(batch * tokens * width), [batch, tokens, width]);
    const out = await this.session.run(feeds, { context, present_key: this.key, present_value: this.value });
    const same = (a, b) => a.length === b.length && a.every((v, i) => Object.is(v, b[i]));
    let written = same(out.context.data, context.data);
    for (const [name, buffer] of [['present_key', this.key], ['present_value', this.value]]) {
      for (let row = 0; written && row < batch * h; row++) {  // the new rows [pastTokens, pastTokens + tokens)
        const from = (row * ctx + this.pastTokens) * d, to = from + tokens * d;
        written = same(out[name].data.subarray(from, to), buffer.data.subarray(from, to));
      }
    }
    if (!written) {
      throw new ArtifactError(`${this.file}: expected onnxruntime-node to write its outputs into the preallocated tensors, `
        + 'it wrote elsewhere');
    }
    this.pastTokens += tokens;
    return { data: context.data, dims: context.dims };
  }
}
