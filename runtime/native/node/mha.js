'use strict';
// Load and run the mha-export ONNX artifacts from Node.js with onnxruntime-node: the Node host of the attention runner
// runtime/native/common/attention.mjs (the input contract and the sessions of the three forms, shared with the web
// runner). This file opens the folder: the contract (d_in, context_length, heads) comes from its manifest.json
// (checked field by field), and every file used (model, cases.json, golden .bin) is checked against the manifest's
// size and sha256 before use; golden cases and decode schedules are validated against the config before any buffer is sized.
// check() runs the cases.json artifacts of the runtimes onnxruntime, onnxruntime-decode and onnxruntime-decode-inplace,
// and returns its results in the format of runtime/native/web/check.mjs --json (cli.js `check DIR --json FILE`).
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { MAX_MANIFEST_BYTES, readRegular, regularSize } = require('./files');
// Node >= 20.19 require()s an ES module with no top-level await synchronously: this module's API stays synchronous
// to load (require('./mha')), as it was.
const attention = require('../common/attention.mjs');

const {
  ArtifactError, ContractError, DECODE_INPLACE_RUNTIME, DECODE_RUNTIME, RUNTIMES, checkInput, checkName, checkSchedule,
  checkTolerance, compare, isObject, nonFinite, plainName,
} = attention;

const MANIFEST_FORMAT = 2;
const CASES_FORMAT = 1;
const MAX_DIM = 2 ** 24;  // any one of d_in, d_out, num_heads, context_length (as the C runner)
const CONFIG_KEYS = ['d_in', 'd_out', 'num_heads', 'context_length'];

function checkConfig(config, where) {
  if (!isObject(config)) throw new ArtifactError(`${where}: expected a config object, got ${JSON.stringify(config)}`);
  for (const key of CONFIG_KEYS) {
    const v = config[key];
    if (v === undefined) throw new ArtifactError(`${where}: expected an integer field '${key}', found none`);
    if (!Number.isInteger(v) || v < 1 || v > MAX_DIM) {
      throw new ArtifactError(`${where}: expected '${key}' an integer from 1 to ${MAX_DIM}, got ${JSON.stringify(v)}`);
    }
  }
  return config;
}

function loadManifest(dir) {
  const file = path.join(dir, 'manifest.json');
  if (!fs.existsSync(file)) throw new ArtifactError(`${file}: expected a manifest (made by \`mha export\`), found none`);
  const text = readRegular(file, MAX_MANIFEST_BYTES, (m) => new ArtifactError(m)).toString('utf8');
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new ArtifactError(`${file}: expected JSON, got a parse error (${e.message.split('\n')[0]})`);
  }
  if (!isObject(doc)) throw new ArtifactError(`${file}: expected a JSON object`);
  if (doc.format !== MANIFEST_FORMAT) {
    throw new ArtifactError(`${file}: expected manifest format ${MANIFEST_FORMAT}, got ${JSON.stringify(doc.format)} `
      + "(re-export the folder with this version's `mha export`)");
  }
  checkConfig(doc.config, `${file}: config`);
  if (!isObject(doc.files)) throw new ArtifactError(`${file}: expected a 'files' object, got ${JSON.stringify(doc.files)}`);
  for (const [name, entry] of Object.entries(doc.files)) {
    if (!plainName(name)) throw new ArtifactError(`${file}: files: expected a file name inside the artifact folder, got '${name}'`);
    if (!isObject(entry) || !Number.isSafeInteger(entry.size) || entry.size < 0) {
      throw new ArtifactError(`${file}: files.${name}: expected 'size' an integer >= 0, got ${JSON.stringify(entry?.size)}`);
    }
    if (typeof entry.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(entry.sha256)) {
      throw new ArtifactError(`${file}: files.${name}: expected 'sha256' of 64 lowercase hex digits, got ${JSON.stringify(entry.sha256)}`);
    }
  }
  return doc;
}

function verifiedBytes(dir, name, manifest) {
  const entry = Object.hasOwn(manifest.files, name) ? manifest.files[name] : undefined;
  const file = path.join(dir, name);
  if (!entry) throw new ArtifactError(`${name}: expected it listed in ${path.join(dir, 'manifest.json')}, found no entry`);
  if (!fs.existsSync(file)) throw new ArtifactError(`${file}: listed in the manifest but missing`);
  attention.checkSize(file, entry, { length: regularSize(file) ?? entry.size });  // one of another size is not read
  const bytes = readRegular(file, entry.size, (m) => new ArtifactError(m));
  attention.checkSize(file, entry, bytes);  // a file that changed since its stat
  attention.checkDigest(file, entry, crypto.createHash('sha256').update(bytes).digest('hex'));
  return bytes;
}

