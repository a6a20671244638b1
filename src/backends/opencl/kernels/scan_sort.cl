/* scan_sort.cl - cumsum and stable sort along one dim.
 *
 * Build defines: T, T_ID (the input's type and nd_dtype number; float16 and
 * bfloat16 are ushort bits), and for cumsum O_T, O_ID (the output's: x's
 * type for floats, long for integers and bool), WG_MAX.
 *
 * Both work on "lines": every element with the same coordinates outside
 * the dim (lgeom, filled by ocl_scan_sort.c). As the CPU (cpu_scan_sort.c):
 * float sums accumulate in acc_t (double when the device has it), integer
 * ones in ulong (wrapping); sort orders by a 64-bit key whose integer order
 * is the value order (NaN largest and all equal, -0 == +0; descending
 * complements it), ties by position, which gives PyTorch's stable order. */

#ifndef WG_MAX
#define WG_MAX 256
#endif

/* ocl_scan_sort.c's lgeom, same layout. Operands: cumsum (out, x), sort
 * (values, indices, x). */
typedef struct {
    long shape[8];     /* dims other than the scanned one (row-major line order) */
    long stride[3][8]; /* each operand's strides over them, in elements */
    long dstride[3];   /* each operand's stride along the dim */
    long offset[3];
    long n;            /* line length */
    long lines;
    int ndim;
    int pad_;
} lgeom;

/* Element offsets of the first element of line l for the first nops operands. */
inline void line_offsets(const lgeom *g, long l, int nops, long *off) {
    for (int k = 0; k < nops; k++) off[k] = g->offset[k];
    for (int d = g->ndim - 1; d >= 0; d--) {
        long q = l / g->shape[d];
        long c = l - q * g->shape[d];
        l = q;
        for (int k = 0; k < nops; k++) off[k] += c * g->stride[k][d];
    }
}

/* ---------------------------------------------------------------- cumsum */
#ifdef O_T

#if T_ID == 0 || T_ID == 1 || T_ID == 6 || T_ID == 7
typedef acc_t sum_t;
#else
typedef ulong sum_t;
#endif

inline sum_t load_x(__global const T *x, long i) {
#if T_ID == 6
    return (sum_t)nd_half_to_float(x[i]);
#elif T_ID == 7
    return (sum_t)nd_bf16_to_float(x[i]);
#elif T_ID == 0 || T_ID == 1
    return (sum_t)x[i];
#else
    return (sum_t)(long)x[i]; /* int32 sign-extends, uint8/bool zero-extend */
#endif
}

inline void store_out(__global O_T *out, long i, sum_t v) {
#if O_ID == 6
    out[i] = nd_float_to_half((float)v);
#elif O_ID == 7
    out[i] = nd_float_to_bf16((float)v);
#elif O_ID == 2
    out[i] = (long)v;
#else
    out[i] = (O_T)v;
#endif
}

/* One work-item per line. */
__kernel void cumsum_lines(lgeom g, __global O_T *out, __global const T *x) {
    long l = get_global_id(0);
    if (l >= g.lines) return;
    long off[2];
    line_offsets(&g, l, 2, off);
    sum_t acc = 0;
    for (long k = 0; k < g.n; k++) {
        acc += load_x(x, off[1] + k * g.dstride[1]);
        store_out(out, off[0] + k * g.dstride[0], acc);
    }
}

/* Long lines, few of them: each line is cut into nchunks chunks. First the
 * sum of every chunk, then each chunk is scanned from the sum of the chunks
 * before it. Work-item (line, chunk). */
__kernel void cumsum_chunk_sums(lgeom g, long chunk, long nchunks, __global const T *x,
                                __global sum_t *sums) {
    long id = get_global_id(0);
    if (id >= g.lines * nchunks) return;
    long l = id / nchunks, c = id - l * nchunks;
    long off[2];
    line_offsets(&g, l, 2, off);
    long k0 = c * chunk, k1 = min(k0 + chunk, g.n);
    sum_t acc = 0;
    for (long k = k0; k < k1; k++) acc += load_x(x, off[1] + k * g.dstride[1]);
    sums[id] = acc;
}

__kernel void cumsum_chunks(lgeom g, long chunk, long nchunks, __global O_T *out,
                            __global const T *x, __global const sum_t *sums) {
    long id = get_global_id(0);
    if (id >= g.lines * nchunks) return;
    long l = id / nchunks, c = id - l * nchunks;
    long off[2];
    line_offsets(&g, l, 2, off);
    sum_t acc = 0;
    for (long p = l * nchunks; p < id; p++) acc += sums[p];
    long k0 = c * chunk, k1 = min(k0 + chunk, g.n);
    for (long k = k0; k < k1; k++) {
        acc += load_x(x, off[1] + k * g.dstride[1]);
        store_out(out, off[0] + k * g.dstride[0], acc);
    }
}

#else /* ---------------------------------------------------------- sort */

inline ulong key_f32(float v) {
    if (isnan(v)) return ULONG_MAX;
    if (v == 0) v = 0.0f;
    uint b = as_uint(v);
    b = (b >> 31) ? ~b : (b | 0x80000000u);
    return (ulong)b << 32; /* the same order as the CPU's key of (double)v */
}

