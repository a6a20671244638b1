/* random.cl - random fills from the Philox4x32-10 stream, for one output
 * type T (build define), as src/backends/cpu/cpu_random.c: element i
 * (row-major over out) uses counter (offset + i) under key seed, and the
 * same conversions from the counter's 4 words:
 *   uniform   float32: top 24 bits of w0; float64: top 53 bits of w0:w1;
 *             float16/bfloat16: top 11/8 bits of w0 (others 24)
 *   normal    Box-Muller, cos branch: float32 from w0 and w1, float64 from
 *             w0:w1 and w2:w3 (other types through the float32 formula)
 *   int       lo + mulhi64(w0:w1, range)
 *   bernoulli 1 when a uniform (24 bits for float32 p, else 53) is < p[i]
 * Integer results and the uniform ones are bit-identical to the CPU's; the
 * normal ones may differ in the last bits (log, cos and sqrt of the device).
 * Types other than float32/float64 go through acc_t (double when the device
 * has fp64, as the CPU's double; float otherwise). Bernoulli programs also
 * get P_T/P_ID, the probabilities' type. */

/* a + w * u must round twice, as the CPU's C code does */
#pragma OPENCL FP_CONTRACT OFF

#define TWO_PI 6.283185307179586476925286766559

inline float u24(uint w) { return (float)(w >> 8) * 0x1p-24f; }
inline ulong words64(uint hi, uint lo) { return (ulong)hi << 32 | lo; }
#ifdef ND_FP64
inline double u53(uint hi, uint lo) { return (double)(words64(hi, lo) >> 11) * 0x1p-53; }
#else
inline float u53(uint hi, uint lo) { return (float)(words64(hi, lo) >> 11) * 0x1p-53f; }
#endif

/* Counter ctr's words under seed (element i of a random op uses counter offset + i). */
inline uint4 draw(ulong seed, ulong ctr) {
    return nd_philox((uint4)((uint)ctr, (uint)(ctr >> 32), 0u, 0u),
                     (uint2)((uint)seed, (uint)(seed >> 32)));
}

inline float normal_f32(uint4 w) {
    float u1 = (float)((w.x >> 8) + 1) * 0x1p-24f; /* (0, 1]: log stays finite */
    return sqrt(-2.0f * log(u1)) * cos((float)TWO_PI * u24(w.y));
}

#ifdef ND_FP64
inline double normal_f64(uint4 w) {
    double u1 = (double)((words64(w.x, w.y) >> 11) + 1) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(TWO_PI * u53(w.z, w.w));
}
#endif

/* ---- one element as the CPU's nd_load_f64 / nd_store_f64 (dtype.c) ---- */

/* float -> int64 truncating toward zero, saturating, NaN -> 0 */
inline long acc_to_i64(acc_t v) {
    if (isnan(v)) return 0;
    if (v >= (acc_t)9.2233720368547758e18) return LONG_MAX;
    if (v <= (acc_t)-9.2233720368547758e18) return LONG_MIN;
    return (long)v;
}

#define LOAD_AS(ID, p, i)                                                   \
    ((ID) == 6 ? (acc_t)nd_half_to_float((ushort)(p)[i])                     \
     : (ID) == 7 ? (acc_t)nd_bf16_to_float((ushort)(p)[i])                   \
     : (ID) == 5 ? (acc_t)((p)[i] != 0)                                    \
     : (acc_t)(p)[i])

inline void store_acc(__global T *o, long i, acc_t v) {
#if T_ID == 0 || T_ID == 1
    o[i] = (T)v;
#elif T_ID == 2
    o[i] = acc_to_i64(v);
#elif T_ID == 3 /* saturating, NaN -> 0, as nd_store_f64 */
    o[i] = isnan(v) ? 0 : convert_int_sat_rtz(v);
#elif T_ID == 4
    o[i] = isnan(v) ? 0 : convert_uchar_sat_rtz(v);
#elif T_ID == 5
    o[i] = v != 0;
#elif T_ID == 6
    o[i] = nd_float_to_half((float)v);
#else
    o[i] = nd_float_to_bf16((float)v);
#endif
}

/* ---- uniform in [a, b). float32: pa = a, pw = (float)(b - a), pb = b,
 * top = the largest float below b; float64: pa, pb, top; other types: pa,
 * pb (acc_t). */
#if T_ID == 0
typedef float P_ARG;
#else
typedef acc_t P_ARG;
#endif

__kernel void rand_uniform(P_ARG pa, P_ARG pw, P_ARG pb, P_ARG top, ulong seed, ulong offset,
                           long n, nd_geom g, __global T *out) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    uint4 w = draw(seed, offset + (ulong)i);
#if T_ID == 0
    float v = pa + pw * u24(w.x);
    out[off[0]] = v < pb ? v : top;
#elif T_ID == 1
    double v = pa + (pb - pa) * u53(w.x, w.y);
    out[off[0]] = v < pb ? v : top;
#else
    /* as many bits as the mantissa holds; a value that still rounds up to
     * b becomes a */
    const int bits = T_ID == 6 ? 11 : T_ID == 7 ? 8 : 24;
    const acc_t scale = (acc_t)1 / (acc_t)(1u << bits);
    store_acc(out, off[0], pa + (pb - pa) * (acc_t)(w.x >> (32 - bits)) * scale);
    if (LOAD_AS(T_ID, out, off[0]) >= pb && pb > pa) store_acc(out, off[0], pa);
#endif
}

/* ---- normal(mean, std) ---- */
__kernel void rand_normal(P_ARG mean, P_ARG std, ulong seed, ulong offset, long n, nd_geom g,
                          __global T *out) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    uint4 w = draw(seed, offset + (ulong)i);
#if T_ID == 0
    out[off[0]] = mean + std * normal_f32(w);
#elif T_ID == 1
    out[off[0]] = mean + std * normal_f64(w);
#else
    store_acc(out, off[0], mean + std * (acc_t)normal_f32(w));
#endif
}

/* ---- integers in [lo, lo + range) ---- */
__kernel void rand_int(long lo, ulong range, ulong seed, ulong offset, long n, nd_geom g,
                       __global T *out) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    uint4 w = draw(seed, offset + (ulong)i);
    long v = (long)((ulong)lo + mul_hi(words64(w.x, w.y), range));
#if T_ID == 2
    out[off[0]] = v;
#elif T_ID == 3
    out[off[0]] = (int)v;
#elif T_ID == 0 || T_ID == 1
    out[off[0]] = (T)v;
#else
    store_acc(out, off[0], (acc_t)v);
#endif
}

/* ---- bernoulli(p): operands out and p (same shape) ---- */
#ifdef P_ID
__kernel void rand_bernoulli(ulong seed, ulong offset, long n, nd_geom g, __global T *out,
                             __global const P_T *p) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    uint4 w = draw(seed, offset + (ulong)i);
#if T_ID == 0 && P_ID == 0
    out[off[0]] = u24(w.x) < p[off[1]] ? 1.0f : 0.0f;
#elif T_ID == 1 && P_ID == 1
    out[off[0]] = u53(w.x, w.y) < p[off[1]] ? 1.0 : 0.0;
#else
    /* float32 p keeps the 24-bit draw so the result matches the fast path */
    acc_t u = P_ID == 0 ? (acc_t)u24(w.x) : (acc_t)u53(w.x, w.y);
    store_acc(out, off[0], u < LOAD_AS(P_ID, p, off[1]) ? (acc_t)1 : (acc_t)0);
#endif
}
#endif
