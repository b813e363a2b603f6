#!/usr/bin/env node
// node runtime/native/web/check.mjs ARTIFACT_DIR [--json FILE] [--repeats N]
// Every golden case of every artifact onnxruntime-web's WebAssembly backend can load, on one thread, with each
// artifact's tolerance; an artifact it cannot load is listed with the runtime's reason and counted neither way.
// One line per case (with the median milliseconds of N timed runs), ending with "N passed, N failed".
// --json FILE writes the same results (pass counts, max errors, median ms per case) for the portability
// table (docs/portability.md) and `mha bench`, with "runtime": "wasm": the format the other runners' `check DIR --json FILE` write too
// (runtime/native/common/report.h).
// On a decoder folder (manifest kind "decoder", or "gpt" before it was named so; made by `mha export --gpt`) the check runs every golden generation
// (golden/generations.json) on gpt.onnx and gpt.inplace.onnx through runtime/native/common/gpt.mjs, and
// node check.mjs generate DIR (--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT) [--max-new-tokens N] [--temperature T --top-k K
//   --seed S] [--no-eos] [--form FILE] [--warmup N] [--json | --text]
// prints the new ids as one line of comma-separated integers (or the text as it is made, or one JSON object with
// time_to_first_token_s and tokens_per_s), as `mha-node generate` does.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ArtifactError, checkArtifacts, openSession } from './core.mjs';
import * as gpt from '../common/gpt.mjs';
import { ATTENTION_KIND, kindOf } from '../common/rules.mjs';
import nodeFiles from '../node/files.js';

// writeJson: a unique temporary name renamed into place, removed when the write fails (a fixed '<file>.tmp' was
// left behind beside a --json path that could not be written, and shared by concurrent runs)
const { MAX_MANIFEST_BYTES, readRegular, regularSize, writeJson } = nodeFiles;

const USAGE = 'usage: node check.mjs ARTIFACT_DIR [--json FILE] [--repeats N]';

function parseArgs(argv) {
  const opts = { dir: null, json: null, repeats: 3 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    // --json once and not '' (an empty one wrote nothing and exited 0), as the Node and C runners take it
    if (a === '--json' && i + 1 < argv.length && opts.json === null && argv[i + 1] !== '') opts.json = argv[++i];
    else if (a === '--repeats' && i + 1 < argv.length) {
      const text = argv[++i];  // a whole decimal: not '0x10', '1e3' or ' 2', which Number() took
      opts.repeats = /^[0-9]+$/.test(text) ? Number(text) : NaN;
      if (!Number.isSafeInteger(opts.repeats) || opts.repeats < 1) return null;
    } else if (!a.startsWith('--') && opts.dir === null) opts.dir = a;
    else return null;
  }
  return opts.dir === null ? null : opts;
}

function nodeIo(dir) {
  const read = (rel, what) => {
    const file = path.join(dir, rel);
    if (!fs.existsSync(file)) {
      throw new ArtifactError(what ? `${file}: expected ${what}, found none` : `${file}: listed but missing`);
    }
    // a regular file only (a FIFO or /dev/zero in its place is never read), as the Node runner reads
    return readRegular(file, what ? MAX_MANIFEST_BYTES : Number.MAX_SAFE_INTEGER, (m) => new ArtifactError(m));
  };
  return {
    where: dir,
    bytes: async (rel, what) => new Uint8Array(read(rel, what)),
    json: async (rel, what) => {
      try {
        return JSON.parse(read(rel, what).toString('utf8'));
      } catch (e) {
        if (e instanceof ArtifactError) throw e;
        throw new ArtifactError(`${path.join(dir, rel)}: expected JSON, got a parse error (${e.message})`);
      }
    },
    size: async (rel) => regularSize(path.join(dir, rel)),
    sha256: async (bytes) => crypto.createHash('sha256').update(bytes).digest('hex'),
  };
}

