// The decoder runner's shared names (runtime/native/common/gpt.mjs re-exports them): its two error classes, the
// manifest's kind and format, the file names of a decoder folder, the decoder forms, and the small helpers every part uses.
export class ArtifactError extends Error {}
export class ContractError extends Error {}

export { DECODER_KIND } from '../rules.mjs';  // "gpt" in folders exported before it: rules.mjs kindOf
export const GPT_MANIFEST_FORMAT = 1;
export const GENERATIONS_FILE = 'golden/generations.json';
export const CONCAT_FORM = 'gpt.onnx';
export const INPLACE_FORM = 'gpt.inplace.onnx';
export const TOKENIZER_FILE = 'tokenizer.json';
export const TOKENIZER_CONFIG = 'tokenizer_config.json';
// The fp32 forms the golden generations (golden/generations.json) are checked on (as `mha check`), in that order;
// the lossy forms (MatMulNBits) reproduce their own golden generations (the manifest entry's "generations"),
// checked where the runner asks for them (`lossy`: Node runs them; onnxruntime-web's kernels are not the ones they
// were recorded with).
export const FP32_FORMS = [CONCAT_FORM, INPLACE_FORM];
export const LOSSY_FORMS = ['gpt.inplace.int8.onnx', 'gpt.inplace.int4.onnx'];
// The contract's tolerance row of every form above (runtime/mha_runtime/decoder/contract.py FORMS: one row for them all;
// tests/decoder/test_gpt_check_honest.py compares this line with it). A golden file's own "tolerance" is a record of it, in
// a file anyone can re-seal: one that differs is a failed line, and the cases are compared with this row.
export const CONTRACT_TOLERANCE = Object.freeze({ atol: 1e-3, rtol: 1e-4, rel_l2: null });

export const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
export const firstLine = (e) => String((e && e.message) || e).split('\n')[0];

// A file name inside the folder: no absolute path, no '.', '..' or empty part, no backslash.
export function plainName(name) {
  return typeof name === 'string' && name !== '' && !name.startsWith('/') && !name.includes('\\')
    && name.split('/').every((p) => p !== '' && p !== '.' && p !== '..');
}
