/* numpy's PCG64 seeded with SeedSequence(seed), and the sampling rule of runtime/mha_runtime/decoder/sampling.py
 * (gpt.h says how): the next id from one step's logits. No ONNX Runtime here. */
#include "gpt.h"

#include <math.h>
#include <string.h>

/* --- numpy's PCG64 and SeedSequence ----------------------------------------------------------------------- */

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_MULT_L 0xca01f9ddu
#define SS_MIX_MULT_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t result = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    return result ^ (result >> SS_XSHIFT);
}

void mha_pcg64_seed(MhaPcg64 *rng, uint64_t seed) {
    /* SeedSequence(seed): the entropy as 32-bit words, least significant first ([0] for 0) */
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    size_t words = seed >> 32 ? 2 : 1;
    uint32_t pool[SS_POOL], hash_const = SS_INIT_A;
    for (size_t i = 0; i < SS_POOL; i++) pool[i] = ss_hashmix(i < words ? entropy[i] : 0, &hash_const);
    for (size_t src = 0; src < SS_POOL; src++)
        for (size_t dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hash_const));
    /* generate_state(4, uint64): 8 words cycling the pool, paired little-endian */
    uint32_t state32[8];
    hash_const = SS_INIT_B;
    for (size_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hash_const;
        hash_const *= SS_MULT_B;
        v *= hash_const;
        v ^= v >> SS_XSHIFT;
        state32[i] = v;
    }
    uint64_t val[4];
    for (size_t i = 0; i < 4; i++) val[i] = (uint64_t)state32[2 * i] | (uint64_t)state32[2 * i + 1] << 32;
    /* pcg64_set_seed(val[0:2], val[2:4]): pcg_setseq_128_srandom_r */
    unsigned __int128 init = (unsigned __int128)val[0] << 64 | val[1], seq = (unsigned __int128)val[2] << 64 | val[3];
    rng->state = 0;
    rng->inc = seq << 1 | 1;
    mha_pcg64_next(rng);
    rng->state += init;
    mha_pcg64_next(rng);
}

uint64_t mha_pcg64_next(MhaPcg64 *rng) {
    const unsigned __int128 mult = (unsigned __int128)0x2360ED051FC65DA4ULL << 64 | 0x4385DF649FCCF645ULL;
    rng->state = rng->state * mult + rng->inc;
    uint64_t value = (uint64_t)(rng->state >> 64) ^ (uint64_t)rng->state;
    unsigned rot = (unsigned)(rng->state >> 122);
    return (value >> rot) | (value << ((64 - rot) & 63));
}

double mha_pcg64_random(MhaPcg64 *rng) { return (double)(mha_pcg64_next(rng) >> 11) * (1.0 / 9007199254740992.0); }

/* --- the sampling rule ------------------------------------------------------------------------------------ */

size_t mha_gpt_scratch_bytes(long long vocab) { return (size_t)vocab * (2 * sizeof(float) + sizeof(double)); }

/* numpy's float32 add.reduce over a contiguous row (pairwise, blocks of 128, 8 accumulators). */
static float pairwise_sum(const float *a, size_t n) {
    if (n < 8) {
        float res = -0.0f;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        size_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + (size_t)j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* The k-th largest of a[0:n] (1 <= k <= n), reordering a (quickselect). */
static float kth_largest(float *a, long n, long k) {
    long lo = 0, hi = n - 1, t = k - 1;
    while (lo < hi) {
        float p = a[lo + (hi - lo) / 2];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i <= j) {
                float tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (t <= j) hi = j;
        else if (t >= i) lo = i;
        else break;
    }
    return a[t];
}

long long mha_gpt_next_id(const float *logits, long long vocab, double temperature, long long top_k, MhaPcg64 *rng,
                          void *scratch) {
    size_t V = (size_t)vocab;
    if (temperature == 0.0) {  /* argmax of the top-k filtered logits is the first maximum of them all */
        size_t best = 0;
        for (size_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return (long long)best;
    }
    float *x = scratch, *work = x + V;
    double *cdf = (double *)(void *)(work + V);
    float kth = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        memcpy(work, logits, V * sizeof(float));
        kth = kth_largest(work, (long)V, (long)top_k);
    }
    float t = (float)temperature, top = -INFINITY;
    for (size_t i = 0; i < V; i++) {
        x[i] = logits[i] < kth ? -INFINITY : logits[i] / t;
        if (x[i] > top) top = x[i];
    }
    for (size_t i = 0; i < V; i++) x[i] = expf(x[i] - top);
    float total = pairwise_sum(x, V);
    double acc = 0;
    for (size_t i = 0; i < V; i++) {
        acc += (double)(x[i] / total);
        cdf[i] = acc;
    }
    double target = mha_pcg64_random(rng) * cdf[V - 1];
    size_t lo = 0, hi = V;  /* searchsorted(cdf, target, side="right"): the first cdf[i] > target */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] <= target) lo = mid + 1;
        else hi = mid;
    }
    return (long long)(lo < V ? lo : V - 1);
}