// count little-endian float32 values from exactly 4 * count bytes; finite ones only.
function floats(bytes, count, where) {
  if (bytes.length !== count * 4) {
    throw new ArtifactError(`${where}: expected ${count} float32 values (${count * 4} bytes), found ${bytes.length} bytes`);
  }
  const out = attention.f32(bytes, where);
  const bad = out.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) throw new ContractError(`${where}: expected finite float32 values, found ${nonFinite(out[bad])} at index ${bad}`);
  return out;
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
    const err = new ArtifactError(`${path.join(dir, name)}: ONNX Runtime cannot load it (${e.message.split('\n')[0]})`);
    err.notLoadable = err.message;  // the runtime itself refused the verified bytes (check()'s not_loadable)
    throw err;
  }
  return { session, config: manifest.config, file: name };
}

// The shared sessions, opened from an artifact folder (or a model file in one) on onnxruntime-node.
class MhaRunner extends attention.PlainSession {
  static async create(artifact, { model = 'mha.onnx' } = {}) {
    const { session, config, file } = await openSession(artifact, model);
    return new MhaRunner(ort, session, config, file);
  }
}

class DecodeSession extends attention.DecodeSession {
  static async create(artifact, { model = 'mha.decode.onnx' } = {}) {
    const { session, config, file } = await openSession(artifact, model);
    return new DecodeSession(ort, session, config, file);
  }
}

// The in-place form with alias: onnxruntime-node writes present_key/present_value into the buffers bound as the past.
class InPlaceDecodeSession extends attention.InPlaceDecodeSession {
  static async create(artifact, { model = 'mha.decode-inplace.onnx' } = {}) {
    const { session, config, file } = await openSession(artifact, model);
    attention.InPlaceDecodeSession.checkForm(session, file);
    return new InPlaceDecodeSession(ort, session, config, file, { alias: true });
  }
}

function checkCase(c, config, schedule, { inplace = false } = {}) {
  checkName(c.name);  // as the C runner
  const shape = (v) => Array.isArray(v) && v.length === 3 && v.every((n) => Number.isSafeInteger(n));
  if (!shape(c.input_shape) || !shape(c.output_shape)) {
    throw new ContractError(`expected input_shape and output_shape [batch, tokens, width] of integers, got ${JSON.stringify(c.input_shape)} and ${JSON.stringify(c.output_shape)}`);
  }
  if (!plainName(c.input_bin) || !plainName(c.output_bin)) {
    throw new ArtifactError(`golden file: expected a file name inside the artifact folder, got ${JSON.stringify(c.input_bin)} and ${JSON.stringify(c.output_bin)}`);
  }
  const [b, t, dIn] = c.input_shape;
  const [ob, ot, width] = c.output_shape;
  if (dIn !== config.d_in) throw new ContractError(`expected last axis d_in=${config.d_in}, got ${dIn}`);
  if (b < 1) throw new ContractError(`expected batch >= 1, got ${b}`);
  if (t < 1 || t > config.context_length) throw new ContractError(`expected 1 <= tokens <= context_length=${config.context_length}, got ${t}`);
  if (width !== config.num_heads * config.d_out) throw new ContractError(`expected output width num_heads*d_out=${config.num_heads * config.d_out}, got ${width}`);
  if (ob !== b || ot !== t) throw new ContractError(`expected output [batch, tokens] = [${b}, ${t}], got [${ob}, ${ot}]`);
  if (!Number.isSafeInteger(b * t * dIn) || !Number.isSafeInteger(b * t * width)) {
    throw new ContractError(`expected batch * tokens * width float32 values to fit in memory, got batch=${b} tokens=${t}`);
  }
  if (schedule !== undefined) checkSchedule(schedule, [b, t], inplace, ContractError);
}

const finite = (v) => (Number.isFinite(v) ? v : null);  // JSON has no Infinity

