#!/usr/bin/env node
'use strict';
// mha-node check ARTIFACT_DIR                          every golden case; last line "N passed, N failed"
// mha-node run ARTIFACT IN.bin BATCH TOKENS OUT.bin    one input as raw little-endian float32
const fs = require('fs');
const { MhaRunner, check } = require('./mha');

async function main(argv) {
  if (argv.length === 2 && argv[0] === 'check') {
    const { passed, failed } = await check(argv[1]);
    console.log(`${passed} passed, ${failed} failed`);
    if (passed + failed === 0) console.error(`error: ${argv[1]}: no ONNX case found in golden/cases.json`);
    return failed > 0 || passed === 0 ? 1 : 0;
  }
  if (argv.length === 6 && argv[0] === 'run') {
    const [, artifact, input, batch, tokens, output] = argv;
    const runner = await MhaRunner.create(artifact);
    const buf = fs.readFileSync(input);
    const x = new Float32Array(buf.length / 4);
    for (let i = 0; i < x.length; i++) x[i] = buf.readFloatLE(4 * i);
    const y = await runner.run(x, [Number(batch), Number(tokens), runner.config.d_in]);
    const out = Buffer.alloc(y.data.length * 4);
    y.data.forEach((v, i) => out.writeFloatLE(v, 4 * i));
    fs.writeFileSync(`${output}.tmp`, out);
    fs.renameSync(`${output}.tmp`, output);
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
