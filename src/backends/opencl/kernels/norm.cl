/* norm.cl - fused (log_)softmax, layer_norm (forward and backward),
 * cross_entropy (forward and backward) and batch_norm, for T = float or
 * double.
 *
 * Semantics follow src/backends/cpu/cpu_softmax.c and cpu_norm.c: sums in
 * acc_t (double when the device has it), exp in T; a NaN in a row makes the
 * row's maximum NaN (so its results NaN), and a row whose maximum is -inf
 * is shifted by 0 instead (0/0 then gives NaN, as PyTorch). Most kernels
 * give one work-group to a row and reduce in local memory; the local size
 * is a power of two <= WG_MAX. */

#ifndef WG_MAX
#define WG_MAX 256
#endif

/* the maximum, NaN winning */
inline T max_nan(T a, T b) { return isnan(a) ? a : (isnan(b) || b > a) ? b : a; }

/* Sum of v over the work-group (every work-item gets it). buf: WG_MAX. */
inline acc_t wg_sum(__local acc_t *buf, acc_t v, int lid, int L) {
    barrier(CLK_LOCAL_MEM_FENCE); /* earlier readers of buf are done */
    buf[lid] = v;
    for (int h = L >> 1; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < h) buf[lid] += buf[lid + h];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return buf[0];
}

