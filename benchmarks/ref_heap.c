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

#include "ref_common.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: ref_heap NODES REQUESTS SEED\n"); return 2; }
    int nodes = atoi(argv[1]); long requests = atol(argv[2]);
    seed(argv[3]);
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
