/* test_api.c - the public C API (needle.h) as an embedding host sees it:
 * creation, metadata, views sharing memory, view vs reshape, dtype
 * conversion (float16/bfloat16 round trips), reading non-contiguous tensors
 * back, broadcasting, reductions, matmul against a naive loop, error
 * statuses and messages, refcounting and borrowed buffers, and that live
 * bytes return to where they started. Uses only needle.h.
 *
 * Exit status 0 when every check passes; each failure is printed as
 * file:line. The last line is "N checks passed" (or "F of N checks failed"). */
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#include "check.h"

/* The absurd-size checks ask for ~256 TiB: under AddressSanitizer that must
 * come back as NULL (then ND_ERR_MEMORY) instead of ASan aborting the test.
 * Ignored when the test is not built with ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* A call that must fail with status st and a message containing substr. */
#define FAILS(expr, st, substr) do { checks++; nd_status s_ = (expr); \
        if (s_ != (st)) FAIL("%s -> %s (%s), expected %s", #expr, nd_status_name(s_), \
                             s_ ? nd_last_error() : "", nd_status_name(st)); \
        else if (!strstr(nd_last_error(), (substr))) \
            FAIL("%s: message \"%s\" does not contain \"%s\"", #expr, nd_last_error(), (substr)); \
    } while (0)

static void release_all(nd_tensor **ts, int n) {
    for (int i = 0; i < n; i++) { nd_release(ts[i]); ts[i] = NULL; }
}

/* Elements of any tensor (any strides, any dtype) as doubles, row-major.
 * Caller frees. NULL (and a failure) when it cannot be read. */
static double *values(const nd_tensor *t) {
    nd_tensor *f = NULL;
    nd_status st = nd_to_dtype(t, ND_FLOAT64, &f);
    if (st != ND_OK) { FAIL("values: %s", nd_last_error()); return NULL; }
    size_t n = (size_t)nd_numel(f);
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (v && nd_copy_to_buffer(f, v, n * sizeof *v) != ND_OK) {
        FAIL("values: %s", nd_last_error());
        free(v);
        v = NULL;
    }
    nd_release(f);
    return v;
}

static int same_shape(const nd_tensor *t, const int64_t *shape, int ndim) {
    if (nd_ndim(t) != ndim) return 0;
    for (int i = 0; i < ndim; i++) if (nd_shape(t)[i] != shape[i]) return 0;
    return 1;
}

static int close_to(double g, double e, double tol) {
    return (isnan(g) && isnan(e)) || g == e || fabs(g - e) <= tol * fmax(1.0, fabs(e));
}

/* Checks dtype, shape and values of t (tolerance relative, 1e-6). */
#define EXPECT(t, dt, shape_lit, vals_lit) expect_at(__LINE__, #t, t, dt, shape_lit, vals_lit)
static void expect_at(int line, const char *what, const nd_tensor *t, nd_dtype dt,
                      const int64_t *shape, int ndim, const double *v, int nv) {
    checks++;
    if (!t) { FAIL_AT(line, "%s is NULL", what); return; }
    if (nd_get_dtype(t) != dt || !same_shape(t, shape, ndim) || nd_numel(t) != nv) {
        failures++;
        check_place(__FILE__, line);
        printf("%s: got %s of %d dims {", what, nd_dtype_name(nd_get_dtype(t)), nd_ndim(t));
        for (int i = 0; i < nd_ndim(t); i++)
            printf("%s%lld", i ? "," : "", (long long)nd_shape(t)[i]);
        printf("}, expected %s of %d dims with %d elements\n", nd_dtype_name(dt), ndim, nv);
        return;
    }
    double *got = values(t);
    if (!got) { failures++; return; }
    for (int i = 0; i < nv; i++) {
        if (!close_to(got[i], v[i], 1e-6)) {
            FAIL_AT(line, "%s: element %d is %.9g, expected %.9g", what, i, got[i], v[i]);
            break;
        }
    }
    free(got);
}

/* ------------------------------------------------------------- library */

static void test_library(void) {
    CHECK(nd_version() && nd_version()[0]);
    CHECK(strcmp(nd_status_name(ND_OK), "ok") == 0);
    CHECK(strcmp(nd_status_name(ND_ERR_SHAPE), "shape mismatch") == 0);
    CHECK(strcmp(nd_dtype_name(ND_FLOAT32), "float32") == 0);
    CHECK(strcmp(nd_dtype_name(ND_FLOAT16), "float16") == 0);
    CHECK(nd_dtype_size(ND_FLOAT32) == 4 && nd_dtype_size(ND_FLOAT64) == 8);
    CHECK(nd_dtype_size(ND_INT64) == 8 && nd_dtype_size(ND_INT32) == 4);
    CHECK(nd_dtype_size(ND_UINT8) == 1 && nd_dtype_size(ND_BOOL) == 1);
    CHECK(nd_dtype_size(ND_FLOAT16) == 2 && nd_dtype_size(ND_BFLOAT16) == 2);
    CHECK(nd_dtype_is_float(ND_FLOAT32) && nd_dtype_is_float(ND_FLOAT16));
    CHECK(!nd_dtype_is_float(ND_INT64) && !nd_dtype_is_float(ND_BOOL));
    nd_dtype dt = ND_FLOAT32;
    OK(nd_dtype_from_name("bfloat16", &dt));
    CHECK(dt == ND_BFLOAT16);
    OK(nd_dtype_from_name("double", &dt));
    CHECK(dt == ND_FLOAT64);
    FAILS(nd_dtype_from_name("float8", &dt), ND_ERR_DTYPE, "float8");
    CHECK(strcmp(nd_unary_name(ND_UNARY_relu), "relu") == 0);
    CHECK(strcmp(nd_binary_name(ND_BINARY_maximum), "maximum") == 0);
    CHECK(strcmp(nd_reduce_name(ND_REDUCE_logsumexp), "logsumexp") == 0);
    int n = nd_get_num_threads();
    CHECK(n >= 1);
    nd_set_num_threads(1);
    CHECK(nd_get_num_threads() == 1);
    nd_set_num_threads(n);
    CHECK(nd_get_num_threads() == n);
}

