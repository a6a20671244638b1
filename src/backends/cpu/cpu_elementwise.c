/* cpu_elementwise.c - unary, binary, where and clamp kernels.
 *
 * One inner function per (op, dtype), instantiated from the op's expression
 * in needle_ops.h (the OpenCL kernels use the same text). Each inner
 * function has a dense fast path (vectorisable), fast paths for a broadcast
 * scalar on either side, and a strided fallback. Signed integer arithmetic
 * wraps (computed in the unsigned type) as in PyTorch, instead of being
 * undefined behaviour. */
#include <string.h>
#include <tgmath.h> /* exp(x) is expf for a float x: the registry's expressions are type-generic */
#include "cpu_kernels.h"
#include "cpu_vmath.h"
#include "cpu_loop.h"

/* ---------------------------------------------------------------- binary */

/* The inner function of one (op, dtype): T the operand type, U the unsigned
 * type its wrapping arithmetic uses, OT the output type. */
#define BIN_FN(NAME, TY, UTY, OT, EXPR)                                               \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx) {             \
        typedef TY T;                                                                 \
        typedef UTY U;                                                                \
        (void)ctx;                                                                    \
        if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == sizeof(T)) {           \
            OT *o = (OT *)p[0];                                                       \
            const T *A = (const T *)p[1], *B = (const T *)p[2];                       \
            for (int64_t i = 0; i < n; i++) { T a = A[i], b = B[i]; o[i] = (OT)(EXPR); } \
        } else if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == 0) {            \
            OT *o = (OT *)p[0];                                                       \
            const T *A = (const T *)p[1];                                             \
            const T b = *(const T *)p[2];                                             \
            for (int64_t i = 0; i < n; i++) { T a = A[i]; o[i] = (OT)(EXPR); }        \
        } else if (s[0] == sizeof(OT) && s[1] == 0 && s[2] == sizeof(T)) {            \
            OT *o = (OT *)p[0];                                                       \
            const T a = *(const T *)p[1];                                             \
            const T *B = (const T *)p[2];                                             \
            for (int64_t i = 0; i < n; i++) { T b = B[i]; o[i] = (OT)(EXPR); }        \
        } else {                                                                      \
            for (int64_t i = 0; i < n; i++) {                                         \
                T a = *(const T *)(p[1] + i * s[1]), b = *(const T *)(p[2] + i * s[2]); \
                *(OT *)(p[0] + i * s[0]) = (OT)(EXPR);                                \
            }                                                                         \
        }                                                                             \
    }

static inline int64_t ipow64(int64_t base, int64_t e) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, b = (uint64_t)base;
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (int64_t)r;
}

/* The kernels of needle_ops.h's binary ops: the float expression for f32
 * and f64, the integer one for the ints (when the op keeps ints), the bool
 * one for bool (when it keeps bools). OUT_ARITH / OUT_CMP: the output type. */
