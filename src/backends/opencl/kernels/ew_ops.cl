/* ew_ops.cl - the per-op functions of the elementwise kernels for one
 * element type T (build define): un_op, bin_op and cmp_op switch over the
 * cases generated from needle_ops.h (ocl_registry_source.c). Compiled in
 * front of kernels/elementwise.cl and of the fused kernels nd.compile
 * generates (ocl_fused.c), which call them with constant op codes.
 *
 * No contraction: a fused kernel evaluates a * b + c as two calls, and
 * must round twice as the unfused kernels do (bit-identical results), not
 * once through an FMA. */
#pragma OPENCL FP_CONTRACT OFF

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

/* The cases come from needle_ops.h (ocl_registry_source.c); the host
 * launches an op only for the dtypes it has a case for, so the returns after
 * the switches are not reached. */
inline T un_op(int op, T x) {
    switch (op) {
#if IS_FLOAT
    ND_UNARY_FLOAT_CASES
#else
    ND_UNARY_INT_CASES
#endif
    }
    return x;
}

inline T bin_op(int op, T a, T b) {
    switch (op) {
#if IS_FLOAT
    ND_BINARY_FLOAT_CASES
#elif IS_BOOL
    ND_BINARY_BOOL_CASES
#else
    ND_BINARY_INT_CASES
#endif
    }
    return a;
}

inline uchar cmp_op(int op, T a, T b) {
    switch (op) {
#if IS_FLOAT
    ND_COMPARE_FLOAT_CASES
#elif IS_BOOL
    ND_COMPARE_BOOL_CASES
#else
    ND_COMPARE_INT_CASES
#endif
    }
    return 0;
}
