/* test_index_sort_random.c - gather/scatter/index_select/index_add/
 * masked_fill/one_hot, cumsum/sort/topk, cat/stack/flip/pad and the random
 * ops, checked against hand-computed values on small inputs (contiguous and
 * not), their error messages (with the positions the Lua layer shows
 * 1-based), reproducibility across thread counts, and
 * that nothing leaks (live bytes return to where they started). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/cpu_philox.h"
#define CHECK_PLACE_LINE /* failures print as "FAIL line N: " */
#include "check.h"

static nd_tensor *mk(nd_dtype dt, const int64_t *shape, int ndim, const double *v, int nv) {
    nd_tensor *f, *t;
    if (nd_from_buffer(v, shape, ndim, ND_FLOAT64, &f) != ND_OK) {
        printf("mk: %s\n", nd_last_error());
        exit(2);
    }
    if ((int)nd_numel(f) != nv) {
        printf("mk: %d values for %lld elements\n", nv, (long long)nd_numel(f));
        exit(2);
    }
    if (nd_to_dtype(f, dt, &t) != ND_OK) {
        printf("mk: %s\n", nd_last_error());
        exit(2);
    }
    nd_release(f);
    return t;
}

/* Values of any tensor (any strides) as doubles; caller frees. */
static double *values_of(const nd_tensor *t) {
    nd_tensor *f;
    if (nd_to_dtype(t, ND_FLOAT64, &f) != ND_OK) return NULL;
    size_t n = (size_t)nd_numel(f);
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (nd_copy_to_buffer(f, v, n * sizeof *v) != ND_OK) { free(v); v = NULL; }
    nd_release(f);
    return v;
}

static void expect_at(int line, const char *what, const nd_tensor *t, nd_dtype dt,
                      const int64_t *shape, int ndim, const double *v, int nv) {
    checks++;
    if (!t) { FAIL_AT(line, "%s: no tensor", what); return; }
    int bad = nd_get_dtype(t) != dt || nd_ndim(t) != ndim || nd_numel(t) != nv;
    for (int i = 0; !bad && i < ndim; i++) bad = nd_shape(t)[i] != shape[i];
    if (bad) {
        failures++;
        check_place(__FILE__, line);
        printf("%s: got %s with %d dims (", what, nd_dtype_name(nd_get_dtype(t)), nd_ndim(t));
        for (int i = 0; i < nd_ndim(t); i++) printf("%s%lld", i ? "," : "", (long long)nd_shape(t)[i]);
        printf("), expected %s with %d dims\n", nd_dtype_name(dt), ndim);
        return;
    }
    double *got = values_of(t);
    for (int i = 0; got && i < nv; i++) {
        double g = got[i], e = v[i];
        int same = (isnan(g) && isnan(e)) || g == e || fabs(g - e) <= 1e-6 * fmax(1, fabs(e));
        if (!same) {
            FAIL_AT(line, "%s: element %d is %.9g, expected %.9g", what, i, g, e);
            break;
        }
    }
    free(got);
}
#define EXPECT(what, t, dt, shape, vals) expect_at(__LINE__, what, t, dt, shape, vals)

/* ------------------------------------------------------------------ */

static void test_gather(void) {
    nd_tensor *x = mk(ND_FLOAT32, S(2, 3), V(1, 2, 3, 4, 5, 6));
    nd_tensor *i1 = mk(ND_INT64, S(2, 2), V(0, 0, 2, 1));
    nd_tensor *i0 = mk(ND_INT64, S(2, 3), V(0, 1, 0, 1, 0, 1));
    nd_tensor *r, *xt, *it;
    OK(nd_gather(x, 1, i1, &r));
    EXPECT("gather dim 1", r, ND_FLOAT32, S(2, 2), V(1, 1, 6, 5));
    nd_release(r);
    OK(nd_gather(x, -2, i0, &r));
    EXPECT("gather dim 0", r, ND_FLOAT32, S(2, 3), V(1, 5, 3, 4, 2, 6));
    nd_release(r);
    /* transposed x {3,2} = [[1,4],[2,5],[3,6]] and a transposed index */
    OK(nd_transpose(x, 0, 1, &xt));
    OK(nd_transpose(i1, 0, 1, &it)); /* [[0,2],[0,1]] */
    OK(nd_gather(xt, 0, it, &r));
    EXPECT("gather transposed", r, ND_FLOAT32, S(2, 2), V(1, 6, 1, 5));
    nd_release(r);
    /* int64 data, index smaller than x in the other dim */
    nd_tensor *xi = mk(ND_INT64, S(3, 3), V(10, 11, 12, 20, 21, 22, 30, 31, 32));
    nd_tensor *ic = mk(ND_INT64, S(2, 1), V(2, 0));
    OK(nd_gather(xi, 1, ic, &r));
    EXPECT("gather int64", r, ND_INT64, S(2, 1), V(12, 20));
    nd_release(r);
    /* errors */
    nd_tensor *bad = mk(ND_INT64, S(2, 2), V(0, 1, 3, 0));
    EXPECT_ERR("gather index 3", nd_gather(x, 1, bad, &r), ND_ERR_INDEX, "gather", "index 3");
    CHECKM(r == NULL, "gather error leaves out NULL");
    nd_tensor *neg = mk(ND_INT64, S(2, 2), V(0, -1, 0, 0));
    EXPECT_ERR("gather index -1", nd_gather(x, 1, neg, &r), ND_ERR_INDEX, "gather", "-1");
    nd_tensor *i32 = mk(ND_INT32, S(2, 2), V(0, 0, 0, 0));
    EXPECT_ERR("gather int32 index", nd_gather(x, 1, i32, &r), ND_ERR_DTYPE, "gather", "int32");
    nd_tensor *wide = mk(ND_INT64, S(3, 1), V(0, 0, 0));
    EXPECT_ERR("gather shape", nd_gather(x, 1, wide, &r), ND_ERR_SHAPE, "gather", "{3,1}");
    EXPECT_ERR("gather dim", nd_gather(x, 2, i1, &r), ND_ERR_INDEX, "gather", "dim 2");
    nd_tensor *ts[] = {x, i1, i0, xt, it, xi, ic, bad, neg, i32, wide};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) nd_release(ts[k]);
}

