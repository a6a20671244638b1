/* sgemm.c - cblas_sgemm called directly, the yardstick of scripts/bench/run.lua's
 * matmul workloads (issue 7: needle within 5% of it). Same method as the
 * workers: WARMUP untimed calls, then the median of REPS timed calls.
 *
 *   sgemm M K N REPS WARMUP THREADS   ->  "ms N", "rss_mb N", "threads N" lines
 *
 * C (M,N) = A (M,K) @ B (K,N), row-major float32. Built by run.lua:
 * cc -O2 sgemm.c -lopenblas, and run against the libopenblas needle-lua
 * loads (LD_LIBRARY_PATH), so that both use the same BLAS. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int); /* OpenBLAS's; not in every cblas.h */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* peak resident set (VmHWM) in MB, -1 when /proc is missing */
static double peak_rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double mb = -1;
    if (!f) return mb;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) mb = atof(line + 6) / 1024.0;
    fclose(f);
    return mb;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: sgemm M K N REPS WARMUP THREADS\n");
        return 2;
    }
    int m = atoi(argv[1]), k = atoi(argv[2]), n = atoi(argv[3]);
    int reps = atoi(argv[4]), warmup = atoi(argv[5]), threads = atoi(argv[6]);
    if (m < 1 || k < 1 || n < 1 || reps < 1 || warmup < 0 || threads < 1) return 2;
    openblas_set_num_threads(threads);
    float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n),
          *c = malloc(sizeof(float) * (size_t)m * n);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!a || !b || !c || !t) return 1;
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)rand() / RAND_MAX;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)rand() / RAND_MAX;
    for (int w = 0; w < warmup; w++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    printf("ms %.6f\n", t[(reps - 1) / 2] * 1e3);
    printf("rss_mb %.3f\n", peak_rss_mb());
    printf("threads %d\n", threads);
    free(a); free(b); free(c); free(t);
    return 0;
}
