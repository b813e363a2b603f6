// Rules every JavaScript runner applies the same way (runtime/native/node with onnxruntime-node, runtime/native/web
// with onnxruntime-web in Node.js and the browser): the golden comparison and the decode schedule check. Plain ES
// module with no imports: attention.mjs and gpt.mjs import it, the pages through them, and Node's mha.js and gpt.js
// require() those (Node >= 20.19 loads ES modules that way).

// The kinds of folder, named by a manifest's "kind" (an attention manifest has none: it came first); "gpt" is the
// decoder kind's name in folders exported before it was named for its task, read and never written. The one place
// the JavaScript runners read a kind (mha_runtime.artifact.manifest.kind_named in Python): every other value, and a
// manifest that is no object, is the attention's, whose loader then names what is wrong.
export const ATTENTION_KIND = 'attention', DECODER_KIND = 'decoder';
const KIND_ALIASES = { gpt: DECODER_KIND };

export function kindOf(doc) {
  const kind = doc !== null && typeof doc === 'object' ? doc.kind : undefined;
  return kind === DECODER_KIND || (typeof kind === 'string' && Object.hasOwn(KIND_ALIASES, kind)) ? DECODER_KIND : ATTENTION_KIND;
}

// The same rule as mha_runtime.artifact.tolerance.compare (and the C runner): |got - want| <= atol + rtol * |want|
// everywhere, all finite, and, where the row has one, relative L2 error <= rel_l2. The max abs error and the
// relative L2 error are always over the whole output, never stopping at the first element out of bounds, so a FAIL
// line reports the whole comparison; a non-finite output or a length mismatch makes both infinite.
export function compare(got, want, tol) {
  if (got.length !== want.length) return { ok: false, maxAbs: Infinity, relL2: Infinity };
  let maxAbs = 0, diff2 = 0, ref2 = 0, ok = true;
  for (let i = 0; i < want.length; i++) {
    const diff = Math.abs(got[i] - want[i]);
    if (!Number.isFinite(got[i])) { ok = false; maxAbs = Infinity; continue; }
    if (!(diff <= tol.atol + tol.rtol * Math.abs(want[i]))) ok = false;
    maxAbs = Math.max(maxAbs, diff);
    diff2 += diff * diff;
    ref2 += want[i] * want[i];
  }
  const relL2 = maxAbs === Infinity ? Infinity : ref2 > 0 ? Math.sqrt(diff2 / ref2) : Math.sqrt(diff2);
  if (tol.rel_l2 !== null && tol.rel_l2 !== undefined && !(relL2 <= tol.rel_l2)) ok = false;
  return { ok, maxAbs, relL2 };
}

// A decode schedule against the case's tokens, before anything runs; the in-place form (GroupQueryAttention) takes
// a chunk of more than one token after a past only at batch 1.
// `Err` is the runner's own error class for a contract refusal.
export function checkSchedule(schedule, [b, t], inplace, Err = Error) {
  const shown = Array.isArray(schedule) ? schedule.join(',') : JSON.stringify(schedule);
  if (!Array.isArray(schedule) || schedule.length < 1) throw new Err(`schedule ${shown}: expected a list of chunks`);
  if (schedule.length > t) throw new Err(`schedule ${shown}: expected at most tokens=${t} chunks, got ${schedule.length}`);
  for (const n of schedule) {
    if (!Number.isInteger(n) || n < 1 || n > t) throw new Err(`schedule ${shown}: expected chunks of 1 to tokens=${t} tokens, got '${n}'`);
  }
  const total = schedule.reduce((p, q) => p + q, 0);
  if (total !== t) throw new Err(`schedule ${shown} adds up to ${total}, expected tokens=${t}`);
  let past = schedule[0];
  for (const n of schedule.slice(1)) {
    if (inplace && b > 1 && n > 1) {
      throw new Err(`schedule ${shown}: a chunk of ${n} tokens after a past of ${past} needs batch 1 `
        + `(ONNX Runtime's GroupQueryAttention), got batch ${b}: feed single tokens`);
    }
    past += n;
  }
}
