/* test_review_fixes_index.c - regression tests for review findings in the
 * index, join, sort and random code:
 *   - sort/topk/randperm called from the caller's own OpenMP parallel region
 *     (scratch was indexed by the caller's thread number: heap overflow);
 *   - nd_dim_loop_run_chunks runs every chunk once, whatever team it gets;
 *   - integer cumsum / scatter_add / index_add wrap instead of signed
 *     overflow (UB);
 *   - index_add rejects a non-finite or out-of-int64-range alpha for integer
 *     tensors;
 *   - one_hot reads min/max exactly as int64 and names its own errors;
 *   - pad with pads near INT64_MIN/INT64_MAX fails cleanly (no overflow);
 *   - cat's list position and gather/scatter's index position render
 *     1-based for the Lua layer (nd_last_error_based(1)).
 * Best run under the ASan/UBSan build too (build-asan). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#include "backends/cpu/cpu_dim_loop.h"
#define CHECK_PLACE_LINE /* failures print as "FAIL line N: " */
#include "check.h"

/* The message as the Lua layer shows it (dims and indices 1-based). */
static void expect_lua_msg_at(int line, const char *what, const char *frag) {
    checks++;
    const char *msg = nd_last_error_based(1);
    if (!strstr(msg, frag)) FAIL_AT(line, "%s: 1-based message '%s' lacks '%s'", what, msg, frag);
}
#define EXPECT_LUA_MSG(what, frag) expect_lua_msg_at(__LINE__, what, frag)

/* An int64 / int32 tensor of the values v (dt gives their C type). */
static nd_tensor *int_tensor(const void *v, const int64_t *shape, int ndim, nd_dtype dt) {
    nd_tensor *t;
    if (nd_from_buffer(v, shape, ndim, dt, &t) != ND_OK) {
        printf("%s: %s\n", dt == ND_INT64 ? "i64_tensor" : "i32_tensor", nd_last_error());
        exit(2);
    }
    return t;
}

static nd_tensor *i64_tensor(const int64_t *v, const int64_t *shape, int ndim) {
    return int_tensor(v, shape, ndim, ND_INT64);
}

static nd_tensor *i32_tensor(const int32_t *v, const int64_t *shape, int ndim) {
    return int_tensor(v, shape, ndim, ND_INT32);
}

/* Exact comparison of an int64 / int32 tensor with n expected values of
 * its C type. */