async function loadOrt() {
  let ort;
  try {
    ort = (await import('onnxruntime-web')).default;
  } catch {
    throw new Error('onnxruntime-web is not installed: run `make web-build` (npm ci in runtime/native/web)');
  }
  ort.env.wasm.numThreads = 1;  // Node's default is up to 4 worker threads
  ort.env.logLevel = 'error';
  return ort;
}

async function loadTokenizerClass() {
  try {
    return (await import('@huggingface/tokenizers')).Tokenizer;
  } catch {
    throw new Error('@huggingface/tokenizers is not installed: run `make web-build` (npm ci in runtime/native/web)');
  }
}

// The kind DIR/manifest.json names (rules.mjs kindOf); anything unreadable is the attention's, whose loader then
// names what is wrong.
function folderKind(dir) {
  try {
    const text = readRegular(path.join(dir, 'manifest.json'), MAX_MANIFEST_BYTES, (m) => new Error(m));
    return kindOf(JSON.parse(text.toString('utf8')));
  } catch {
    return ATTENTION_KIND;
  }
}

function checkFolder(dir) {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) {
    throw new ArtifactError(`artifact folder ${dir}: expected a folder made by \`mha export\`, found none`);
  }
}

async function loadSession(ort, bytes, form) {
  try {
    return await openSession(ort, bytes);
  } catch (e) {
    throw new ArtifactError(`${form}: onnxruntime-web (wasm) cannot load it (${String(e && e.message || e).split('\n')[0]})`);
  }
}

// The golden generations of a GPT folder on wasm: one line per case and form, "N passed, N failed".
async function checkGpt(opts) {
  const ort = await loadOrt();
  const t0 = performance.now();
  const result = await gpt.checkGenerations(ort, nodeIo(opts.dir), {
    openSession: (bytes) => openSession(ort, bytes), alias: false, Tokenizer: await loadTokenizerClass(),
    onLine: (l) => console.log(l),
  });
  Object.assign(result, { runtime: 'wasm', backend: 'wasm', threads: ort.env.wasm.numThreads,
    onnxruntime_web: ort.env.versions?.web ?? null, host: `node ${process.version}`, artifact_dir: opts.dir,
    total_ms: performance.now() - t0 });
  if (opts.json) writeJson(opts.json, result);
  console.log(`${result.passed} passed, ${result.failed} failed`);
  if (result.passed + result.failed === 0) console.error(`error: ${opts.dir}: no case ran (no decoder form in golden/generations.json's folder)`);
  return result.failed > 0 || result.passed === 0 ? 1 : 0;
}

// The default form on wasm is gpt.onnx: the wasm backend copies every input into its memory and every output out
// of it, so the in-place form moves its whole [1, H, C, D] buffers both ways on every step (2 x 75 MB a token for
// GPT_CONFIG_124M), the Concat form only the rows filled so far. On gpt-mini (C = 256) the two ran at the same
// tokens/s; --form gpt.inplace.onnx runs the other.
async function loadTemplateClass() {
  try {
    return (await import('@huggingface/jinja')).Template;
  } catch {
    throw new Error('@huggingface/jinja is not installed: run `make web-build` (npm ci in runtime/native/web)');
  }
}

