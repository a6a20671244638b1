/* test_shape_rule.c - issue 15 through the C API (run it under build-asan:
 * UBSan reports any signed overflow these paths used to hit):
 *   - the size rule (tensor.h, nd_check_shape): sizes >= 0 whose product,
 *     counting 0 as 1, is at most 2^48; reshape/view, expand, broadcasting
 *     and matmul apply it, so {0, 2^62, 2^62} never exists;
 *   - nd_check_strides, the rule for strides read from files;
 *   - conversions into integer dtypes saturate (NaN -> 0), fills refuse
 *     numbers that do not fit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "needle.h"
#include "tensor.h"
#include "check.h"

#define BIG ((int64_t)1 << 62)
#define RULE "(the product of its sizes, counting 0 as 1, is more than 2^48)"

static void test_shapes(void) {
    nd_tensor *e, *r = NULL;
    EXPECT_ERR("empty {0,2^62,2^62}", nd_empty(S(0, BIG, BIG), ND_FLOAT32, &r), ND_ERR_MEMORY,
               "empty: shape {0,4611686018427387904,4611686018427387904} is too large", RULE);
    OK(nd_empty(S(0), ND_FLOAT32, &e));
    EXPECT_ERR("reshape to {0,2^62,2^62}", nd_reshape(e, S(0, BIG, BIG), &r), ND_ERR_MEMORY,
               "reshape: shape {0,4611686018427387904,4611686018427387904} is too large", RULE);
    EXPECT_ERR("view as {0,2^62,2^62}", nd_view(e, S(0, BIG, BIG), &r), ND_ERR_MEMORY,
               "view: shape {0,", RULE);
    EXPECT_ERR("reshape to {2^62,0,-1}", nd_reshape(e, S(BIG, 0, -1), &r), ND_ERR_MEMORY,
               "reshape: shape {", "too large");
    /* at the bound: the strides are exact */
    OK(nd_reshape(e, S(0, (int64_t)1 << 24, (int64_t)1 << 24), &r));
    CHECK(nd_strides(r)[0] == (int64_t)1 << 48 && nd_strides(r)[1] == (int64_t)1 << 24);
    nd_tensor *s;
    OK(nd_reduce(ND_REDUCE_sum, r, (const int[]){1}, 1, 0, 0, &s));
    CHECK(nd_ndim(s) == 2 && nd_shape(s)[0] == 0 && nd_shape(s)[1] == (int64_t)1 << 24);
    nd_release(s);
    nd_release(r);

    nd_tensor *one;
    OK(nd_zeros(S(1, 1, 0), ND_FLOAT32, &one));
    nd_tensor *a, *b;
    OK(nd_expand(one, S((int64_t)1 << 40, 1, 0), &a));
    OK(nd_expand(one, S(1, (int64_t)1 << 40, 0), &b));
    EXPECT_ERR("broadcast past the rule", nd_binary(ND_BINARY_add, a, b, &r), ND_ERR_MEMORY,
               "add: shape {1099511627776,1099511627776,0} is too large", RULE);
    EXPECT_ERR("expand past the rule", nd_expand(one, S((int64_t)1 << 40, (int64_t)1 << 40, 0), &r),
               ND_ERR_MEMORY, "expand: shape {", RULE);
    nd_release(a);
    nd_release(b);
    nd_release(one);

    nd_tensor *m;
    OK(nd_zeros(S(1, 1, 1, 1), ND_FLOAT32, &m));
    OK(nd_expand(m, S((int64_t)1 << 30, 1, 1, 1), &a));
    OK(nd_expand(m, S(1, (int64_t)1 << 30, 1, 1), &b));
    EXPECT_ERR("matmul batch past the rule", nd_matmul(a, b, &r), ND_ERR_MEMORY,
               "matmul: shape {1073741824,1073741824} is too large", NULL);
    nd_release(a);
    nd_release(b);
    nd_release(m);
    nd_release(e);

    const int64_t sh04[] = {0, 4}, st04[] = {BIG, 1}, sh2[] = {2}, stneg[] = {-1};
    const int64_t sh32[] = {3, 2}, st32[] = {(int64_t)1 << 47, 1};
    EXPECT_ERR("strides reaching past 2^48", nd_check_strides("t", sh04, st04, 2), ND_ERR_ARG,
               "t: strides {4611686018427387904,1} are invalid for shape {0,4}", NULL);
    EXPECT_ERR("negative stride", nd_check_strides("t", sh2, stneg, 1), ND_ERR_ARG, "invalid", NULL);
    CHECK(nd_check_strides("t", sh32, st32, 2) == ND_OK);
}