/* ------------------------------------------------------------- creation */

static void test_creation(void) {
    nd_tensor *t[12] = {0};

    OK(nd_empty(S(2, 3), ND_FLOAT32, &t[0]));
    CHECK(nd_ndim(t[0]) == 2 && nd_numel(t[0]) == 6);
    CHECK(nd_shape(t[0])[0] == 2 && nd_shape(t[0])[1] == 3);
    CHECK(nd_strides(t[0])[0] == 3 && nd_strides(t[0])[1] == 1);
    CHECK(nd_get_dtype(t[0]) == ND_FLOAT32);
    CHECK(nd_is_contiguous(t[0]));
    CHECK(nd_data(t[0]) != NULL);

    OK(nd_zeros(S(2, 2), ND_INT64, &t[1]));
    EXPECT(t[1], ND_INT64, S(2, 2), V(0, 0, 0, 0));
    OK(nd_full(S(3), ND_INT32, 7, &t[2]));
    EXPECT(t[2], ND_INT32, S(3), V(7, 7, 7));

    OK(nd_scalar(2.5, ND_FLOAT64, &t[3]));
    CHECK(nd_ndim(t[3]) == 0 && nd_numel(t[3]) == 1 && nd_is_contiguous(t[3]));
    double item = 0;
    OK(nd_get_item(t[3], NULL, &item));
    CHECK(item == 2.5);

    OK(nd_arange(0, 5, 1, ND_FLOAT32, &t[4]));
    EXPECT(t[4], ND_FLOAT32, S(5), V(0, 1, 2, 3, 4));
    OK(nd_arange(1, 2, 0.25, ND_FLOAT64, &t[5]));
    EXPECT(t[5], ND_FLOAT64, S(4), V(1, 1.25, 1.5, 1.75));
    OK(nd_arange(10, 0, -3, ND_INT64, &t[6]));
    EXPECT(t[6], ND_INT64, S(4), V(10, 7, 4, 1));
    nd_tensor *bad = NULL;
    FAILS(nd_arange(0, 1, 0, ND_FLOAT32, &bad), ND_ERR_ARG, "arange");

    OK(nd_linspace(0, 1, 5, ND_FLOAT32, &t[7]));
    EXPECT(t[7], ND_FLOAT32, S(5), V(0, 0.25, 0.5, 0.75, 1));
    OK(nd_linspace(-1, 1, 1, ND_FLOAT64, &t[8]));
    EXPECT(t[8], ND_FLOAT64, S(1), V(-1));
    FAILS(nd_linspace(0, 1, -2, ND_FLOAT32, &bad), ND_ERR_ARG, "linspace");

    OK(nd_eye(2, 3, ND_FLOAT32, &t[9]));
    EXPECT(t[9], ND_FLOAT32, S(2, 3), V(1, 0, 0, 0, 1, 0));

    /* from_buffer copies: later writes to the source are not seen */
    float src[6] = {1, 2, 3, 4, 5, 6};
    OK(nd_from_buffer(src, S(3, 2), ND_FLOAT32, &t[10]));
    CHECK(nd_data(t[10]) != (void *)src);
    src[0] = 100;
    EXPECT(t[10], ND_FLOAT32, S(3, 2), V(1, 2, 3, 4, 5, 6));

    /* an empty tensor is fine */
    OK(nd_zeros(S(0, 3), ND_FLOAT32, &t[11]));
    CHECK(nd_numel(t[11]) == 0 && nd_ndim(t[11]) == 2 && nd_shape(t[11])[1] == 3);
    CHECK(nd_copy_to_buffer(t[11], NULL, 0) == ND_OK);

    release_all(t, 12);
}

/* from_borrowed: no copy, both directions see writes. */
static int borrowed_calls = 0;
static void *borrowed_ctx_seen = NULL;
static void on_borrowed_release(void *ctx) { borrowed_calls++; borrowed_ctx_seen = ctx; }

