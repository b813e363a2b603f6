#!/usr/bin/env node
'use strict';
// mha-node check ARTIFACT_DIR [--json FILE]           every golden case of golden/cases.json; last line
//                                                      "N passed, N failed"; --json FILE also writes the results
//                                                      as JSON (the format of runtime/native/web/check.mjs --json,
//                                                      "runtime": "node"; {"runtime", "artifact_dir", "error"}
//                                                      when the check stops before any case)
// mha-node run ARTIFACT IN.bin BATCH TOKENS OUT.bin    one input as raw little-endian float32
// On a decoder folder (made by `mha export --gpt`, see gpt.js):
// mha-node generate DIR (--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT) [--max-new-tokens N] [--temperature T --top-k K --seed S]
//                   [--no-eos] [--form FILE] [--threads N] [--warmup N] [--json | --text]
//                                                      the new ids as one line of comma-separated integers (greedy
//                                                      by default), --text the new text as it is made, --json one
//                                                      object with the ids and time_to_first_token_s, tokens_per_s;
//                                                      --chat: a user message through the folder's chat template,
//                                                      the reply ending at its end of turn
// mha-node check DIR [--json FILE]                     every golden generation (golden/generations.json)
// Both write their file under a name unique to this process (pid + random suffix) and rename it into place,
// so concurrent runs on one output path never see each other's half-written files.
const path = require('path');
const { MhaRunner, check, floats, ContractError } = require('./mha');
const {
  MAX_MANIFEST_BYTES, checkUtf8Arg, exitAfterStdout, exitOnClosedStdout, readRegular, writeAtomically, writeJson,
} = require('./files');

const { ATTENTION_KIND, kindOf } = require('../common/rules.mjs');

// What `check` runs per kind of folder (rules.mjs kindOf reads the manifest's kind): the attention's golden cases, or
// a decoder's golden generations (gpt.js, loaded only for one).
const KINDS = {
  attention: { check: (dir) => check(dir), golden: 'golden/cases.json' },
  decoder: { check: (dir) => require('./gpt').checkGpt(dir), golden: 'golden/generations.json' },
};

// The kind DIR/manifest.json names; anything unreadable is the attention's, whose loader then names what is wrong.
function folderKind(dir) {
  try {
    const text = readRegular(path.join(dir, 'manifest.json'), MAX_MANIFEST_BYTES, (m) => new Error(m));
    return KINDS[kindOf(JSON.parse(text.toString('utf8')))];
  } catch {
    return KINDS[ATTENTION_KIND];
  }
}

const MAX_BATCH = 2 ** 20;  // as the C runner

// A whole decimal argument in [lo, hi]: '3', not '3abc', '', '1e3' or '0x3'.
function intArg(text, lo, hi) {
  const v = /^-?[0-9]+$/.test(text) ? Number(text) : NaN;
  return Number.isSafeInteger(v) && v >= lo && v <= hi ? v : null;
}

// check ARTIFACT_DIR [--json FILE], --json before or after the folder: { dir, json } or null.
function checkArgs(argv) {
  if (argv[0] !== 'check') return null;
  let dir = null, json = null;
  for (let i = 1; i < argv.length; i++) {
    if (argv[i] === '--json' && i + 1 < argv.length && json === null && argv[i + 1] !== '') json = argv[++i];
    else if (!argv[i].startsWith('--') && dir === null) dir = argv[i];
    else return null;
  }
  return dir === null ? null : { dir, json };
}

async function main(argv) {
  const args = checkArgs(argv);
  if (args) {
    const head = { runtime: 'node', artifact_dir: args.dir, onnxruntime: require('onnxruntime-node/package.json').version,
      errors: [] };  // as the C runners' (failures tied to no artifact): check() has none
    const kind = folderKind(args.dir);
    let result;
    try {
      result = await kind.check(args.dir);
    } catch (e) {  // stopped before any case: the error is the result
      if (args.json) writeJson(args.json, { runtime: head.runtime, artifact_dir: args.dir, error: e.message.split('\n')[0] });
      throw e;
    }
    const { passed, failed } = result;
    console.log(`${passed} passed, ${failed} failed`);
    if (passed + failed === 0) console.error(`error: ${args.dir}: no ONNX case found in ${kind.golden}`);
    if (args.json) writeJson(args.json, { ...head, ...result });
    return failed > 0 || passed === 0 ? 1 : 0;
  }
  if (argv[0] === 'generate') {
    const gpt = require('./gpt');
    const opts = gpt.parseGenerateArgs(argv.slice(1));
    if (opts) {
      checkUtf8Arg(argv, '--prompt', (m) => new ContractError(m));
      checkUtf8Arg(argv, '--chat', (m) => new ContractError(m));
      return gpt.generateCommand(opts);
    }
  }
  if (argv.length === 6 && argv[0] === 'run') {
    const [, artifact, input, batchArg, tokensArg, output] = argv;
    const runner = await MhaRunner.create(artifact);
    const { d_in: dIn, context_length: ctx } = runner.config;
    const batch = intArg(batchArg, 1, MAX_BATCH), tokens = intArg(tokensArg, 1, ctx);
    if (batch === null) throw new ContractError(`BATCH: expected an integer from 1 to ${MAX_BATCH}, got '${batchArg.slice(0, 30)}'`);
    if (tokens === null) throw new ContractError(`TOKENS: expected 1 <= tokens <= context_length=${ctx}, got '${tokensArg.slice(0, 30)}'`);
    const dims = [batch, tokens, dIn];
    const count = batch * tokens * dIn;
    let buf;
    try {
      buf = readRegular(input, Number.MAX_SAFE_INTEGER, (m) => new ContractError(m));  // floats() judges its size
    } catch (e) {
      if (e instanceof ContractError) throw e;
      throw new Error(`${input}: expected a readable file (${e.code || e.message})`);
    }
    const x = floats(buf, count, input);
    const y = await runner.run(x, dims);
    const out = Buffer.alloc(y.data.length * 4);
    y.data.forEach((v, i) => out.writeFloatLE(v, 4 * i));
    writeAtomically(output, out);
    console.log(`wrote ${output} ${JSON.stringify(y.dims)}`);
    return 0;
  }
  console.error('usage: mha-node check ARTIFACT_DIR [--json FILE] | mha-node run ARTIFACT IN.bin BATCH TOKENS OUT.bin'
    + ' | mha-node generate DECODER_DIR (--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT) [--max-new-tokens N] [--temperature T]'
    + ' [--top-k K] [--seed S] [--no-eos] [--form FILE] [--threads N] [--warmup N] [--json | --text]');
  return 2;
}

exitOnClosedStdout();
main(process.argv.slice(2)).then((code) => exitAfterStdout(code), (e) => {
  console.error(`error: ${e.message.split('\n')[0]}`);
  process.exit(1);
});
