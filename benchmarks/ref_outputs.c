/* The second C reference for benchmarks/bench_kernel.py: ref_heap.c's models (NODES M/M/8
 * nodes, 10 ms mean service, Poisson arrivals at utilisation 0.9, random routing, FIFO,
 * one binary event heap, xoshiro256**) keeping the outputs relakit's plain kernel keeps
 * per request, so that the ratio to it says how much of the distance to ref_heap.c is
 * the outputs and how much the kernel:
 *
 *   - each arrival draws its tier (a uniform against the tiers' cumulative shares) and
 *     its demand at arrival; a job pool holds (arrival time, demand, tier);
 *   - per node: busy-server seconds (accumulated at every change of the busy count),
 *     the Prometheus histogram of latency at the node (a count per default bucket,
 *     bounds counted branch-free) and its sum, requests by tier and outcome;
 *   - per tier: outcomes, and the client latency histogram (200 log-spaced bins a decade
 *     from 1 us, the bin found from the float's bits as relakit.sim.latency_bins does,
 *     its edges found at start-up from log10) and its sum.
 *
 *   ref_outputs NODES REQUESTS SEED
 *
 * Prints "requests cpu_seconds wall_seconds mean_latency_s", as ref_heap does.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref_common.h"

/* the client histogram's bins (relakit.sim.latency_bins) */
#define BINS 2000
#define CELL_BITS 8
static double edges[BINS + 1]; static int16_t *cell_bin; static int e_min, e_max;
static int bin_log10(double ms) {
    if (ms <= 0.0) return 0;
    double x = (log10(ms) + 3.0) * 200;
    if (x < 0.0) return 0;
    if (x >= BINS) return BINS - 1;
    return (int)x;
}
static void make_bins(void) {
    edges[0] = 0.0; edges[BINS] = INFINITY;
    for (int b = 1; b < BINS; b++) {
        double x = pow(10.0, -3.0 + b / 200.0);
        while (bin_log10(x) >= b) x = nextafter(x, 0.0);
        while (bin_log10(x) < b) x = nextafter(x, INFINITY);
        edges[b] = x;
    }
    int e; frexp(edges[1], &e); e_min = e - 1; frexp(edges[BINS - 1], &e); e_max = e - 1;
    long n = (long)(e_max - e_min + 1) << CELL_BITS;
    cell_bin = malloc(n * sizeof *cell_bin);
    int b = 0;
    for (long k = 0; k < n; k++) {
        double low = ldexp(1.0 + (double)(k & ((1 << CELL_BITS) - 1)) / (1 << CELL_BITS),
                           e_min + (int)(k >> CELL_BITS));
        while (b < BINS && edges[b + 1] <= low) b++;
        cell_bin[k] = (int16_t)b;
    }
}
static inline int hist_bin(double ms) {
    if (ms <= 0.0) return 0;
    uint64_t bits; memcpy(&bits, &ms, 8);
    int e = (int)((bits >> 52) & 0x7FF) - 1023;
    if (e < e_min) return 0;
    if (e > e_max) return BINS - 1;
    long cell = ((long)(e - e_min) << CELL_BITS) + (long)((bits >> (52 - CELL_BITS)) & ((1 << CELL_BITS) - 1));
    int b = cell_bin[cell];
    return b + (ms >= edges[b + 1]);
}

#define TIERS 3
#define OUTCOMES 4
static const double bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
#define NB (int)(sizeof bounds / sizeof bounds[0])

typedef struct { double t_arr, demand; int64_t tier, node, next; } job_t;
typedef struct { double busy_area, last_t, lat_sum; int64_t busy, qlen, qhead, qtail;
                 int64_t lat_b[NB + 1]; int64_t cnt[TIERS][OUTCOMES]; } node_t;

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: ref_outputs NODES REQUESTS SEED\n"); return 2; }
    int nodes = atoi(argv[1]); long requests = atol(argv[2]);
    seed(argv[3]);
    make_bins();
    const int servers = 8; const double mean_s = 0.010;
    const double rate = 0.9 * servers / mean_s * nodes;
    const double tier_cum[2] = {1.0, 1.0}; /* the bench's scenarios: every request gold */
    long cap = (long)nodes * servers + 16, jcap = 1 << 20;
    ht = malloc(cap * sizeof *ht); hk = malloc(cap * sizeof *hk);
    job_t *jobs = malloc(jcap * sizeof *jobs); int64_t *job_free = malloc(jcap * sizeof *job_free);
    for (long j = 0; j < jcap; j++) job_free[j] = jcap - 1 - j;
    long free_n = jcap;
    node_t *nd = calloc(nodes, sizeof *nd);
    for (int n = 0; n < nodes; n++) { nd[n].qhead = nd[n].qtail = -1; }
    int64_t (*hist)[OUTCOMES][BINS] = calloc(TIERS, sizeof *hist);
    int64_t tier_cnt[TIERS][OUTCOMES] = {{0}}; double tier_lat_sum[TIERS][OUTCOMES] = {{0}};
    double lat_sum = 0.0; long done = 0;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_MONOTONIC, &a); clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    double t_arr = expo(1.0 / rate);
    while (done < requests) {
        double t = hn > 0 && ht[0] < t_arr ? ht[0] : t_arr;
        if (t == t_arr) {  /* an arrival: tier, demand, route, queue, maybe start */
            double u = uniform();
            int64_t tier = (u >= tier_cum[0]) + (u >= tier_cum[1]);
            double demand = expo(mean_s);
            int n = nodes == 1 ? 0 : (int)(uniform() * nodes);
            if (n >= nodes) n = nodes - 1;
            if (free_n == 0) { fprintf(stderr, "job pool full\n"); return 1; }
            int64_t j = job_free[--free_n];
            jobs[j] = (job_t){t, demand, tier, n, -1};
            node_t *q = &nd[n];
            if (q->busy < servers) {
                q->busy_area += q->busy * (t - q->last_t); q->last_t = t; q->busy++;
                push(t + demand, j);
            } else {
                if (q->qtail >= 0) jobs[q->qtail].next = j; else q->qhead = j;
                q->qtail = j; q->qlen++;
            }
            t_arr = t + expo(1.0 / rate);
        } else {           /* a completion: node and client outputs, then the next starts */
            int64_t j = hk[0]; pop();
            job_t *jb = &jobs[j]; node_t *q = &nd[jb->node];
            double lat = t - jb->t_arr;
            int bk = 0;
            for (int i = 0; i < NB; i++) bk += lat > bounds[i];
            q->lat_b[bk]++; q->lat_sum += lat; q->cnt[jb->tier][0]++;
            double ms = lat * 1000.0;
            tier_cnt[jb->tier][0]++; tier_lat_sum[jb->tier][0] += ms;
            hist[jb->tier][0][hist_bin(ms)]++;
            lat_sum += lat; done++;
            job_free[free_n++] = j;
            q->busy_area += q->busy * (t - q->last_t); q->last_t = t;
            if (q->qlen > 0) {
                int64_t k = q->qhead; q->qhead = jobs[k].next;
                if (q->qhead < 0) q->qtail = -1;
                q->qlen--;
                push(t + jobs[k].demand, k);
            } else q->busy--;
        }
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb); clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
    double cpu = (cb.tv_sec - ca.tv_sec) + 1e-9 * (cb.tv_nsec - ca.tv_nsec);
    long check = 0; for (int i = 0; i < BINS; i++) check += hist[0][0][i];
    if (check != done) { fprintf(stderr, "histogram lost requests\n"); return 1; }
    printf("%ld %.6f %.6f %.6f\n", done, cpu, secs, lat_sum / done);
    return 0;
}