static void test_borrowed(void) {
    double buf[6] = {1, 2, 3, 4, 5, 6};
    int ctx_token = 0;
    nd_tensor *b = NULL, *v[4] = {0};
    borrowed_calls = 0;
    int64_t live0 = nd_live_bytes();
    OK(nd_from_borrowed(buf, S(2, 3), ND_FLOAT64, on_borrowed_release, &ctx_token, &b));
    CHECK(nd_data(b) == (void *)buf);
    CHECKM(nd_live_bytes() == live0, "borrowed memory is not the library's: live bytes %lld -> %lld",
           (long long)live0, (long long)nd_live_bytes());
    buf[4] = 50; /* host writes, tensor sees */
    double item = 0;
    OK(nd_get_item(b, (const int64_t[]){1, 1}, &item));
    CHECK(item == 50);
    OK(nd_fill_(b, 9)); /* tensor writes, host sees */
    CHECK(buf[0] == 9 && buf[5] == 9);

    /* views keep the buffer alive after the base is released */
    OK(nd_transpose(b, 0, 1, &v[0]));
    OK(nd_select(b, 0, 1, &v[1]));
    OK(nd_reshape(b, S(6), &v[2])); /* contiguous: a view */
    CHECK(nd_data(v[2]) == (void *)buf);
    CHECK(nd_data(v[1]) == (void *)(buf + 3));
    OK(nd_contiguous(v[2], &v[3])); /* already contiguous: a new reference to the same */
    CHECK(v[3] == v[2]);
    nd_release(b);
    CHECK(borrowed_calls == 0);
    for (int i = 0; i < 4; i++) {
        nd_release(v[i]);
        v[i] = NULL;
        CHECKM(borrowed_calls == (i == 3 ? 1 : 0), "after releasing view %d: %d release calls", i,
               borrowed_calls);
    }
    CHECK(borrowed_ctx_seen == &ctx_token);

    /* a NULL release callback is allowed (the host frees the buffer itself) */
    OK(nd_from_borrowed(buf, S(6), ND_FLOAT64, NULL, NULL, &b));
    nd_release(b);
    CHECK(borrowed_calls == 1);
    nd_tensor *bad = NULL;
    FAILS(nd_from_borrowed(NULL, S(2), ND_FLOAT32, NULL, NULL, &bad), ND_ERR_ARG, "NULL");
}

/* ---------------------------------------------------------------- views */

static void test_views(void) {
    nd_tensor *base = NULL, *t[12] = {0};
    OK(nd_arange(0, 12, 1, ND_FLOAT32, &base));
    float *bp = nd_data(base);

    OK(nd_view(base, S(3, 4), &t[0]));
    CHECK(nd_data(t[0]) == (void *)bp && nd_is_contiguous(t[0]));
    OK(nd_transpose(t[0], 0, 1, &t[1])); /* {4,3}, strides {1,4} */
    CHECK(nd_shape(t[1])[0] == 4 && nd_strides(t[1])[0] == 1 && nd_strides(t[1])[1] == 4);
    CHECK(!nd_is_contiguous(t[1]));
    EXPECT(t[1], ND_FLOAT32, S(4, 3), V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));

    /* writing through nd_data of a view is seen by the base */
    OK(nd_select(t[0], 0, 2, &t[2])); /* row 2: elements 8..11 */
    CHECK(nd_ndim(t[2]) == 1 && nd_shape(t[2])[0] == 4);
    ((float *)nd_data(t[2]))[1] = -9;
    CHECK(bp[9] == -9);
    double item = 0;
    OK(nd_get_item(t[1], (const int64_t[]){1, 2}, &item));
    CHECK(item == -9);

    OK(nd_narrow(t[0], 1, 1, 2, &t[3])); /* columns 1..2 */
    CHECK(nd_data(t[3]) == (void *)(bp + 1));
    EXPECT(t[3], ND_FLOAT32, S(3, 2), V(1, 2, 5, 6, -9, 10));
    OK(nd_slice(base, 0, 1, 12, 3, &t[4])); /* 1, 4, 7, 10 */
    CHECK(nd_strides(t[4])[0] == 3);
    EXPECT(t[4], ND_FLOAT32, S(4), V(1, 4, 7, 10));
    OK(nd_fill_(t[4], 0)); /* in place through a strided view */
    CHECK(bp[1] == 0 && bp[4] == 0 && bp[7] == 0 && bp[10] == 0 && bp[2] == 2);

    OK(nd_unsqueeze(t[2], 0, &t[5])); /* {1,4} */
    OK(nd_expand(t[5], S(3, 4), &t[6]));
    CHECK(nd_strides(t[6])[0] == 0 && nd_data(t[6]) == nd_data(t[2]));
    EXPECT(t[6], ND_FLOAT32, S(3, 4), V(8, -9, 0, 11, 8, -9, 0, 11, 8, -9, 0, 11));
    OK(nd_squeeze(t[5], 0, &t[7]));
    CHECK(nd_ndim(t[7]) == 1);
    OK(nd_squeeze_all(t[5], &t[8]));
    CHECK(nd_ndim(t[8]) == 1 && nd_shape(t[8])[0] == 4);

    OK(nd_view(base, S(2, 3, 2), &t[9]));
    OK(nd_permute(t[9], (const int[]){2, 0, 1}, 3, &t[10])); /* {2,2,3} */
    CHECK(same_shape(t[10], S(2, 2, 3)));
    CHECK(nd_data(t[10]) == (void *)bp);
    OK(nd_flatten(t[9], 1, 2, &t[11])); /* {2,6}, a view */
    CHECK(same_shape(t[11], S(2, 6)) && nd_data(t[11]) == (void *)bp);
    release_all(t, 12);

    /* view of a transposed tensor fails; reshape copies */
    nd_tensor *m = NULL, *mt = NULL, *v = NULL, *r = NULL, *r2 = NULL;
    OK(nd_arange(0, 6, 1, ND_FLOAT32, &r2));
    OK(nd_reshape(r2, S(2, 3), &m));
    nd_release(r2);
    r2 = NULL;
    OK(nd_transpose(m, 0, 1, &mt));
    FAILS(nd_view(mt, S(6), &v), ND_ERR_SHAPE, "view");
    CHECK(v == NULL);
    FAILS(nd_view(m, S(4), &v), ND_ERR_SHAPE, "view");
    OK(nd_reshape(mt, S(6), &r));
    CHECK(nd_is_contiguous(r));
    CHECK(nd_data(r) != nd_data(m)); /* a copy */
    EXPECT(r, ND_FLOAT32, S(6), V(0, 3, 1, 4, 2, 5));
    OK(nd_fill_(r, 42));
    EXPECT(m, ND_FLOAT32, S(2, 3), V(0, 1, 2, 3, 4, 5));
    OK(nd_reshape(m, S(3, -1), &r2)); /* contiguous: a view, -1 inferred */
    CHECK(same_shape(r2, S(3, 2)) && nd_data(r2) == nd_data(m));
    FAILS(nd_reshape(m, S(-1, -1), &v), ND_ERR_ARG, "-1");
    FAILS(nd_reshape(m, S(4, 2), &v), ND_ERR_SHAPE, "reshape");
    nd_release(m); nd_release(mt); nd_release(r); nd_release(r2);
    nd_release(base);
}

