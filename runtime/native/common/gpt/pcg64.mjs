// numpy's random generator in JavaScript (runtime/native/common/gpt.mjs re-exports it): SeedSequence(seed) -> PCG64
// -> random(), bit for bit numpy's, for the sampling rule (sampling.mjs).
import { ContractError } from './base.mjs';

// numpy/random/bit_generator.pyx (SeedSequence: pool of 4 uint32 words, hashmix/mix with these constants) and
// numpy/random/src/pcg64 (pcg64_set_seed: state words [0:2] as (high, low), increment words [2:4]; XSL-RR 128/64,
// the state stepped before each output). 32-bit words with Math.imul, the 128-bit state with BigInt.
const INIT_A = 0x43b0d7e5, MULT_A = 0x931e8875, INIT_B = 0x8b51f9dd, MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd, MIX_MULT_R = 0x4973f715, XSHIFT = 16, POOL_SIZE = 4;
const MASK64 = (1n << 64n) - 1n, MASK128 = (1n << 128n) - 1n;
const PCG_MULT = (2549297995355413924n << 64n) + 4865540595714422341n;

// A seed as numpy takes it: an integer >= 0 of any size (a number that is a safe integer, a BigInt, or a decimal
// string) -> BigInt; anything else is refused.
export function seedValue(seed) {
  let v = null;
  if (typeof seed === 'bigint') v = seed;
  else if (typeof seed === 'number' && Number.isSafeInteger(seed)) v = BigInt(seed);
  else if (typeof seed === 'string' && /^[0-9]+$/.test(seed)) v = BigInt(seed);
  if (v === null || v < 0n) throw new ContractError(`seed: expected an integer >= 0, got ${JSON.stringify(String(seed)).slice(0, 40)}`);
  return v;
}

// numpy's _int_to_uint32_array: the lowest 32 bits first; 0 is one word.
function uint32Words(n) {
  if (n === 0n) return [0];
  const words = [];
  for (let v = n; v > 0n; v >>= 32n) words.push(Number(v & 0xffffffffn));
  return words;
}

function hashmix(value, hash) {
  let v = (value ^ hash.c) >>> 0;
  hash.c = Math.imul(hash.c, MULT_A) >>> 0;
  v = Math.imul(v, hash.c) >>> 0;
  return (v ^ (v >>> XSHIFT)) >>> 0;
}

function mix(x, y) {
  const r = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
  return (r ^ (r >>> XSHIFT)) >>> 0;
}

// SeedSequence(seed).pool: mix_entropy over the seed's words (no spawn key).
export function seedSequencePool(seed) {
  const entropy = uint32Words(seedValue(seed));
  const pool = new Array(POOL_SIZE);
  const hash = { c: INIT_A };
  for (let i = 0; i < POOL_SIZE; i++) pool[i] = hashmix(i < entropy.length ? entropy[i] : 0, hash);
  for (let src = 0; src < POOL_SIZE; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash));
  }
  for (let src = POOL_SIZE; src < entropy.length; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash));
  }
  return pool;
}

// SeedSequence(seed).generate_state(n, uint64): 2n uint32 words viewed as n little-endian uint64 words (BigInt).
export function generateState64(seed, n) {
  const pool = seedSequencePool(seed);
  let hashConst = INIT_B;
  const words = [];
  for (let i = 0; i < 2 * n; i++) {
    let v = (pool[i % POOL_SIZE] ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_B) >>> 0;
    v = Math.imul(v, hashConst) >>> 0;
    words.push((v ^ (v >>> XSHIFT)) >>> 0);
  }
  return Array.from({ length: n }, (_, j) => BigInt(words[2 * j]) | (BigInt(words[2 * j + 1]) << 32n));
}

// numpy.random.PCG64(seed): next64() and random() as numpy.random.Generator(PCG64(seed)).random() gives them.
export class PCG64 {
  constructor(seed) {
    const [s0, s1, i0, i1] = generateState64(seed, 4);
    const initState = (s0 << 64n) | s1, initSeq = (i0 << 64n) | i1;
    this.state = 0n;
    this.inc = ((initSeq << 1n) | 1n) & MASK128;
    this.step();
    this.state = (this.state + initState) & MASK128;
    this.step();
  }

  step() { this.state = (this.state * PCG_MULT + this.inc) & MASK128; }

  next64() {
    this.step();
    const rot = this.state >> 122n;
    const x = ((this.state >> 64n) ^ this.state) & MASK64;
    return ((x >> rot) | (x << ((64n - rot) & 63n))) & MASK64;
  }

  random() { return Number(this.next64() >> 11n) * 2 ** -53; }
}