/* the float64 v converted to dt, read back as int64 */
static int64_t converted(double v, nd_dtype dt) {
    nd_tensor *x, *y;
    int64_t out = -12345;
    if (nd_from_buffer(&v, S(1), ND_FLOAT64, &x) != ND_OK) return out;
    if (nd_to_dtype(x, dt, &y) == ND_OK) {
        out = nd_load_i64(nd_data(y), dt);
        nd_release(y);
    }
    nd_release(x);
    return out;
}

static void test_conversions(void) {
    CHECK(converted(1e10, ND_INT32) == INT32_MAX);
    CHECK(converted(-1e10, ND_INT32) == INT32_MIN);
    CHECK(converted(INFINITY, ND_INT32) == INT32_MAX);
    CHECK(converted(-INFINITY, ND_INT32) == INT32_MIN);
    CHECK(converted(NAN, ND_INT32) == 0);
    CHECK(converted(-2.7, ND_INT32) == -2);
    CHECK(converted(300.0, ND_UINT8) == 255);
    CHECK(converted(-1.0, ND_UINT8) == 0);
    CHECK(converted(NAN, ND_UINT8) == 0);
    CHECK(converted(255.9, ND_UINT8) == 255);
    CHECK(converted(9223372036854775808.0, ND_INT64) == INT64_MAX); /* 2^63: no UB */
    CHECK(converted(-9223372036854775808.0, ND_INT64) == INT64_MIN);
    CHECK(converted(NAN, ND_INT64) == 0);
    /* int64 -> int32 narrows by saturating, not wrapping */
    int64_t big = (int64_t)1 << 40;
    nd_tensor *x, *y;
    OK(nd_from_buffer(&big, S(1), ND_INT64, &x));
    OK(nd_to_dtype(x, ND_INT32, &y));
    CHECK(*(const int32_t *)nd_data(y) == INT32_MAX);
    nd_release(y);
    nd_release(x);

    nd_tensor *t;
    OK(nd_zeros(S(2), ND_INT32, &t));
    EXPECT_ERR("fill int32 with 2^40", nd_fill_int_(t, big), ND_ERR_ARG,
               "fill_: value 1099511627776 is out of range for int32 (-2147483648..2147483647)", NULL);
    EXPECT_ERR("fill int32 with 2.5", nd_fill_(t, 2.5), ND_ERR_ARG, "fill_: value 2.5 is not an integer", NULL);
    EXPECT_ERR("fill int32 with nan", nd_fill_(t, NAN), ND_ERR_ARG, "fill_: value nan is not an integer", NULL);
    CHECK(((const int32_t *)nd_data(t))[0] == 0);
    OK(nd_fill_(t, -2147483648.0));
    CHECK(((const int32_t *)nd_data(t))[1] == INT32_MIN);
    nd_release(t);
    OK(nd_zeros(S(2), ND_INT64, &t));
    EXPECT_ERR("fill int64 with 2^63", nd_fill_(t, 9223372036854775808.0), ND_ERR_ARG,
               "value 9223372036854775808 is out of range for int64", NULL);
    OK(nd_fill_int_(t, INT64_MAX));
    CHECK(((const int64_t *)nd_data(t))[0] == INT64_MAX);
    nd_release(t);
}

int main(void) {
    test_shapes();
    test_conversions();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