/* ---------------------------------------------------------- conversions */

static void test_dtypes(void) {
    nd_tensor *t[8] = {0};
    OK(nd_from_buffer((const float[]){2.7f, -2.7f, 0.0f, 255.0f}, S(4), ND_FLOAT32, &t[0]));
    OK(nd_to_dtype(t[0], ND_INT64, &t[1]));
    EXPECT(t[1], ND_INT64, S(4), V(2, -2, 0, 255)); /* truncation toward zero */
    OK(nd_to_dtype(t[0], ND_BOOL, &t[2]));
    EXPECT(t[2], ND_BOOL, S(4), V(1, 1, 0, 1));
    release_all(t, 8);

    /* float16: exactly representable values survive the round trip, others round */
    const float in[] = {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f,
                        5.9604644775390625e-08f, INFINITY, -INFINITY, 0.1f, 1e6f, 1e-9f};
    const float want[] = {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f,
                          5.9604644775390625e-08f, INFINITY, -INFINITY, 0.0999755859375f,
                          INFINITY, 0.0f};
    enum { NH = sizeof in / sizeof *in };
    OK(nd_from_buffer(in, (const int64_t[]){NH}, 1, ND_FLOAT32, &t[0]));
    OK(nd_to_dtype(t[0], ND_FLOAT16, &t[1]));
    CHECK(nd_get_dtype(t[1]) == ND_FLOAT16 && nd_numel(t[1]) == NH);
    uint16_t half[NH];
    OK(nd_copy_to_buffer(t[1], half, sizeof half));
    CHECK(half[2] == 0x3C00 && half[3] == 0xC000 && half[5] == 0x7BFF && half[1] == 0x8000);
    OK(nd_to_dtype(t[1], ND_FLOAT32, &t[2]));
    float back[NH];
    OK(nd_copy_to_buffer(t[2], back, sizeof back));
    for (int i = 0; i < NH; i++)
        CHECKM(back[i] == want[i] && signbit(back[i]) == signbit(want[i]),
               "float16 round trip of %.9g gave %.9g, expected %.9g", in[i], back[i], want[i]);
    /* NaN stays NaN */
    OK(nd_full(S(1), ND_FLOAT32, NAN, &t[3]));
    OK(nd_to_dtype(t[3], ND_FLOAT16, &t[4]));
    OK(nd_to_dtype(t[4], ND_FLOAT64, &t[5]));
    double d = 0;
    OK(nd_get_item(t[5], (const int64_t[]){0}, &d));
    CHECK(isnan(d));
    /* bfloat16 */
    OK(nd_to_dtype(t[0], ND_BFLOAT16, &t[6]));
    OK(nd_to_dtype(t[6], ND_FLOAT64, &t[7]));
    double bvals[NH];
    OK(nd_copy_to_buffer(t[7], bvals, sizeof bvals));
    CHECK(bvals[2] == 1.0 && bvals[3] == -2.0 && bvals[10] == 0.10009765625 && bvals[11] == 999424.0);
    release_all(t, 8);

    /* float16 is storage only: compute ops refuse it or convert, never crash */
    nd_tensor *h = NULL, *r = NULL;
    OK(nd_full(S(2), ND_FLOAT16, 1.5, &h));
    nd_status st = nd_unary(ND_UNARY_exp, h, &r);
    CHECKM(st == ND_OK || st == ND_ERR_DTYPE, "exp on float16 -> %s: %s", nd_status_name(st),
           nd_last_error());
    nd_release(r);
    nd_release(h);
}

