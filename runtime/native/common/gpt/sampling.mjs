// The sampling rule (runtime/mha_runtime/decoder/sampling.py; runtime/native/common/gpt.mjs re-exports it): top-k,
// / temperature, float32 softmax, the inverse-CDF draw from numpy's PCG64 (pcg64.mjs), argmax at temperature 0.
import { ContractError } from './base.mjs';
import { PCG64, seedValue } from './pcg64.mjs';

// Temperatures besides 0: float32 division overflows below the range and is inf above it (NaN probabilities).
export const TEMPERATURE_MIN = 1e-4, TEMPERATURE_MAX = 1e4;
export const TEMPERATURE_RULE = '0 (greedy) or a number in 0.0001..10000';

export function checkSampling(temperature, topK, vocabSize) {
  if (typeof temperature !== 'number' || !(temperature === 0 || (temperature >= TEMPERATURE_MIN && temperature <= TEMPERATURE_MAX))) {
    throw new ContractError(`temperature: expected ${TEMPERATURE_RULE}, got ${JSON.stringify(temperature)}`);
  }
  if (topK !== null && topK !== undefined && (!Number.isInteger(topK) || topK < 1 || topK > vocabSize)) {
    throw new ContractError(`top_k: expected an integer in 1..${vocabSize}, got ${JSON.stringify(topK)}`);
  }
}

// The first maximum (torch.argmax, np.argmax).
export function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

// Everything below the k-th largest set to -inf (ties at the k-th value stay); null keeps all.
export function filteredLogits(logits, topK) {
  const x = Float32Array.from(logits);
  if (topK === null || topK === undefined) return x;
  const kth = Float32Array.from(x).sort()[x.length - topK];  // ascending: the k-th largest
  for (let i = 0; i < x.length; i++) if (x[i] < kth) x[i] = -Infinity;
  return x;
}

const f32 = Math.fround;

// numpy's float32 add.reduce along a contiguous axis: 0 + its pairwise sum (8 accumulators, blocks of 128).
function pairwiseSum(a, lo, n) {
  if (n < 8) {
    let r = 0;
    for (let i = 0; i < n; i++) r = f32(r + a[lo + i]);
    return r;
  }
  if (n <= 128) {
    const r = [];
    for (let j = 0; j < 8; j++) r.push(a[lo + j]);
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] = f32(r[j] + a[lo + i + j]);
    let res = f32(f32(f32(r[0] + r[1]) + f32(r[2] + r[3])) + f32(f32(r[4] + r[5]) + f32(r[6] + r[7])));
    for (; i < n; i++) res = f32(res + a[lo + i]);
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return f32(pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2));
}

// float32 probabilities for temperature > 0: top-k, / temperature, softmax, each operation rounded to float32 as
// numpy does it (the sum is numpy's pairwise sum). exp is the one step that may differ from numpy's in the last bit
// (numpy's float32 exp is its own SIMD polynomial, and differs by CPU); a draw changes only if u lands within that
// rounding of a boundary.
export function probabilities(logits, temperature, topK) {
  const t = f32(temperature);
  const x = filteredLogits(logits, topK);
  let max = -Infinity;
  for (let i = 0; i < x.length; i++) {
    x[i] = f32(x[i] / t);
    if (x[i] > max) max = x[i];
  }
  for (let i = 0; i < x.length; i++) x[i] = f32(Math.exp(f32(x[i] - max)));
  const total = f32(0 + pairwiseSum(x, 0, x.length));
  for (let i = 0; i < x.length; i++) x[i] = f32(x[i] / total);
  return x;
}

// The first id whose float64 cumulative probability exceeds u * total (np.searchsorted(cdf, u * cdf[-1], 'right')).
export function draw(probs, u) {
  const cdf = new Float64Array(probs.length);
  let acc = 0;
  for (let i = 0; i < probs.length; i++) cdf[i] = acc += probs[i];
  const target = u * cdf[cdf.length - 1];
  let lo = 0, hi = cdf.length;  // the count of cdf values <= target
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cdf[mid] <= target) lo = mid + 1; else hi = mid;
  }
  return Math.min(lo, probs.length - 1);
}

// A random seed when none is given, as Python's (a 63-bit integer), from the platform's crypto.
function freshSeed() {
  const w = new Uint32Array(2);
  globalThis.crypto.getRandomValues(w);
  return ((BigInt(w[0]) << 32n) | BigInt(w[1])) & ((1n << 63n) - 1n);
}

// The next id of one generation: argmax at temperature 0 (no draw), else one draw u = PCG64(seed).random() per token.
export class Sampler {
  constructor({ temperature = 0, topK = null, seed = null, vocabSize }) {
    checkSampling(temperature, topK, vocabSize);
    this.temperature = temperature;
    this.topK = topK ?? null;
    this.seed = seed === null || seed === undefined ? freshSeed() : seedValue(seed);
    this.stream = new PCG64(this.seed);
  }

  next(logits) {
    if (this.temperature === 0) return argmax(logits);
    return draw(probabilities(logits, this.temperature, this.topK), this.stream.random());
  }
}
