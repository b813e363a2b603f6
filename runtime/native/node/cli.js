#!/usr/bin/env node
'use strict';
// mha-node check ARTIFACT_DIR                          every golden case; last line "N passed, N failed"
// mha-node run ARTIFACT IN.bin BATCH TOKENS OUT.bin    one input as raw little-endian float32
// `run` writes OUT.bin under a name unique to this process (pid + random suffix) and renames it into place,
// so concurrent runs on one output path never see each other's half-written files.
const crypto = require('crypto');
const fs = require('fs');
const { MhaRunner, check, floats, ContractError } = require('./mha');

const MAX_BATCH = 2 ** 20;  // as the C runner

// A whole decimal argument in [lo, hi]: '3', not '3abc', '', '1e3' or '0x3'.
function intArg(text, lo, hi) {
  const v = /^-?[0-9]+$/.test(text) ? Number(text) : NaN;
  return Number.isSafeInteger(v) && v >= lo && v <= hi ? v : null;
}

function writeAtomically(output, bytes) {
  const tmp = `${output}.${process.pid}.${crypto.randomBytes(6).toString('hex')}.tmp`;
  try {
    fs.writeFileSync(tmp, bytes, { flag: 'wx' });  // 'wx': never reuse a file that is already there
    fs.renameSync(tmp, output);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw new Error(`${output}: cannot write it (${e.code || e.message})`);
  }
}

async function main(argv) {
  if (argv.length === 2 && argv[0] === 'check') {
    const { passed, failed } = await check(argv[1]);
    console.log(`${passed} passed, ${failed} failed`);
    if (passed + failed === 0) console.error(`error: ${argv[1]}: no ONNX case found in golden/cases.json`);
    return failed > 0 || passed === 0 ? 1 : 0;
  }
  if (argv.length === 6 && argv[0] === 'run') {
    const [, artifact, input, batchArg, tokensArg, output] = argv;
    const runner = await MhaRunner.create(artifact);
    const { d_in: dIn, context_length: ctx } = runner.config;
    const batch = intArg(batchArg, 1, MAX_BATCH), tokens = intArg(tokensArg, 1, ctx);
    if (batch === null) throw new ContractError(`BATCH: expected an integer from 1 to ${MAX_BATCH}, got '${batchArg.slice(0, 30)}'`);
    if (tokens === null) throw new ContractError(`TOKENS: expected 1 <= tokens <= context_length=${ctx}, got '${tokensArg.slice(0, 30)}'`);
    let buf;
    try {
      buf = fs.readFileSync(input);
    } catch (e) {
      throw new Error(`${input}: expected a readable file (${e.code || e.message})`);
    }
    const dims = [batch, tokens, dIn];
    const count = batch * tokens * dIn;
    const x = floats(buf, count, input);
    const y = await runner.run(x, dims);
    const out = Buffer.alloc(y.data.length * 4);
    y.data.forEach((v, i) => out.writeFloatLE(v, 4 * i));
    writeAtomically(output, out);
    console.log(`wrote ${output} ${JSON.stringify(y.dims)}`);
    return 0;
  }
  console.error('usage: mha-node check ARTIFACT_DIR | mha-node run ARTIFACT IN.bin BATCH TOKENS OUT.bin');
  return 2;
}

main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
  console.error(`error: ${e.message.split('\n')[0]}`);
  process.exit(1);
});