/* Reading non-contiguous tensors back into a host buffer. */
static void test_copy_to_buffer(void) {
    nd_tensor *a = NULL, *m = NULL, *t[4] = {0};
    OK(nd_arange(0, 6, 1, ND_INT32, &a));
    OK(nd_view(a, S(2, 3), &m));
    OK(nd_transpose(m, 0, 1, &t[0])); /* {3,2} */
    int32_t out6[6];
    OK(nd_copy_to_buffer(t[0], out6, sizeof out6));
    const int32_t want_t[6] = {0, 3, 1, 4, 2, 5};
    CHECK(memcmp(out6, want_t, sizeof out6) == 0);
    OK(nd_slice(m, 1, 0, 3, 2, &t[1])); /* columns 0, 2: {2,2} */
    int32_t out4[4];
    OK(nd_copy_to_buffer(t[1], out4, sizeof out4));
    CHECK(out4[0] == 0 && out4[1] == 2 && out4[2] == 3 && out4[3] == 5);
    OK(nd_select(m, 1, 1, &t[2])); /* column 1: {2}, stride 3 */
    int32_t out2[2];
    OK(nd_copy_to_buffer(t[2], out2, sizeof out2));
    CHECK(out2[0] == 1 && out2[1] == 4);
    OK(nd_expand(t[2], S(3, 2), &t[3])); /* stride 0 */
    OK(nd_copy_to_buffer(t[3], out6, sizeof out6));
    CHECK(out6[0] == 1 && out6[1] == 4 && out6[4] == 1 && out6[5] == 4);
    FAILS(nd_copy_to_buffer(t[3], out6, sizeof out6 - 1), ND_ERR_ARG, "bytes");
    double item;
    FAILS(nd_get_item(m, (const int64_t[]){2, 0}, &item), ND_ERR_INDEX, "out of range");
    release_all(t, 4);
    nd_release(m);
    nd_release(a);
}

/* ------------------------------------------------------------ arithmetic */

static void test_binary(void) {
    nd_tensor *a = NULL, *b = NULL, *t[10] = {0};
    OK(nd_from_buffer((const float[]){1, 2}, S(2, 1), ND_FLOAT32, &a));
    OK(nd_from_buffer((const float[]){10, 20, 30}, S(3), ND_FLOAT32, &b));
    OK(nd_binary(ND_BINARY_add, a, b, &t[0]));
    EXPECT(t[0], ND_FLOAT32, S(2, 3), V(11, 21, 31, 12, 22, 32));
    OK(nd_binary(ND_BINARY_mul, b, a, &t[1]));
    EXPECT(t[1], ND_FLOAT32, S(2, 3), V(10, 20, 30, 20, 40, 60));
    OK(nd_binary(ND_BINARY_gt, t[0], t[1], &t[2]));
    EXPECT(t[2], ND_BOOL, S(2, 3), V(1, 1, 1, 0, 0, 0));
    OK(nd_binary_scalar(ND_BINARY_sub, b, 1, 1, &t[3])); /* 1 - b */
    EXPECT(t[3], ND_FLOAT32, S(3), V(-9, -19, -29));
    OK(nd_binary_scalar(ND_BINARY_div, b, 4, 0, &t[4]));
    EXPECT(t[4], ND_FLOAT32, S(3), V(2.5, 5, 7.5));
    /* type promotion: int64 + float32 -> float32; int64 / 2.5 -> float32 */
    OK(nd_arange(0, 3, 1, ND_INT64, &t[5]));
    OK(nd_binary(ND_BINARY_add, t[5], b, &t[6]));
    EXPECT(t[6], ND_FLOAT32, S(3), V(10, 21, 32));
    OK(nd_binary_scalar(ND_BINARY_mul, t[5], 2.5, 0, &t[7]));
    EXPECT(t[7], ND_FLOAT32, S(3), V(0, 2.5, 5));
    /* in place, broadcast b into a {2,3} */
    OK(nd_binary_(ND_BINARY_sub, t[0], b));
    EXPECT(t[0], ND_FLOAT32, S(2, 3), V(1, 1, 1, 2, 2, 2));
    OK(nd_binary_scalar_(ND_BINARY_mul, t[0], 3));
    EXPECT(t[0], ND_FLOAT32, S(2, 3), V(3, 3, 3, 6, 6, 6));
    /* a scalar (0-dim) tensor broadcasts to anything */
    OK(nd_scalar(-1, ND_FLOAT32, &t[8]));
    OK(nd_binary(ND_BINARY_maximum, t[8], t[3], &t[9]));
    EXPECT(t[9], ND_FLOAT32, S(3), V(-1, -1, -1));
    release_all(t, 10);

    nd_tensor *c = NULL, *r = NULL;
    OK(nd_zeros(S(4), ND_FLOAT32, &c));
    FAILS(nd_binary(ND_BINARY_add, b, c, &r), ND_ERR_SHAPE, "add");
    FAILS(nd_binary_(ND_BINARY_add, a, b), ND_ERR_SHAPE, "add"); /* {2,3} does not fit {2,1} */
    nd_release(c);

    OK(nd_from_buffer((const float[]){-1, 0, 4}, S(3), ND_FLOAT32, &c));
    OK(nd_unary(ND_UNARY_relu, c, &r));
    EXPECT(r, ND_FLOAT32, S(3), V(0, 0, 4));
    nd_release(r);
    OK(nd_clamp(c, NAN, 1, &r));
    EXPECT(r, ND_FLOAT32, S(3), V(-1, 0, 1));
    nd_release(r);
    nd_release(c);
    nd_release(a);
    nd_release(b);
}

