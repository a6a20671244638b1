/* test_index_fuzz.c - gather, scatter(_add), index_select, index_add,
 * cumsum and sort on random shapes, dims and layouts (permuted, stepped,
 * large enough to go parallel), compared with plain loops over row-major
 * copies. Exercises every path of the dim loop (slices and lane tiles). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"

static int failures = 0, trials = 0;
static uint64_t rng = 88172645463325252ull;

static uint64_t next(void) { /* xorshift64: the test's own inputs */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static int64_t rnd(int64_t n) { return (int64_t)(next() % (uint64_t)n); }

#define REQ(expr) do { nd_status s_ = (expr); if (s_ != ND_OK) { failures++; \
        printf("FAIL line %d (trial %d): %s -> %s\n", __LINE__, trials, #expr, nd_last_error()); \
        exit(1); } } while (0)

static double *values_of(const nd_tensor *t) {
    nd_tensor *f;
    REQ(nd_to_dtype(t, ND_FLOAT64, &f));
    size_t n = (size_t)nd_numel(f);
    double *v = malloc((n ? n : 1) * sizeof *v);
    REQ(nd_copy_to_buffer(f, v, n * sizeof *v));
    nd_release(f);
    return v;
}

/* A tensor of `shape` in a random layout: contiguous, permuted, or a step-2
 * slice of a larger one. Values from make(i). */
