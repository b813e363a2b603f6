// Load mha.onnx from an artifact folder and run one input (batch 1, 4 tokens).
const { MhaRunner } = require('./mha');  // from another folder: require('<repo>/runtime/native/node/mha')

(async () => {
  const runner = await MhaRunner.create(process.argv[2] || 'artifacts/seed');
  const { d_in: dIn } = runner.config;                 // the contract, from manifest.json
  const x = Float32Array.from({ length: 4 * dIn }, (_, i) => Math.sin(i));
  const { data, dims } = await runner.run(x, [1, 4, dIn]);
  console.log('context', dims, Array.from(data.slice(0, 4)));
})();
