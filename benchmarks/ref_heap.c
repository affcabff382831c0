/* The C reference for benchmarks/bench_kernel.py: the same models as relakit's plain
 * runs, written as plainly and as fast as C allows, to give the kernel a yardstick.
 *
 *   ref_heap NODES REQUESTS SEED
 *
 * NODES M/M/8 nodes (10 ms mean service), Poisson arrivals at utilisation 0.9 routed
 * uniformly at random (NODES = 1: plain M/M/8), FIFO queues; one binary event heap
 * holds every pending event (arrivals and service completions); xoshiro256** random
 * numbers as in relakit.sim.rng. Prints "requests cpu_seconds wall_seconds mean_latency_s"
 * on one line: requests completed, and the CPU and wall seconds of the simulation loop
 * (CPU time is what a loaded machine leaves comparable: relakit's figure is CPU time too).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t s[4];
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline double uniform(void) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return (r >> 11) * 0x1.0p-53;
}
static inline double expo(double mean) { return -mean * log(1.0 - uniform()); }

/* heap of (time, key): key < 0 is the arrival, key >= 0 a completion at node key */
static double *ht; static int64_t *hk; static long hn;
static inline void push(double t, int64_t k) {
    long i = hn++;
    while (i > 0) { long p = (i - 1) >> 1; if (ht[p] <= t) break; ht[i] = ht[p]; hk[i] = hk[p]; i = p; }
    ht[i] = t; hk[i] = k;
}
static inline void pop(void) {
    double lt = ht[--hn]; int64_t lk = hk[hn]; long i = 0;
    for (;;) { long c = 2 * i + 1; if (c >= hn) break;
        if (c + 1 < hn && ht[c + 1] < ht[c]) c++;
        if (ht[c] >= lt) break; ht[i] = ht[c]; hk[i] = hk[c]; i = c; }
    ht[i] = lt; hk[i] = lk;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: ref_heap NODES REQUESTS SEED\n"); return 2; }
    int nodes = atoi(argv[1]); long requests = atol(argv[2]);
    uint64_t x = strtoull(argv[3], 0, 10) + 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < 4; i++) { /* splitmix64 seeding */
        uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        s[i] = z ^ (z >> 31);
    }
    const int servers = 8; const double mean_s = 0.010;
    const double rate = 0.9 * servers / mean_s * nodes;
    long cap = (long)nodes * servers + 16;
    ht = malloc(cap * sizeof *ht); hk = malloc(cap * sizeof *hk);
    int *busy = calloc(nodes, sizeof *busy); long *qlen = calloc(nodes, sizeof *qlen);
    /* FIFO queues: per node a ring of arrival times (their order is all a FIFO needs) */
    long qcap = 1 << 16; double *qt = malloc((size_t)nodes * qcap * sizeof *qt);
    long *qh = calloc(nodes, sizeof *qh);
    double lat_sum = 0.0; long done = 0;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_MONOTONIC, &a); clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    push(expo(1.0 / rate), -1);
    while (done < requests) {
        double t = ht[0]; int64_t k = hk[0]; pop();
        if (k < 0) {  /* an arrival: route, then start service or queue */
            int n = nodes == 1 ? 0 : (int)(uniform() * nodes);
            if (n >= nodes) n = nodes - 1;
            if (busy[n] < servers) { busy[n]++; lat_sum += 0.0; push(t + expo(mean_s), n); }
            else { if (qlen[n] == qcap) { fprintf(stderr, "queue full\n"); return 1; }
                   qt[(size_t)n * qcap + (qh[n] + qlen[n]) % qcap] = t; qlen[n]++; }
            push(t + expo(1.0 / rate), -1);
        } else {      /* a completion: the next in the queue starts */
            int n = (int)k; done++;
            if (qlen[n] > 0) { lat_sum += t - qt[(size_t)n * qcap + qh[n]];
                qh[n] = (qh[n] + 1) % qcap; qlen[n]--; push(t + expo(mean_s), n); }
            else busy[n]--;
        }
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb); clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
    double cpu = (cb.tv_sec - ca.tv_sec) + 1e-9 * (cb.tv_nsec - ca.tv_nsec);
    printf("%ld %.6f %.6f %.6f\n", done, cpu, secs, lat_sum / done);
    return 0;
}
