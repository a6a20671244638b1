/* elementwise.cl - unary, binary (arithmetic and comparisons), scalar forms,
 * where, clamp and fill for one element type T (build define).
 *
 * Op codes are nd_unary_op / nd_binary_op (needle.h; ocl_elementwise.c
 * checks the numbering). Every kernel has a flat form (operands contiguous
 * from their offsets) and a strided one driven by an nd_geom. Semantics
 * follow the CPU kernels: signed integers wrap, max/min propagate NaN,
 * round is half-to-even, bool + is or and * is and. */

#if T_ID == 0 || T_ID == 1
#define IS_FLOAT 1
#else
#define IS_FLOAT 0
#endif
#if T_ID == 2
typedef ulong U;
#elif T_ID == 3
typedef uint U;
#else
typedef uint U;
#endif
#define IS_BOOL (T_ID == 5)

enum { U_NEG, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_TANH, U_SIGMOID, U_RELU, U_SIGN,
       U_FLOOR, U_CEIL, U_ROUND, U_SIN, U_COS, U_ERF };
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAX, B_MIN, B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE };

#if !IS_FLOAT
inline long ipow64(long base, long e) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
    ulong r = 1, b = (ulong)base;
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (long)r;
}
#endif

inline T un_op(int op, T x) {
#if IS_FLOAT
    switch (op) {
    case U_NEG: return -x;
    case U_ABS: return fabs(x);
    case U_EXP: return exp(x);
    case U_LOG: return log(x);
    case U_SQRT: return sqrt(x);
    case U_RSQRT: return (T)1 / sqrt(x);
    case U_TANH: return tanh(x);
    case U_SIGMOID: return (T)1 / ((T)1 + exp(-x));
    case U_RELU: return x > 0 ? x : (isnan(x) ? x : (T)0);
    case U_SIGN: return x > 0 ? (T)1 : x < 0 ? (T)-1 : x;
    case U_FLOOR: return floor(x);
    case U_CEIL: return ceil(x);
    case U_ROUND: return rint(x);
    case U_SIN: return sin(x);
    case U_COS: return cos(x);
    default: return erf(x);
    }
#elif T_ID == 4 || IS_BOOL
    switch (op) {
    case U_NEG: return (T)(0u - (uint)x);
    case U_SIGN: return (T)(x > 0);
    default: return x; /* abs, relu, floor, ceil, round */
    }
#else
    switch (op) {
    case U_NEG: return (T)(0 - (U)x);
    case U_ABS: return x < 0 ? (T)(0 - (U)x) : x;
    case U_RELU: return x > 0 ? x : 0;
    case U_SIGN: return (T)((x > 0) - (x < 0));
    default: return x; /* floor, ceil, round */
    }
#endif
}

inline T bin_op(int op, T a, T b) {
#if IS_FLOAT
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_POW: return pow(a, b);
    case B_MAX: return (a > b || isnan(a)) ? a : b;
    default: return (a < b || isnan(a)) ? a : b;
    }
#elif IS_BOOL
    switch (op) {
    case B_ADD: case B_MAX: return a | b;
    default: return a & b; /* mul, min */
    }
#else
    switch (op) {
    case B_ADD: return (T)((U)a + (U)b);
    case B_SUB: return (T)((U)a - (U)b);
    case B_MUL: return (T)((U)a * (U)b);
    case B_POW: return (T)ipow64((long)a, (long)b);
    case B_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
#endif
}

inline uchar cmp_op(int op, T a, T b) {
    switch (op) {
    case B_EQ: return a == b;
    case B_NE: return a != b;
    case B_LT: return a < b;
    case B_LE: return a <= b;
    case B_GT: return a > b;
    default: return a >= b;
    }
}

__kernel void unary_flat(int op, long n, __global T *o, long oo, __global const T *x, long xo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = un_op(op, x[xo + i]);
}

__kernel void unary_strided(int op, long n, nd_geom g, __global T *o, __global const T *x) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    o[off[0]] = un_op(op, x[off[1]]);
}

__kernel void binary_flat(int op, long n, __global T *o, long oo, __global const T *a, long ao,
                          __global const T *b, long bo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = bin_op(op, a[ao + i], b[bo + i]);
}

__kernel void binary_strided(int op, long n, nd_geom g, __global T *o, __global const T *a,
                             __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    o[off[0]] = bin_op(op, a[off[1]], b[off[2]]);
}

__kernel void compare_strided(int op, long n, nd_geom g, __global uchar *o, __global const T *a,
                              __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    o[off[0]] = cmp_op(op, a[off[1]], b[off[2]]);
}

/* a op s, or s op a when scalar_first */
__kernel void scalar_strided(int op, int scalar_first, T s, long n, nd_geom g, __global T *o,
                             __global const T *a) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T x = a[off[1]];
    o[off[0]] = scalar_first ? bin_op(op, s, x) : bin_op(op, x, s);
}

__kernel void scalar_flat(int op, int scalar_first, T s, long n, __global T *o, long oo,
                          __global const T *a, long ao) {
    long i = get_global_id(0);
    if (i >= n) return;
    T x = a[ao + i];
    o[oo + i] = scalar_first ? bin_op(op, s, x) : bin_op(op, x, s);
}

__kernel void compare_scalar_strided(int op, int scalar_first, T s, long n, nd_geom g,
                                     __global uchar *o, __global const T *a) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T x = a[off[1]];
    o[off[0]] = scalar_first ? cmp_op(op, s, x) : cmp_op(op, x, s);
}

__kernel void where_strided(long n, nd_geom g, __global T *o, __global const uchar *c,
                            __global const T *a, __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[4];
    GEOM_OFFSETS(g, i, 4, off);
    o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
}

/* lo/hi already resolved by the host (integers: exact bounds; floats:
 * +-inf for no bound); has_lo/has_hi kept for NaN bounds. */
__kernel void clamp_strided(T lo, T hi, long n, nd_geom g, __global T *o, __global const T *x) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T v = x[off[1]];
    o[off[0]] = v < lo ? lo : v > hi ? hi : v;
}

__kernel void fill_strided(T v, long n, nd_geom g, __global T *o) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    o[off[0]] = v;
}

__kernel void fill_flat(T v, long n, __global T *o, long oo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = v;
}
