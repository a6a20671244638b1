/* copy.cl - strided copy with dtype conversion: build defines SRC_T/SRC_ID
 * and DST_T/DST_ID (nd_dtype numbers: 0 float32, 1 float64, 2 int64,
 * 3 int32, 4 uint8, 5 bool, 6 float16, 7 bfloat16; the half types are
 * ushort bits). As the CPU (dtype.c's nd_store_f64): into an integer
 * dtype, floats truncate toward zero and everything saturates at the
 * destination's range (NaN gives 0); anything -> bool is != 0 (NaN too),
 * half types round to nearest even (common.cl's conversions, bit for bit
 * as the CPU). */

#define S_FLOAT (SRC_ID == 0 || SRC_ID == 1 || SRC_ID == 6 || SRC_ID == 7)
#define D_INT (DST_ID >= 2 && DST_ID <= 4)

#if SRC_ID == 1 || DST_ID == 1
typedef double mid_t;
#else
typedef float mid_t;
#endif

inline DST_T convert_one(__global const SRC_T *src, long i) {
#if SRC_ID == DST_ID
    return src[i];
#else
    /* read */
#if SRC_ID == 6
    mid_t v = (mid_t)nd_half_to_float(src[i]);
#elif SRC_ID == 7
    mid_t v = (mid_t)nd_bf16_to_float(src[i]);
#elif S_FLOAT
    mid_t v = (mid_t)src[i];
#else
    long iv = (long)src[i];
#endif
    /* write */
#if DST_ID == 5
#if S_FLOAT
    return (DST_T)(v != 0);
#else
    return (DST_T)(iv != 0);
#endif
#elif D_INT
#if S_FLOAT
    if (isnan(v)) return 0;
#if DST_ID == 2
    return convert_long_sat_rtz(v);
#elif DST_ID == 3
    return convert_int_sat_rtz(v);
#else
    return convert_uchar_sat_rtz(v);
#endif
#else /* integer -> narrower integer saturates too */
#if DST_ID == 2
    return iv;
#elif DST_ID == 3
    return convert_int_sat(iv);
#else
    return convert_uchar_sat(iv);
#endif
#endif
#else /* float destination */
#if S_FLOAT
    mid_t f = v;
#else
    mid_t f = (mid_t)iv;
#endif
#if DST_ID == 7
    return nd_float_to_bf16((float)f);
#elif DST_ID == 6
    return nd_float_to_half((float)f);
#else
    return (DST_T)f;
#endif
#endif
#endif
}

/* dst[di] = convert(src[si]) */
inline void store_one(__global DST_T *dst, long di, __global const SRC_T *src, long si) {
    dst[di] = convert_one(src, si);
}

__kernel void copy_strided(long n, nd_geom g, __global DST_T *dst, __global const SRC_T *src) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    store_one(dst, off[0], src, off[1]);
}

__kernel void copy_flat(long n, __global DST_T *dst, long doff, __global const SRC_T *src,
                        long soff) {
    long i = get_global_id(0);
    if (i < n) store_one(dst, doff + i, src, soff + i);
}
