/* pooling.cl - 2-D max and average pooling, forward and backward, for
 * T = float or double (build define), on contiguous (planes, H, W) inputs
 * and (planes, oh, ow) outputs given by element offsets. The window
 * arithmetic, tie-breaking, NaN handling, divisors and summation order are
 * those of src/backends/cpu/cpu_pool.c, so results equal the CPU's bit for
 * bit. Backward kernels are gathers (each input element sums what reaches
 * it, in the CPU's order): deterministic, no atomics. */

typedef struct {
    long kh, kw, sh, sw, ph, pw, dh, dw;
    long oh, ow;
    int count_include_pad, adaptive;
} pool_geom;

/* ---------------------------------------------------------------- max */

__kernel void max_pool(long n, pool_geom p, long H, long W, __global T *out, long ooff,
                       __global long *ind, long ioff, __global const T *x, long xoff) {
    long idx = get_global_id(0);
    if (idx >= n) return;
    long OL = p.oh * p.ow;
    long pl = idx / OL, o = idx - pl * OL;
    long oh = o / p.ow, ow = o - oh * p.ow;
    __global const T *xp = x + xoff + pl * H * W;
    long h0 = oh * p.sh - p.ph;
    long h1 = min(h0 + (p.kh - 1) * p.dh + 1, H);
    while (h0 < 0) h0 += p.dh;
    long w0 = ow * p.sw - p.pw;
    long w1 = min(w0 + (p.kw - 1) * p.dw + 1, W);
    while (w0 < 0) w0 += p.dw;
    /* strictly greater keeps the first of tied maxima; a NaN wins */
    T best = -INFINITY;
    long bi = h0 * W + w0;
    for (long h = h0; h < h1; h += p.dh)
        for (long w = w0; w < w1; w += p.dw) {
            T v = xp[h * W + w];
            if (v > best || v != v) {
                best = v;
                bi = h * W + w;
            }
        }
    out[ooff + idx] = best;
    ind[ioff + idx] = bi;
}

/* Backward, pass 1: for output row (pl, oh), the lowest and highest input
 * row its (valid) indices point at, so pass 2 visits only the output rows
 * that can reach an input row, for any indices. */
__kernel void max_pool_rows(long n, long OH, long OW, long H, long W,
                            __global const long *ind, long ioff, __global long *rows) {
    long r = get_global_id(0);
    if (r >= n) return;
    __global const long *ip = ind + ioff + r * OW;
    long HW = H * W, lo = H, hi = -1;
    for (long ow = 0; ow < OW; ow++) {
        long k = ip[ow];
        if (k < 0 || k >= HW) continue;
        long y = k / W;
        lo = min(lo, y);
        hi = max(hi, y);
    }
    rows[2 * r] = lo;
    rows[2 * r + 1] = hi;
}

/* Pass 2: one work-item per input row (pl, y): zeroes it, then adds g at
 * every index that lands in it, in output order (the CPU's order). */
__kernel void max_pool_backward(long n, long OH, long OW, long H, long W, __global T *gx,
                                long gxoff, __global const T *g, long goff,
                                __global const long *ind, long ioff,
                                __global const long *rows) {
    long r = get_global_id(0);
    if (r >= n) return;
    long pl = r / H, y = r - pl * H;
    __global T *gp = gx + gxoff + pl * H * W;
    for (long w = 0; w < W; w++) gp[y * W + w] = 0;
    long lo = y * W, hi = lo + W;
    for (long oh = 0; oh < OH; oh++) {
        long ro = pl * OH + oh;
        if (y < rows[2 * ro] || y > rows[2 * ro + 1]) continue;
        __global const long *ip = ind + ioff + ro * OW;
        __global const T *g0 = g + goff + ro * OW;
        for (long ow = 0; ow < OW; ow++) {
            long k = ip[ow];
            if (k >= lo && k < hi) gp[k] += g0[ow];
        }
    }
}

