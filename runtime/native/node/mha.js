'use strict';
// Load and run the mha-export ONNX artifacts from Node.js with onnxruntime-node.
// The contract (d_in, context_length, heads) comes from the folder's manifest.json, and every model
// file is checked against the manifest's sha256 before it is loaded.
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

class ContractError extends Error {}
class ArtifactError extends Error {}

function loadManifest(dir) {
  const file = path.join(dir, 'manifest.json');
  if (!fs.existsSync(file)) throw new ArtifactError(`${file}: expected a manifest (made by \`mha export\`), found none`);
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new ArtifactError(`${file}: expected JSON, got a parse error (${e.message})`);
  }
}

function verifiedBytes(dir, name, manifest) {
  const entry = manifest.files[name];
  const file = path.join(dir, name);
  if (!entry) throw new ArtifactError(`${name}: not listed in ${path.join(dir, 'manifest.json')}`);
  if (!fs.existsSync(file)) throw new ArtifactError(`${file}: listed in the manifest but missing`);
  const bytes = fs.readFileSync(file);
  if (bytes.length !== entry.size) {
    throw new ArtifactError(`${file}: expected ${entry.size} bytes (manifest), found ${bytes.length}; file truncated or replaced`);
  }
  const digest = crypto.createHash('sha256').update(bytes).digest('hex');
  if (digest !== entry.sha256) {
    throw new ArtifactError(`${file}: sha256 ${digest.slice(0, 12)}... differs from the manifest's `
      + `${entry.sha256.slice(0, 12)}...; the file was altered: re-export it with \`mha export\``);
  }
  return bytes;
}

// Refuse what breaks the contract before ONNX Runtime sees it. dims: [batch, tokens, d_in].
function checkInput(data, dims, config, pastTokens = 0) {
  if (!(data instanceof Float32Array)) throw new ContractError(`input 'x': expected a Float32Array, got ${data?.constructor?.name}`);
  if (dims.length !== 3) throw new ContractError(`input 'x': expected rank 3 [batch, tokens, ${config.d_in}], got rank ${dims.length}`);
  const [batch, tokens, dIn] = dims;
  const maxTokens = config.context_length - pastTokens;
  if (dIn !== config.d_in) throw new ContractError(`input 'x': expected last axis d_in=${config.d_in}, got ${dIn}`);
  if (batch < 1) throw new ContractError(`input 'x': expected batch >= 1, got ${batch}`);
  if (tokens < 1 || tokens > maxTokens) {
    const limit = pastTokens ? `context_length - past_tokens = ${maxTokens}` : `context_length=${config.context_length}`;
    throw new ContractError(`input 'x': expected 1 <= tokens <= ${limit}, got ${tokens}`);
  }
  if (data.length !== batch * tokens * dIn) throw new ContractError(`input 'x': expected ${batch * tokens * dIn} values for ${JSON.stringify(dims)}, got ${data.length}`);
  if (!data.every(Number.isFinite)) throw new ContractError("input 'x': expected finite float32 values");
}

async function openSession(artifact, model) {
  const isDir = fs.existsSync(artifact) && fs.statSync(artifact).isDirectory();
  const dir = isDir ? artifact : path.dirname(artifact);
  const name = isDir ? model : path.basename(artifact);
  const manifest = loadManifest(dir);
  const bytes = verifiedBytes(dir, name, manifest);
  let session;
  try {
    session = await ort.InferenceSession.create(bytes, { intraOpNumThreads: 1 });
  } catch (e) {
    throw new ArtifactError(`${path.join(dir, name)}: ONNX Runtime cannot load it (${e.message.split('\n')[0]})`);
  }
  return { session, config: manifest.config, file: name };
}

class MhaRunner {
  static async create(artifact, { model = 'mha.onnx' } = {}) {
    const r = new MhaRunner();
    Object.assign(r, await openSession(artifact, model));
    return r;
  }

  // x: Float32Array of [batch, tokens, d_in] -> { data: Float32Array, dims: [batch, tokens, heads * d_out] }
  async run(data, dims) {
    checkInput(data, dims, this.config);
    const out = await this.session.run({ x: new ort.Tensor('float32', data, dims) });
    return { data: out.context.data, dims: out.context.dims };
  }
}

class DecodeSession {
  static async create(artifact, { model = 'mha.decode.onnx' } = {}) {
    const d = new DecodeSession();
    Object.assign(d, await openSession(artifact, model));
    d.reset();
    return d;
  }

  reset() { this.pastKey = null; this.pastValue = null; }

  get pastTokens() { return this.pastKey ? this.pastKey.dims[2] : 0; }

