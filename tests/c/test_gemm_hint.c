/* test_gemm_hint.c - a GEMM hint (backend.h gemm_hint: nd.compile's tuned
 * work split of a product, graph_tune.c) moves work between threads and
 * blocks but never changes a result's bits. Every hint the tuner can give,
 * and ones it does not (a block of one tile's rows, more threads than the
 * machine has), on products over the kernels' edges (one row, one column,
 * partial tiles, more than one K block, B read in place, B wider than L2
 * holds), transposed operands, C = and C +=, at float32 matmul precision
 * "highest" and, where the CPU has a bfloat16 kernel, "medium": each result
 * must equal the one without a hint byte for byte. Skipped (77) where the
 * CPU has no kernel of needle's own (nd_cpu_sgemm declines). */
#include <stdint.h>
#include <stdlib.h>
#include "backend.h"
#include "check.h"

/* backends/cpu: not in needle.h (a host reaches them through nd.compile) */
bool nd_cpu_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk, const float *B,
                  int64_t b_sk, int64_t b_sn, float *C, int64_t ldc, bool accumulate);
bool nd_cpu_gemm_bf16_available(void);

static uint32_t rng = 12345;
static float next_value(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((int32_t)(rng >> 8) % 2001 - 1000) / 997.0f;
}

typedef struct { int64_t M, N, K; bool a_t; } shape;

/* C (M x N) from A (M x K, or stored K x M when a_t) and B (K x N), with
 * the hint h set (NULL: none); C starts as c0 (for accumulate) */
static bool product(const shape *s, const float *A, const float *B, const float *c0, float *C, bool acc,
                    const nd_gemm_hint *h) {
    memcpy(C, c0, sizeof(float) * (size_t)(s->M * s->N));
    nd_cpu_backend.gemm_hint(h);
    bool ok = nd_cpu_sgemm(s->M, s->N, s->K, A, s->a_t ? 1 : s->K, s->a_t ? s->M : 1, B, s->N, 1, C, s->N, acc);
    nd_cpu_backend.gemm_hint(NULL);
    return ok;
}

static int run_shapes(const char *precision) {
    static const shape shapes[] = {
        {1, 300, 77, false},    /* one row: the vector path */
        {37, 1, 300, false},    /* one column */
        {5, 64, 33, false},     /* few rows: B read in place */
        {37, 1000, 300, true},  /* partial tiles both ways, A transposed */
        {200, 97, 1025, false}, /* three K blocks, a partial last panel */
        {300, 1100, 400, false} /* a packed B block wider than half of most L2s */
    };
    static const int threads[] = {0, 1, 64};
    static const int mcs[] = {0, 12, 96, 384, 1000};
    int compared = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        size_t na = (size_t)(s->M * s->K), nb = (size_t)(s->K * s->N), nc = (size_t)(s->M * s->N);
        float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *c0 = malloc(nc * sizeof *c0);
        float *want = malloc(nc * sizeof *want), *got = malloc(nc * sizeof *got);
        if (!A || !B || !c0 || !want || !got) {
            FAIL("out of memory");
            free(A), free(B), free(c0), free(want), free(got);
            return compared;
        }
        for (size_t i = 0; i < na; i++) A[i] = next_value();
        for (size_t i = 0; i < nb; i++) B[i] = next_value();
        for (size_t i = 0; i < nc; i++) c0[i] = next_value();
        for (int acc = 0; acc < 2; acc++) {
            if (!product(s, A, B, c0, want, acc, NULL)) {
                free(A), free(B), free(c0), free(want), free(got);
                return -1; /* no kernel of needle's own */
            }
            for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++)
                for (size_t mi = 0; mi < sizeof mcs / sizeof *mcs; mi++)
                    for (int order = 0; order <= 2; order++)
                        for (int split = 0; split <= 2; split++) {
                            nd_gemm_hint h = {threads[ti], mcs[mi], order, split};
                            checks++;
                            if (!product(s, A, B, c0, got, acc, &h)) {
                                FAIL("%s: %lldx%lldx%lld: the product with a hint failed", precision,
                                     (long long)s->M, (long long)s->N, (long long)s->K);
                                continue;
                            }
                            compared++;
                            if (memcmp(want, got, nc * sizeof *got) != 0)
                                FAIL("%s: %lldx%lldx%lld%s%s: hint {threads %d, mc %d, order %d, split %d} "
                                     "changed the result's bits", precision, (long long)s->M, (long long)s->N,
                                     (long long)s->K, s->a_t ? " (A transposed)" : "", acc ? " (C +=)" : "",
                                     h.threads, h.mc, h.order, h.split);
                        }
        }
        free(A), free(B), free(c0), free(want), free(got);
    }
    return compared;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(nd_cpu_backend.gemm_hint != NULL);
    int n = run_shapes("highest");
    if (n < 0) {
        printf("skipped: this CPU has no GEMM kernel of needle's own (or NEEDLE_GEMM=openblas)\n");
        return 77;
    }
    if (nd_cpu_gemm_bf16_available()) {
        nd_set_float32_matmul_precision(ND_MATMUL_MEDIUM);
        int m = run_shapes("medium");
        nd_set_float32_matmul_precision(ND_MATMUL_HIGHEST);
        if (m > 0) n += m;
    }
    printf("%d hinted products compared\n", n);
    if (failures) printf("%d of %d checks failed\n", failures, checks);
    else printf("%d checks passed\n", checks);
    return failures ? 1 : 0;
}