inline ulong sort_key(T v) {
#if T_ID == 0
    return key_f32(v);
#elif T_ID == 1
    if (isnan(v)) return ULONG_MAX;
    if (v == 0) v = 0.0;
    ulong b = as_ulong(v);
    return (b >> 63) ? ~b : (b | ((ulong)1 << 63));
#elif T_ID == 6
    return key_f32(nd_half_to_float(v));
#elif T_ID == 7
    return key_f32(nd_bf16_to_float(v));
#elif T_ID == 2 || T_ID == 3
    return (ulong)(long)v ^ ((ulong)1 << 63);
#else
    return (ulong)v; /* uint8, bool */
#endif
}

/* Keys of row l at keys[l*np ..]: line elements, then padding that sorts
 * after everything (the largest key and position). */
__kernel void sort_init(lgeom g, long np, int descending, __global const T *x,
                        __global ulong *keys, __global long *idx) {
    long i = get_global_id(0);
    if (i >= g.lines * np) return;
    long l = i / np, p = i - l * np;
    if (p < g.n) {
        long off[3];
        line_offsets(&g, l, 3, off);
        ulong k = sort_key(x[off[2] + p * g.dstride[2]]);
        keys[i] = descending ? ~k : k;
        idx[i] = p;
    } else {
        keys[i] = ULONG_MAX;
        idx[i] = LONG_MAX;
    }
}

/* (ka, ia) after (kb, ib) in the sorted order */
inline bool after(ulong ka, long ia, ulong kb, long ib) { return ka > kb || (ka == kb && ia > ib); }

/* Bitonic sort: every row is np (a power of two) entries; at stage k the
 * block of k entries holding position p (within its row) is sorted
 * ascending when (p & k) == 0. Pairs (i, i + j) never cross rows. */
inline void local_steps(__local ulong *lk, __local long *li, long base, long np, long k, long j0,
                        int lid) {
    for (long j = j0; j > 0; j >>= 1) {
        long i = 2 * (long)lid - (lid & (j - 1));
        long p = (base + i) & (np - 1);
        bool asc = (p & k) == 0;
        ulong ka = lk[i], kb = lk[i + j];
        long ia = li[i], ib = li[i + j];
        if (after(ka, ia, kb, ib) == asc && (ka != kb || ia != ib)) {
            lk[i] = kb; lk[i + j] = ka;
            li[i] = ib; li[i + j] = ia;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* Segments of 2 * local size entries, each sorted in local memory through
 * the stages k = 2 .. kmax (kmax = min(np, segment)). Entries past `total`
 * (only when one segment holds several rows) are padding kept in local memory. */
__kernel void sort_local(__global ulong *keys, __global long *idx, long total, long np, long kmax) {
    __local ulong lk[2 * WG_MAX];
    __local long li[2 * WG_MAX];
    int lid = get_local_id(0), L = get_local_size(0);
    long B = 2 * (long)L, base = get_group_id(0) * B;
    for (long t = lid; t < B; t += L) {
        long i = base + t;
        lk[t] = i < total ? keys[i] : ULONG_MAX;
        li[t] = i < total ? idx[i] : LONG_MAX;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long k = 2; k <= kmax; k <<= 1) local_steps(lk, li, base, np, k, k >> 1, lid);
    for (long t = lid; t < B; t += L) {
        long i = base + t;
        if (i < total) { keys[i] = lk[t]; idx[i] = li[t]; }
    }
}

/* One compare-exchange step (k, j) with j >= the segment size, over total / 2 pairs. */
__kernel void sort_global_step(__global ulong *keys, __global long *idx, long total, long np,
                               long k, long j) {
    long t = get_global_id(0);
    if (t >= total / 2) return;
    long i = 2 * t - (t & (j - 1));
    bool asc = ((i & (np - 1)) & k) == 0;
    ulong ka = keys[i], kb = keys[i + j];
    long ia = idx[i], ib = idx[i + j];
    if (after(ka, ia, kb, ib) == asc && (ka != kb || ia != ib)) {
        keys[i] = kb; keys[i + j] = ka;
        idx[i] = ib; idx[i + j] = ia;
    }
}

/* The steps j = segment / 2 .. 1 of stage k (> segment size, so segments
 * lie within one row and total is a multiple of the segment). */
__kernel void sort_local_merge(__global ulong *keys, __global long *idx, long np, long k) {
    __local ulong lk[2 * WG_MAX];
    __local long li[2 * WG_MAX];
    int lid = get_local_id(0), L = get_local_size(0);
    long B = 2 * (long)L, base = get_group_id(0) * B;
    for (long t = lid; t < B; t += L) { lk[t] = keys[base + t]; li[t] = idx[base + t]; }
    barrier(CLK_LOCAL_MEM_FENCE);
    local_steps(lk, li, base, np, k, L, lid);
    for (long t = lid; t < B; t += L) { keys[base + t] = lk[t]; idx[base + t] = li[t]; }
}

/* values[l, p] = x[l, idx[l*np + p]], indices[l, p] = idx[l*np + p]. */
__kernel void sort_gather(lgeom g, long np, __global T *values, __global long *indices,
                          __global const T *x, __global const long *idx) {
    long i = get_global_id(0);
    if (i >= g.lines * g.n) return;
    long l = i / g.n, p = i - l * g.n;
    long off[3];
    line_offsets(&g, l, 3, off);
    long s = idx[l * np + p];
    values[off[0] + p * g.dstride[0]] = x[off[2] + s * g.dstride[2]];
    indices[off[1] + p * g.dstride[1]] = s;
}

#endif
