/* common.cl - compiled in front of every kernels/<file>.cl.
 *
 * Build defines: T (the element type of the program, when it has one),
 * T_FLOAT (1 for float/double), T_ID (nd_dtype number), ND_FP64 (the device
 * has doubles). */
#ifdef ND_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

/* Strided operands of one shape (ocl_geom in ocl_runtime.h, same layout):
 * operand k's element i (row-major over shape) sits at
 * offset[k] + sum_d coord_d(i) * strides[k][d]. */
typedef struct {
    long shape[8];
    long strides[4][8];
    long offset[4];
    int ndim;
    int pad_;
} nd_geom;

/* Element offsets of linear index i for the first `nops` operands. */
#define GEOM_OFFSETS(g, i, nops, off)                                   \
    do {                                                                \
        long r_ = (i);                                                  \
        for (int k_ = 0; k_ < (nops); k_++) (off)[k_] = (g).offset[k_]; \
        for (int d_ = (g).ndim - 1; d_ >= 0; d_--) {                    \
            long s_ = (g).shape[d_];                                    \
            long q_ = d_ ? r_ / s_ : 0;                                 \
            long c_ = r_ - q_ * s_;                                     \
            r_ = q_;                                                    \
            for (int k_ = 0; k_ < (nops); k_++) (off)[k_] += c_ * (g).strides[k_][d_]; \
        }                                                               \
    } while (0)

/* Accumulator type for reductions of T. */
#if defined(ND_FP64)
typedef double acc_t;
#else
typedef float acc_t;
#endif

/* Philox4x32-10, as src/backends/cpu/cpu_philox.h: counter (c0..c3), key (k0, k1).
 * The rounds are unrolled: that lets POCL vectorise the random kernels (3-5x). */
inline uint4 nd_philox(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        ulong p0 = (ulong)0xD2511F53u * c.x;
        ulong p1 = (ulong)0xCD9E8D57u * c.z;
        uint4 n;
        n.x = (uint)(p1 >> 32) ^ c.y ^ k.x;
        n.y = (uint)p1;
        n.z = (uint)(p0 >> 32) ^ c.w ^ k.y;
        n.w = (uint)p0;
        c = n;
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}
