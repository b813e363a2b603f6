// The golden-case check on onnxruntime-web, shared by check.mjs (Node.js) and page.mjs (the browser page).
// Platform-neutral: the caller passes the `ort` module and an `io` object:
//   io.bytes(rel) -> Promise<Uint8Array>, io.json(rel) -> Promise<object>, io.sha256(Uint8Array) -> Promise<hex>,
//   optional io.size(rel) -> Promise<bytes or null> (by stat: a listed file of another size is not read),
//   io.where: the artifact folder, for messages. `rel` is a path inside the artifact folder.
// The runner is runtime/native/common/attention.mjs, the one runtime/native/node/mha.js runs too (the input contract
// and the sessions of the three forms); this file is its wasm host and check: the contract comes from manifest.json,
// every model and golden file is checked against the manifest's sha256 and size before it is used, and decode
// artifacts run each case's schedule of chunks (validated first, with the words of mha.js and the C runner).
import {
  ArtifactError, DECODE_INPLACE_RUNTIME, DECODE_RUNTIME, DecodeSession, InPlaceDecodeSession, ONNX_RUNTIME, PlainSession,
  checkDigest, checkName, checkSchedule, checkShape as checkDims, checkSize, checkTolerance, compare, f32, isObject, plainName,
} from '../common/attention.mjs';

export { ArtifactError, DECODE_INPLACE_RUNTIME, DECODE_RUNTIME, ONNX_RUNTIME, checkSchedule, compare, f32 };

const DECODE_RUNTIMES = [DECODE_RUNTIME, DECODE_INPLACE_RUNTIME];