async function generateGpt(o) {
  checkFolder(o.dir);
  const io = nodeIo(o.dir);
  const manifest = await gpt.readGptManifest(io);
  const listed = gpt.listedForms(manifest);
  const form = o.form !== null ? o.form : (listed.includes(gpt.CONCAT_FORM) ? gpt.CONCAT_FORM : listed[0]);  // '' too is checked
  if (!form || !listed.includes(form)) {
    throw new ArtifactError(`${o.dir}: no decoder ${o.form || ''} listed in the manifest; it holds ${listed.join(', ') || 'none'}`);
  }
  const bytes = await gpt.verifiedBytes(io, manifest, form);
  const tokenizer = await gpt.loadTokenizer(io, manifest, await loadTokenizerClass());
  const chat = o.chat != null ? await gpt.loadChat(io, manifest, tokenizer, await loadTemplateClass()) : null;
  const ort = await loadOrt();
  const decoder = gpt.makeDecoder(ort, await loadSession(ort, bytes, path.join(o.dir, form)), manifest, form, { alias: false });
  if (o.text && !tokenizer) throw new ArtifactError(`${o.dir}: this folder has no tokenizer (exported without --tokenizer): --text needs one`);
  const stream = o.text ? new gpt.TextStream(tokenizer) : null;
  // after each piece a turn of the event loop: onnxruntime-web's steps are promises only, so a write to a closed pipe
  // was never seen (its EPIPE waits for libuv) and the whole generation ran on to exit 0
  const show = async (t) => { process.stdout.write(stream.push(t)); await new Promise((done) => setImmediate(done)); };
  const r = await gpt.runGenerate(decoder, manifest, tokenizer, o, { onToken: stream ? show : null, chat, where: o.dir });
  if (o.json) {
    console.log(JSON.stringify({ prompt_ids: r.prompt_ids, ids: r.ids, stop: r.stop, seed: r.seed,
      time_to_first_token_s: Number(r.time_to_first_token_s.toFixed(6)), tokens_per_s: Number(r.tokens_per_s.toFixed(3)),
      form, runtime: 'wasm', onnxruntime_web: ort.env.versions?.web ?? null, threads: ort.env.wasm.numThreads }));
    return 0;
  }
  process.stdout.write(stream ? `${stream.end()}\n` : `${r.ids.join(',')}\n`);
  console.error(`${r.ids.length} tokens, time to first token ${(r.time_to_first_token_s * 1e3).toFixed(1)} ms, `
    + `${r.tokens_per_s.toFixed(1)} tokens/s (stopped: ${r.stop}; seed ${r.seed}; ${form}, wasm 1 thread)`);
  return 0;
}

async function main(argv) {
  if (argv[0] === 'generate') {
    const o = gpt.parseGenerateArgs(argv.slice(1));
    if (!o || o.threads !== null) {
      console.error(`${USAGE}\n       node check.mjs generate DECODER_DIR (--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT) [--max-new-tokens N] `
        + '[--temperature T] [--top-k K] [--seed S] [--no-eos] [--form FILE] [--warmup N] [--json | --text]');
      return 2;
    }
    nodeFiles.checkUtf8Arg(argv, '--prompt', (m) => new gpt.ContractError(m));
    nodeFiles.checkUtf8Arg(argv, '--chat', (m) => new gpt.ContractError(m));
    return generateGpt(o);
  }
  const opts = parseArgs(argv);
  if (!opts) {
    console.error(USAGE);
    return 2;
  }
  checkFolder(opts.dir);
  return KINDS[folderKind(opts.dir)](opts);
}

// What the check runs per kind of folder: the attention's golden cases, or a decoder's golden generations.
const KINDS = { attention: checkAttention, decoder: checkGpt };

// Every golden case of an attention folder's artifacts that onnxruntime-web can load.
async function checkAttention(opts) {
  const ort = await loadOrt();
  const t0 = performance.now();
  const result = await checkArtifacts(ort, nodeIo(opts.dir), { repeats: opts.repeats, onLine: (l) => console.log(l) });
  result.host = `node ${process.version}`;
  result.artifact_dir = opts.dir;
  result.total_ms = performance.now() - t0;
  if (opts.json) writeJson(opts.json, result);
  console.log(`onnxruntime-web ${result.onnxruntime_web} wasm, ${result.threads} thread; `
    + `${result.not_loadable.length} artifact(s) not loadable${result.not_loadable.map((a) => `: ${a.file}`).join(',')}`);
  console.log(`${result.passed} passed, ${result.failed} failed`);
  if (result.passed + result.failed === 0) console.error(`error: ${opts.dir}: no case ran (nothing onnxruntime-web can load in golden/cases.json)`);
  return result.failed > 0 || result.passed === 0 ? 1 : 0;
}

nodeFiles.exitOnClosedStdout();
main(process.argv.slice(2)).then((code) => nodeFiles.exitAfterStdout(code), (e) => {
  console.error(`error: ${String(e && e.message || e).split('\n')[0]}`);
  process.exit(1);
});
