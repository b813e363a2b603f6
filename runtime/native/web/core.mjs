// The golden-case check on onnxruntime-web, shared by check.mjs (Node.js) and page.mjs (the browser page).
// Platform-neutral: the caller passes the `ort` module and an `io` object:
//   io.bytes(rel) -> Promise<Uint8Array>, io.json(rel) -> Promise<object>, io.sha256(Uint8Array) -> Promise<hex>,
//   io.where: the artifact folder, for messages. `rel` is a path inside the artifact folder.
// Mirrors runtime/native/node/mha.js: the contract comes from manifest.json, every model file is checked against
// the manifest's sha256 and size before it is loaded, and decode artifacts run each case's schedule of chunks
// (validated first, with the words of mha.js and the C runner).
import { checkSchedule, compare } from '../common/rules.mjs';

export { checkSchedule, compare };

export const ONNX_RUNTIME = 'onnxruntime';
export const DECODE_RUNTIME = 'onnxruntime-decode';
export const DECODE_INPLACE_RUNTIME = 'onnxruntime-decode-inplace';
const DECODE_RUNTIMES = [DECODE_RUNTIME, DECODE_INPLACE_RUNTIME];

// The tutorial's six tokens "Your journey starts with one step" (3-dim embeddings), fed as a batch of two.
export const BOOK_INPUT = [
  [0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
  [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55],
];

export class ArtifactError extends Error {}

// Raw little-endian float32, whatever the host's byte order.
export function f32(bytes, where) {
  if (bytes.byteLength % 4) throw new ArtifactError(`${where}: ${bytes.byteLength} bytes is not a whole number of float32 values`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

// Refuse what breaks the contract before ONNX Runtime sees it (the messages of mha.js and the C runner).
export function checkShape(dims, config, pastTokens = 0) {
  if (dims.length !== 3) throw new ArtifactError(`input 'x': expected rank 3 [batch, tokens, ${config.d_in}], got rank ${dims.length}`);
  const [batch, tokens, dIn] = dims;
  const maxTokens = config.context_length - pastTokens;
  if (dIn !== config.d_in) throw new ArtifactError(`input 'x': expected last axis d_in=${config.d_in}, got ${dIn}`);
  if (batch < 1) throw new ArtifactError(`input 'x': expected batch >= 1, got ${batch}`);
  if (tokens < 1 || tokens > maxTokens) {
    const limit = pastTokens ? `context_length - past_tokens = ${maxTokens}` : `context_length=${config.context_length}`;
    throw new ArtifactError(`input 'x': expected 1 <= tokens <= ${limit}, got ${tokens}`);
  }
}

function hexdigestMismatch(where, name, digest, expected) {
  return new ArtifactError(`${where}/${name}: sha256 ${digest.slice(0, 12)}... differs from the manifest's `
    + `${expected.slice(0, 12)}...; the file was altered: re-export it with \`mha export\``);
}

// A model file's bytes, only if its size and sha256 are the manifest's.
export async function verifiedBytes(io, manifest, name) {
  const entry = (manifest.files || {})[name];
  if (!entry) throw new ArtifactError(`${name}: not listed in ${io.where}/manifest.json`);
  const bytes = await io.bytes(name);
  if (bytes.length !== entry.size) {
    throw new ArtifactError(`${io.where}/${name}: expected ${entry.size} bytes (manifest), found ${bytes.length}; file truncated or replaced`);
  }
  const digest = await io.sha256(bytes);
  if (digest !== entry.sha256) throw hexdigestMismatch(io.where, name, digest, entry.sha256);
  return bytes;
}

export async function readManifest(io) {
  const manifest = await io.json('manifest.json', 'a manifest (made by `mha export`)');
  if (!manifest || typeof manifest.files !== 'object' || typeof manifest.config !== 'object') {
    throw new ArtifactError(`${io.where}/manifest.json: expected "files" and "config" (manifest format 2)`);
  }
  return manifest;
}

export async function openSession(ort, bytes) {
  return ort.InferenceSession.create(bytes, { executionProviders: ['wasm'], intraOpNumThreads: 1 });
}

function runtimeReason(e) {
  return String((e && e.message) || e).split('\n')[0];
}

// One forward pass of x [b, t, d_in] through a plain artifact -> Float32Array [b, t, width].
async function runPlain(ort, session, x, dims) {
  const out = await session.run({ x: new ort.Tensor('float32', x, dims) });
  return out.context.data;
}

// Feed x [b, t, d_in] to `step` in the schedule's chunks, in order; `step(chunk, start, n)` runs one chunk
// (a Tensor [b, n, d_in] starting at token `start`) and returns its context [b, n, width], put back in place.
async function runSchedule(ort, x, dims, schedule, config, width, step) {
  const [b, t, dIn] = dims;
  const got = new Float32Array(b * t * width);
  let start = 0;
  for (const n of schedule) {
    checkShape([b, n, dIn], config, start);
    const chunk = new Float32Array(b * n * dIn);
    for (let i = 0; i < b; i++) chunk.set(x.subarray((i * t + start) * dIn, (i * t + start + n) * dIn), i * n * dIn);
    const c = await step(new ort.Tensor('float32', chunk, [b, n, dIn]), start, n);
    if (c.length !== b * n * width) throw new ArtifactError(`output 'context': expected ${b * n * width} values [${b},${n},${width}], got ${c.length}`);
    for (let i = 0; i < b; i++) got.set(c.subarray(i * n * width, (i + 1) * n * width), (i * t + start) * width);
    start += n;
  }
  if (start !== t) throw new ArtifactError(`schedule adds up to ${start} tokens, expected ${t}`);
  return got;
}

// The decode form from an empty cache, each chunk's present_key/present_value fed to the next as its past.
async function runDecode(ort, session, x, dims, schedule, config, width) {
  const { num_heads: h, d_out: d } = config;
  let past = { past_key: new ort.Tensor('float32', new Float32Array(0), [dims[0], h, 0, d]) };
  past.past_value = past.past_key;
  return runSchedule(ort, x, dims, schedule, config, width, async (chunk) => {
    const out = await session.run({ x: chunk, ...past });
    past = { past_key: out.present_key, past_value: out.present_value };
    return out.context.data;
  });
}

// The in-place form from zeroed buffers of [b, heads, context_length, d_out] (rows at and after past_tokens are never
// read). onnxruntime-web's wasm backend copies tensors into and out of its own memory and leaves preallocated
// output tensors unwritten, so each step's present_key/present_value are fed back as the next step's past.
async function runDecodeInplace(ort, session, x, dims, schedule, config, width) {
  const [b] = dims;
  const { num_heads: h, context_length: ctx, d_out: d } = config;
  let past = {
    past_key: new ort.Tensor('float32', new Float32Array(b * h * ctx * d), [b, h, ctx, d]),
    past_value: new ort.Tensor('float32', new Float32Array(b * h * ctx * d), [b, h, ctx, d]),
  };
  return runSchedule(ort, x, dims, schedule, config, width, async (chunk, start) => {
    const out = await session.run({ x: chunk, ...past, past_tokens: new ort.Tensor('int32', new Int32Array(b).fill(start), [b]) });
    past = { past_key: out.present_key, past_value: out.present_value };
    return out.context.data;
  });
}

function median(values) {
  if (!values.length) return null;
  const s = [...values].sort((p, q) => p - q);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

const finite = (v) => (Number.isFinite(v) ? v : null);  // JSON has no Infinity

// Every golden case of every ONNX artifact that cases.json lists, each with its own tolerance.
// An artifact whose sha256 or size differs from the manifest fails all its cases; one that onnxruntime-web cannot
// load (a contrib op missing from the wasm build, an IR or opset too new) is reported with the runtime's reason and
// counted neither way. `repeats` timed runs follow one untimed run (whose output is the one compared).
// onLine(text) receives one line per case as it finishes. Returns a plain JSON-able summary.
export async function checkArtifacts(ort, io, { repeats = 3, onLine = () => {}, now = () => performance.now() } = {}) {
  const manifest = await readManifest(io);
  const cases = await io.json('golden/cases.json', 'golden fixtures (made by `mha export`)');
  const config = manifest.config;
  const inputs = {}, wants = {};
  const artifacts = [];
  let passed = 0, failed = 0;
  for (const entry of cases.artifacts || []) {
    if (entry.runtime !== ONNX_RUNTIME && !DECODE_RUNTIMES.includes(entry.runtime)) continue;
    const inplace = entry.runtime === DECODE_INPLACE_RUNTIME;
    const record = { file: entry.file, runtime: entry.runtime, sha256: manifest.files[entry.file]?.sha256 ?? null,
      loaded: false, not_loadable: null, error: null, load_ms: null, passed: 0, failed: 0, median_ms: null, cases: [] };
    artifacts.push(record);
    let session = null;
    try {
      const bytes = await verifiedBytes(io, manifest, entry.file);
      const t0 = now();
      try {
        session = await openSession(ort, bytes);
      } catch (e) {
        record.not_loadable = runtimeReason(e);
        onLine(`skip ${entry.file.padEnd(20)} not loadable by onnxruntime-web (wasm): ${record.not_loadable}`);
        continue;
      }
      record.load_ms = now() - t0;
      record.loaded = true;
    } catch (e) {
      record.error = runtimeReason(e);
    }
    const times = [];
    for (const c of cases.cases) {
      const result = { name: c.name, shape: c.input_shape, tolerance: entry.tolerance, ok: false,
        max_abs: null, rel_l2: null, median_ms: null, error: null };
      try {
        if (record.error) throw new ArtifactError(record.error);
        checkShape(c.input_shape, config);
        const width = config.num_heads * config.d_out;
        if (c.output_shape[2] !== width) throw new ArtifactError(`expected output width ${width}, got ${c.output_shape[2]}`);
        inputs[c.name] ??= f32(await io.bytes(`golden/${c.input_bin}`), `${io.where}/golden/${c.input_bin}`);
        wants[c.name] ??= f32(await io.bytes(`golden/${c.output_bin}`), `${io.where}/golden/${c.output_bin}`);
        const x = inputs[c.name], want = wants[c.name];
        const n = (s) => s.reduce((p, q) => p * q, 1);
        if (x.length !== n(c.input_shape) || want.length !== n(c.output_shape)) {
          throw new ArtifactError(`golden files of ${c.name} do not hold ${JSON.stringify(c.input_shape)} -> ${JSON.stringify(c.output_shape)}`);
        }
        const decode = DECODE_RUNTIMES.includes(entry.runtime);
        const schedule = decode ? (entry.schedules || {})[c.name] : null;
        if (decode && !schedule) throw new ArtifactError(`no decode schedule for ${c.name} in cases.json`);
        if (decode) checkSchedule(schedule, c.input_shape, inplace, ArtifactError);
        const run = inplace ? runDecodeInplace : runDecode;
        const once = () => (schedule ? run(ort, session, x, c.input_shape, schedule, config, width)
          : runPlain(ort, session, x, c.input_shape));
        const got = await once();
        const caseTimes = [];
        for (let r = 0; r < repeats; r++) {
          const t0 = now();
          await once();
          caseTimes.push(now() - t0);
        }
        times.push(...caseTimes);
        const cmp = compare(got, want, entry.tolerance);
        Object.assign(result, { ok: cmp.ok, max_abs: finite(cmp.maxAbs), rel_l2: finite(cmp.relL2), median_ms: median(caseTimes) });
      } catch (e) {
        result.error = runtimeReason(e);
      }
      record.cases.push(result);
      result.ok ? (record.passed++, passed++) : (record.failed++, failed++);
      onLine(caseLine(entry.file, result));
    }
    record.median_ms = median(times);
    if (session) await session.release();
  }
  return {
    runtime: 'wasm', name: manifest.name, config, backend: 'wasm', threads: ort.env.wasm.numThreads,
    onnxruntime_web: ort.env.versions?.web ?? null, repeats, passed, failed,
    not_loadable: artifacts.filter((a) => a.not_loadable).map((a) => ({ file: a.file, reason: a.not_loadable })),
    artifacts,
  };
}

// C's %.3g: 0, 0.000138, 1.49e-08 -> 1.49e-8; null (an infinite error) -> inf.
export function g3(v) {
  if (v === null || v === undefined) return 'inf';
  if (v === 0) return '0';
  const a = Math.abs(v);
  return a < 1e-4 || a >= 1e3 ? v.toExponential(2).replace(/\.?0+e/, 'e') : String(Number(v.toPrecision(3)));
}

export function caseLine(file, r) {
  const head = `${r.ok ? 'ok  ' : 'FAIL'} ${file.padEnd(20)} ${r.name.padEnd(10)}`;
  if (r.error) return `${head} ${r.error}`;
  const ms = r.median_ms === null ? '' : ` median_ms=${r.median_ms.toFixed(3)}`;
  const bound = r.ok || r.tolerance.rel_l2 === null || r.tolerance.rel_l2 === undefined ? ''
    : ` rel_l2<=${g3(r.tolerance.rel_l2)}`;  // a FAIL line names both bounds it was held to
  return `${head} max_abs=${g3(r.max_abs)} rel_l2=${g3(r.rel_l2)} atol=${g3(r.tolerance.atol)}${bound}${ms}`;
}

// context[0, 0, :] of the book's input (batch 2) through mha.onnx, checked against the manifest first.
export async function bookRow(ort, io) {
  const manifest = await readManifest(io);
  const flat = Float32Array.from([...BOOK_INPUT, ...BOOK_INPUT].flat());
  const dims = [2, BOOK_INPUT.length, BOOK_INPUT[0].length];
  checkShape(dims, manifest.config);
  const session = await openSession(ort, await verifiedBytes(io, manifest, 'mha.onnx'));
  try {
    const context = await runPlain(ort, session, flat, dims);
    return Array.from(context.subarray(0, manifest.config.num_heads * manifest.config.d_out));
  } finally {
    await session.release();
  }
}