static nd_tensor *random_layout(const int64_t *shape, int ndim, nd_dtype dt, double (*make)(void)) {
    int kind = (int)rnd(3);
    int64_t big[8];
    int perm[8];
    for (int i = 0; i < ndim; i++) { big[i] = shape[i]; perm[i] = i; }
    if (kind == 1) /* shuffle the storage order, view back */
        for (int i = ndim - 1; i > 0; i--) { int j = (int)rnd(i + 1); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int sd = (int)rnd(ndim);
    if (kind == 2) big[sd] = shape[sd] * 2;
    int64_t pshape[8];
    for (int i = 0; i < ndim; i++) pshape[i] = big[perm[i]];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= pshape[i];
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = make();
    nd_tensor *base, *typed, *t;
    REQ(nd_from_buffer(v, pshape, ndim, ND_FLOAT64, &base));
    free(v);
    REQ(nd_to_dtype(base, dt, &typed));
    nd_release(base);
    int inv[8];
    for (int i = 0; i < ndim; i++) inv[perm[i]] = i;
    REQ(nd_permute(typed, inv, ndim, &t));
    nd_release(typed);
    if (kind == 2) {
        nd_tensor *s;
        REQ(nd_slice(t, sd, 1, big[sd], 2, &s));
        nd_release(t);
        t = s;
    }
    return t;
}

static double make_val(void) { return (double)(rnd(2001) - 1000) / 8.0; }
static int64_t g_limit;
static double make_idx(void) { return (double)rnd(g_limit); }

static int64_t flat(const int64_t *pos, const int64_t *shape, int ndim) {
    int64_t f = 0;
    for (int i = 0; i < ndim; i++) f = f * shape[i] + pos[i];
    return f;
}
static void unflat(int64_t f, const int64_t *shape, int ndim, int64_t *pos) {
    for (int i = ndim - 1; i >= 0; i--) { pos[i] = f % shape[i]; f /= shape[i]; }
}

static void compare(const char *what, const nd_tensor *got, const double *want, int64_t n) {
    double *g = values_of(got);
    for (int64_t i = 0; i < n; i++)
        if (!(g[i] == want[i] || (isnan(g[i]) && isnan(want[i])))) {
            failures++;
            printf("FAIL trial %d: %s element %lld: got %g want %g\n", trials, what,
                   (long long)i, g[i], want[i]);
            break;
        }
    free(g);
}

static void random_shape(int64_t *shape, int *ndim) {
    *ndim = 1 + (int)rnd(4);
    for (int i = 0; i < *ndim; i++) shape[i] = 1 + rnd(6);
    if (rnd(3) == 0) shape[rnd(*ndim)] = 2000 + rnd(3000); /* big enough for threads */
}

static void trial(void) {
    int64_t xs[8], is[8], pos[8];
    int nd;
    random_shape(xs, &nd);
    int dim = (int)rnd(nd);
    nd_dtype dt = rnd(2) ? ND_FLOAT64 : ND_FLOAT32;
    nd_tensor *x = random_layout(xs, nd, dt, make_val);
    double *xv = values_of(x);
    int64_t xn = nd_numel(x);

    /* gather / scatter index: no larger than x except along dim */
    for (int i = 0; i < nd; i++) is[i] = 1 + rnd(xs[i]);
    is[dim] = 1 + rnd(2 * xs[dim] > 6000 ? 6000 : 2 * xs[dim]);
    g_limit = xs[dim];
    nd_tensor *idx = random_layout(is, nd, ND_INT64, make_idx);
    double *iv = values_of(idx);
    int64_t in = nd_numel(idx);

    nd_tensor *r;
    REQ(nd_gather(x, dim, idx, &r));
    double *want = malloc((size_t)(in > xn ? in : xn) * sizeof *want);
    for (int64_t f = 0; f < in; f++) {
        unflat(f, is, nd, pos);
        pos[dim] = (int64_t)iv[f];
        want[f] = xv[flat(pos, xs, nd)];
    }
    compare("gather", r, want, in);
    nd_release(r);

    /* scatter / scatter_add with src in index's shape */
    nd_tensor *src = random_layout(is, nd, dt, make_val);
    double *sv = values_of(src);
    for (int acc = 0; acc < 2; acc++) {
        REQ(nd_scatter(x, dim, idx, src, acc, &r));
        memcpy(want, xv, (size_t)xn * sizeof *want);
        for (int64_t f = 0; f < in; f++) {
            unflat(f, is, nd, pos);
            pos[dim] = (int64_t)iv[f];
            int64_t o = flat(pos, xs, nd);
            if (acc) want[o] = dt == ND_FLOAT32 ? (double)(float)(want[o] + sv[f]) : want[o] + sv[f];
            else want[o] = sv[f];
        }
        compare(acc ? "scatter_add" : "scatter", r, want, xn);
        nd_release(r);
    }

    /* index_select / index_add with a 1-D index of k entries */
    int64_t k = 1 + rnd(2 * xs[dim] > 6000 ? 6000 : 2 * xs[dim]);
    nd_tensor *i1 = random_layout(&k, 1, ND_INT64, make_idx);
    double *i1v = values_of(i1);
    REQ(nd_index_select(x, dim, i1, &r));
    int64_t os[8];
    memcpy(os, xs, sizeof os);
    os[dim] = k;
    int64_t on = nd_numel(r);
    double *want2 = malloc((size_t)(on > xn ? on : xn) * sizeof *want2);
    for (int64_t f = 0; f < on; f++) {
        unflat(f, os, nd, pos);
        pos[dim] = (int64_t)i1v[pos[dim]];
        want2[f] = xv[flat(pos, xs, nd)];
    }
    compare("index_select", r, want2, on);
    nd_release(r);
    nd_tensor *asrc = random_layout(os, nd, dt, make_val);
    double *av = values_of(asrc);
    REQ(nd_index_add(x, dim, i1, asrc, 2.0, &r));
    memcpy(want2, xv, (size_t)xn * sizeof *want2);
    for (int64_t f = 0; f < on; f++) {
        unflat(f, os, nd, pos);
        pos[dim] = (int64_t)i1v[pos[dim]];
        int64_t o = flat(pos, xs, nd);
        double s = want2[o] + 2.0 * av[f];
        want2[o] = dt == ND_FLOAT32 ? (double)(float)s : s;
    }
    compare("index_add", r, want2, xn);
    nd_release(r);

    /* cumsum (exact: values are multiples of 1/8 and sums stay small) */
    REQ(nd_cumsum(x, dim, &r));
    for (int64_t f = 0; f < xn; f++) {
        unflat(f, xs, nd, pos);
        if (pos[dim] == 0) {
            double acc = 0;
            for (int64_t j = 0; j < xs[dim]; j++) {
                pos[dim] = j;
                int64_t o = flat(pos, xs, nd);
                acc += xv[o];
                want[o] = dt == ND_FLOAT32 ? (double)(float)acc : acc;
            }
        }
    }
    compare("cumsum", r, want, xn);
    nd_release(r);

    /* sort: sorted along dim, values match indices, stable */
    nd_tensor *v, *si;
    int desc = (int)rnd(2);
    REQ(nd_sort(x, dim, desc, &v, &si));
    double *vv = values_of(v), *siv = values_of(si);
    int ok = 1;
    for (int64_t f = 0; f < xn && ok; f++) {
        unflat(f, xs, nd, pos);
        int64_t j = pos[dim];
        pos[dim] = (int64_t)siv[f];
        ok = vv[f] == xv[flat(pos, xs, nd)];
        if (ok && j > 0) {
            double a = vv[f], prev;
            pos[dim] = j - 1;
            prev = vv[flat(pos, xs, nd)];
            double pi = siv[flat(pos, xs, nd)];
            ok = desc ? (prev > a || (prev == a && pi < siv[f])) : (prev < a || (prev == a && pi < siv[f]));
        }
    }
    if (!ok) {
        failures++;
        printf("FAIL trial %d: sort (dim %d, desc %d)\n", trials, dim, desc);
    }
    free(vv);
    free(siv);
    nd_release(v);
    nd_release(si);

    free(xv); free(iv); free(sv); free(i1v); free(av); free(want); free(want2);
    nd_release(x); nd_release(idx); nd_release(src); nd_release(i1); nd_release(asrc);
}

int main(void) {
    int64_t live0 = nd_live_bytes();
    int n = getenv("NEEDLE_FUZZ_TRIALS") ? atoi(getenv("NEEDLE_FUZZ_TRIALS")) : 300;
    for (trials = 0; trials < n; trials++) {
        if (trials % 3 == 1) omp_set_num_threads(1);
        if (trials % 3 == 2) omp_set_num_threads(3);
        trial();
    }
    if (nd_live_bytes() != live0) {
        failures++;
        printf("FAIL: leak, %lld live bytes before, %lld after\n", (long long)live0,
               (long long)nd_live_bytes());
    }
    printf("%s: %d trials, %d failures\n", failures ? "FAILED" : "ok", trials, failures);
    return failures ? 1 : 0;
}