static void test_reduce(void) {
    nd_tensor *x = NULL, *xt = NULL, *t[10] = {0};
    OK(nd_from_buffer((const double[]){1, 2, 3, 4, 5, 6}, S(2, 3), ND_FLOAT64, &x));
    OK(nd_reduce(ND_REDUCE_sum, x, (const int[]){1}, 1, 1, 0, &t[0]));
    EXPECT(t[0], ND_FLOAT64, S(2, 1), V(6, 15));
    OK(nd_reduce(ND_REDUCE_sum, x, (const int[]){1}, 1, 0, 0, &t[1]));
    EXPECT(t[1], ND_FLOAT64, S(2), V(6, 15));
    OK(nd_reduce(ND_REDUCE_mean, x, NULL, 0, 0, 0, &t[2]));
    EXPECT(t[2], ND_FLOAT64, S0, V(3.5));
    OK(nd_reduce(ND_REDUCE_max, x, (const int[]){-2}, 1, 1, 0, &t[3]));
    EXPECT(t[3], ND_FLOAT64, S(1, 3), V(4, 5, 6));
    OK(nd_reduce(ND_REDUCE_var, x, (const int[]){0}, 1, 0, 1, &t[4]));
    EXPECT(t[4], ND_FLOAT64, S(3), V(4.5, 4.5, 4.5));
    OK(nd_reduce(ND_REDUCE_argmax, x, (const int[]){1}, 1, 0, 0, &t[5]));
    EXPECT(t[5], ND_INT64, S(2), V(2, 2));
    OK(nd_reduce(ND_REDUCE_sum, x, (const int[]){0, 1}, 2, 1, 0, &t[6]));
    EXPECT(t[6], ND_FLOAT64, S(1, 1), V(21));
    /* on a transposed (non-contiguous) operand */
    OK(nd_transpose(x, 0, 1, &xt));
    OK(nd_reduce(ND_REDUCE_sum, xt, (const int[]){0}, 1, 1, 0, &t[7]));
    EXPECT(t[7], ND_FLOAT64, S(1, 2), V(6, 15));
    OK(nd_max_dim(x, 0, 0, 1, &t[8], &t[9]));
    EXPECT(t[8], ND_FLOAT64, S(3), V(1, 2, 3));
    EXPECT(t[9], ND_INT64, S(3), V(0, 0, 0));
    release_all(t, 10);
    nd_tensor *r = NULL;
    FAILS(nd_reduce(ND_REDUCE_sum, x, (const int[]){2}, 1, 0, 0, &r), ND_ERR_INDEX, "dim");
    FAILS(nd_reduce(ND_REDUCE_sum, x, (const int[]){-3}, 1, 0, 0, &r), ND_ERR_INDEX, "out of range");
    FAILS(nd_transpose(x, 0, 2, &r), ND_ERR_INDEX, "dim");
    FAILS(nd_select(x, 1, 3, &r), ND_ERR_INDEX, "out of range");
    FAILS(nd_unsqueeze(x, 4, &r), ND_ERR_INDEX, "dim");
    nd_release(xt);
    nd_release(x);
}

/* ---------------------------------------------------------------- matmul */

/* out[i][j] = sum_k a[i][k] b[k][j], reading a and b through nd_get_item
 * (so any strides are honoured). */
static void naive_matmul(const nd_tensor *a, const nd_tensor *b, double *out) {
    int64_t n = nd_shape(a)[0], k = nd_shape(a)[1], m = nd_shape(b)[1];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = 0, x, y;
            for (int64_t p = 0; p < k; p++) {
                nd_get_item(a, (const int64_t[]){i, p}, &x);
                nd_get_item(b, (const int64_t[]){p, j}, &y);
                s += x * y;
            }
            out[i * m + j] = s;
        }
}

static void check_matmul(int line, nd_dtype dt, const nd_tensor *a, const nd_tensor *b, double tol) {
    nd_tensor *c = NULL;
    checks++;
    nd_status st = nd_matmul(a, b, &c);
    if (st != ND_OK) {
        FAIL_AT(line, "matmul: %s", nd_last_error());
        return;
    }
    int64_t n = nd_shape(a)[0], m = nd_shape(b)[1];
    checks++;
    if (nd_get_dtype(c) != dt || !same_shape(c, (const int64_t[]){n, m}, 2)) {
        FAIL_AT(line, "matmul result has the wrong dtype or shape");
        nd_release(c);
        return;
    }
    double *want = malloc(sizeof(double) * (size_t)(n * m));
    naive_matmul(a, b, want);
    double *got = values(c);
    for (int64_t i = 0; got && i < n * m; i++) {
        if (!close_to(got[i], want[i], tol)) {
            FAIL_AT(line, "matmul element %lld is %.9g, naive loop gives %.9g", (long long)i,
                    got[i], want[i]);
            break;
        }
    }
    free(got);
    free(want);
    nd_release(c);
}