// Every golden case on every ONNX artifact of cases.json, each with its own tolerance. The manifest is
// required: cases.json, the golden files and the models are all checked against it. One line per case to log;
// returns { passed, failed, not_loadable: [{ file, reason }], artifacts: [{ file, runtime, not_loadable, error,
// passed, failed, cases: [{ name, ok, max_abs, rel_l2, error }] }] }: an artifact ONNX Runtime cannot load keeps
// its failed cases and names the reason in not_loadable; max_abs and rel_l2 are null when a case was not compared.
async function check(dir, log = console.log) {
  const casesFile = path.join(dir, 'golden', 'cases.json');
  if (!fs.existsSync(casesFile)) throw new ArtifactError(`${casesFile}: expected golden fixtures (made by \`mha export\`), found none`);
  const manifest = loadManifest(dir);
  const config = manifest.config;
  let cases;
  try {
    cases = JSON.parse(verifiedBytes(dir, 'golden/cases.json', manifest).toString('utf8'));
  } catch (e) {
    if (e instanceof ArtifactError) throw e;
    throw new ArtifactError(`${casesFile}: expected JSON, got a parse error (${e.message.split('\n')[0]})`);
  }
  if (!isObject(cases) || !Array.isArray(cases.cases) || !Array.isArray(cases.artifacts)) {
    throw new ArtifactError(`${casesFile}: expected an object with 'cases' and 'artifacts' arrays`);
  }
  if (cases.format !== CASES_FORMAT) {
    throw new ArtifactError(`${casesFile}: expected 'format' ${CASES_FORMAT}, got ${typeof cases.format === 'number' ? 'another number' : JSON.stringify(cases.format)}`);
  }
  if (cases.config !== undefined) {  // as the C runner: fixtures made for another shape do not belong here
    for (const key of CONFIG_KEYS) {
      if (!isObject(cases.config) || cases.config[key] !== config[key]) {
        const got = isObject(cases.config) ? cases.config[key] : cases.config;
        throw new ArtifactError(`${casesFile}: config says ${key}=${got}, the manifest says ${config[key]}; the fixtures do not belong to this folder`);
      }
    }
  }
  const golden = new Map();  // golden/NAME -> verified bytes, read once
  const goldenFloats = (name, count) => {
    const rel = `golden/${name}`;
    if (!golden.has(rel)) golden.set(rel, verifiedBytes(dir, rel, manifest));
    return floats(golden.get(rel), count, path.join(dir, rel));
  };
  let passed = 0, failed = 0;
  const artifacts = [];
  for (const entry of cases.artifacts) {
    if (!isObject(entry) || !RUNTIMES.includes(entry.runtime)) continue;
    const inplace = entry.runtime === DECODE_INPLACE_RUNTIME;
    const decode = inplace || entry.runtime === DECODE_RUNTIME;
    const file = String(entry.file);
    const record = { file, runtime: entry.runtime, not_loadable: null, error: null, passed: 0, failed: 0, cases: [] };
    artifacts.push(record);
    let runner = null, error = null;
    try {
      if (!plainName(entry.file)) throw new ArtifactError(`file: expected a file name inside the artifact folder, got ${JSON.stringify(entry.file)}`);
      checkTolerance(entry.tolerance, `${file}: tolerance`);
      if (decode && !isObject(entry.schedules)) throw new ArtifactError(`${file}: expected 'schedules' for the decode runtime`);
      const kind = inplace ? InPlaceDecodeSession : decode ? DecodeSession : MhaRunner;
      runner = await kind.create(dir, { model: file });
    } catch (e) {
      error = e.message;
      if (e.notLoadable) record.not_loadable = e.notLoadable;
      else record.error = error.split('\n')[0];
    }
    for (const c of cases.cases) {
      const name = isObject(c) ? String(c.name) : '?';
      const shown = JSON.stringify(name).slice(1, -1);  // in a line: control characters escaped
      const result = { name, ok: false, max_abs: null, rel_l2: null, error: null };
      let line;
      try {
        if (error) throw new Error(error);
        if (!isObject(c)) throw new ArtifactError(`expected a case object, got ${JSON.stringify(c)}`);
        const schedule = decode ? (Object.hasOwn(entry.schedules, name) ? entry.schedules[name] : null) : undefined;
        checkCase(c, config, schedule, { inplace });
        const [b, t, dIn] = c.input_shape;
        const x = goldenFloats(c.input_bin, b * t * dIn);
        const want = goldenFloats(c.output_bin, c.output_shape.reduce((p, q) => p * q, 1));
        let got;
        if (!decode) {
          got = (await runner.run(x, c.input_shape)).data;
        } else {  // decode: the case's (validated) schedule of chunks, from an empty cache
          runner.reset();
          const parts = [];
          let start = 0;
          for (const n of schedule) {
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
        if (got.length !== want.length) {
          throw new ContractError(`output 'context': expected ${want.length} values ${JSON.stringify(c.output_shape)}, got ${got.length}`);
        }
        const r = compare(got, want, entry.tolerance);
        line = `${r.ok ? 'ok  ' : 'FAIL'} ${file.padEnd(20)} ${shown.padEnd(10)} max_abs=${r.maxAbs.toPrecision(3)} rel_l2=${r.relL2.toPrecision(3)}`
          + (r.ok ? '' : ` atol=${entry.tolerance.atol}` + (entry.tolerance.rel_l2 == null ? '' : ` rel_l2<=${entry.tolerance.rel_l2}`));
        Object.assign(result, { ok: r.ok, max_abs: finite(r.maxAbs), rel_l2: finite(r.relL2) });
      } catch (e) {
        line = `FAIL ${file.padEnd(20)} ${shown.padEnd(10)} ${e.message.split('\n')[0]}`;
        result.error = e.message.split('\n')[0];
      }
      result.ok ? (passed++, record.passed++) : (failed++, record.failed++);
      record.cases.push(result);
      log(line);
    }
  }
  const notLoadable = artifacts.filter((a) => a.not_loadable).map((a) => ({ file: a.file, reason: a.not_loadable }));
  return { passed, failed, not_loadable: notLoadable, artifacts };
}

module.exports = {
  MhaRunner, DecodeSession, InPlaceDecodeSession, check, checkInput, checkCase, floats, loadManifest, ContractError, ArtifactError,
};