/* ---------------------------------------------------------------- avg */

/* Window [*a, *b) of output o along one axis of size n, and its share of
 * the divisor (cpu_pool.c avg_window). */
inline void avg_window(pool_geom p, int axis, long o, long n, long *a, long *b, long *cnt) {
    long osz = axis ? p.ow : p.oh;
    if (p.adaptive) {
        *a = (o * n) / osz;
        *b = ((o + 1) * n + osz - 1) / osz;
        *cnt = *b - *a;
        return;
    }
    long k = axis ? p.kw : p.kh, s = axis ? p.sw : p.sh, pad = axis ? p.pw : p.ph;
    long lo = o * s - pad, hi = lo + k;
    if (hi > n + pad) hi = n + pad;
    long pool = hi - lo;
    if (lo < 0) lo = 0;
    if (hi > n) hi = n;
    *a = lo;
    *b = hi;
    *cnt = p.count_include_pad ? pool : hi - lo;
}

/* Outputs [*first, *last] along one axis whose windows may contain input
 * position h (a superset: callers check with avg_window). */
inline void avg_candidates(pool_geom p, int axis, long h, long n, long *first, long *last) {
    long osz = axis ? p.ow : p.oh;
    long a, b;
    if (p.adaptive) {
        a = (h * osz) / n;
        b = ((h + 1) * osz + n - 1) / n; /* exclusive */
    } else {
        long k = axis ? p.kw : p.kh, s = axis ? p.sw : p.sh, pad = axis ? p.pw : p.ph;
        /* o*s - pad <= h < o*s - pad + k */
        long t = h + pad - k + 1;
        a = t <= 0 ? 0 : (t + s - 1) / s;
        b = (h + pad) / s + 1;
    }
    *first = max(a, 0L);
    *last = min(b, osz) - 1;
}

__kernel void avg_pool(long n, pool_geom p, long H, long W, __global T *out, long ooff,
                       __global const T *x, long xoff) {
    long idx = get_global_id(0);
    if (idx >= n) return;
    long OL = p.oh * p.ow;
    long pl = idx / OL, o = idx - pl * OL;
    long oh = o / p.ow, ow = o - oh * p.ow;
    __global const T *xp = x + xoff + pl * H * W;
    long h0, h1, ch, w0, w1, cw;
    avg_window(p, 0, oh, H, &h0, &h1, &ch);
    avg_window(p, 1, ow, W, &w0, &w1, &cw);
    T sum = 0;
    if (h0 < h1 && w0 < w1) {
        for (long h = h0; h < h1; h++)
            for (long w = w0; w < w1; w++) sum += xp[h * W + w];
        sum /= (T)(ch * cw);
    }
    out[ooff + idx] = sum;
}

__kernel void avg_pool_backward(long n, pool_geom p, long H, long W, __global T *gx, long gxoff,
                                __global const T *g, long goff) {
    long idx = get_global_id(0);
    if (idx >= n) return;
    long HW = H * W;
    long pl = idx / HW, rem = idx - pl * HW;
    long y = rem / W, xx = rem - y * W;
    __global const T *g0 = g + goff + pl * p.oh * p.ow;
    long oh0, oh1, ow0, ow1;
    avg_candidates(p, 0, y, H, &oh0, &oh1);
    avg_candidates(p, 1, xx, W, &ow0, &ow1);
    T sum = 0;
    for (long oh = oh0; oh <= oh1; oh++) {
        long h0, h1, ch;
        avg_window(p, 0, oh, H, &h0, &h1, &ch);
        if (y < h0 || y >= h1) continue;
        for (long ow = ow0; ow <= ow1; ow++) {
            long w0, w1, cw;
            avg_window(p, 1, ow, W, &w0, &w1, &cw);
            if (xx < w0 || xx >= w1) continue;
            sum += g0[oh * p.ow + ow] / (T)(ch * cw);
        }
    }
    gx[gxoff + idx] = sum;
}