static void test_matmul(void) {
    nd_manual_seed(1234);
    for (int f = 0; f < 2; f++) {
        nd_dtype dt = f ? ND_FLOAT64 : ND_FLOAT32;
        double tol = f ? 1e-12 : 1e-5;
        nd_tensor *a = NULL, *b = NULL, *at = NULL, *bt = NULL, *as = NULL;
        OK(nd_randn(S(7, 5), dt, &a));  /* a^T: {5,7} with strides {1,5} */
        OK(nd_randn(S(9, 7), dt, &b));  /* b^T: {7,9} with strides {1,7} */
        OK(nd_transpose(a, 0, 1, &at));
        OK(nd_transpose(b, 0, 1, &bt));
        check_matmul(__LINE__, dt, at, bt, tol);        /* both transposed */
        nd_release(a);
        nd_release(b);
        nd_release(at);
        nd_release(bt);
        a = b = at = bt = NULL;
        /* a plain {4,6} x {6,3}, a transposed {6,4}^T x {6,3}, and a sliced operand */
        OK(nd_randn(S(4, 6), dt, &a));
        OK(nd_randn(S(6, 3), dt, &b));
        check_matmul(__LINE__, dt, a, b, tol);
        OK(nd_randn(S(6, 4), dt, &at));
        nd_tensor *att = NULL;
        OK(nd_transpose(at, 0, 1, &att));
        check_matmul(__LINE__, dt, att, b, tol);
        OK(nd_slice(a, 1, 0, 6, 2, &as)); /* {4,3}, column stride 2 */
        OK(nd_randn(S(3, 5), dt, &bt));
        check_matmul(__LINE__, dt, as, bt, tol);
        nd_release(att);
        nd_release(a); nd_release(b); nd_release(at); nd_release(bt); nd_release(as);
    }

    /* batched and vector forms */
    nd_tensor *x = NULL, *w = NULL, *v = NULL, *r = NULL;
    OK(nd_arange(0, 12, 1, ND_FLOAT32, &r));
    OK(nd_reshape(r, S(2, 2, 3), &x));
    nd_release(r);
    OK(nd_from_buffer((const float[]){1, 0, 0, 1, 1, 1}, S(3, 2), ND_FLOAT32, &w));
    OK(nd_matmul(x, w, &r)); /* {2,2,3} x {3,2} -> {2,2,2} */
    EXPECT(r, ND_FLOAT32, S(2, 2, 2), V(2, 3, 8, 9, 14, 15, 20, 21));
    nd_release(r);
    OK(nd_from_buffer((const float[]){1, 2, 3}, S(3), ND_FLOAT32, &v));
    OK(nd_matmul(v, w, &r)); /* {3} x {3,2} -> {2} */
    EXPECT(r, ND_FLOAT32, S(2), V(4, 5));
    nd_release(r);
    OK(nd_matmul(v, v, &r)); /* dot -> 0-dim */
    EXPECT(r, ND_FLOAT32, S0, V(14));
    nd_release(r);
    r = NULL;

    /* errors */
    nd_tensor *a = NULL, *b = NULL, *s = NULL;
    OK(nd_zeros(S(2, 3), ND_FLOAT32, &a));
    OK(nd_zeros(S(4, 5), ND_FLOAT32, &b));
    FAILS(nd_matmul(a, b, &r), ND_ERR_SHAPE, "matmul: shapes {2,3} and {4,5} do not match");
    CHECK(r == NULL);
    OK(nd_scalar(1, ND_FLOAT32, &s));
    FAILS(nd_matmul(s, a, &r), ND_ERR_SHAPE, "matmul");
    nd_release(a); nd_release(b); nd_release(s);
    nd_release(x); nd_release(w); nd_release(v);
}

/* -------------------------------------------------------------- errors */

static void test_errors(void) {
    nd_tensor *r = NULL;
    /* absurd sizes: an error, never a crash */
    FAILS(nd_empty(S((int64_t)1 << 30, (int64_t)1 << 30), ND_FLOAT32, &r), ND_ERR_MEMORY, "too large");
    FAILS(nd_zeros(S(INT64_MAX, INT64_MAX), ND_FLOAT64, &r), ND_ERR_MEMORY, "empty");
    FAILS(nd_full(S(-3), ND_FLOAT32, 1, &r), ND_ERR_ARG, "negative size");
    FAILS(nd_empty(S(1, 1, 1, 1, 1, 1, 1, 1, 1), ND_FLOAT32, &r), ND_ERR_ARG, "at most 8");
    /* allowed by the size limit, but no machine has 256 TiB: refused before
     * malloc (nd_memory_limit), whatever the kernel's overcommit policy */
    FAILS(nd_empty(S((int64_t)1 << 46), ND_FLOAT32, &r), ND_ERR_MEMORY, "of memory this process can have");
    FAILS(nd_arange(0, 1e30, 1, ND_FLOAT32, &r), ND_ERR_MEMORY, "arange");
    FAILS(nd_eye(-2, 3, ND_FLOAT32, &r), ND_ERR_ARG, "negative");
    FAILS(nd_empty(S(2), (nd_dtype)99, &r), ND_ERR_DTYPE, "dtype");
    CHECK(r == NULL);
    /* the message is thread-local state: a later success does not clear it,
     * a later failure replaces it */
    nd_tensor *ok = NULL;
    OK(nd_zeros(S(2), ND_FLOAT32, &ok));
    CHECK(strstr(nd_last_error(), "dtype") != NULL);
    FAILS(nd_squeeze(ok, 3, &r), ND_ERR_INDEX, "squeeze");
    FAILS(nd_expand(ok, S(3), &r), ND_ERR_SHAPE, "expand");
    FAILS(nd_permute(ok, (const int[]){0, 0}, 2, &r), ND_ERR_ARG, "permute");
    FAILS(nd_narrow(ok, 0, 1, 5, &r), ND_ERR_INDEX, "narrow");
    FAILS(nd_slice(ok, 0, 0, 2, 0, &r), ND_ERR_ARG, "step");
    nd_release(ok);
}

/* A requested shape whose element count overflows int64 must be an error,
 * not a tensor that claims more elements than its storage holds. */
