/* conv_depthwise.cl - depthwise conv2d (groups == in_channels, weight
 * (C*M, 1, kh, kw), channel multiplier M) and its two gradients, for
 * T = float or double (build define); launched by ocl_conv.c.
 *
 * Why not im2col + a GEMM per group: each group is a product of M rows by
 * kh*kw deep, so the launch per group and the im2col copy (kh*kw times the
 * input) cost far more than the arithmetic. Here:
 *   dw_forward  one work-item per output element sums its kh*kw taps
 *   dw_grad_x   one work-item per input element gathers, over its M output
 *               channels and the taps that read it, w * dy (no atomics)
 *   dw_grad_w   one work-group per weight element: its work-items sum
 *               strided slices of x * dy over the batch and the output
 *               pixels, then a tree in local memory adds the partial sums
 * All tensors contiguous from their element offsets. */

typedef struct {
    long kh, kw, sh, sw, ph, pw, dh, dw;
    long lh, lw;
} conv_geom;

/* over (lw, lh, N*C*M): out[n, o, oh, ow] = b[o] + sum_ij w[o, i, j] * x[n, o / M, ...] */
__kernel void dw_forward(conv_geom g, long C, long M, long H, long W, long planes,
                         __global T *out, long ooff, __global const T *x, long xoff,
                         __global const T *w, long woff, __global const T *b, long boff,
                         int has_bias) {
    long ow = get_global_id(0), oh = get_global_id(1), p = get_global_id(2);
    if (ow >= g.lw || oh >= g.lh || p >= planes) return;
    long o = p % (C * M), n = p / (C * M), c = o / M;
    __global const T *xp = x + xoff + (n * C + c) * H * W;
    __global const T *wp = w + woff + o * g.kh * g.kw;
    T sum = has_bias ? b[boff + o] : (T)0;
    long y0 = oh * g.sh - g.ph, x0 = ow * g.sw - g.pw;
    for (long i = 0; i < g.kh; i++) {
        long y = y0 + i * g.dh;
        if (y < 0 || y >= H) continue;
        for (long j = 0; j < g.kw; j++) {
            long xx = x0 + j * g.dw;
            if (xx >= 0 && xx < W) sum += wp[i * g.kw + j] * xp[y * W + xx];
        }
    }
    out[ooff + p * g.lh * g.lw + oh * g.lw + ow] = sum;
}

/* over (W, H, N*C): gx[n, c, y, x] = sum over m, i, j of w[c*M + m, i, j] * dy[n, c*M + m, oh, ow]
 * where oh*sh - ph + i*dh = y and ow*sw - pw + j*dw = x */
__kernel void dw_grad_x(conv_geom g, long C, long M, long H, long W, long planes,
                        __global T *gx, long gxoff, __global const T *dy, long dyoff,
                        __global const T *w, long woff) {
    long xx = get_global_id(0), y = get_global_id(1), p = get_global_id(2);
    if (xx >= W || y >= H || p >= planes) return;
    long n = p / C, c = p % C, L = g.lh * g.lw;
    T sum = 0;
    for (long m = 0; m < M; m++) {
        long o = c * M + m;
        __global const T *dp = dy + dyoff + (n * C * M + o) * L;
        __global const T *wp = w + woff + o * g.kh * g.kw;
        for (long i = 0; i < g.kh; i++) {
            long t = y + g.ph - i * g.dh; /* = oh * sh */
            if (t < 0) break;
            if (t % g.sh) continue;
            long oh = t / g.sh;
            if (oh >= g.lh) continue;
            for (long j = 0; j < g.kw; j++) {
                long u = xx + g.pw - j * g.dw; /* = ow * sw */
                if (u < 0) break;
                if (u % g.sw) continue;
                long ow = u / g.sw;
                if (ow < g.lw) sum += wp[i * g.kw + j] * dp[oh * g.lw + ow];
            }
        }
    }
    gx[gxoff + p * H * W + y * W + xx] = sum;
}

#define DW_WG 64 /* work-items per weight element (ocl_conv.c launches this many) */

/* work-group k = o*kh*kw + i*kw + j: gw[o, i, j] = sum over n, oh, ow of
 * x[n, o / M, oh*sh - ph + i*dh, ow*sw - pw + j*dw] * dy[n, o, oh, ow] */
__kernel __attribute__((reqd_work_group_size(DW_WG, 1, 1)))
void dw_grad_w(conv_geom g, long C, long M, long H, long W, long N,
               __global T *gw, long gwoff, __global const T *dy, long dyoff,
               __global const T *x, long xoff) {
    __local T part[DW_WG];
    long k = get_group_id(0), lid = get_local_id(0), kk = g.kh * g.kw;
    long o = k / kk, t = k % kk, i = t / g.kw, j = t % g.kw, c = o / M;
    long L = g.lh * g.lw, total = N * L;
    T sum = 0;
    for (long e = lid; e < total; e += DW_WG) {
        long n = e / L, l = e % L, oh = l / g.lw, ow = l % g.lw;
        long y = oh * g.sh - g.ph + i * g.dh, xx = ow * g.sw - g.pw + j * g.dw;
        if (y >= 0 && y < H && xx >= 0 && xx < W)
            sum += x[xoff + ((n * C + c) * H + y) * W + xx] * dy[dyoff + (n * C * M + o) * L + l];
    }
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long s = DW_WG / 2; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) gw[gwoff + k] = part[0];
}