#define OUT_ARITH(T) T
#define OUT_CMP(T) uint8_t
#define KEEP_IF_KEEP(...) __VA_ARGS__
#define KEEP_IF_FLOAT(...)
#define KEEP_IF_INT64(...)
#define KEEP_IF_REFUSE(...)
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr)                              \
    BIN_FN(name##_f32, float, uint32_t, OUT_##kind(float), fexpr)                       \
    BIN_FN(name##_f64, double, uint64_t, OUT_##kind(double), fexpr)                    \
    KEEP_IF_##ints(BIN_FN(name##_i64, int64_t, uint64_t, OUT_##kind(int64_t), iexpr)    \
                   BIN_FN(name##_i32, int32_t, uint32_t, OUT_##kind(int32_t), iexpr)    \
                   BIN_FN(name##_u8, uint8_t, uint32_t, OUT_##kind(uint8_t), iexpr))    \
    KEEP_IF_##bools(BIN_FN(name##_b8, uint8_t, uint32_t, uint8_t, bexpr))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtype-limits" /* x < 0 on uint8 */
#pragma GCC diagnostic ignored "-Wunused-local-typedefs" /* U: only wrapping ops use it */
#pragma GCC diagnostic ignored "-Wsign-compare"
ND_BINARY_OPS(ND_X)
#pragma GCC diagnostic pop
#undef ND_X

#define FN_IF_KEEP(fn) fn
#define FN_IF_FLOAT(fn) NULL
#define FN_IF_INT64(fn) NULL
#define FN_IF_REFUSE(fn) NULL

/* [dtype][op]; NULL where the op layer converts first (needle_ops.h). */
static const nd_inner_fn binary_fns[ND_NUM_DTYPES][ND_NUM_BINARY] = {
#define ND_X(name, kind, ints, bools, ...)                                 \
    [ND_FLOAT32][ND_BINARY_##name] = name##_f32,                          \
    [ND_FLOAT64][ND_BINARY_##name] = name##_f64,                          \
    [ND_INT64][ND_BINARY_##name] = FN_IF_##ints(name##_i64),              \
    [ND_INT32][ND_BINARY_##name] = FN_IF_##ints(name##_i32),              \
    [ND_UINT8][ND_BINARY_##name] = FN_IF_##ints(name##_u8),               \
    [ND_BOOL][ND_BINARY_##name] = FN_IF_##bools(name##_b8),
    ND_BINARY_OPS(ND_X)
#undef ND_X
};

static nd_inner_fn binary_fn(nd_binary_op op, nd_dtype dt) {
    return (unsigned)dt < ND_NUM_DTYPES && (unsigned)op < ND_NUM_BINARY ? binary_fns[dt][op] : NULL;
}

nd_inner_fn nd_cpu_binary_inner(nd_binary_op op, nd_dtype dt) { return binary_fn(op, dt); }

nd_status nd_cpu_binary(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    nd_inner_fn fn = binary_fn(op, a->dtype);
    if (!fn) return nd_fail_dtype_kernel(nd_binary_name(op), a->dtype);
    nd_loop L;
    const nd_tensor *ts[3] = {out, a, b};
    nd_loop_init(&L, 3, ts);
    nd_loop_run(&L, fn, NULL, 1);
    return ND_OK;
}

nd_status nd_cpu_binary_scalar(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                               int scalar_first) {
    nd_inner_fn fn = binary_fn(op, a->dtype);
    if (!fn) return nd_fail_dtype_kernel(nd_binary_name(op), a->dtype);
    /* The scalar becomes a 0-stride operand of a's dtype. */
    _Alignas(8) unsigned char value[8];
    memcpy(value, s, nd_dtype_size(a->dtype));
    nd_loop L;
    const nd_tensor *ts[2] = {out, a};
    nd_loop_init(&L, 2, ts);
    nd_loop_add_scalar(&L, value);
    if (scalar_first) { /* swap operands 1 and 2 */
        char *tb = L.base[1];
        L.base[1] = L.base[2];
        L.base[2] = tb;
        for (int d = 0; d < L.ndim; d++) {
            int64_t t = L.strides[1][d];
            L.strides[1][d] = L.strides[2][d];
            L.strides[2][d] = t;
        }
    }
    nd_loop_run(&L, fn, NULL, 1);
    return ND_OK;
}

/* ----------------------------------------------------------------- unary */

#define UN_FN(NAME, TY, UTY, EXPR)                                             \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx) {       \
        typedef TY T;                                                          \
        typedef UTY U;                                                         \
        (void)ctx;                                                             \
        if (s[0] == sizeof(T) && s[1] == sizeof(T)) {                          \
            T *o = (T *)p[0];                                                  \
            const T *X = (const T *)p[1];                                      \
            for (int64_t i = 0; i < n; i++) { T x = X[i]; o[i] = (T)(EXPR); }  \
        } else {                                                               \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = *(const T *)(p[1] + i * s[1]);                           \
                *(T *)(p[0] + i * s[0]) = (T)(EXPR);                           \
            }                                                                  \
        }                                                                      \
    }

/* The kernels of needle_ops.h's unary ops (bool inputs arrive as uint8). */
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw)                  \
    UN_FN(name##_f32, float, uint32_t, fexpr)                            \
    UN_FN(name##_f64, double, uint64_t, fexpr)                           \
    KEEP_IF_##ints(UN_FN(name##_i64, int64_t, uint64_t, iexpr)           \
                   UN_FN(name##_i32, int32_t, uint32_t, iexpr)           \
                   UN_FN(name##_u8, uint8_t, uint32_t, iexpr))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtype-limits"
#pragma GCC diagnostic ignored "-Wunused-local-typedefs"
ND_UNARY_OPS(ND_X)
#pragma GCC diagnostic pop
#undef ND_X

static const nd_inner_fn unary_fns[ND_NUM_DTYPES][ND_NUM_UNARY] = {
#define ND_X(name, ints, ...)                                      \
    [ND_FLOAT32][ND_UNARY_##name] = name##_f32,                   \
    [ND_FLOAT64][ND_UNARY_##name] = name##_f64,                   \
    [ND_INT64][ND_UNARY_##name] = FN_IF_##ints(name##_i64),       \
    [ND_INT32][ND_UNARY_##name] = FN_IF_##ints(name##_i32),       \
    [ND_UINT8][ND_UNARY_##name] = FN_IF_##ints(name##_u8),
    ND_UNARY_OPS(ND_X)
#undef ND_X
};

/* float32 exp, tanh and sigmoid: the vectorised array functions
 * (cpu_vmath.h). A strided run goes through a buffer, so that every layout
 * (and the fused kernels, which call these) gives the same bits. */
#define VMATH_FN(NAME, VFN)                                                    \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx) {       \
        (void)ctx;                                                             \
        if (s[0] == sizeof(float) && s[1] == sizeof(float)) {                  \
            VFN((float *)p[0], (const float *)p[1], n);                        \
            return;                                                            \
        }                                                                      \
        float buf[256];                                                        \
        for (int64_t i0 = 0; i0 < n; i0 += 256) {                              \
            int64_t m = n - i0 < 256 ? n - i0 : 256;                           \
            for (int64_t i = 0; i < m; i++) buf[i] = *(const float *)(p[1] + (i0 + i) * s[1]); \
            VFN(buf, buf, m);                                                  \
            for (int64_t i = 0; i < m; i++) *(float *)(p[0] + (i0 + i) * s[0]) = buf[i]; \
        }                                                                      \
    }
VMATH_FN(vexp_f32, nd_cpu_vexp_f32)
VMATH_FN(vtanh_f32, nd_cpu_vtanh_f32)
VMATH_FN(vsigmoid_f32, nd_cpu_vsigmoid_f32)
VMATH_FN(verf_f32, nd_cpu_verf_f32)
VMATH_FN(vgelu_f32, nd_cpu_vgelu_f32)
VMATH_FN(vgelu_tanh_f32, nd_cpu_vgelu_tanh_f32)
#undef VMATH_FN

nd_inner_fn nd_cpu_unary_inner(nd_unary_op op, nd_dtype dt) {
    if (dt == ND_FLOAT32 && op == ND_UNARY_exp) return vexp_f32;
    if (dt == ND_FLOAT32 && op == ND_UNARY_tanh) return vtanh_f32;
    if (dt == ND_FLOAT32 && op == ND_UNARY_sigmoid) return vsigmoid_f32;
    if (dt == ND_FLOAT32 && op == ND_UNARY_erf) return verf_f32;
    if (dt == ND_FLOAT32 && op == ND_UNARY_gelu) return vgelu_f32;
    if (dt == ND_FLOAT32 && op == ND_UNARY_gelu_tanh) return vgelu_tanh_f32;
    return (unsigned)dt < ND_NUM_DTYPES && (unsigned)op < ND_NUM_UNARY ? unary_fns[dt][op] : NULL;
}

nd_status nd_cpu_unary(nd_unary_op op, nd_tensor *out, const nd_tensor *x) {
    nd_inner_fn fn = nd_cpu_unary_inner(op, x->dtype);
    if (!fn) return nd_fail_dtype_kernel(nd_unary_name(op), x->dtype);
    nd_loop L;
    const nd_tensor *ts[2] = {out, x};
    nd_loop_init(&L, 2, ts);
    nd_loop_run(&L, fn, NULL, 1);
    return ND_OK;
}

/* ----------------------------------------------------------- where, clamp */

void nd_cpu_where_inner(char **p, const int64_t *s, int64_t n, void *ctx) {
    size_t sz = *(const size_t *)ctx;
    for (int64_t i = 0; i < n; i++) {
        const char *src = p[1][i * s[1]] ? p[2] + i * s[2] : p[3] + i * s[3];
        memcpy(p[0] + i * s[0], src, sz);
    }
}

nd_status nd_cpu_where(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a,
                       const nd_tensor *b) {
    size_t sz = nd_dtype_size(out->dtype);
    nd_loop L;
    const nd_tensor *ts[4] = {out, cond, a, b};
    nd_loop_init(&L, 4, ts);
    nd_loop_run(&L, nd_cpu_where_inner, &sz, 1);
    return ND_OK;
}

/* NaN bounds mean "unbounded"; a NaN input stays NaN. */
#define CLAMP_LOOP(T)                                                               \
    do {                                                                            \
        const T lo = (T)(isnan(c->lo) ? -INFINITY : c->lo);                          \
        const T hi = (T)(isnan(c->hi) ? INFINITY : c->hi);                           \
        if (s[0] == sizeof(T) && s[1] == sizeof(T)) { /* contiguous: vectorised */  \
            T *o = (T *)(void *)p[0];                                               \
            const T *X = (const T *)(const void *)p[1];                             \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = X[i];                                                         \
                o[i] = x < lo ? lo : x > hi ? hi : x;                               \
            }                                                                       \
            break;                                                                  \
        }                                                                           \
        for (int64_t i = 0; i < n; i++) {                                           \
            T x = *(const T *)(p[1] + i * s[1]);                                    \
            *(T *)(p[0] + i * s[0]) = x < lo ? lo : x > hi ? hi : x;                \
        }                                                                           \
    } while (0)

/* Integer bounds: the smallest integer >= lo and the largest <= hi,
 * saturated to int64, so int64 values compare exactly (no trip through
 * double, which holds only 53 bits). */
static int64_t bound_i64(double v, bool lower) {
    if (isnan(v)) return lower ? INT64_MIN : INT64_MAX;
    v = lower ? ceil(v) : floor(v);
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    return (int64_t)v;
}

void nd_cpu_clamp_inner(char **p, const int64_t *s, int64_t n, void *vctx) {
    const nd_cpu_clamp_ctx *c = vctx;
    if (c->dt == ND_FLOAT32) { CLAMP_LOOP(float); return; }
    if (c->dt == ND_FLOAT64) { CLAMP_LOOP(double); return; }
    if (nd_dtype_is_int(c->dt)) {
        int64_t lo = bound_i64(c->lo, true), hi = bound_i64(c->hi, false);
        for (int64_t i = 0; i < n; i++) {
            int64_t x = nd_load_i64(p[1] + i * s[1], c->dt);
            if (x < lo) x = lo;
            if (x > hi) x = hi;
            nd_store_number(p[0] + i * s[0], c->dt, nd_num_i(x));
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        double x = nd_load_f64(p[1] + i * s[1], c->dt);
        if (!isnan(c->lo) && x < c->lo) x = c->lo;
        if (!isnan(c->hi) && x > c->hi) x = c->hi;
        nd_store_f64(p[0] + i * s[0], c->dt, x);
    }
}

nd_status nd_cpu_clamp(nd_tensor *out, const nd_tensor *x, double lo, double hi) {
    nd_cpu_clamp_ctx c = {lo, hi, x->dtype};
    nd_loop L;
    const nd_tensor *ts[2] = {out, x};
    nd_loop_init(&L, 2, ts);
    nd_loop_run(&L, nd_cpu_clamp_inner, &c, 1);
    return ND_OK;
}

/* gx = g where y > 0 (the backend's relu_backward: contiguous, one float
 * dtype); one pass instead of a mask and a product. Both loads are
 * unconditional: with G[i] read only where y > 0, GCC kept a scalar loop
 * with a branch that mispredicts on every other element of random data
 * (0.1 ms for 64k floats, ten times a vector select). */
#define RELU_BACKWARD(T)                                                                 \
    do {                                                                                 \
        const T *G = (const T *)nd_ptr(g), *Y = (const T *)nd_ptr(y);                    \
        T *GX = (T *)nd_ptr(gx);                                                         \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                                \
            const T gi = G[i], yi = Y[i];                                                \
            GX[i] = yi > (T)0 ? gi : (T)0;                                               \
        }                                                                                \
    } while (0)

/* The same as an inner loop (operands gx, g, y; any strides), for fused runs. */
#define RELU_BACKWARD_INNER(NAME, T)                                                    \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx) {                \
        (void)ctx;                                                                      \
        if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {              \
            T *GX = (T *)p[0];                                                          \
            const T *G = (const T *)p[1], *Y = (const T *)p[2];                         \
            for (int64_t i = 0; i < n; i++) {                                           \
                const T gi = G[i], yi = Y[i];                                           \
                GX[i] = yi > (T)0 ? gi : (T)0;                                          \
            }                                                                           \
        } else {                                                                        \
            for (int64_t i = 0; i < n; i++) {                                           \
                const T gi = *(const T *)(p[1] + i * s[1]), yi = *(const T *)(p[2] + i * s[2]); \
                *(T *)(p[0] + i * s[0]) = yi > (T)0 ? gi : (T)0;                        \
            }                                                                           \
        }                                                                               \
    }
RELU_BACKWARD_INNER(relu_backward_f32, float)
RELU_BACKWARD_INNER(relu_backward_f64, double)

nd_inner_fn nd_cpu_relu_backward_inner(nd_dtype dt) {
    return dt == ND_FLOAT32 ? relu_backward_f32 : dt == ND_FLOAT64 ? relu_backward_f64 : NULL;
}

nd_status nd_cpu_relu_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *y) {
    const int64_t n = nd_numel(gx);
    if (gx->dtype == ND_FLOAT32) RELU_BACKWARD(float);
    else if (gx->dtype == ND_FLOAT64) RELU_BACKWARD(double);
    else return nd_fail(ND_ERR_DTYPE, "relu_backward: no cpu kernel for %s", nd_dtype_name(gx->dtype));
    return ND_OK;
}
