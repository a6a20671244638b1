/* test_sort_threads.c - sort, topk and randperm under the caller's own
 * OpenMP threads, and the dim loop's chunks they run on:
 *   - sort/topk/randperm called from the caller's own OpenMP parallel region
 *     (scratch was indexed by the caller's thread number: heap overflow);
 *   - nd_dim_loop_run_chunks runs every chunk once, whatever team it gets.
 * The Lua side (many short rows, a few long ones) is in spec/join_spec.lua.
 * Best run under the ASan/UBSan build too (build-asan). */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#include "backends/cpu/cpu_dim_loop.h"
#define CHECK_PLACE_LINE /* failures print as "FAIL line N: " */
#include "check.h"

/* An int64 tensor of the values v. */
static nd_tensor *i64_tensor(const int64_t *v, const int64_t *shape, int ndim) {
    nd_tensor *t;
    if (nd_from_buffer(v, shape, ndim, ND_INT64, &t) != ND_OK) {
        printf("i64_tensor: %s\n", nd_last_error());
        exit(2);
    }
    return t;
}

/* ---- sort inside the caller's parallel region ---- */

/* Sorts rows of a fresh random tensor (rows x cols) and checks that every
 * row comes out ascending and its indices are a permutation that gives the
 * values. Returns the number of problems (0: fine). Thread-safe. */
static int sort_and_check(int64_t rows, int64_t cols, int descending) {
    nd_tensor *x = NULL, *v = NULL, *ix = NULL;
    int bad = 0;
    if (nd_rand((const int64_t[]){rows, cols}, 2, ND_FLOAT32, &x) != ND_OK) return 1;
    if (nd_sort(x, 1, descending, &v, &ix) != ND_OK) {
        nd_release(x);
        return 1;
    }
    size_t n = (size_t)(rows * cols);
    float *xs = malloc(n * sizeof *xs), *vs = malloc(n * sizeof *vs);
    int64_t *is = malloc(n * sizeof *is);
    char *seen = malloc((size_t)cols);
    if (!xs || !vs || !is || !seen || nd_copy_to_buffer(x, xs, n * sizeof *xs) != ND_OK ||
        nd_copy_to_buffer(v, vs, n * sizeof *vs) != ND_OK ||
        nd_copy_to_buffer(ix, is, n * sizeof *is) != ND_OK) {
        bad = 1;
    } else {
        for (int64_t r = 0; r < rows && !bad; r++) {
            memset(seen, 0, (size_t)cols);
            for (int64_t c = 0; c < cols && !bad; c++) {
                int64_t k = r * cols + c, j = is[k];
                if (j < 0 || j >= cols || seen[j]) { bad = 1; break; }
                seen[j] = 1;
                if (vs[k] != xs[r * cols + j]) bad = 1;
                if (c > 0 && (descending ? vs[k - 1] < vs[k] : vs[k - 1] > vs[k])) bad = 1;
            }
        }
    }
    free(xs);
    free(vs);
    free(is);
    free(seen);
    nd_release(x);
    nd_release(v);
    nd_release(ix);
    return bad;
}

static int topk_and_randperm(void) {
    int bad = 0;
    nd_tensor *x = NULL, *v = NULL, *ix = NULL, *p = NULL;
    if (nd_randn((const int64_t[]){8, 2000}, 2, ND_FLOAT64, &x) != ND_OK) return 1;
    if (nd_topk(x, 5, 1, 1, &v, &ix) != ND_OK) bad = 1;
    else if (nd_shape(v)[1] != 5 || nd_shape(ix)[1] != 5) bad = 1;
    if (nd_randperm(3000, &p) != ND_OK) {
        bad = 1;
    } else {
        int64_t *pv = malloc(3000 * sizeof *pv);
        char *seen = calloc(3000, 1);
        if (!pv || !seen || nd_copy_to_buffer(p, pv, 3000 * sizeof *pv) != ND_OK) bad = 1;
        for (int i = 0; !bad && i < 3000; i++) {
            if (pv[i] < 0 || pv[i] >= 3000 || seen[pv[i]]) bad = 1;
            else seen[pv[i]] = 1;
        }
        free(pv);
        free(seen);
    }
    nd_release(x);
    nd_release(v);
    nd_release(ix);
    nd_release(p);
    return bad;
}

