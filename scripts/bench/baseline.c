/* baseline.c - the plain-C yardsticks that scripts/bench/foundation.lua
 * compares needle against: cblas_sgemm called directly, and an elementwise
 * add written as a bare (OpenMP) loop. Prints "name value" lines.
 * Built by foundation.lua: cc -O3 -fopenmp baseline.c -lopenblas */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    double t[64];
    if (reps > 64) reps = 64;

    int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) { a[i] = (float)rand() / RAND_MAX; b[i] = (float)rand() / RAND_MAX; }
    for (int w = 0; w < 3; w++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t[r] = now() - t0;
    }
    printf("sgemm_1024_ms %.4f\n", median(t, reps) * 1e3);
    free(a); free(b); free(c);

    long m = 1L << 24;
    float *x = malloc(sizeof(float) * m), *y = malloc(sizeof(float) * m), *z = malloc(sizeof(float) * m);
    for (long i = 0; i < m; i++) { x[i] = 1.0f; y[i] = 2.0f; z[i] = 0.0f; }
    for (int r = 0; r < reps; r++) {
        double t0 = now();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < m; i++) z[i] = x[i] + y[i];
        t[r] = now() - t0;
    }
    double s = median(t, reps);
    printf("add_2p24_ms %.4f\n", s * 1e3);
    printf("add_2p24_gbs %.3f\n", 3.0 * 4.0 * (double)m / s / 1e9);
    printf("threads %d\n", omp_get_max_threads());
    free(x); free(y); free(z);
    return 0;
}
