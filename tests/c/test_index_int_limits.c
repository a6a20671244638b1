/* test_index_int_limits.c - the index and join ops at the limits of the
 * integer dtypes:
 *   - integer cumsum / scatter_add / index_add wrap instead of signed
 *     overflow (UB);
 *   - index_add rejects a non-finite or out-of-int64-range alpha for integer
 *     tensors;
 *   - one_hot reads min/max exactly as int64 and names its own errors;
 *   - pad with pads near INT64_MIN/INT64_MAX fails cleanly (no overflow).
 * The Lua side is in spec/join_spec.lua and spec/construct_spec.lua (one_hot).
 * Best run under the ASan/UBSan build too (build-asan). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#define CHECK_PLACE_LINE /* failures print as "FAIL line N: " */
#include "check.h"

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

/* ---- integer accumulation wraps ---- */

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

/* ---- index_add alpha for integer tensors ---- */

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

/* ---- one_hot with huge class values ---- */

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

/* ---- pad with extreme pads ---- */

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

int main(void) {
    int64_t live0 = nd_live_bytes();
    test_integer_wrap();
    test_index_add_alpha();
    test_one_hot();
    test_pad_overflow();
    int64_t live1 = nd_live_bytes();
    CHECKM(live1 == live0, "live bytes back to %lld, got %lld", (long long)live0, (long long)live1);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