static void test_sort_in_caller_region(void) {
    int saved = omp_get_max_threads(), saved_levels = omp_get_max_active_levels();
    /* The review's repro: OMP_NUM_THREADS=1, a 4-thread region of the
     * caller's; every thread sorts (the serial path, thread ids 0..3). Small
     * slices (merge sort) and long ones (radix sort), both directions. */
    omp_set_num_threads(1);
    omp_set_max_active_levels(1);
    int bad = 0;
#pragma omp parallel num_threads(4) reduction(+ : bad)
    {
        bad += sort_and_check(16, 100, 0);
        bad += sort_and_check(3, 5000, 1);
        bad += topk_and_randperm();
    }
    CHECKM(bad == 0, "sort/topk/randperm in a caller's 4-thread region (1 thread max): %d bad", bad);

    /* More threads allowed than the inner region gets (nesting off). */
    omp_set_num_threads(8);
    bad = 0;
#pragma omp parallel num_threads(3) reduction(+ : bad)
    {
        bad += sort_and_check(64, 3000, 0);
        bad += topk_and_randperm();
    }
    CHECKM(bad == 0, "sort in a caller's region, 8 threads max, nesting off: %d bad", bad);

    /* Nesting on: the inner regions get real teams. */
    omp_set_max_active_levels(2);
    omp_set_num_threads(2);
    bad = 0;
#pragma omp parallel num_threads(2) reduction(+ : bad)
    {
        bad += sort_and_check(64, 3000, 1);
        bad += topk_and_randperm();
    }
    CHECKM(bad == 0, "sort in a caller's region, nesting on: %d bad", bad);
    omp_set_max_active_levels(saved_levels);
    omp_set_num_threads(saved);

    /* And plainly, outside any region. */
    CHECKM(sort_and_check(200, 700, 0) == 0, "sort outside a region");
}

/* ---- nd_dim_loop_run_chunks: every slice once, chunk numbers in range ---- */

typedef struct {
    int nchunks;
    int bad;
    int *hits; /* per slice */
    int *chunk_of;
} chunk_ctx;

/* ptrs: a contiguous int64 tensor of slice numbers, one row per slice. */
static void note_chunk(char **p, const int64_t *s, int64_t n, int chunk, void *vctx) {
    chunk_ctx *c = vctx;
    int64_t slice = *(const int64_t *)p[0];
    if (chunk < 0 || chunk >= c->nchunks) {
#pragma omp atomic write
        c->bad = 1;
        return;
    }
#pragma omp atomic update
    c->hits[slice]++;
    c->chunk_of[slice] = chunk;
}

static void test_run_chunks(void) {
    enum { ROWS = 50, COLS = 4 };
    int64_t v[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) v[i] = i / COLS;
    nd_tensor *t = i64_tensor(v, S(ROWS, COLS));
    nd_dim_loop L;
    const nd_tensor *ops[1] = {t};
    nd_dim_loop_init(&L, 1, ops, nd_shape(t), 2, 1);
    CHECKM(nd_dim_loop_chunks(&L, 0) == 1, "a serial loop has one chunk");
    CHECKM(nd_dim_loop_chunks(&L, 1) >= 1, "at least one chunk");
    int levels = omp_get_max_active_levels();
    for (int pass = 0; pass < 4; pass++) {
        int hits[ROWS] = {0}, chunk_of[ROWS];
        int nchunks = (int[]){1, 3, 7, 200}[pass];
        chunk_ctx c = {.nchunks = nchunks, .hits = hits, .chunk_of = chunk_of};
        if (pass == 2) {
            /* from inside a region with nesting off: a team of one runs all */
            omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
            {
#pragma omp single
                nd_dim_loop_run_chunks(&L, note_chunk, &c, nchunks);
            }
            omp_set_max_active_levels(levels);
        } else {
            nd_dim_loop_run_chunks(&L, note_chunk, &c, nchunks);
        }
        CHECKM(!c.bad, "run_chunks(%d): a chunk number out of range", nchunks);
        int once = 1, ordered = 1;
        for (int r = 0; r < ROWS; r++) {
            once &= hits[r] == 1;
            if (r) ordered &= chunk_of[r] >= chunk_of[r - 1]; /* runs of neighbours */
        }
        CHECKM(once, "run_chunks(%d): every slice exactly once", nchunks);
        CHECKM(ordered, "run_chunks(%d): chunks are runs of neighbouring slices", nchunks);
    }
    nd_release(t);
}

int main(void) {
    int64_t live0 = nd_live_bytes();
    test_sort_in_caller_region();
    test_run_chunks();
    int64_t live1 = nd_live_bytes();
    CHECKM(live1 == live0, "live bytes back to %lld, got %lld", (long long)live0, (long long)live1);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