static void test_scatter(void) {
    /* PyTorch's example: zeros(3,5).scatter_(0, [[0,1,2,0]], arange(1,11).view(2,5)) */
    nd_tensor *z = mk(ND_FLOAT32, S(3, 5), V(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    nd_tensor *src = mk(ND_FLOAT32, S(2, 5), V(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
    nd_tensor *idx = mk(ND_INT64, S(1, 4), V(0, 1, 2, 0));
    nd_tensor *r;
    OK(nd_scatter(z, 0, idx, src, 0, &r));
    EXPECT("scatter", r, ND_FLOAT32, S(3, 5), V(1, 0, 0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0));
    nd_release(r);
    /* duplicates: scatter keeps the last, scatter_add sums */
    nd_tensor *z3 = mk(ND_FLOAT64, S(3), V(0.5, 0, 0));
    nd_tensor *d = mk(ND_INT64, S(5), V(0, 1, 0, 2, 0));
    nd_tensor *s5 = mk(ND_FLOAT64, S(5), V(1, 2, 3, 4, 5));
    OK(nd_scatter(z3, 0, d, s5, 0, &r));
    EXPECT("scatter duplicates", r, ND_FLOAT64, S(3), V(5, 2, 4));
    nd_release(r);
    OK(nd_scatter(z3, 0, d, s5, 1, &r));
    EXPECT("scatter_add", r, ND_FLOAT64, S(3), V(9.5, 2, 4));
    nd_release(r);
    /* int64 scatter_add with a float src (cast) and src through a step slice */
    nd_tensor *zi = mk(ND_INT64, S(2, 3), V(1, 1, 1, 1, 1, 1));
    nd_tensor *wide = mk(ND_FLOAT32, S(2, 6), V(1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0));
    nd_tensor *step, *ix = mk(ND_INT64, S(2, 3), V(2, 2, 0, 1, 1, 1));
    OK(nd_slice(wide, 1, 0, 6, 2, &step)); /* [[1,2,3],[4,5,6]] */
    OK(nd_scatter(zi, 1, ix, step, 1, &r));
    EXPECT("scatter_add int64", r, ND_INT64, S(2, 3), V(4, 1, 4, 1, 16, 1));
    nd_release(r);
    /* 0-dim src: a value */
    nd_tensor *one;
    OK(nd_scalar(7, ND_FLOAT32, &one));
    OK(nd_scatter(z, 1, idx, one, 0, &r));
    EXPECT("scatter scalar", r, ND_FLOAT32, S(3, 5), V(7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    nd_release(r);
    /* errors */
    nd_tensor *bad = mk(ND_INT64, S(1, 4), V(0, 1, 3, 0));
    EXPECT_ERR("scatter index 3", nd_scatter(z, 0, bad, src, 0, &r), ND_ERR_INDEX, "scatter",
               "index 3");
    EXPECT_ERR("scatter_add index 3", nd_scatter(z, 0, bad, src, 1, &r), ND_ERR_INDEX,
               "scatter_add", "index 3");
    EXPECT_ERR("scatter accumulate 2", nd_scatter(z, 0, idx, src, 2, &r), ND_ERR_ARG, "scatter",
               NULL);
    nd_tensor *big = mk(ND_INT64, S(3, 4), V(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    EXPECT_ERR("scatter src too small", nd_scatter(z, 0, big, src, 0, &r), ND_ERR_SHAPE,
               "scatter", "{2,5}");

    /* large scatter_add along dim 1 with many duplicates, parallel over rows */
    int64_t rows = 64, cols = 5000;
    nd_tensor *zz, *ones, *ii;
    OK(nd_zeros(S(64, 10), ND_FLOAT32, &zz));
    OK(nd_full(S(64, 5000), ND_FLOAT32, 1.0, &ones));
    OK(nd_empty(S(64, 5000), ND_INT64, &ii));
    int64_t *ip = nd_data(ii);
    for (int64_t a = 0; a < rows; a++)
        for (int64_t b = 0; b < cols; b++) ip[a * cols + b] = (a * 7 + b * b) % 10;
    OK(nd_scatter(zz, 1, ii, ones, 1, &r));
    const float *rp = nd_data(r);
    int ok = 1;
    for (int64_t a = 0; a < rows && ok; a++) {
        int64_t cnt[10] = {0};
        for (int64_t b = 0; b < cols; b++) cnt[(a * 7 + b * b) % 10]++;
        for (int c = 0; c < 10; c++) ok &= rp[a * 10 + c] == (float)cnt[c];
    }
    CHECKM(ok, "large scatter_add counts");
    nd_release(r);
    nd_tensor *ts[] = {z, src, idx, z3, d, s5, zi, wide, step, ix, one, bad, big, zz, ones, ii};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) nd_release(ts[k]);
}

static void test_index_select_add(void) {
    nd_tensor *x = mk(ND_FLOAT32, S(3, 4), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
    nd_tensor *i = mk(ND_INT64, S(2), V(2, 0));
    nd_tensor *j = mk(ND_INT64, S(3), V(3, 3, 1));
    nd_tensor *r, *xt;
    OK(nd_index_select(x, 0, i, &r));
    EXPECT("index_select dim 0", r, ND_FLOAT32, S(2, 4), V(8, 9, 10, 11, 0, 1, 2, 3));
    nd_release(r);
    OK(nd_index_select(x, 1, j, &r));
    EXPECT("index_select dim 1", r, ND_FLOAT32, S(3, 3), V(3, 3, 1, 7, 7, 5, 11, 11, 9));
    nd_release(r);
    OK(nd_transpose(x, 0, 1, &xt)); /* {4,3} */
    OK(nd_index_select(xt, 0, j, &r));
    EXPECT("index_select transposed", r, ND_FLOAT32, S(3, 3), V(3, 7, 11, 3, 7, 11, 1, 5, 9));
    nd_release(r);
    /* rows of 8 float64 (64 bytes): the memcpy path */
    nd_tensor *e = mk(ND_FLOAT64, S(3, 8), V(0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16,
                                               17, 20, 21, 22, 23, 24, 25, 26, 27));
    nd_tensor *k = mk(ND_INT64, S(4), V(2, 2, 0, 1));
    OK(nd_index_select(e, 0, k, &r));
    EXPECT("index_select rows", r, ND_FLOAT64, S(4, 8),
           V(20, 21, 22, 23, 24, 25, 26, 27, 20, 21, 22, 23, 24, 25, 26, 27, 0, 1, 2, 3, 4, 5, 6,
             7, 10, 11, 12, 13, 14, 15, 16, 17));
    nd_release(r);
    nd_tensor *bad = mk(ND_INT64, S(2), V(0, 3));
    EXPECT_ERR("index_select index 3", nd_index_select(x, 0, bad, &r), ND_ERR_INDEX,
               "index_select", "index 3");
    EXPECT_ERR("index_select index 3 rows", nd_index_select(e, 0, bad, &r), ND_ERR_INDEX,
               "index_select", "index 3");
    nd_tensor *i2 = mk(ND_INT64, S(1, 2), V(0, 1));
    EXPECT_ERR("index_select 2-D index", nd_index_select(x, 0, i2, &r), ND_ERR_SHAPE,
               "index_select", "{1,2}");

    /* index_add: PyTorch's example, then duplicates with alpha */
    nd_tensor *o = mk(ND_FLOAT32, S(5, 3), V(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    nd_tensor *src = mk(ND_FLOAT32, S(3, 3), V(1, 2, 3, 4, 5, 6, 7, 8, 9));
    nd_tensor *ia = mk(ND_INT64, S(3), V(0, 4, 2));
    OK(nd_index_add(o, 0, ia, src, 1.0, &r));
    EXPECT("index_add", r, ND_FLOAT32, S(5, 3),
           V(2, 3, 4, 1, 1, 1, 8, 9, 10, 1, 1, 1, 5, 6, 7));
    nd_release(r);
    nd_tensor *dup = mk(ND_INT64, S(3), V(1, 1, 0));
    nd_tensor *srct;
    OK(nd_transpose(src, 0, 1, &srct)); /* [[1,4,7],[2,5,8],[3,6,9]] */
    nd_tensor *oi = mk(ND_INT64, S(3, 2), V(0, 0, 0, 0, 0, 0));
    OK(nd_index_add(oi, 1, dup, srct, 2.0, &r));
    EXPECT("index_add dup int64", r, ND_INT64, S(3, 2), V(14, 10, 16, 14, 18, 18));
    nd_release(r);
    nd_tensor *i5 = mk(ND_INT64, S(3), V(0, 5, 1));
    EXPECT_ERR("index_add index 5", nd_index_add(o, 0, i5, src, 1.0, &r), ND_ERR_INDEX,
               "index_add", "index 5");
    EXPECT_ERR("index_add alpha", nd_index_add(oi, 1, dup, srct, 0.5, &r), ND_ERR_ARG,
               "index_add", "alpha");
    nd_tensor *ts[] = {x, i, j, xt, e, k, bad, i2, o, src, ia, dup, srct, oi, i5};
    for (size_t q = 0; q < sizeof ts / sizeof *ts; q++) nd_release(ts[q]);
}

static void test_masked_fill_one_hot(void) {
    nd_tensor *x = mk(ND_FLOAT32, S(2, 3), V(1, 2, 3, 4, 5, 6));
    nd_tensor *m = mk(ND_BOOL, S(3), V(1, 0, 1));
    nd_tensor *r;
    OK(nd_masked_fill(x, m, -1, &r));
    EXPECT("masked_fill", r, ND_FLOAT32, S(2, 3), V(-1, 2, -1, -1, 5, -1));
    nd_release(r);
    nd_tensor *xt;
    OK(nd_transpose(x, 0, 1, &xt)); /* {3,2} [[1,4],[2,5],[3,6]] */
    nd_tensor *m2 = mk(ND_BOOL, S(3, 1), V(0, 1, 0));
    OK(nd_masked_fill(xt, m2, 9, &r));
    EXPECT("masked_fill transposed", r, ND_FLOAT32, S(3, 2), V(1, 4, 9, 9, 3, 6));
    nd_release(r);
    nd_tensor *xi = mk(ND_INT64, S(3), V(1, 2, 3));
    nd_tensor *mb = mk(ND_BOOL, S(2, 1), V(1, 0));
    OK(nd_masked_fill(xi, mb, 0, &r));
    EXPECT("masked_fill broadcast both", r, ND_INT64, S(2, 3), V(0, 0, 0, 1, 2, 3));
    nd_release(r);
    nd_tensor *mu = mk(ND_UINT8, S(3), V(1, 0, 1));
    EXPECT_ERR("masked_fill uint8 mask", nd_masked_fill(x, mu, 0, &r), ND_ERR_DTYPE,
               "masked_fill", "uint8");
    nd_tensor *m4 = mk(ND_BOOL, S(4), V(1, 0, 1, 0));
    EXPECT_ERR("masked_fill shape", nd_masked_fill(x, m4, 0, &r), ND_ERR_SHAPE, "masked_fill",
               "{4}");

    nd_tensor *c = mk(ND_INT64, S(3), V(0, 2, 1));
    OK(nd_one_hot(c, -1, &r));
    EXPECT("one_hot infer", r, ND_INT64, S(3, 3), V(1, 0, 0, 0, 0, 1, 0, 1, 0));
    nd_release(r);
    nd_tensor *c2 = mk(ND_INT64, S(2, 2), V(3, 0, 1, 1));
    OK(nd_one_hot(c2, 4, &r));
    EXPECT("one_hot 2-D", r, ND_INT64, S(2, 2, 4),
           V(0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0));
    nd_release(r);
    EXPECT_ERR("one_hot too small", nd_one_hot(c2, 3, &r), ND_ERR_INDEX, "one_hot", "3");
    nd_tensor *cn = mk(ND_INT64, S(2), V(1, -2));
    EXPECT_ERR("one_hot negative", nd_one_hot(cn, 3, &r), ND_ERR_INDEX, "one_hot", "-2");
    nd_tensor *cf = mk(ND_FLOAT32, S(2), V(1, 2));
    EXPECT_ERR("one_hot float", nd_one_hot(cf, 3, &r), ND_ERR_DTYPE, "one_hot", "float32");
    nd_tensor *ts[] = {x, m, xt, m2, xi, mb, mu, m4, c, c2, cn, cf};
    for (size_t q = 0; q < sizeof ts / sizeof *ts; q++) nd_release(ts[q]);
}

static void test_cumsum(void) {
    nd_tensor *x = mk(ND_FLOAT32, S(2, 3), V(1, 2, 3, 4, 5, 6));
    nd_tensor *r, *xt;
    OK(nd_cumsum(x, 1, &r));
    EXPECT("cumsum dim 1", r, ND_FLOAT32, S(2, 3), V(1, 3, 6, 4, 9, 15));
    nd_release(r);
    OK(nd_cumsum(x, 0, &r));
    EXPECT("cumsum dim 0", r, ND_FLOAT32, S(2, 3), V(1, 2, 3, 5, 7, 9));
    nd_release(r);
    OK(nd_transpose(x, 0, 1, &xt));
    OK(nd_cumsum(xt, -1, &r));
    EXPECT("cumsum transposed", r, ND_FLOAT32, S(3, 2), V(1, 5, 2, 7, 3, 9));
    nd_release(r);
    nd_tensor *xi = mk(ND_INT32, S(4), V(1, -2, 3, 4));
    OK(nd_cumsum(xi, 0, &r));
    EXPECT("cumsum int32 -> int64", r, ND_INT64, S(4), V(1, -1, 2, 6));
    nd_release(r);
    nd_tensor *xb = mk(ND_BOOL, S(4), V(1, 0, 1, 1));
    OK(nd_cumsum(xb, 0, &r));
    EXPECT("cumsum bool -> int64", r, ND_INT64, S(4), V(1, 1, 2, 3));
    nd_release(r);
    nd_tensor *x0;
    OK(nd_scalar(2.5, ND_FLOAT64, &x0));
    OK(nd_cumsum(x0, 0, &r));
    CHECKM(nd_ndim(r) == 0 && nd_get_dtype(r) == ND_FLOAT64, "cumsum 0-dim shape");
    double v = 0;
    int64_t none[1] = {0};
    OK(nd_get_item(r, none, &v));
    CHECKM(v == 2.5, "cumsum 0-dim value %g", v);
    nd_release(r);
    EXPECT_ERR("cumsum dim", nd_cumsum(x, 2, &r), ND_ERR_INDEX, "cumsum", "dim 2");
    /* float32 accumulates in double: 1e6 steps of 0.1 stays close */
    nd_tensor *big;
    OK(nd_full(S(1000000), ND_FLOAT32, 0.1, &big));
    OK(nd_cumsum(big, 0, &r));
    const float *rp = nd_data(r);
    CHECKM(fabs(rp[999999] - 100000.0) < 0.01, "cumsum float32 drift: %f", rp[999999]);
    nd_release(r);
    nd_tensor *ts[] = {x, xt, xi, xb, x0, big};
    for (size_t q = 0; q < sizeof ts / sizeof *ts; q++) nd_release(ts[q]);
}

static void test_sort_topk(void) {
    nd_tensor *x = mk(ND_FLOAT32, S(5), V(3, 1, NAN, 2, 1));
    nd_tensor *v, *i;
    OK(nd_sort(x, 0, 0, &v, &i));
    EXPECT("sort values", v, ND_FLOAT32, S(5), V(1, 1, 2, 3, NAN));
    EXPECT("sort indices (stable)", i, ND_INT64, S(5), V(1, 4, 3, 0, 2));
    nd_release(v);
    nd_release(i);
    OK(nd_sort(x, 0, 1, &v, &i));
    EXPECT("sort descending", v, ND_FLOAT32, S(5), V(NAN, 3, 2, 1, 1));
    EXPECT("sort descending indices (stable)", i, ND_INT64, S(5), V(2, 0, 3, 1, 4));
    nd_release(v);
    nd_release(i);
    /* -0 equals +0 (keeps order); infinities */
    nd_tensor *z = mk(ND_FLOAT64, S(5), V(0.0, -0.0, INFINITY, -INFINITY, -1));
    OK(nd_sort(z, 0, 0, &v, &i));
    EXPECT("sort zeros/infs", v, ND_FLOAT64, S(5), V(-INFINITY, -1, 0, 0, INFINITY));
    EXPECT("sort zeros/infs indices", i, ND_INT64, S(5), V(3, 4, 0, 1, 2));
    nd_release(v);
    nd_release(i);
    /* 2-D, both dims, and a transposed input */
    nd_tensor *m = mk(ND_INT64, S(2, 3), V(5, -7, 2, 0, 9, -1));
    OK(nd_sort(m, 1, 0, &v, &i));
    EXPECT("sort dim 1", v, ND_INT64, S(2, 3), V(-7, 2, 5, -1, 0, 9));
    EXPECT("sort dim 1 idx", i, ND_INT64, S(2, 3), V(1, 2, 0, 2, 0, 1));
    nd_release(v);
    nd_release(i);
    OK(nd_sort(m, 0, 1, &v, &i));
    EXPECT("sort dim 0 desc", v, ND_INT64, S(2, 3), V(5, 9, 2, 0, -7, -1));
    EXPECT("sort dim 0 desc idx", i, ND_INT64, S(2, 3), V(0, 1, 0, 1, 0, 1));
    nd_release(v);
    nd_release(i);
    nd_tensor *mt;
    OK(nd_transpose(m, 0, 1, &mt)); /* [[5,0],[-7,9],[2,-1]] */
    OK(nd_sort(mt, 0, 0, &v, NULL));
    EXPECT("sort transposed", v, ND_INT64, S(3, 2), V(-7, -1, 2, 0, 5, 9));
    nd_release(v);
    /* big int64 values keep full precision */
    nd_tensor *bi;
    int64_t bv[3] = {INT64_MAX, INT64_MAX - 1, INT64_MIN};
    OK(nd_from_buffer(bv, S(3), ND_INT64, &bi));
    OK(nd_sort(bi, 0, 0, NULL, &i));
    EXPECT("sort int64 extremes", i, ND_INT64, S(3), V(2, 1, 0));
    nd_release(i);
    /* a step slice */
    nd_tensor *w = mk(ND_FLOAT32, S(8), V(4, 0, 3, 0, 2, 0, 1, 0)), *ws;
    OK(nd_slice(w, 0, 0, 8, 2, &ws));
    OK(nd_sort(ws, 0, 0, &v, &i));
    EXPECT("sort step slice", v, ND_FLOAT32, S(4), V(1, 2, 3, 4));
    EXPECT("sort step slice idx", i, ND_INT64, S(4), V(3, 2, 1, 0));
    nd_release(v);
    nd_release(i);

    /* 0-dim */
    nd_tensor *sc;
    OK(nd_scalar(3, ND_FLOAT32, &sc));
    OK(nd_sort(sc, 0, 0, &v, &i));
    CHECKM(nd_ndim(v) == 0 && nd_ndim(i) == 0, "sort 0-dim keeps 0 dims");
    expect_at(__LINE__, "sort 0-dim index", i, ND_INT64, NULL, 0, V(0));
    nd_release(v);
    nd_release(i);
    nd_release(sc);

    /* topk */
    nd_tensor *t = mk(ND_FLOAT32, S(2, 5), V(1, 5, 3, 4, 2, 9, 8, 7, 6, 10));
    OK(nd_topk(t, 2, 1, 1, &v, &i));
    EXPECT("topk largest", v, ND_FLOAT32, S(2, 2), V(5, 4, 10, 9));
    EXPECT("topk largest idx", i, ND_INT64, S(2, 2), V(1, 3, 4, 0));
    nd_release(v);
    nd_release(i);
    OK(nd_topk(t, 3, -1, 0, &v, &i));
    EXPECT("topk smallest", v, ND_FLOAT32, S(2, 3), V(1, 2, 3, 6, 7, 8));
    EXPECT("topk smallest idx", i, ND_INT64, S(2, 3), V(0, 4, 2, 3, 2, 1));
    nd_release(v);
    nd_release(i);
    OK(nd_topk(t, 1, 0, 1, &v, &i));
    EXPECT("topk dim 0", v, ND_FLOAT32, S(1, 5), V(9, 8, 7, 6, 10));
    nd_release(v);
    nd_release(i);
    EXPECT_ERR("topk k too big", nd_topk(t, 6, 1, 1, &v, &i), ND_ERR_INDEX, "topk", "6");

    /* large sort, threads 1 vs 2 */
    int64_t n = 200000;
    nd_tensor *big, *v1, *v2, *i1, *i2;
    nd_manual_seed(7);
    OK(nd_randint(0, 1000, S(4, 50000), ND_FLOAT32, &big));
    (void)n;
    omp_set_num_threads(1);
    OK(nd_sort(big, 1, 0, &v1, &i1));
    omp_set_num_threads(2);
    OK(nd_sort(big, 1, 0, &v2, &i2));
    CHECKM(memcmp(nd_data(v1), nd_data(v2), 200000 * 4) == 0, "sort values differ by threads");
    CHECKM(memcmp(nd_data(i1), nd_data(i2), 200000 * 8) == 0, "sort indices differ by threads");
    const float *vp = nd_data(v1), *bp = nd_data(big);
    const int64_t *ipp = nd_data(i1);
    int ok = 1;
    for (int64_t r = 0; r < 4 && ok; r++)
        for (int64_t k = 0; k < 50000 && ok; k++) {
            int64_t q = r * 50000 + k;
            ok = vp[q] == bp[r * 50000 + ipp[q]];
            if (k) ok = ok && (vp[q - 1] < vp[q] || (vp[q - 1] == vp[q] && ipp[q - 1] < ipp[q]));
        }
    CHECKM(ok, "large sort is not sorted and stable");
    nd_tensor *ts[] = {x, z, m, mt, bi, w, ws, t, big, v1, v2, i1, i2};
    for (size_t q = 0; q < sizeof ts / sizeof *ts; q++) nd_release(ts[q]);
}

static void test_join(void) {
    nd_tensor *a = mk(ND_FLOAT32, S(2, 2), V(1, 2, 3, 4));
    nd_tensor *b = mk(ND_FLOAT64, S(1, 2), V(5, 6));
    nd_tensor *e = mk(ND_FLOAT32, S(0), (const double[]){0}, 0); /* shape {0}: skipped */
    nd_tensor *r, *at;
    nd_tensor *l1[] = {a, e, b};
    OK(nd_cat(l1, 3, 0, &r));
    EXPECT("cat dim 0 promotes", r, ND_FLOAT64, S(3, 2), V(1, 2, 3, 4, 5, 6));
    nd_release(r);
    OK(nd_transpose(a, 0, 1, &at)); /* [[1,3],[2,4]] */
    nd_tensor *l2[] = {a, at};
    OK(nd_cat(l2, 2, -1, &r));
    EXPECT("cat dim 1 transposed", r, ND_FLOAT32, S(2, 4), V(1, 2, 1, 3, 3, 4, 2, 4));
    nd_release(r);
    nd_tensor *l3[] = {a, b};
    EXPECT_ERR("cat mismatch", nd_cat(l3, 2, 1, &r), ND_ERR_SHAPE, "cat", "{1,2}");
    nd_tensor *s0;
    OK(nd_scalar(1, ND_FLOAT32, &s0));
    nd_tensor *l4[] = {a, s0};
    EXPECT_ERR("cat 0-dim", nd_cat(l4, 2, 0, &r), ND_ERR_SHAPE, "cat", "zero-dimensional");

    nd_tensor *p = mk(ND_INT64, S(2), V(1, 2)), *q = mk(ND_INT64, S(2), V(3, 4));
    nd_tensor *l5[] = {p, q};
    OK(nd_stack(l5, 2, 0, &r));
    EXPECT("stack dim 0", r, ND_INT64, S(2, 2), V(1, 2, 3, 4));
    nd_release(r);
    OK(nd_stack(l5, 2, -1, &r));
    EXPECT("stack dim -1", r, ND_INT64, S(2, 2), V(1, 3, 2, 4));
    nd_release(r);
    nd_tensor *l6[] = {a, at, a};
    OK(nd_stack(l6, 3, 1, &r));
    EXPECT("stack dim 1", r, ND_FLOAT32, S(2, 3, 2), V(1, 2, 1, 3, 1, 2, 3, 4, 2, 4, 3, 4));
    nd_release(r);
    nd_tensor *l7[] = {p, a};
    EXPECT_ERR("stack mismatch", nd_stack(l7, 2, 0, &r), ND_ERR_SHAPE, "stack", "{2,2}");

    nd_tensor *x = mk(ND_FLOAT32, S(2, 3), V(1, 2, 3, 4, 5, 6));
    OK(nd_flip(x, (int[]){0}, 1, &r));
    EXPECT("flip 0", r, ND_FLOAT32, S(2, 3), V(4, 5, 6, 1, 2, 3));
    nd_release(r);
    OK(nd_flip(x, (int[]){-1}, 1, &r));
    EXPECT("flip 1", r, ND_FLOAT32, S(2, 3), V(3, 2, 1, 6, 5, 4));
    nd_release(r);
    OK(nd_flip(x, (int[]){0, 1}, 2, &r));
    EXPECT("flip both", r, ND_FLOAT32, S(2, 3), V(6, 5, 4, 3, 2, 1));
    nd_release(r);
    nd_tensor *xt;
    OK(nd_transpose(x, 0, 1, &xt)); /* [[1,4],[2,5],[3,6]] */
    OK(nd_flip(xt, (int[]){0}, 1, &r));
    EXPECT("flip transposed", r, ND_FLOAT32, S(3, 2), V(3, 6, 2, 5, 1, 4));
    CHECKM(nd_is_contiguous(r), "flip result is contiguous");
    nd_release(r);
    EXPECT_ERR("flip dup", nd_flip(x, (int[]){1, -1}, 2, &r), ND_ERR_ARG, "flip", "more than once");

    OK(nd_pad(x, (int64_t[]){1, 1}, 1, 0, &r));
    EXPECT("pad last", r, ND_FLOAT32, S(2, 5), V(0, 1, 2, 3, 0, 0, 4, 5, 6, 0));
    nd_release(r);
    OK(nd_pad(x, (int64_t[]){0, 1, 1, 0}, 2, 9, &r));
    EXPECT("pad two dims", r, ND_FLOAT32, S(3, 4), V(9, 9, 9, 9, 1, 2, 3, 9, 4, 5, 6, 9));
    nd_release(r);
    OK(nd_pad(x, (int64_t[]){-1, 1}, 1, 0, &r));
    EXPECT("pad crop", r, ND_FLOAT32, S(2, 3), V(2, 3, 0, 5, 6, 0));
    nd_release(r);
    OK(nd_pad(xt, (int64_t[]){0, 0, -1, -1}, 2, 0, &r));
    EXPECT("pad crop transposed", r, ND_FLOAT32, S(1, 2), V(2, 5));
    nd_release(r);
    EXPECT_ERR("pad negative size", nd_pad(x, (int64_t[]){-2, -2}, 1, 0, &r), ND_ERR_SHAPE, "pad",
               "-1");
    EXPECT_ERR("pad too many pairs", nd_pad(x, (int64_t[]){0, 0, 0, 0, 0, 0}, 3, 0, &r),
               ND_ERR_ARG, "pad", "3 pairs");
    nd_tensor *ts[] = {a, b, e, at, s0, p, q, x, xt};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) nd_release(ts[k]);
}

/* ---- random ---- */

static void test_philox_kat(void) {
    /* Random123 tests/kat_vectors, philox4x32 10 */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        nd_philox4x32_10(kat[k], kat[k] + 4, out);
        CHECKM(memcmp(out, kat[k] + 6, sizeof out) == 0, "philox KAT %d: %08x %08x %08x %08x", k,
              out[0], out[1], out[2], out[3]);
    }
}

typedef nd_status (*gen_fn)(nd_tensor **out);
static nd_status gen_rand(nd_tensor **o) { return nd_rand(S(100000), ND_FLOAT32, o); }
static nd_status gen_rand64(nd_tensor **o) { return nd_rand(S(100000), ND_FLOAT64, o); }
static nd_status gen_randn(nd_tensor **o) { return nd_randn(S(100000), ND_FLOAT32, o); }
static nd_status gen_randn64(nd_tensor **o) { return nd_randn(S(100000), ND_FLOAT64, o); }
static nd_status gen_randint(nd_tensor **o) { return nd_randint(-5, 7, S(100000), ND_INT64, o); }
static nd_status gen_randperm(nd_tensor **o) { return nd_randperm(100000, o); }

static void test_random(void) {
    test_philox_kat();
    nd_tensor *r, *r2;
    /* element 0 with seed 0, offset 0 is counter 0 under key 0: the KAT's first word */
    nd_rng_set_state(0, 0);
    OK(nd_rand(S(1), ND_FLOAT32, &r));
    EXPECT("rand first value", r, ND_FLOAT32, S(1), V((0x6627e8d5u >> 8) * 0x1p-24));
    nd_release(r);
    uint64_t seed, off;
    nd_rng_get_state(&seed, &off);
    CHECKM(seed == 0 && off == 4, "state after 1 value: seed %llu offset %llu",
          (unsigned long long)seed, (unsigned long long)off);
    OK(nd_rand(S(5), ND_FLOAT32, &r));
    nd_rng_get_state(&seed, &off);
    CHECKM(off == 12, "offset after 5 more values: %llu", (unsigned long long)off);
    /* same state, same values; manual_seed resets the offset */
    nd_rng_set_state(0, 4);
    OK(nd_rand(S(5), ND_FLOAT32, &r2));
    CHECKM(memcmp(nd_data(r), nd_data(r2), 20) == 0, "rand not reproducible from state");
    nd_release(r);
    nd_release(r2);
    nd_manual_seed(42);
    OK(nd_randn(S(3, 3), ND_FLOAT64, &r));
    OK(nd_randn(S(3, 3), ND_FLOAT64, &r2));
    CHECKM(memcmp(nd_data(r), nd_data(r2), 72) != 0, "successive calls repeat values");
    nd_release(r2);
    nd_manual_seed(42);
    OK(nd_randn(S(3, 3), ND_FLOAT64, &r2));
    CHECKM(memcmp(nd_data(r), nd_data(r2), 72) == 0, "manual_seed does not reproduce");
    nd_release(r);
    nd_release(r2);

    /* The fill draws 8 stream positions at a time (cpu_random.c: AVX2 lanes
     * where the CPU has them): element i of a bulk draw must be element 0 of
     * a one-element draw at counter offset + i, for every lane, at offsets
     * that are not multiples of 8 and across the counter's 32-bit carry.
     * randn float64 reads all four words of each position; element 0 at
     * state (0, 0) is tied to the KAT above by the rand check. */
    {
        const uint64_t seeds[2] = {0, 0x243f6a8885a308d3ull};
        const uint64_t offs[3] = {0, 13, 0xfffffffdull};
        for (int si = 0; si < 2; si++)
            for (int oi = 0; oi < 3; oi++) {
                nd_rng_set_state(seeds[si], offs[oi]);
                OK(nd_randn(S(21), ND_FLOAT64, &r));
                const double *bulk = nd_data(r);
                for (int i = 0; i < 21; i++) {
                    nd_rng_set_state(seeds[si], offs[oi] + (uint64_t)i);
                    OK(nd_randn(S(1), ND_FLOAT64, &r2));
                    CHECKM(memcmp(nd_data(r2), bulk + i, 8) == 0,
                           "randn element %d at seed %llx offset %llx: %.17g in bulk, %.17g alone", i,
                           (unsigned long long)seeds[si], (unsigned long long)offs[oi], bulk[i],
                           *(const double *)nd_data(r2));
                    nd_release(r2);
                }
                nd_release(r);
            }
    }

    /* thread count does not change anything */
    gen_fn gens[] = {gen_rand, gen_rand64, gen_randn, gen_randn64, gen_randint, gen_randperm};
    const char *names[] = {"rand", "rand64", "randn", "randn64", "randint", "randperm"};
    for (int g = 0; g < 6; g++) {
        nd_manual_seed(1234);
        omp_set_num_threads(1);
        OK(gens[g](&r));
        nd_manual_seed(1234);
        omp_set_num_threads(2);
        OK(gens[g](&r2));
        size_t bytes = (size_t)nd_numel(r) * nd_dtype_size(nd_get_dtype(r));
        CHECKM(memcmp(nd_data(r), nd_data(r2), bytes) == 0, "%s differs between 1 and 2 threads",
              names[g]);
        nd_release(r);
        nd_release(r2);
    }
    nd_tensor *p, *b1, *b2;
    OK(nd_full(S(100000), ND_FLOAT32, 0.3, &p));
    nd_manual_seed(5);
    omp_set_num_threads(1);
    OK(nd_bernoulli(p, &b1));
    nd_manual_seed(5);
    omp_set_num_threads(2);
    OK(nd_bernoulli(p, &b2));
    CHECKM(memcmp(nd_data(b1), nd_data(b2), 400000) == 0, "bernoulli differs between threads");

    /* statistics (n = 1e5: standard errors about 0.001-0.003) */
    nd_manual_seed(99);
    const float *bp = nd_data(b1);
    double s = 0;
    for (int k = 0; k < 100000; k++) s += bp[k];
    CHECKM(fabs(s / 1e5 - 0.3) < 0.01, "bernoulli(0.3) mean %g", s / 1e5);
    CHECKM(nd_get_dtype(b1) == ND_FLOAT32, "bernoulli dtype");
    OK(gen_rand(&r));
    const float *fp = nd_data(r);
    double mn = 1, mx = 0;
    s = 0;
    for (int k = 0; k < 100000; k++) {
        s += fp[k];
        mn = fmin(mn, fp[k]);
        mx = fmax(mx, fp[k]);
    }
    CHECKM(fabs(s / 1e5 - 0.5) < 0.01 && mn >= 0 && mx < 1 && mx > 0.999 && mn < 0.001,
          "rand: mean %g min %g max %g", s / 1e5, mn, mx);
    nd_release(r);
    OK(gen_randn64(&r));
    const double *dp = nd_data(r);
    double s2 = 0;
    s = 0;
    for (int k = 0; k < 100000; k++) { s += dp[k]; s2 += dp[k] * dp[k]; }
    double mean = s / 1e5, sd = sqrt(s2 / 1e5 - mean * mean);
    CHECKM(fabs(mean) < 0.02 && fabs(sd - 1) < 0.02, "randn: mean %g std %g", mean, sd);
    nd_release(r);
    OK(gen_randn(&r));
    fp = nd_data(r);
    s = s2 = 0;
    for (int k = 0; k < 100000; k++) { s += fp[k]; s2 += (double)fp[k] * fp[k]; }
    mean = s / 1e5;
    sd = sqrt(s2 / 1e5 - mean * mean);
    CHECKM(fabs(mean) < 0.02 && fabs(sd - 1) < 0.02, "randn float32: mean %g std %g", mean, sd);
    nd_release(r);
    OK(gen_randint(&r));
    const int64_t *ip = nd_data(r);
    int64_t cnt[12] = {0};
    int inrange = 1;
    for (int k = 0; k < 100000; k++) {
        if (ip[k] < -5 || ip[k] >= 7) inrange = 0;
        else cnt[ip[k] + 5]++;
    }
    int spread = 1;
    for (int k = 0; k < 12; k++) spread &= cnt[k] > 7500 && cnt[k] < 9200;
    CHECKM(inrange && spread, "randint [-5,7): in range %d, counts ok %d", inrange, spread);
    nd_release(r);
    OK(nd_randint(0, 3, S(2, 3), ND_INT32, &r));
    CHECKM(nd_get_dtype(r) == ND_INT32, "randint int32 dtype");
    nd_release(r);
    OK(gen_randperm(&r));
    ip = nd_data(r);
    char *seen = calloc(100000, 1);
    int perm = 1;
    for (int k = 0; k < 100000 && perm; k++) {
        perm = ip[k] >= 0 && ip[k] < 100000 && !seen[ip[k]];
        if (perm) seen[ip[k]] = 1;
    }
    free(seen);
    CHECKM(perm && nd_get_dtype(r) == ND_INT64, "randperm is not a permutation");
    CHECKM(ip[0] != 0 || ip[1] != 1 || ip[2] != 2, "randperm did not shuffle");
    nd_release(r);
    OK(nd_randperm(0, &r));
    CHECKM(nd_numel(r) == 0, "randperm(0) is empty");
    nd_release(r);

    /* bernoulli extremes and errors */
    nd_tensor *pe = mk(ND_FLOAT64, S(4), V(0, 1, 0, 1));
    OK(nd_bernoulli(pe, &r));
    EXPECT("bernoulli 0/1", r, ND_FLOAT64, S(4), V(0, 1, 0, 1));
    nd_release(r);
    nd_tensor *pb = mk(ND_FLOAT32, S(3), V(0.5, 1.5, 0.2));
    EXPECT_ERR("bernoulli p > 1", nd_bernoulli(pb, &r), ND_ERR_ARG, "bernoulli", "1.5");
    nd_tensor *pn = mk(ND_FLOAT32, S(3), V(0.5, -0.25, 0.2));
    EXPECT_ERR("bernoulli p < 0", nd_bernoulli(pn, &r), ND_ERR_ARG, "bernoulli", "-0.25");
    nd_tensor *pnan = mk(ND_FLOAT32, S(3), V(0.5, NAN, 0.2));
    EXPECT_ERR("bernoulli p nan", nd_bernoulli(pnan, &r), ND_ERR_ARG, "bernoulli", "nan");
    nd_tensor *pi = mk(ND_INT64, S(2), V(0, 1));
    EXPECT_ERR("bernoulli int p", nd_bernoulli(pi, &r), ND_ERR_DTYPE, "bernoulli", "int64");
    EXPECT_ERR("rand int dtype", nd_rand(S(2), ND_INT64, &r), ND_ERR_DTYPE, "rand", "int64");
    EXPECT_ERR("randint empty range", nd_randint(3, 3, S(2), ND_INT64, &r), ND_ERR_ARG, "randint",
               "3");
    EXPECT_ERR("randint uint8 range", nd_randint(0, 300, S(2), ND_UINT8, &r), ND_ERR_ARG,
               "randint", "uint8");
    EXPECT_ERR("randperm negative", nd_randperm(-1, &r), ND_ERR_ARG, "randperm", "-1");

    /* bernoulli reads a transposed p in its own row-major order */
    nd_tensor *p01 = mk(ND_FLOAT32, S(2, 3), V(0, 1, 1, 0, 0, 1)), *p01t;
    OK(nd_transpose(p01, 0, 1, &p01t));
    OK(nd_bernoulli(p01t, &r));
    EXPECT("bernoulli transposed p", r, ND_FLOAT32, S(3, 2), V(0, 0, 1, 0, 1, 1));
    nd_release(r);
    /* the kernel on a non-contiguous out: element i of the view's row-major
     * order still uses counter offset + i */
    nd_tensor *base, *view, *flatv;
    OK(nd_empty(S(3, 4), ND_FLOAT64, &base));
    OK(nd_transpose(base, 0, 1, &view)); /* {4,3}, not contiguous */
    OK(nd_empty(S(4, 3), ND_FLOAT64, &flatv));
    OK(nd_cpu_random(view, ND_RANDOM_NORMAL, 1, 2, NULL, 77, 8));
    OK(nd_cpu_random(flatv, ND_RANDOM_NORMAL, 1, 2, NULL, 77, 8));
    double *vv = values_of(view), *fv = values_of(flatv);
    CHECKM(memcmp(vv, fv, 12 * sizeof(double)) == 0, "random into a strided out");
    free(vv);
    free(fv);
    nd_release(base);
    nd_release(view);
    nd_release(flatv);
    /* float16 rand stays in [0, 1) */
    OK(nd_rand(S(5000), ND_FLOAT16, &r));
    double *hv = values_of(r);
    int in01 = 1;
    for (int k = 0; k < 5000; k++) in01 &= hv[k] >= 0 && hv[k] < 1;
    CHECKM(in01, "float16 rand outside [0, 1)");
    free(hv);
    nd_release(r);
    nd_release(p01);
    nd_release(p01t);
    nd_tensor *ts[] = {p, b1, b2, pe, pb, pn, pnan, pi};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) nd_release(ts[k]);
}

/* The message as the Lua layer shows it (dims and indices 1-based). */
static void expect_lua_msg_at(int line, const char *what, const char *frag) {
    checks++;
    const char *msg = nd_last_error_based(1);
    if (!strstr(msg, frag)) FAIL_AT(line, "%s: 1-based message '%s' lacks '%s'", what, msg, frag);
}
#define EXPECT_LUA_MSG(what, frag) expect_lua_msg_at(__LINE__, what, frag)

/* ---- positions in messages render 1-based for Lua ---- */

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
    idx = mk(ND_INT64, S(2, 2), V(0, 1, 2, 4));
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
    idx = mk(ND_INT64, S(2, 2), V(0, 0, -1, 0));
    EXPECT_ERR("scatter_add negative index", nd_scatter(x, 0, idx, x, 1, &r), ND_ERR_INDEX,
               "scatter_add: index -1 is out of bounds for dim 0 with size 2",
               "(at position {1,0} of the index tensor)");
    EXPECT_LUA_MSG("scatter_add negative index, Lua", "index -1 is out of bounds for dim 1 with "
                   "size 2 (at position {2,1} of the index tensor)");
    nd_release(idx);
    /* 8-dim index: the longest position fits */
    nd_tensor *x8, *i8;
    OK(nd_full(S(1, 1, 1, 1, 1, 1, 1, 2), ND_FLOAT32, 0, &x8));
    i8 = mk(ND_INT64, S(1, 1, 1, 1, 1, 1, 1, 2), V(0, 9));
    EXPECT_ERR("gather 8-dim position", nd_gather(x8, 7, i8, &r), ND_ERR_INDEX,
               "(at position {0,0,0,0,0,0,0,1} of the index tensor)", NULL);
    EXPECT_LUA_MSG("gather 8-dim position, Lua", "(at position {1,1,1,1,1,1,1,2} of the index");
    nd_release(i8);
    nd_release(x8);
    nd_release(x);
}

int main(void) {
    int64_t live0 = nd_live_bytes();
    int threads = omp_get_max_threads();
    test_gather();
    test_scatter();
    test_index_select_add();
    test_masked_fill_one_hot();
    test_cumsum();
    test_sort_topk();
    omp_set_num_threads(threads);
    test_join();
    test_positions();
    test_random();
    omp_set_num_threads(threads);
    int64_t live1 = nd_live_bytes();
    CHECKM(live1 == live0, "leak: %lld live bytes at start, %lld at the end", (long long)live0,
          (long long)live1);
    printf("%s: %d checks, %d failed\n", failures ? "FAILED" : "ok", checks, failures);
    return failures ? 1 : 0;
}