  // Feed new tokens; the cache grows only when the step succeeds.
  async step(data, dims) {
    checkInput(data, dims, this.config, this.pastTokens);
    const { num_heads: h, d_out: d } = this.config;
    const empty = new ort.Tensor('float32', new Float32Array(0), [dims[0], h, 0, d]);
    if (this.pastKey && this.pastKey.dims[0] !== dims[0]) {
      throw new ContractError(`input 'x': expected batch ${this.pastKey.dims[0]} (the cache's), got ${dims[0]}`);
    }
    const out = await this.session.run({
      x: new ort.Tensor('float32', data, dims), past_key: this.pastKey || empty, past_value: this.pastValue || empty,
    });
    this.pastKey = out.present_key;
    this.pastValue = out.present_value;
    return { data: out.context.data, dims: out.context.dims };
  }
}

function readBin(file, count) {
  const buf = fs.readFileSync(file);
  if (buf.length !== count * 4) throw new ArtifactError(`${file}: expected ${count} float32 values, found ${buf.length / 4}`);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = buf.readFloatLE(4 * i);
  return out;
}

function compare(got, want, tol) {
  let maxAbs = 0, diff2 = 0, ref2 = 0, ok = got.length === want.length;
  for (let i = 0; ok && i < want.length; i++) {
    const diff = Math.abs(got[i] - want[i]);
    if (!Number.isFinite(got[i]) || diff > tol.atol + tol.rtol * Math.abs(want[i])) ok = false;
    maxAbs = Math.max(maxAbs, Number.isFinite(got[i]) ? diff : Infinity);
    diff2 += diff * diff;
    ref2 += want[i] * want[i];
  }
  const relL2 = ref2 > 0 ? Math.sqrt(diff2 / ref2) : Math.sqrt(diff2);
  if (tol.rel_l2 !== null && tol.rel_l2 !== undefined && relL2 > tol.rel_l2) ok = false;
  return { ok, maxAbs, relL2 };
}

// Every golden case on every ONNX artifact of cases.json, each with its own tolerance.
async function check(dir, log = console.log) {
  const casesFile = path.join(dir, 'golden', 'cases.json');
  if (!fs.existsSync(casesFile)) throw new ArtifactError(`${casesFile}: expected golden fixtures (made by \`mha export\`), found none`);
  const cases = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
  let passed = 0, failed = 0;
  for (const entry of cases.artifacts) {
    if (entry.runtime !== 'onnxruntime' && entry.runtime !== 'onnxruntime-decode') continue;
    let runner = null, error = null;
    try {
      runner = entry.runtime === 'onnxruntime' ? await MhaRunner.create(dir, { model: entry.file })
        : await DecodeSession.create(dir, { model: entry.file });
    } catch (e) {
      error = e.message;
    }
    for (const c of cases.cases) {
      let line;
      try {
        if (error) throw new Error(error);
        const [b, t, dIn] = c.input_shape;
        const x = readBin(path.join(dir, 'golden', c.input_bin), b * t * dIn);
        const want = readBin(path.join(dir, 'golden', c.output_bin), c.output_shape.reduce((p, q) => p * q, 1));
        let got;
        if (entry.runtime === 'onnxruntime') {
          got = (await runner.run(x, c.input_shape)).data;
        } else {  // decode: the case's schedule of chunks, from an empty cache
          runner.reset();
          const parts = [];
          let start = 0;
          for (const n of entry.schedules[c.name]) {
            const chunk = new Float32Array(b * n * dIn);
            for (let i = 0; i < b; i++) chunk.set(x.subarray((i * t + start) * dIn, (i * t + start + n) * dIn), i * n * dIn);
            parts.push({ n, out: (await runner.step(chunk, [b, n, dIn])).data });
            start += n;
          }
          const width = c.output_shape[2];
          got = new Float32Array(want.length);
          let at = 0;
          for (const { n, out } of parts) {
            for (let i = 0; i < b; i++) got.set(out.subarray(i * n * width, (i + 1) * n * width), (i * t + at) * width);
            at += n;
          }
        }
        const r = compare(got, want, entry.tolerance);
        line = `${r.ok ? 'ok  ' : 'FAIL'} ${entry.file.padEnd(20)} ${c.name.padEnd(10)} max_abs=${r.maxAbs.toPrecision(3)} rel_l2=${r.relL2.toPrecision(3)}`;
        r.ok ? passed++ : failed++;
      } catch (e) {
        line = `FAIL ${entry.file.padEnd(20)} ${c.name.padEnd(10)} ${e.message}`;
        failed++;
      }
      log(line);
    }
  }
  return { passed, failed };
}

module.exports = { MhaRunner, DecodeSession, check, checkInput, loadManifest, ContractError, ArtifactError };