static void test_shape_overflow(void) {
    nd_tensor *t = NULL, *r = NULL;
    OK(nd_zeros(S(4), ND_FLOAT32, &t));
    /* (2^62 + 1) * 4 wraps to 4 in 64 bits */
    nd_status st = nd_reshape(t, S(((int64_t)1 << 62) + 1, 4), &r);
    CHECKM(st != ND_OK, "reshape of a 4-element tensor to {2^62+1,4} succeeded (numel %lld)",
           r ? (long long)nd_numel(r) : 0LL);
    nd_release(r);
    r = NULL;
    st = nd_view(t, S(((int64_t)1 << 62) + 1, 4), &r);
    CHECK(st != ND_OK);
    nd_release(r);
    r = NULL;
    nd_release(t);
    /* an empty tensor with a huge dim: fine or an error, but no overflow in
     * its strides (4 * 2^62) */
    st = nd_zeros(S(0, (int64_t)1 << 62, 4), ND_FLOAT32, &r);
    CHECKM(st != ND_OK || nd_numel(r) == 0, "zeros {0,2^62,4} -> %s", nd_status_name(st));
    nd_release(r);
}

/* ----------------------------------------------------------- refcounts */

static void test_refcount(void) {
    nd_tensor *t = NULL, *c = NULL, *v = NULL;
    OK(nd_full(S(3), ND_FLOAT32, 2, &t));
    nd_retain(t);
    nd_release(t); /* still one reference */
    EXPECT(t, ND_FLOAT32, S(3), V(2, 2, 2));
    OK(nd_contiguous(t, &c));
    CHECK(c == t); /* already contiguous: a new reference to t */
    nd_release(c);
    OK(nd_clone(t, &c));
    CHECK(c != t && nd_data(c) != nd_data(t));
    OK(nd_fill_(c, 5));
    EXPECT(t, ND_FLOAT32, S(3), V(2, 2, 2));
    OK(nd_narrow(t, 0, 1, 2, &v));
    nd_release(t); /* the view keeps the storage alive */
    EXPECT(v, ND_FLOAT32, S(2), V(2, 2));
    nd_release(v);
    nd_release(c);
    nd_release(NULL); /* a no-op */
    nd_retain(NULL);

    /* copy_ between host-owned memory and library memory */
    float host[4] = {1, 2, 3, 4};
    nd_tensor *h = NULL, *z = NULL;
    OK(nd_from_borrowed(host, S(2, 2), ND_FLOAT32, NULL, NULL, &h));
    OK(nd_zeros(S(2, 2), ND_FLOAT64, &z));
    OK(nd_transpose(h, 0, 1, &v));
    OK(nd_copy_(z, v)); /* cast + transpose */
    EXPECT(z, ND_FLOAT64, S(2, 2), V(1, 3, 2, 4));
    OK(nd_copy_(h, z)); /* write back through the borrowed tensor */
    CHECK(host[1] == 3 && host[2] == 2);
    nd_release(v); nd_release(h); nd_release(z);
}

/* The caching allocator's per-thread front for small blocks: a thread's
 * blocks go back to the shared lists when it ends (else they would be lost
 * with its thread-local storage), and nd_empty_cache() frees the calling
 * thread's own. The thread also frees a tensor the main thread made. */
static void *small_ops_thread(void *arg) {
    nd_release((nd_tensor *)arg);
    for (int i = 0; i < 100; i++) {
        nd_tensor *a = NULL;
        if (nd_zeros((const int64_t[]){16}, 1, ND_FLOAT32, &a) == ND_OK) nd_release(a);
    }
    return NULL;
}

static void test_thread_cache(void) {
    nd_empty_cache();
    CHECK(nd_cached_bytes() == 0);
    nd_tensor *made_here = NULL;
    OK(nd_zeros((const int64_t[]){4}, 1, ND_FLOAT32, &made_here));
    pthread_t th;
    checks++;
    if (pthread_create(&th, NULL, small_ops_thread, made_here) != 0) {
        FAIL("pthread_create failed");
        nd_release(made_here);
        return;
    }
    pthread_join(th, NULL);
    CHECKM(nd_cached_bytes() > 0, "the ended thread's small blocks were not returned (%lld cached)",
           (long long)nd_cached_bytes());
    nd_empty_cache();
    CHECK(nd_cached_bytes() == 0);
    nd_tensor *a = NULL;
    OK(nd_zeros((const int64_t[]){16}, 1, ND_FLOAT32, &a));
    nd_release(a);
    CHECK(nd_cached_bytes() > 0); /* this thread's front is counted */
    nd_empty_cache();
    CHECK(nd_cached_bytes() == 0);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* failures show even if a sanitizer aborts */
    int64_t live0 = nd_live_bytes();
    test_library();
    test_creation();
    test_borrowed();
    test_views();
    test_dtypes();
    test_copy_to_buffer();
    test_binary();
    test_reduce();
    test_matmul();
    test_errors();
    test_refcount();
    test_thread_cache();
    checks++;
    if (nd_live_bytes() != live0)
        FAIL("live bytes: %lld at start, %lld after releasing everything", (long long)live0,
              (long long)nd_live_bytes());
    nd_empty_cache();
    CHECK(nd_cached_bytes() == 0);
    /* last: a known overflow bug trips UBSan here (signed overflow) */
    test_shape_overflow();
    CHECK(nd_live_bytes() == live0);
    if (failures) printf("%d of %d checks failed\n", failures, checks);
    else printf("%d checks passed\n", checks);
    return failures ? 1 : 0;
}