// The tutorial's six tokens "Your journey starts with one step" (3-dim embeddings), fed as a batch of two.
export const BOOK_INPUT = [
  [0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
  [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55],
];

// Refuse what breaks the contract before ONNX Runtime sees it (the messages of mha.js and the C runner).
export function checkShape(dims, config, pastTokens = 0) {
  checkDims(dims, config, pastTokens, ArtifactError);
}

// A model file's bytes, only if its size and sha256 are the manifest's.
export async function verifiedBytes(io, manifest, name) {
  const entry = (manifest.files || {})[name];
  if (!entry) throw new ArtifactError(`${name}: not listed in ${io.where}/manifest.json`);
  checkSize(`${io.where}/${name}`, entry, { length: await io.size?.(name) ?? entry.size });  // where io can stat
  const bytes = await io.bytes(name);
  checkSize(`${io.where}/${name}`, entry, bytes);
  checkDigest(`${io.where}/${name}`, entry, await io.sha256(bytes));
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

// The session of an artifact's form over a loaded session (the in-place form fed back: onnxruntime-web's wasm backend
// copies tensors into and out of its own memory and leaves preallocated output tensors unwritten).
function runnerOf(ort, session, config, entry) {
  if (entry.runtime === DECODE_INPLACE_RUNTIME) return new InPlaceDecodeSession(ort, session, config, entry.file, { alias: false });
  if (entry.runtime === DECODE_RUNTIME) return new DecodeSession(ort, session, config, entry.file);
  return new PlainSession(ort, session, config, entry.file);
}

// Feed x [b, t, d_in] to a decode runner in the schedule's chunks, in order, from an empty cache (zeroed buffers for
// the in-place form); each chunk's context [b, n, width] is put back in place -> Float32Array [b, t, width].
async function runSchedule(runner, x, dims, schedule, config, width) {
  const [b, t, dIn] = dims;
  const got = new Float32Array(b * t * width);
  runner.reset();
  let start = 0;
  for (const n of schedule) {
    checkShape([b, n, dIn], config, start);
    const chunk = new Float32Array(b * n * dIn);
    for (let i = 0; i < b; i++) chunk.set(x.subarray((i * t + start) * dIn, (i * t + start + n) * dIn), i * n * dIn);
    const c = (await runner.forward(chunk, [b, n, dIn])).data;
    if (c.length !== b * n * width) throw new ArtifactError(`output 'context': expected ${b * n * width} values [${b},${n},${width}], got ${c.length}`);
    for (let i = 0; i < b; i++) got.set(c.subarray(i * n * width, (i + 1) * n * width), (i * t + start) * width);
    start += n;
  }
  if (start !== t) throw new ArtifactError(`schedule adds up to ${start} tokens, expected ${t}`);
  return got;
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
  // sealed as the models are (the Node, C and Python checks refuse an edited cases.json or golden file; this check
  // passed a cases.json cut to one case, and compared against an edited output file)
  await verifiedBytes(io, manifest, 'golden/cases.json');
  // the Node runner's words for what is not one ("cases.cases is not iterable" was the line)
  if (!isObject(cases) || !Array.isArray(cases.cases) || !Array.isArray(cases.artifacts)) {
    throw new ArtifactError(`${io.where}/golden/cases.json: expected an object with 'cases' and 'artifacts' arrays`);
  }
  const config = manifest.config;
  const inputs = {}, wants = {};
  const artifacts = [];
  let passed = 0, failed = 0;
  for (const entry of cases.artifacts) {
    if (!isObject(entry)) continue;  // as Node: a runtime it does not run
    if (entry.runtime !== ONNX_RUNTIME && !DECODE_RUNTIMES.includes(entry.runtime)) continue;
    const inplace = entry.runtime === DECODE_INPLACE_RUNTIME;
    const record = { file: entry.file, runtime: entry.runtime, sha256: manifest.files[entry.file]?.sha256 ?? null,
      loaded: false, not_loadable: null, error: null, load_ms: null, passed: 0, failed: 0, median_ms: null, cases: [] };
    artifacts.push(record);
    let session = null, runner = null;
    try {
      // what Node's check refuses first, in its words (a number as 'file' or no tolerance was a JS TypeError's line)
      if (!plainName(entry.file)) throw new ArtifactError(`file: expected a file name inside the artifact folder, got ${JSON.stringify(entry.file)}`);
      checkTolerance(entry.tolerance, `${entry.file}: tolerance`);
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
      runner = runnerOf(ort, session, config, entry);
    } catch (e) {
      record.error = runtimeReason(e);
    }
    const times = [];
    for (const c of cases.cases) {
      const result = { name: isObject(c) ? c.name : '?', shape: c?.input_shape ?? null, tolerance: entry.tolerance, ok: false,
        max_abs: null, rel_l2: null, median_ms: null, error: null };
      try {
        if (record.error) throw new ArtifactError(record.error);
        if (!isObject(c)) throw new ArtifactError(`expected a case object, got ${JSON.stringify(c)}`);
        checkName(c.name);
        const shape = (v) => Array.isArray(v) && v.length === 3 && v.every((n) => Number.isSafeInteger(n));
        if (!shape(c.input_shape) || !shape(c.output_shape)) {  // as Node (an absent output_shape was a TypeError)
          throw new ArtifactError(`expected input_shape and output_shape [batch, tokens, width] of integers, got ${JSON.stringify(c.input_shape)} and ${JSON.stringify(c.output_shape)}`);
        }
        if (!plainName(c.input_bin) || !plainName(c.output_bin)) {  // never read from outside the folder
          throw new ArtifactError(`golden file: expected a file name inside the artifact folder, got ${JSON.stringify(c.input_bin)} and ${JSON.stringify(c.output_bin)}`);
        }
        checkShape(c.input_shape, config);
        const width = config.num_heads * config.d_out;
        if (c.output_shape[2] !== width) throw new ArtifactError(`expected output width ${width}, got ${c.output_shape[2]}`);
        inputs[c.name] ??= f32(await verifiedBytes(io, manifest, `golden/${c.input_bin}`), `${io.where}/golden/${c.input_bin}`);
        wants[c.name] ??= f32(await verifiedBytes(io, manifest, `golden/${c.output_bin}`), `${io.where}/golden/${c.output_bin}`);
        const x = inputs[c.name], want = wants[c.name];
        const n = (s) => s.reduce((p, q) => p * q, 1);
        if (x.length !== n(c.input_shape) || want.length !== n(c.output_shape)) {
          throw new ArtifactError(`golden files of ${c.name} do not hold ${JSON.stringify(c.input_shape)} -> ${JSON.stringify(c.output_shape)}`);
        }
        const decode = DECODE_RUNTIMES.includes(entry.runtime);
        const schedule = decode ? (entry.schedules || {})[c.name] : null;
        if (decode && !schedule) throw new ArtifactError(`no decode schedule for ${c.name} in cases.json`);
        if (decode) checkSchedule(schedule, c.input_shape, inplace, ArtifactError);
        const once = async () => (schedule ? runSchedule(runner, x, c.input_shape, schedule, config, width)
          : (await runner.forward(x, c.input_shape)).data);
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
  const name = JSON.stringify(String(r.name)).slice(1, -1);  // control characters escaped, not written to a terminal
  const head = `${r.ok ? 'ok  ' : 'FAIL'} ${String(file).padEnd(20)} ${name.padEnd(10)}`;
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
    const context = (await new PlainSession(ort, session, manifest.config, 'mha.onnx').forward(flat, dims)).data;
    return Array.from(context.subarray(0, manifest.config.num_heads * manifest.config.d_out));
  } finally {
    await session.release();
  }
}
