// The golden generations check (runtime/mha_runtime/decoder/golden.py; runtime/native/common/gpt.mjs re-exports it): every
// golden generation on every decoder form the folder lists, in the check format every runner writes.
import { compare } from '../rules.mjs';
import { ArtifactError, CONTRACT_TOLERANCE, ContractError, FP32_FORMS, GENERATIONS_FILE, DECODER_KIND, LOSSY_FORMS, firstLine, isObject,
  plainName } from './base.mjs';
import { formKind, listedForms, readGptManifest, verifiedBytes, verifiedJson } from './folder.mjs';
import { loadTokenizer } from './tokenizer.mjs';
import { makeDecoder } from './decoders.mjs';
import { generate } from './generate.mjs';

export async function loadGenerations(io, manifest, file = GENERATIONS_FILE) {
  const where = `${io.where}/${file}`;
  if (!plainName(file) || !Object.hasOwn(manifest.files, file)) {
    throw new ArtifactError(`${where}: the manifest lists no golden generations (re-export with this version)`);
  }
  const doc = await verifiedJson(io, manifest, file);
  if (!isObject(doc) || doc.kind !== 'gpt-generations' || doc.format !== 1 || !Array.isArray(doc.cases)) {
    throw new ArtifactError(`${where}: expected kind 'gpt-generations' format 1 with a 'cases' list`);
  }
  // as `mha check` and the C runner: a check of no case passed nothing ("0 passed, 0 failed")
  if (doc.cases.length === 0) throw new ArtifactError(`${where}: expected at least one case`);
  const tol = doc.tolerance;
  const num = (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0;
  if (!isObject(tol) || !num(tol.atol) || !num(tol.rtol) || !(tol.rel_l2 === null || tol.rel_l2 === undefined || num(tol.rel_l2))) {
    throw new ArtifactError(`${where}: expected a tolerance {atol, rtol, rel_l2} of numbers >= 0, got ${JSON.stringify(tol)}`);
  }
  doc.cases.forEach((c, i) => {
    const at = `${where}: cases[${i}]`;
    if (!isObject(c) || typeof c.name !== 'string') throw new ArtifactError(`${at}: expected a case object with a name`);
    // printed in every result line: refused as `mha check` and the C runner refuse it (and as the attention check)
    if (!c.name || /[\u0000-\u001f\u007f-\u009f]/.test(c.name)) throw new ArtifactError(`${at}: name: expected printable text, got ${JSON.stringify(c.name)}`);
    const ints = (v) => Array.isArray(v) && v.every(Number.isInteger);
    if (!ints(c.prompt_ids) || !ints(c.ids)) throw new ArtifactError(`${at}: expected integer lists 'prompt_ids' and 'ids'`);
    if (!Number.isInteger(c.max_new_tokens) || typeof c.temperature !== 'number') throw new ArtifactError(`${at}: expected 'max_new_tokens' and 'temperature'`);
    // a JSON number or null, as the Python and C readers take it: the sampler's seedValue() also takes a decimal
    // string (the command line's), and a golden "seed": "123" passed as 123
    if (c.seed !== null && c.seed !== undefined && typeof c.seed !== 'number') throw new ArtifactError(`${at}: expected 'seed' an integer or null, got ${JSON.stringify(c.seed).slice(0, 40)}`);
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
  const name = JSON.stringify(String(r.name)).slice(1, -1);  // control characters escaped, not written to a terminal
  const head = `${r.ok ? 'ok  ' : 'FAIL'} ${file.padEnd(16)} ${name.padEnd(16)} ${JSON.stringify(r.shape).padEnd(8)}`;
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
  const generationsOf = (form) => {
    const file = manifest.artifacts[form]?.generations ?? GENERATIONS_FILE;
    // as `mha check` words it (the path itself, named as a folder file, read "the manifest lists no golden generations")
    if (!plainName(file)) {
      throw new ArtifactError(`${io.where}/manifest.json: artifacts.${form}: generations: expected a file name inside the artifact folder, got ${JSON.stringify(file)}`);
    }
    return file;
  };
  const chosen = forms || [...FP32_FORMS, ...(lossy ? LOSSY_FORMS : [])].filter((f) => listedForms(manifest).includes(f));
  for (const file of new Set([GENERATIONS_FILE, ...chosen.map(generationsOf)])) {
    const golden = await loadGenerations(io, manifest, file);
    const wants = {};
    for (const c of golden.cases) {
      wants[c.name] = floats(await verifiedBytes(io, manifest, `golden/${c.first_logits_bin}`), manifest.shapes.vocab_size,
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
    const row = CONTRACT_TOLERANCE, own = golden.tolerance;
    if (own.atol !== row.atol || own.rtol !== row.rtol || (own.rel_l2 ?? null) !== row.rel_l2) {
      const r = { name: 'tolerance', shape: [], ok: false, max_abs: null, rel_l2: null, tolerance: row,
        error: `${io.where}/${generationsOf(form)}: expected the contract's tolerance ${JSON.stringify(row)}, got ${JSON.stringify(own)}` };
      record.cases.push(r);
      record.failed++;
      failed++;
      onLine(caseLine(form, r));
    }
    for (const c of golden.cases) {
      const r = error ? { name: c.name, shape: [1, c.prompt_ids.length], ok: false, error, max_abs: null, rel_l2: null,
        tolerance: row } : await checkCase(decoder, c, wants[c.name], row, tokenizer);
      record.cases.push(r);
      if (r.ok) { record.passed++; passed++; } else { record.failed++; failed++; }
      onLine(caseLine(form, r));
    }
    if (decoder?.session?.release) await decoder.session.release();
  }
  return { name: manifest.name, kind: DECODER_KIND, config: manifest.config, shapes: manifest.shapes, tokenizer: Boolean(tokenizer), passed, failed,
    not_loadable: artifacts.filter((a) => a.not_loadable).map((a) => ({ file: a.file, reason: a.not_loadable })), artifacts };
}
