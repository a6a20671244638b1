/* index.cl - gather/index_select (pick), scatter, scatter_add/index_add,
 * masked_fill and the index bounds check, for one element type T.
 *
 * Moves (pick, scatter_set, masked_fill) are built with an integer type of
 * the element's size (ocl_index.c), so every dtype of that size shares one
 * program and bits move untouched. The accumulating kernel is built per
 * dtype and follows the CPU (cpu_index.c): integers wrap, bool ORs, float16
 * and bfloat16 add through double (float without fp64) and round once to
 * float, then to the half type.
 *
 * Scatter and index_add give each work-item one lane (a line of positions
 * along dim) and walk its sources in index order: a destination element is
 * only ever written by its own lane, so there are no atomics, duplicates
 * resolve as on the CPU (the last write wins, sums in index order) and
 * results are bit-identical to it. */

/* a*b+c must round twice, as the CPU's C code does */
#pragma OPENCL FP_CONTRACT OFF

/* ---- bounds check: flag = 1 when any index is outside [0, limit) ---- */
__kernel void check_index(long limit, __global int *flag, long n, nd_geom g,
                          __global const long *idx) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    /* one unsigned compare catches negatives too; every writer stores 1 */
    if ((ulong)idx[off[0]] >= (ulong)limit) *flag = 1;
}

/* ---- pick: out = x moved along dim by the index (gather, index_select).
 * Operands: out, the index and x viewed in out's shape (x with stride 0
 * along dim); xd is x's stride along dim. */
__kernel void pick(long xd, long n, nd_geom g, __global T *out, __global const long *idx,
                   __global const T *x) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    out[off[0]] = x[off[2] + idx[off[1]] * xd];
}

/* ---- masked_fill: out = mask ? value : out ---- */
__kernel void masked_fill(T value, long n, nd_geom g, __global T *out,
                          __global const uchar *mask) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    if (mask[off[1]]) out[off[0]] = value;
}

/* ---- scatter: one work-item per lane. Operands: out, index, src viewed
 * in the lane shape (index's shape with dim of size 1); K positions along
 * dim with strides os (out), is (index), ss (src). */
__kernel void scatter_set(long K, long os, long is, long ss, long n, nd_geom g,
                          __global T *out, __global const long *idx, __global const T *src) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    for (long k = 0; k < K; k++) out[off[0] + idx[off[1] + k * is] * os] = src[off[2] + k * ss];
}

#ifdef ACC
/* ---- accumulate: out[j] += alpha * src[k] (scatter_add has alpha 1, which
 * changes no value: 1 * v == v in every dtype) ---- */

#if T_ID == 6 || T_ID == 7
/* float16/bfloat16 as the CPU's nd_half_to_float / nd_float_to_half /
 * nd_bf16_to_float / nd_float_to_bf16 (dtype.c), bit for bit */
inline float half_bits_to_float(ushort h) {
#if T_ID == 6
    return nd_half_to_float(h);
#else
    return nd_bf16_to_float(h);
#endif
}

inline ushort float_to_half_bits(float f) {
#if T_ID == 6
    return nd_float_to_half(f);
#else
    return nd_float_to_bf16(f);
#endif
}
#endif

/* ALPHA_T: the type alpha travels in (ocl_index.c sets it to match). */
#if T_ID == 0
typedef float ALPHA_T;
#elif T_ID == 1
typedef double ALPHA_T;
#elif T_ID == 2
typedef ulong ALPHA_T;
#elif T_ID == 3
typedef uint ALPHA_T;
#elif T_ID == 4 || T_ID == 5
typedef uchar ALPHA_T;
#else
typedef acc_t ALPHA_T;
#endif

inline T add_scaled(T d, ALPHA_T a, T v) {
#if T_ID == 0 || T_ID == 1
    return d + a * v;
#elif T_ID == 2
    return (long)((ulong)d + a * (ulong)v);
#elif T_ID == 3
    return (int)((uint)d + a * (uint)v);
#elif T_ID == 4
    return (uchar)(d + a * v);
#elif T_ID == 5
    return d | (a & v);
#else
    acc_t s = (acc_t)half_bits_to_float(d) + a * (acc_t)half_bits_to_float(v);
    return float_to_half_bits((float)s);
#endif
}

__kernel void scatter_add(ALPHA_T alpha, long K, long os, long is, long ss, long n, nd_geom g,
                          __global T *out, __global const long *idx, __global const T *src) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    for (long k = 0; k < K; k++) {
        long d = off[0] + idx[off[1] + k * is] * os;
        out[d] = add_scaled(out[d], alpha, src[off[2] + k * ss]);
    }
}
#endif