static void expect_ints_at(int line, const char *what, const nd_tensor *t, nd_dtype dt,
                           const void *want, int n) {
    checks++;
    if (!t || nd_get_dtype(t) != dt || nd_numel(t) != n) {
        if (dt == ND_INT64)
            FAIL_AT(line, "%s: wrong tensor (dtype %s, %lld elements)", what,
                    t ? nd_dtype_name(nd_get_dtype(t)) : "-", t ? (long long)nd_numel(t) : -1LL);
        else
            FAIL_AT(line, "%s: wrong tensor", what);
        return;
    }
    int64_t got64[16];
    int32_t got32[16];
    int wide = dt == ND_INT64;
    if (nd_copy_to_buffer(t, wide ? (void *)got64 : (void *)got32,
                          (size_t)n * (wide ? sizeof *got64 : sizeof *got32)) != ND_OK) {
        FAIL_AT(line, "%s: %s", what, nd_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        long long g = wide ? got64[i] : got32[i];
        long long w = wide ? ((const int64_t *)want)[i] : ((const int32_t *)want)[i];
        if (g != w) {
            FAIL_AT(line, "%s: element %d is %lld, expected %lld", what, i, g, w);
            return;
        }
    }
}
#define EXPECT_I64(what, t, ...) expect_ints_at(__LINE__, what, t, ND_INT64, \
    (const int64_t[]){__VA_ARGS__}, (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define EXPECT_I32(what, t, ...) expect_ints_at(__LINE__, what, t, ND_INT32, \
    (const int32_t[]){__VA_ARGS__}, (int)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))

/* ---- 1. sort inside the caller's parallel region ---- */

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

/* ---- 2. integer accumulation wraps ---- */

static void test_integer_wrap(void) {
    nd_tensor *x = NULL, *r = NULL, *idx = NULL, *src = NULL;
    /* cumsum int64 and int32 (into int64) */
    x = i64_tensor((const int64_t[]){INT64_MAX, 1, 1}, S(3));
    OK(nd_cumsum(x, 0, &r));
    EXPECT_I64("cumsum int64 wraps", r, INT64_MAX, INT64_MIN, INT64_MIN + 1);
    nd_release(r);
    nd_release(x);
    x = i64_tensor((const int64_t[]){INT64_MIN, -1, INT64_MAX, INT64_MIN, 5, 6}, S(3, 2));
    OK(nd_cumsum(x, 0, &r)); /* dim 0: lanes */
    /* column 0: MIN, MIN+MAX = -1, -1+5 = 4; column 1: -1, -1+MIN wraps to
     * MAX, MAX+6 wraps to MIN+5 */
    EXPECT_I64("cumsum int64 along dim 0 wraps", r, INT64_MIN, -1, -1, INT64_MAX, 4,
               INT64_MIN + 5);
    nd_release(r);
    nd_release(x);

    /* scatter_add int64: two adds onto one element overflow */
    x = i64_tensor((const int64_t[]){INT64_MAX, 0}, S(2));
    idx = i64_tensor((const int64_t[]){0, 0, 1}, S(3));
    src = i64_tensor((const int64_t[]){1, 1, INT64_MIN}, S(3));
    OK(nd_scatter(x, 0, idx, src, 1, &r));
    EXPECT_I64("scatter_add int64 wraps", r, INT64_MIN + 1, INT64_MIN);
    nd_release(r);
    nd_release(x);
    nd_release(src);
    /* scatter_add int32 */
    x = i32_tensor((const int32_t[]){INT32_MAX, INT32_MIN}, S(2));
    nd_tensor *src32 = i32_tensor((const int32_t[]){1, 1, -1}, S(3));
    OK(nd_scatter(x, 0, idx, src32, 1, &r));
    EXPECT_I32("scatter_add int32 wraps", r, INT32_MIN + 1, INT32_MAX);
    nd_release(r);
    nd_release(x);
    nd_release(idx);

    /* index_add int64: alpha * src overflows, and the sum does */
    x = i64_tensor((const int64_t[]){INT64_MAX, 1}, S(2));
    idx = i64_tensor((const int64_t[]){0, 1}, S(2));
    src = i64_tensor((const int64_t[]){1, INT64_MAX}, S(2));
    OK(nd_index_add(x, 0, idx, src, 1, &r));
    EXPECT_I64("index_add int64 wraps", r, INT64_MIN, INT64_MIN);
    nd_release(r);
    OK(nd_index_add(x, 0, idx, src, 4, &r)); /* 4 * INT64_MAX = -4 (mod 2^64) */
    EXPECT_I64("index_add int64 alpha 4 wraps", r, INT64_MIN + 3, -3);
    nd_release(r);
    OK(nd_index_add(x, 0, idx, src, -0x1p63, &r)); /* alpha = INT64_MIN is allowed */
    EXPECT_I64("index_add int64 alpha INT64_MIN", r, -1, 1 + INT64_MIN);
    nd_release(r);
    nd_release(x);
    /* index_add int32 (2-D, along both dims so both tile layouts run) */
    x = i32_tensor((const int32_t[]){INT32_MAX, 0, 0, INT32_MIN}, S(2, 2));
    nd_tensor *s2 = i32_tensor((const int32_t[]){1, 2, 3, -1}, S(2, 2));
    OK(nd_index_add(x, 0, idx, s2, 1, &r));
    EXPECT_I32("index_add int32 dim 0 wraps", r, INT32_MIN, 2, 3, INT32_MAX);
    nd_release(r);
    OK(nd_index_add(x, 1, idx, s2, 0x1p40 + 1, &r)); /* alpha wraps to 1 in int32 */
    EXPECT_I32("index_add int32 dim 1, alpha 2^40 + 1", r, INT32_MIN, 2, 3, INT32_MAX);
    nd_release(r);
    nd_release(s2);
    nd_release(x);
    nd_release(src);
    nd_release(idx);
    nd_release(src32);
}

/* ---- 3. index_add alpha for integer tensors ---- */

static void test_index_add_alpha(void) {
    nd_tensor *x = NULL, *r = NULL, *idx = NULL, *src = NULL;
    x = i64_tensor((const int64_t[]){1, 2, 3}, S(3));
    idx = i64_tensor((const int64_t[]){0}, S(1));
    src = i64_tensor((const int64_t[]){1}, S(1));
    EXPECT_ERR("index_add alpha inf", nd_index_add(x, 0, idx, src, INFINITY, &r), ND_ERR_ARG,
               "index_add: alpha inf", "finite");
    CHECKM(r == NULL, "no result on error");
    EXPECT_ERR("index_add alpha -inf", nd_index_add(x, 0, idx, src, -INFINITY, &r), ND_ERR_ARG,
               "index_add: alpha -inf", "finite");
    EXPECT_ERR("index_add alpha nan", nd_index_add(x, 0, idx, src, NAN, &r), ND_ERR_ARG,
               "index_add: alpha", "finite");
    EXPECT_ERR("index_add alpha 1e30", nd_index_add(x, 0, idx, src, 1e30, &r), ND_ERR_ARG,
               "index_add: alpha 1e+30 is out of range for dtype int64", "[-2^63, 2^63)");
    EXPECT_ERR("index_add alpha 2^63", nd_index_add(x, 0, idx, src, 0x1p63, &r), ND_ERR_ARG,
               "index_add: alpha", "out of range");
    EXPECT_ERR("index_add alpha -1e30", nd_index_add(x, 0, idx, src, -1e30, &r), ND_ERR_ARG,
               "index_add: alpha", "out of range");
    EXPECT_ERR("index_add alpha 0.5", nd_index_add(x, 0, idx, src, 0.5, &r), ND_ERR_ARG,
               "index_add: alpha 0.5", "must be an integer");
    /* the same for int32, uint8 and bool tensors */
    nd_tensor *xi;
    OK(nd_to_dtype(x, ND_INT32, &xi));
    EXPECT_ERR("index_add int32 alpha inf", nd_index_add(xi, 0, idx, src, INFINITY, &r),
               ND_ERR_ARG, "alpha inf must be finite", "int32");
    nd_release(xi);
    OK(nd_to_dtype(x, ND_UINT8, &xi));
    EXPECT_ERR("index_add uint8 alpha 1e30", nd_index_add(xi, 0, idx, src, 1e30, &r),
               ND_ERR_ARG, "out of range", "uint8");
    nd_release(xi);
    OK(nd_to_dtype(x, ND_BOOL, &xi));
    EXPECT_ERR("index_add bool alpha inf", nd_index_add(xi, 0, idx, src, INFINITY, &r),
               ND_ERR_ARG, "finite", "bool");
    nd_release(xi);
    /* float tensors take any alpha */
    nd_tensor *xf, *sf;
    OK(nd_to_dtype(x, ND_FLOAT64, &xf));
    OK(nd_to_dtype(src, ND_FLOAT64, &sf));
    OK(nd_index_add(xf, 0, idx, sf, INFINITY, &r));
    double first;
    OK(nd_get_item(r, (const int64_t[]){0}, &first));
    CHECKM(isinf(first) && first > 0, "float index_add with alpha inf gives inf, got %g", first);
    nd_release(r);
    nd_release(xf);
    nd_release(sf);
    nd_release(x);
    nd_release(idx);
    nd_release(src);
}

/* ---- 4. one_hot with huge class values ---- */

static void test_one_hot(void) {
    nd_tensor *idx = NULL, *r = NULL;
    idx = i64_tensor((const int64_t[]){0, INT64_MAX}, S(2));
    EXPECT_ERR("one_hot infer from INT64_MAX", nd_one_hot(idx, -1, &r), ND_ERR_ARG,
               "one_hot: cannot infer num_classes", "9223372036854775807");
    CHECKM(r == NULL, "no result on error");
    EXPECT_ERR("one_hot INT64_MAX with explicit num_classes", nd_one_hot(idx, INT64_MAX, &r),
               ND_ERR_INDEX, "one_hot: class value 9223372036854775807 is out of range", NULL);
    nd_release(idx);
    idx = i64_tensor((const int64_t[]){1, INT64_MAX - 1}, S(2));
    EXPECT_ERR("one_hot infer INT64_MAX classes", nd_one_hot(idx, -1, &r), ND_ERR_MEMORY,
               "one_hot: shape {2,9223372036854775807} is too large", NULL);
    nd_release(idx);
    /* beyond 2^53 doubles round: 2^53 + 1 vs num_classes 2^53 + 1 must be
     * out of range, 2^53 vs 2^53 + 1 in range (then too large to build) */
    idx = i64_tensor((const int64_t[]){(INT64_C(1) << 53) + 1}, S(1));
    EXPECT_ERR("one_hot exact compare (out of range)",
               nd_one_hot(idx, (INT64_C(1) << 53) + 1, &r), ND_ERR_INDEX,
               "class value 9007199254740993 is out of range", "num_classes 9007199254740993");
    nd_release(idx);
    idx = i64_tensor((const int64_t[]){INT64_C(1) << 53}, S(1));
    EXPECT_ERR("one_hot exact compare (in range)", nd_one_hot(idx, (INT64_C(1) << 53) + 1, &r),
               ND_ERR_MEMORY, "one_hot: shape {1,9007199254740993} is too large", NULL);
    nd_release(idx);
    idx = i64_tensor((const int64_t[]){INT64_MIN, 2}, S(2));
    EXPECT_ERR("one_hot INT64_MIN", nd_one_hot(idx, -1, &r), ND_ERR_INDEX,
               "one_hot: class values must be at least 0, got -9223372036854775808", NULL);
    nd_release(idx);
    /* the ordinary path still works, on a non-contiguous index too */
    nd_tensor *base = i64_tensor((const int64_t[]){2, 9, 0, 9, 1, 9}, S(3, 2)), *col;
    OK(nd_select(base, 1, 0, &col)); /* {2, 0, 1}, stride 2 */
    OK(nd_one_hot(col, -1, &r));
    EXPECT_I64("one_hot inferred", r, 0, 0, 1, 1, 0, 0, 0, 1, 0);
    nd_release(r);
    nd_release(col);
    nd_release(base);
}

/* ---- 5. pad with extreme pads ---- */

static void test_pad_overflow(void) {
    nd_tensor *x = NULL, *r = NULL;
    OK(nd_full(S(2, 3), ND_FLOAT32, 1, &x));
    EXPECT_ERR("pad INT64_MAX", nd_pad(x, (const int64_t[]){INT64_MAX, 5}, 1, 0, &r),
               ND_ERR_SHAPE, "pad: padding (9223372036854775807, 5) of dim 1 of size 3",
               "overflows int64");
    CHECKM(r == NULL, "no result on error");
    EXPECT_ERR("pad 5, INT64_MAX", nd_pad(x, (const int64_t[]){5, INT64_MAX}, 1, 0, &r),
               ND_ERR_SHAPE, "pad: padding (5, 9223372036854775807)", "overflows int64");
    EXPECT_ERR("pad INT64_MIN", nd_pad(x, (const int64_t[]){INT64_MIN, 0}, 1, 0, &r),
               ND_ERR_SHAPE, "pad: padding (-9223372036854775808, 0) of dim 1 of size 3",
               "negative size");
    EXPECT_ERR("pad 0, INT64_MIN on dim 0",
               nd_pad(x, (const int64_t[]){0, 0, 0, INT64_MIN}, 2, 0, &r), ND_ERR_SHAPE,
               "pad: padding (0, -9223372036854775808) of dim 0 of size 2", "negative size");
    EXPECT_ERR("pad INT64_MIN + INT64_MIN", nd_pad(x, (const int64_t[]){INT64_MIN, INT64_MIN}, 1,
               0, &r), ND_ERR_SHAPE, "pad: padding (-9223372036854775808, -9223372036854775808)",
               "gives a negative size (below -2^63)");
    EXPECT_ERR("pad INT64_MAX + INT64_MAX", nd_pad(x, (const int64_t[]){INT64_MAX, INT64_MAX}, 1,
               0, &r), ND_ERR_SHAPE, "pad: padding (9223372036854775807, 9223372036854775807)",
               "overflows int64");
    EXPECT_ERR("pad huge but representable", nd_pad(x, (const int64_t[]){INT64_MAX - 3, 0}, 1,
               0, &r), ND_ERR_MEMORY, "pad: shape {2,9223372036854775807} is too large", NULL);
    /* crop everything and pad back: INT64_MIN + INT64_MAX + 3 = 2 columns of
     * the pad value (no -INT64_MIN on the way) */
    OK(nd_pad(x, (const int64_t[]){INT64_MIN, INT64_MAX}, 1, 7, &r));
    CHECKM(nd_ndim(r) == 2 && nd_shape(r)[0] == 2 && nd_shape(r)[1] == 2, "pad crop-all shape");
    float got[4];
    OK(nd_copy_to_buffer(r, got, sizeof got));
    CHECKM(got[0] == 7 && got[1] == 7 && got[2] == 7 && got[3] == 7, "pad crop-all values");
    nd_release(r);
    OK(nd_pad(x, (const int64_t[]){INT64_MAX, INT64_MIN}, 1, 7, &r));
    CHECKM(nd_shape(r)[1] == 2, "pad pad-then-crop-all shape");
    nd_release(r);
    nd_release(x);
}

/* ---- 6. positions render 1-based for Lua ---- */

static void test_positions(void) {
    nd_tensor *a = NULL, *s = NULL, *r = NULL;
    OK(nd_full(S(2), ND_FLOAT32, 1, &a));
    OK(nd_scalar(1, ND_FLOAT32, &s));
    nd_tensor *list[3] = {a, a, s};
    EXPECT_ERR("cat 0-dim", nd_cat(list, 3, 0, &r), ND_ERR_SHAPE,
               "cat: zero-dimensional tensor (at position 2) cannot be concatenated", NULL);
    EXPECT_LUA_MSG("cat 0-dim, Lua", "zero-dimensional tensor (at position 3)");
    nd_tensor *nulls[2] = {a, NULL};
    EXPECT_ERR("cat NULL", nd_cat(nulls, 2, 0, &r), ND_ERR_ARG, "cat: tensor 1 is NULL", NULL);
    EXPECT_LUA_MSG("cat NULL, Lua", "cat: tensor 2 is NULL");
    EXPECT_ERR("stack NULL", nd_stack(nulls, 2, 0, &r), ND_ERR_ARG, "stack: tensor 1 is NULL",
               NULL);
    EXPECT_LUA_MSG("stack NULL, Lua", "stack: tensor 2 is NULL");
    nd_release(s);
    nd_release(a);

    /* gather: the bad index 4 sits at (1, 1) of the index tensor */
    nd_tensor *x, *idx;
    OK(nd_full(S(2, 3), ND_FLOAT32, 1, &x));
    idx = i64_tensor((const int64_t[]){0, 1, 2, 4}, S(2, 2));
    EXPECT_ERR("gather position", nd_gather(x, 1, idx, &r), ND_ERR_INDEX,
               "gather: index 4 is out of bounds for dim 1 with size 3",
               "(at position {1,1} of the index tensor)");
    EXPECT_LUA_MSG("gather position, Lua", "gather: index 5 is out of bounds for dim 2 with size "
                   "3 (at position {2,2} of the index tensor)");
    EXPECT_ERR("scatter position", nd_scatter(x, 1, idx, x, 0, &r), ND_ERR_INDEX,
               "scatter: index 4", "(at position {1,1} of the index tensor)");
    EXPECT_LUA_MSG("scatter position, Lua", "(at position {2,2} of the index tensor)");
    nd_release(idx);
    /* a negative index keeps its value; its position is still 1-based */
    idx = i64_tensor((const int64_t[]){0, 0, -1, 0}, S(2, 2));
    EXPECT_ERR("scatter_add negative index", nd_scatter(x, 0, idx, x, 1, &r), ND_ERR_INDEX,
               "scatter_add: index -1 is out of bounds for dim 0 with size 2",
               "(at position {1,0} of the index tensor)");
    EXPECT_LUA_MSG("scatter_add negative index, Lua", "index -1 is out of bounds for dim 1 with "
                   "size 2 (at position {2,1} of the index tensor)");
    nd_release(idx);
    /* 8-dim index: the longest position fits */
    nd_tensor *x8, *i8;
    OK(nd_full(S(1, 1, 1, 1, 1, 1, 1, 2), ND_FLOAT32, 0, &x8));
    i8 = i64_tensor((const int64_t[]){0, 9}, S(1, 1, 1, 1, 1, 1, 1, 2));
    EXPECT_ERR("gather 8-dim position", nd_gather(x8, 7, i8, &r), ND_ERR_INDEX,
               "(at position {0,0,0,0,0,0,0,1} of the index tensor)", NULL);
    EXPECT_LUA_MSG("gather 8-dim position, Lua", "(at position {1,1,1,1,1,1,1,2} of the index");
    nd_release(i8);
    nd_release(x8);
    nd_release(x);
}

int main(void) {
    int64_t live0 = nd_live_bytes();
    test_sort_in_caller_region();
    test_run_chunks();
    test_integer_wrap();
    test_index_add_alpha();
    test_one_hot();
    test_pad_overflow();
    test_positions();
    int64_t live1 = nd_live_bytes();
    CHECKM(live1 == live0, "live bytes back to %lld, got %lld", (long long)live0, (long long)live1);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
