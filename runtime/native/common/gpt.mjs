// The decoder generation contract in JavaScript, written once for every JavaScript runner: runtime/native/node (Node.js,
// onnxruntime-node: it require()s this file), runtime/native/web/check.mjs (onnxruntime-web's wasm backend in Node.js)
// and the browser page runtime/native/web/gpt.html. Plain ES modules with no imports but rules.mjs: the caller passes
// `ort` (onnxruntime-node or onnxruntime-web, the same Tensor/InferenceSession API), an `io` object and the tokenizer
// class, so the same code runs in Node.js and in a browser without a bundler:
//   io.where: the folder, for messages; io.bytes(rel) -> Promise<Uint8Array> (an ArtifactError when missing);
//   io.sha256(Uint8Array) -> Promise<lowercase hex>; optional io.size(rel) -> Promise<bytes or null> (a regular
//   file's size by stat, so that a listed file of another size is never read).
// This file only gathers the parts in common/gpt/, one concept each, each the rule of the Python runtime
// (runtime/mha_runtime/decoder/*.py); importers use this one name (the browser fetches the parts by relative import):
// - base.mjs: the error classes, the manifest's kind and format, the file names and decoder forms, small helpers;
// - pcg64.mjs: numpy's random generator, PCG64 seeded through SeedSequence, random() = (next 64-bit output >> 11)
//   * 2**-53, bit for bit numpy's;
// - sampling.mjs: the sampling rule (top-k, / temperature, float32 softmax, the inverse-CDF draw);
// - folder.mjs: the manifest (kind "decoder", format 1) and every file used, checked against its size and sha256
//   before it is parsed; its contract.shapes (every shape allocated); the contract a session's inputs and outputs must
//   match, by name, dtype and fixed axes;
// - tokenizer.mjs: the tokenizer (tokenizer.json through the caller's Tokenizer class) and the streamed text;
// - decoders.mjs: the two decoder forms (gpt.onnx: Optimum names, a Concat-grown cache; gpt.inplace.onnx: one
//   [1, KV, C, D] buffer per layer and key/value, KV the key/value heads, bound as past and present), batch 1, prefill then one token per step;
// - generate.mjs: one generation and its stop rule (max_new_tokens, eos, context_length);
// - golden.mjs: the golden generations check;
// - chat.mjs: the folder's chat template through the caller's Template class (@huggingface/jinja), its stop ids;
// - command.mjs: the command line of `generate` (Node and wasm-in-Node share it).
export { compare } from './rules.mjs';
export { ArtifactError, ContractError, DECODER_KIND, GPT_MANIFEST_FORMAT, GENERATIONS_FILE, CONCAT_FORM, INPLACE_FORM,
  TOKENIZER_FILE, TOKENIZER_CONFIG, FP32_FORMS, LOSSY_FORMS, plainName } from './gpt/base.mjs';
export { seedValue, seedSequencePool, generateState64, PCG64 } from './gpt/pcg64.mjs';
export { TEMPERATURE_MIN, TEMPERATURE_MAX, TEMPERATURE_RULE, checkSampling, argmax, filteredLogits, probabilities, draw,
  Sampler } from './gpt/sampling.mjs';
export { readGptManifest, verifiedBytes, listedForms, formKind, checkContract } from './gpt/folder.mjs';
export { CHAT_TEMPLATE_FILE, namedTokens, checkMessages, templateSource, compileTemplate, renderChat, loadChat, noChat }
  from './gpt/chat.mjs';
export { loadTokenizer, TextStream } from './gpt/tokenizer.mjs';
export { ConcatDecoder, InPlaceDecoder, makeDecoder } from './gpt/decoders.mjs';
export { checkPrompt, checkRequest, takeToken, generate } from './gpt/generate.mjs';
export { loadGenerations, floats, caseLine, checkCase, checkGenerations } from './gpt/golden.mjs';
export { parseGenerateArgs, parseIds, runGenerate } from './gpt/command.mjs';
