/* What benchmarks/ref_heap.c and ref_outputs.c share: xoshiro256** as relakit.sim.rng
 * draws it (splitmix64 seeding), exponential draws, and one binary event heap of
 * (time, key) pairs. Header-only: each reference is still one `cc -O2 x.c -lm`. */
#ifndef REF_COMMON_H
#define REF_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t s[4];
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline double uniform(void) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return (r >> 11) * 0x1.0p-53;
}
static inline double expo(double mean) { return -mean * log(1.0 - uniform()); }

static void seed(const char *arg) { /* splitmix64 seeding */
    uint64_t x = strtoull(arg, 0, 10) + 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        s[i] = z ^ (z >> 31);
    }
}

static double *ht; static int64_t *hk; static long hn;
static inline void push(double t, int64_t k) {
    long i = hn++;
    while (i > 0) { long p = (i - 1) >> 1; if (ht[p] <= t) break; ht[i] = ht[p]; hk[i] = hk[p]; i = p; }
    ht[i] = t; hk[i] = k;
}
static inline void pop(void) {
    double lt = ht[--hn]; int64_t lk = hk[hn]; long i = 0;
    for (;;) {
        long c = 2 * i + 1;
        if (c >= hn) break;
        if (c + 1 < hn && ht[c + 1] < ht[c]) c++;
        if (ht[c] >= lt) break;
        ht[i] = ht[c]; hk[i] = hk[c]; i = c;
    }
    ht[i] = lt; hk[i] = lk;
}
#endif
