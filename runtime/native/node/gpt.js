'use strict';
// The whole GPT from Node.js with onnxruntime-node: `mha-node generate` and `mha-node check` on a GPT folder (made by
// `mha export --gpt`). The generation contract (manifest and sha256 checks, the decoder loop, the sampling rule and
// numpy's PCG64) is runtime/native/common/gpt.mjs, shared with the wasm runner and the browser page; this file only
// opens the folder, the session and the tokenizer (@huggingface/tokenizers, pure JS, reading tokenizer.json), and for
// --chat the chat template's Template (@huggingface/jinja).
// Decoder: gpt.inplace.onnx by default. onnxruntime-node 1.30 writes a run's outputs into the tensors given as
// fetches, over their own memory, so the same [1, H, C, D] tensor is passed as past_key_values.{i}.* and as the
// preallocated present.{i}.*: GroupQueryAttention sees one buffer and writes only the new rows (checked on the first
// run). It also returns copies of the outputs (one copy of each cache buffer per step; onnxruntime#32346 would end
// that). gpt.onnx (the Concat form) runs with --form gpt.onnx.
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { Tokenizer } = require('@huggingface/tokenizers');
const gpt = require('../common/gpt.mjs');
const { MAX_MANIFEST_BYTES, readRegular, regularSize } = require('./files');

const { ArtifactError, INPLACE_FORM } = gpt;

function nodeIo(dir) {
  return {
    where: dir,
    async bytes(rel, what) {
      const file = path.join(dir, rel);
      try {
        const buf = readRegular(file, what ? MAX_MANIFEST_BYTES : Number.MAX_SAFE_INTEGER, (m) => new ArtifactError(m));
        return new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
      } catch (e) {
        if (e instanceof ArtifactError) throw e;
        if (e.code === 'ENOENT') throw new ArtifactError(what ? `${file}: expected ${what}, found none` : `${file}: listed in the manifest but missing`);
        throw new ArtifactError(`${file}: cannot read it (${e.code || e.message})`);
      }
    },
    async size(rel) { return regularSize(path.join(dir, rel)); },
    async sha256(bytes) { return crypto.createHash('sha256').update(bytes).digest('hex'); },
  };
}

function sessionOptions(threads) {
  return threads ? { intraOpNumThreads: threads, interOpNumThreads: 1 } : {};
}

async function openSession(bytes, form, threads = null) {
  try {
    return await ort.InferenceSession.create(bytes, sessionOptions(threads));
  } catch (e) {
    throw new ArtifactError(`${form}: ONNX Runtime cannot load it (${String(e.message).split('\n')[0]})`);
  }
}

function checkFolder(dir) {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) {
    throw new ArtifactError(`decoder folder ${dir}: expected a folder made by \`mha export --gpt\`, found none`);
  }
}

// Open DIR for generation: the manifest, the form's sha256, the contract, the tokenizer's sha256, in that order,
// all before anything runs. -> { manifest, decoder, tokenizer }
async function openGpt(dir, { form = null, threads = null } = {}) {
  checkFolder(dir);
  const io = nodeIo(dir);
  const manifest = await gpt.readGptManifest(io);
  const listed = gpt.listedForms(manifest);
  // null: the default; any string given (even '') must be a listed form, as `mha generate --form` says
  const chosen = form !== null ? form : (listed.includes(INPLACE_FORM) ? INPLACE_FORM : listed[0]);
  if (!chosen || !listed.includes(chosen)) {
    throw new ArtifactError(`${dir}: no decoder ${form || ''} listed in the manifest; it holds ${listed.join(', ') || 'none'}`);
  }
  const bytes = await gpt.verifiedBytes(io, manifest, chosen);
  const tokenizer = await gpt.loadTokenizer(io, manifest, Tokenizer);
  const session = await openSession(bytes, path.join(dir, chosen), threads);
  const decoder = gpt.makeDecoder(ort, session, manifest, chosen, { alias: true });
  return { manifest, decoder, tokenizer, form: chosen, io };
}

// `generate DIR ...` (gpt.parseGenerateArgs): the new ids as one line of comma-separated integers, or with --text
// the new text streamed as it is made, or with --json one object {prompt_ids, ids, stop, seed,
// time_to_first_token_s, tokens_per_s, form, runtime}; a summary line on stderr unless --json.
async function generateCommand(o, out = process.stdout, err = process.stderr) {
  const { manifest, decoder, tokenizer, form, io } = await openGpt(o.dir, { form: o.form, threads: o.threads });
  // --chat: the folder's template through @huggingface/jinja (transformers.js' library), read only when asked
  const chat = o.chat != null ? await gpt.loadChat(io, manifest, tokenizer, require('@huggingface/jinja').Template) : null;
  if (o.text && !tokenizer) throw new ArtifactError(`${o.dir}: this folder has no tokenizer (exported without --tokenizer): --text needs one`);
  const stream = o.text ? new gpt.TextStream(tokenizer) : null;
  const r = await gpt.runGenerate(decoder, manifest, tokenizer, o, { onToken: stream ? (t) => { out.write(stream.push(t)); } : null,
    chat, where: o.dir });
  if (o.json) {
    out.write(`${JSON.stringify({ prompt_ids: r.prompt_ids, ids: r.ids, stop: r.stop, seed: r.seed,
      time_to_first_token_s: Number(r.time_to_first_token_s.toFixed(6)), tokens_per_s: Number(r.tokens_per_s.toFixed(3)),
      form, runtime: 'node', onnxruntime: require('onnxruntime-node/package.json').version })}\n`);
    return 0;
  }
  out.write(stream ? `${stream.end()}\n` : `${r.ids.join(',')}\n`);
  err.write(`${r.ids.length} tokens, time to first token ${(r.time_to_first_token_s * 1e3).toFixed(1)} ms, `
    + `${r.tokens_per_s.toFixed(1)} tokens/s (stopped: ${r.stop}; seed ${r.seed}; ${form})\n`);
  return 0;
}

// `check DIR` on a GPT folder: every golden generation on gpt.onnx, gpt.inplace.onnx and the lossy forms (each
// against its own); the check format.
async function checkGpt(dir, log = console.log) {
  checkFolder(dir);
  const result = await gpt.checkGenerations(ort, nodeIo(dir), {
    openSession: (bytes, form) => openSession(bytes, path.join(dir, form), 1), alias: true, Tokenizer, onLine: log,
    lossy: true,
  });
  return result;
}

module.exports = { openGpt, generateCommand, checkGpt, parseGenerateArgs: gpt.parseGenerateArgs, gpt };