inline T wg_max_nan(__local acc_t *buf, T v, int lid, int L) {
    barrier(CLK_LOCAL_MEM_FENCE);
    buf[lid] = v;
    for (int h = L >> 1; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < h) buf[lid] = max_nan((T)buf[lid], (T)buf[lid + h]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return (T)buf[0];
}

/* ---------------------------------------------------------------- softmax
 * x, y: (outer, n, inner) contiguous from their offsets; row r = (o, i). */

__kernel void softmax_rows(long n, long inner, int want_log, __global const T *x, long xoff,
                           __global T *y, long yoff) {
    __local acc_t buf[WG_MAX];
    long r = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    long o = r / inner, base = o * n * inner + (r - o * inner);
    __global const T *xr = x + xoff + base;
    __global T *yr = y + yoff + base;
    T m = -INFINITY;
    for (long k = lid; k < n; k += L) m = max_nan(m, xr[k * inner]);
    m = wg_max_nan(buf, m, lid, L);
    if (isinf(m) && m < 0) m = 0;
    acc_t s = 0;
    for (long k = lid; k < n; k += L) {
        T e = exp(xr[k * inner] - m);
        if (!want_log) yr[k * inner] = e;
        s += e;
    }
    s = wg_sum(buf, s, lid, L);
    if (want_log) {
        T ls = (T)log(s); /* (x - m) - ls keeps the digits m + ls would lose */
        for (long k = lid; k < n; k += L) yr[k * inner] = (xr[k * inner] - m) - ls;
    } else {
        T inv = (T)((acc_t)1 / s);
        for (long k = lid; k < n; k += L) yr[k * inner] *= inv;
    }
}

/* One work-item per row: short rows, or a dim that is not the last (then
 * neighbouring work-items read neighbouring elements). */
__kernel void softmax_serial(long n, long inner, long rows, int want_log, __global const T *x,
                             long xoff, __global T *y, long yoff) {
    long r = get_global_id(0);
    if (r >= rows) return;
    long o = r / inner, base = o * n * inner + (r - o * inner);
    __global const T *xr = x + xoff + base;
    __global T *yr = y + yoff + base;
    T m = -INFINITY;
    for (long k = 0; k < n; k++) m = max_nan(m, xr[k * inner]);
    if (isinf(m) && m < 0) m = 0;
    acc_t s = 0;
    for (long k = 0; k < n; k++) {
        T e = exp(xr[k * inner] - m);
        if (!want_log) yr[k * inner] = e;
        s += e;
    }
    if (want_log) {
        T ls = (T)log(s);
        for (long k = 0; k < n; k++) yr[k * inner] = (xr[k * inner] - m) - ls;
    } else {
        T inv = (T)((acc_t)1 / s);
        for (long k = 0; k < n; k++) yr[k * inner] *= inv;
    }
}

/* ------------------------------------------------------------- layer norm
 * x, y: (rows, cols); mean, rstd: (rows); w, b: (cols) when has_w / has_b. */

__kernel void layer_norm_rows(long cols, acc_t eps, __global const T *x, long xoff,
                              __global T *y, long yoff, __global T *mean, long moff,
                              __global T *rstd, long roff, int has_w, __global const T *w,
                              long woff, int has_b, __global const T *b, long boff) {
    __local acc_t buf[WG_MAX];
    long r = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    __global const T *xr = x + xoff + r * cols;
    __global T *yr = y + yoff + r * cols;
    acc_t s = 0;
    for (long k = lid; k < cols; k += L) s += xr[k];
    acc_t mu = wg_sum(buf, s, lid, L) / (acc_t)cols;
    acc_t v = 0;
    for (long k = lid; k < cols; k += L) {
        acc_t d = xr[k] - mu;
        v += d * d;
    }
    v = wg_sum(buf, v, lid, L);
    acc_t rs = (acc_t)1 / sqrt(v / (acc_t)cols + eps);
    if (lid == 0) {
        mean[moff + r] = (T)mu;
        rstd[roff + r] = (T)rs;
    }
    T tm = (T)mu, trs = (T)rs;
    for (long k = lid; k < cols; k += L) {
        T h = (xr[k] - tm) * trs;
        if (has_w) h *= w[woff + k];
        if (has_b) h += b[boff + k];
        yr[k] = h;
    }
}

/* dx = rstd * (gw - mean(gw) - xh * mean(gw * xh)), xh = (x - mean) * rstd, gw = g * w */
__kernel void layer_norm_dx(long cols, __global const T *g, long goff, __global const T *x,
                            long xoff, int has_w, __global const T *w, long woff,
                            __global const T *mean, long moff, __global const T *rstd, long roff,
                            __global T *dx, long dxoff) {
    __local acc_t buf[WG_MAX];
    long r = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    __global const T *gr = g + goff + r * cols, *xr = x + xoff + r * cols;
    acc_t mu = mean[moff + r], rs = rstd[roff + r];
    acc_t a = 0, bs = 0;
    for (long k = lid; k < cols; k += L) {
        acc_t xh = (xr[k] - mu) * rs, gw = has_w ? gr[k] * (acc_t)w[woff + k] : (acc_t)gr[k];
        a += gw;
        bs += gw * xh;
    }
    a = wg_sum(buf, a, lid, L) / (acc_t)cols;
    bs = wg_sum(buf, bs, lid, L) / (acc_t)cols;
    __global T *dr = dx + dxoff + r * cols;
    for (long k = lid; k < cols; k += L) {
        acc_t xh = (xr[k] - mu) * rs, gw = has_w ? gr[k] * (acc_t)w[woff + k] : (acc_t)gr[k];
        dr[k] = (T)(rs * (gw - a - xh * bs));
    }
}

/* dw = sum over rows of g * xh, db = sum of g. Work-group tiles of
 * (LC columns) x (LR row lanes): neighbouring work-items read neighbouring
 * columns; the row lanes are folded in local memory. */
__kernel void layer_norm_dwdb(long rows, long cols, __global const T *g, long goff,
                              __global const T *x, long xoff, __global const T *mean, long moff,
                              __global const T *rstd, long roff, int want_dw, __global T *dw,
                              long dwoff, int want_db, __global T *db, long dboff) {
    __local acc_t bw[WG_MAX], bb[WG_MAX];
    int lc = get_local_id(0), lr = get_local_id(1);
    int LC = get_local_size(0), LR = get_local_size(1);
    long k = get_group_id(0) * LC + lc;
    acc_t sw = 0, sb = 0;
    if (k < cols) {
        for (long r = lr; r < rows; r += LR) {
            acc_t gk = g[goff + r * cols + k];
            acc_t xh = (x[xoff + r * cols + k] - (acc_t)mean[moff + r]) * (acc_t)rstd[roff + r];
            sw += gk * xh;
            sb += gk;
        }
    }
    int t = lr * LC + lc;
    bw[t] = sw;
    bb[t] = sb;
    for (int h = LR >> 1; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lr < h) {
            bw[t] += bw[t + h * LC];
            bb[t] += bb[t + h * LC];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lr == 0 && k < cols) {
        if (want_dw) dw[dwoff + k] = (T)bw[lc];
        if (want_db) db[dboff + k] = (T)bb[lc];
    }
}

/* ---------------------------------------------------------- cross entropy
 * logits (n, c); labels int64 (0-based) with stride lstride; loss (n).
 * loss = (1 - e) (lse - x[label]) + e (lse - mean(x)); 0 for ignored rows. */

__kernel void cross_entropy_rows(long c, long ignore, acc_t smoothing, __global const T *x,
                                 long xoff, __global const long *labels, long loff, long lstride,
                                 __global T *loss, long lossoff) {
    __local acc_t buf[WG_MAX];
    long r = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    long lab = labels[loff + r * lstride];
    /* An ignored row still goes through the reductions: every work-item must
     * reach every barrier (some drivers hang otherwise, even when the whole
     * group would leave together). */
    bool ignored = lab == ignore;
    __global const T *xr = x + xoff + r * c;
    T m = -INFINITY;
    for (long k = lid; k < c; k += L) m = max_nan(m, xr[k]);
    m = wg_max_nan(buf, m, lid, L);
    if (isinf(m) && m < 0) m = 0;
    acc_t s = 0, total = 0;
    for (long k = lid; k < c; k += L) {
        s += exp(xr[k] - m);
        total += xr[k];
    }
    s = wg_sum(buf, s, lid, L);
    total = wg_sum(buf, total, lid, L);
    if (lid == 0 && ignored) loss[lossoff + r] = 0;
    if (lid == 0 && !ignored) {
        acc_t lse = (acc_t)m + log(s);
        acc_t nll = lse - (acc_t)xr[lab];
        acc_t smooth = lse - total / (acc_t)c;
        loss[lossoff + r] = (T)(((acc_t)1 - smoothing) * nll + smoothing * smooth);
    }
}

/* dlogits = (softmax - target) * wrow[row], target = (1 - e) onehot + e / c;
 * rows that are ignored or weigh 0 get 0. */
__kernel void cross_entropy_backward_rows(long c, long ignore, acc_t smoothing,
                                          __global const T *x, long xoff,
                                          __global const long *labels, long loff, long lstride,
                                          __global const T *wrow, long wroff, long wrstride,
                                          __global T *d, long doff) {
    __local acc_t buf[WG_MAX];
    long r = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    long lab = labels[loff + r * lstride];
    T wr = wrow[wroff + r * wrstride];
    __global const T *xr = x + xoff + r * c;
    __global T *dr = d + doff + r * c;
    bool skip = lab == ignore || wr == 0; /* reductions still run: see cross_entropy_rows */
    T m = -INFINITY;
    for (long k = lid; k < c; k += L) m = max_nan(m, xr[k]);
    m = wg_max_nan(buf, m, lid, L);
    if (isinf(m) && m < 0) m = 0;
    acc_t s = 0;
    for (long k = lid; k < c; k += L) s += exp(xr[k] - m);
    s = wg_sum(buf, s, lid, L);
    T scale = wr / (T)s, off = (T)(smoothing / (acc_t)c) * wr;
    T lw = (T)((acc_t)1 - smoothing) * wr;
    for (long k = lid; k < c; k += L) {
        T v = exp(xr[k] - m) * scale - off;
        if (k == lab) v -= lw;
        dr[k] = skip ? (T)0 : v;
    }
}

/* ------------------------------------------------------------- batch norm
 * x, y: (n, c, sp); mean, rstd: (c). */

/* One work-group per channel: mean and rstd (biased variance), two passes. */
__kernel void batch_norm_stats(long n, long c, long sp, acc_t eps, __global const T *x, long xoff,
                               __global T *mean, long moff, __global T *rstd, long roff) {
    __local acc_t buf[WG_MAX];
    long ch = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    long cnt = n * sp;
    acc_t s = 0;
    for (long j = lid; j < cnt; j += L) {
        long i = j / sp, k = j - i * sp;
        s += x[xoff + (i * c + ch) * sp + k];
    }
    acc_t mu = wg_sum(buf, s, lid, L) / (acc_t)cnt;
    acc_t v = 0;
    for (long j = lid; j < cnt; j += L) {
        long i = j / sp, k = j - i * sp;
        acc_t dd = x[xoff + (i * c + ch) * sp + k] - mu;
        v += dd * dd;
    }
    v = wg_sum(buf, v, lid, L);
    if (lid == 0) {
        mean[moff + ch] = (T)mu;
        rstd[roff + ch] = (T)((acc_t)1 / sqrt(v / (acc_t)cnt + eps));
    }
}

/* y = x * scale + shift, scale = rstd * w, shift = b - mean * scale (per channel) */
__kernel void batch_norm_apply(long total, long c, long sp, __global const T *x, long xoff,
                               __global T *y, long yoff, __global const T *mean, long moff,
                               __global const T *rstd, long roff, int has_w, __global const T *w,
                               long woff, int has_b, __global const T *b, long boff) {
    long i = get_global_id(0);
    if (i >= total) return;
    long ch = (i / sp) % c;
    T mu = mean[moff + ch];
    T scale = rstd[roff + ch] * (has_w ? w[woff + ch] : (T)1);
    T shift = (has_b ? b[boff + ch] : (T)0) - mu * scale;
    y[yoff + i] = x[xoff + i] * scale + shift;
}

/* -------------------------------------------------------------- attention
 * out (B1, B2, L, Ev) = softmax(scale * q k^T + mask) v (backend.h's
 * attention): one work-item per (product, query), b = b1 * B2 + b2. q, k, v
 * are read through their strides (rows unit-stride), the mask through its
 * four (broadcast ones 0); out is contiguous from ooff. The scores are made
 * twice, once for the maximum and once for the weighted sum of v's rows,
 * which accumulates in the output row and is divided by the sum at the end
 * (the composition divides first: results agree to rounding). A NaN score
 * or a row of -inf makes the row NaN, as softmax's. S >= 1 (the host writes
 * zeros for no keys). */
inline acc_t attn_score(__global const T *qr, __global const T *kr, long E, acc_t scale,
                        __global const T *mr, int causal, long i, long j) {
    acc_t s = 0;
    for (long e = 0; e < E; e++) s += (acc_t)qr[e] * (acc_t)kr[e];
    s *= scale;
    if (mr) s += (acc_t)mr[0];
    if (causal && j > i) s = -INFINITY;
    return s;
}

__kernel void attention_rows(long rows, long B2, long L, long S, long E, long Ev, acc_t scale, int causal,
                             __global const T *q, long qoff, long qs0, long qs1, long qs2,
                             __global const T *k, long koff, long ks0, long ks1, long ks2,
                             __global const T *v, long voff, long vs0, long vs1, long vs2,
                             int has_mask, __global const T *m, long moff, long ms0, long ms1,
                             long ms2, long ms3, __global T *out, long ooff, long os0, long os1,
                             long os2, int has_lse, __global T *lse, long lseoff) {
    long r = get_global_id(0);
    if (r >= rows) return; /* (the launch rounds up to whole work-groups) */
    long b = r / L, i = r - b * L, b1 = b / B2, b2 = b - b1 * B2;
    __global const T *qr = q + qoff + b1 * qs0 + b2 * qs1 + i * qs2;
    __global const T *kb = k + koff + b1 * ks0 + b2 * ks1;
    __global const T *vb = v + voff + b1 * vs0 + b2 * vs1;
    __global const T *mb = has_mask ? m + moff + b1 * ms0 + b2 * ms1 + i * ms2 : 0;
    __global T *orow = out + ooff + b1 * os0 + b2 * os1 + i * os2;
    acc_t mx = -INFINITY;
    for (long j = 0; j < S; j++) {
        acc_t s = attn_score(qr, kb + j * ks2, E, scale, mb ? mb + j * ms3 : 0, causal, i, j);
        mx = isnan(mx) ? mx : (isnan(s) || s > mx) ? s : mx;
    }
    for (long e = 0; e < Ev; e++) orow[e] = 0;
    acc_t sum = 0;
    for (long j = 0; j < S; j++) {
        acc_t p = exp(attn_score(qr, kb + j * ks2, E, scale, mb ? mb + j * ms3 : 0, causal, i, j) - mx);
        sum += p;
        __global const T *vr = vb + j * vs2;
        for (long e = 0; e < Ev; e++) orow[e] = (T)((acc_t)orow[e] + p * (acc_t)vr[e]);
    }
    for (long e = 0; e < Ev; e++) orow[e] = (T)((acc_t)orow[e] / sum);
    if (has_lse) lse[lseoff + r] = (T)(mx + log(sum));
}

/* attention's backward (backend.h's attention_backward), the weights made
 * again from the forward's log-sum-exp, P = exp(s - lse), D_i = dO_i . O_i:
 * attention_bwd_q has one work-item per (product, query) and writes
 * dQ_i = scale sum_j P_ij (dO_i . V_j - D_i) K_j; attention_bwd_kv one per
 * (product, key), writing dV_j = sum_i P_ij dO_i and dK_j = scale sum_i
 * P_ij (dO_i . V_j - D_i) Q_i (D_i made again for each key: no buffer
 * between the two). Plain kernels that keep training on the device, not
 * tuned (no GPU to tune them on yet). */
inline acc_t attn_dot(__global const T *a, __global const T *b, long n) {
    acc_t s = 0;
    for (long e = 0; e < n; e++) s += (acc_t)a[e] * (acc_t)b[e];
    return s;
}

#define ATTN_BWD_ARGS                                                                          \
    long B2, long L, long S, long E, long Ev, acc_t scale, int causal,                          \
    __global const T *q, long qoff, long qs0, long qs1, long qs2,                               \
    __global const T *k, long koff, long ks0, long ks1, long ks2,                               \
    __global const T *v, long voff, long vs0, long vs1, long vs2,                               \
    int has_mask, __global const T *m, long moff, long ms0, long ms1, long ms2, long ms3,       \
    __global const T *g, long goff, long gs0, long gs1, long gs2,                               \
    __global const T *o, long ooff, long os0, long os1, long os2,                               \
    __global const T *lse, long lseoff

__kernel void attention_bwd_q(long rows, ATTN_BWD_ARGS, __global T *dq, long dqoff, long dqs0,
                              long dqs1, long dqs2) {
    long r = get_global_id(0);
    if (r >= rows) return;
    long b = r / L, i = r - b * L, b1 = b / B2, b2 = b - b1 * B2;
    __global const T *qr = q + qoff + b1 * qs0 + b2 * qs1 + i * qs2;
    __global const T *kb = k + koff + b1 * ks0 + b2 * ks1;
    __global const T *vb = v + voff + b1 * vs0 + b2 * vs1;
    __global const T *mb = has_mask ? m + moff + b1 * ms0 + b2 * ms1 + i * ms2 : 0;
    __global const T *gr = g + goff + b1 * gs0 + b2 * gs1 + i * gs2;
    __global const T *orow = o + ooff + b1 * os0 + b2 * os1 + i * os2;
    __global T *dr = dq + dqoff + b1 * dqs0 + b2 * dqs1 + i * dqs2;
    const acc_t l = (acc_t)lse[lseoff + r], D = attn_dot(gr, orow, Ev);
    for (long e = 0; e < E; e++) dr[e] = 0;
    for (long j = 0; j < S; j++) {
        acc_t p = exp(attn_score(qr, kb + j * ks2, E, scale, mb ? mb + j * ms3 : 0, causal, i, j) - l);
        acc_t ds = p * (attn_dot(gr, vb + j * vs2, Ev) - D) * scale;
        __global const T *kr = kb + j * ks2;
        for (long e = 0; e < E; e++) dr[e] = (T)((acc_t)dr[e] + ds * (acc_t)kr[e]);
    }
}

__kernel void attention_bwd_kv(long keys, ATTN_BWD_ARGS, int has_dk, __global T *dk, long dkoff,
                               long dks0, long dks1, long dks2, int has_dv, __global T *dv,
                               long dvoff, long dvs0, long dvs1, long dvs2) {
    long r = get_global_id(0);
    if (r >= keys) return;
    long b = r / S, j = r - b * S, b1 = b / B2, b2 = b - b1 * B2;
    __global const T *qb = q + qoff + b1 * qs0 + b2 * qs1;
    __global const T *kr = k + koff + b1 * ks0 + b2 * ks1 + j * ks2;
    __global const T *vr = v + voff + b1 * vs0 + b2 * vs1 + j * vs2;
    __global const T *mb = has_mask ? m + moff + b1 * ms0 + b2 * ms1 + j * ms3 : 0;
    __global const T *gb = g + goff + b1 * gs0 + b2 * gs1;
    __global const T *ob = o + ooff + b1 * os0 + b2 * os1;
    __global T *dkr = has_dk ? dk + dkoff + b1 * dks0 + b2 * dks1 + j * dks2 : 0;
    __global T *dvr = has_dv ? dv + dvoff + b1 * dvs0 + b2 * dvs1 + j * dvs2 : 0;
    for (long e = 0; has_dk && e < E; e++) dkr[e] = 0;
    for (long e = 0; has_dv && e < Ev; e++) dvr[e] = 0;
    for (long i = 0; i < L; i++) {
        __global const T *qr = qb + i * qs2, *gr = gb + i * gs2;
        acc_t p = exp(attn_score(qr, kr, E, scale, mb ? mb + i * ms2 : 0, causal, i, j) -
                      (acc_t)lse[lseoff + b * L + i]);
        if (has_dv)
            for (long e = 0; e < Ev; e++) dvr[e] = (T)((acc_t)dvr[e] + p * (acc_t)gr[e]);
        if (has_dk) {
            acc_t ds = p * (attn_dot(gr, vr, Ev) - attn_dot(gr, ob + i * os2, Ev)) * scale;
            for (long e = 0; e < E; e++) dkr[e] = (T)((acc_t)dkr[e] + ds * (acc_t)qr[e]);
        }
    }
}
