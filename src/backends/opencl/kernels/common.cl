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

/* float16 / bfloat16 bits <-> float, bit for bit as the CPU's nd_half_to_float,
 * nd_float_to_half, nd_bf16_to_float and nd_float_to_bf16 (dtype.c): round to
 * nearest even, the same quiet-NaN bits. Every kernel uses these (not
 * vload_half/vstore_half) so that devices agree with the CPU exactly. */
inline float nd_half_to_float(ushort h) {
    uint sign = (uint)(h >> 15) << 31, e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (e == 0) {
        if (mant == 0) return as_float(sign);
        float f = ldexp((float)mant, -24);
        return sign ? -f : f;
    }
    if (e == 31) return as_float(sign | 0x7f800000u | (mant << 13));
    return as_float(sign | ((e + 112) << 23) | (mant << 13));
}

inline ushort nd_float_to_half(float f) {
    uint x = as_uint(f);
    ushort sign = (ushort)((x >> 16) & 0x8000);
    uint absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);
    if (absx >= 0x477ff000u) return sign | 0x7c00;
    if (absx < 0x38800000u) return sign | (ushort)rint(as_float(absx) * 16777216.0f);
    uint mant = absx & 0x7fffff, e = (absx >> 23) - 112;
    uint h = (e << 10) | (mant >> 13);
    uint rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (ushort)h;
}

inline float nd_bf16_to_float(ushort h) { return as_float((uint)h << 16); }

inline ushort nd_float_to_bf16(float f) {
    uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (ushort)(x >> 16);
}
