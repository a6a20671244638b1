/* conv.cl - im2col and col2im for T = float or double (build define), the
 * data movement half of convolution (src/backends/cpu/cpu_conv.c).
 *
 * x is (planes, H, W) with plane p = n*C + c; cols is (planes*kh*kw, L),
 * L = lh*lw, row (p*kh + i)*kw + j, column oh*lw + ow holding
 * x[p, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside). Both are
 * contiguous from their element offsets.
 *
 * col2im is written as a gather: each x element sums the (at most kh*kw)
 * cols entries that read it, in (i, j) order, which is the order the CPU
 * adds them in, so results match it bit for bit and need no atomics. */

typedef struct {
    long kh, kw, sh, sw, ph, pw, dh, dw;
    long lh, lw;
} conv_geom;

/* Launched over (lw, lh, planes): one work-item per output position of a
 * plane writes its kh*kw cols entries (adjacent work-items write adjacent
 * columns, and no index is divided). */
__kernel void im2col(conv_geom g, long H, long W, long planes, __global T *cols, long coff,
                     __global const T *x, long xoff) {
    long ow = get_global_id(0), oh = get_global_id(1), p = get_global_id(2);
    if (ow >= g.lw || oh >= g.lh || p >= planes) return;
    long L = g.lh * g.lw, kk = g.kh * g.kw;
    __global const T *xp = x + xoff + p * H * W;
    __global T *cp = cols + coff + p * kk * L + oh * g.lw + ow;
    long y0 = oh * g.sh - g.ph, x0 = ow * g.sw - g.pw;
    for (long i = 0; i < g.kh; i++) {
        long y = y0 + i * g.dh;
        bool yin = y >= 0 && y < H;
        for (long j = 0; j < g.kw; j++) {
            long xx = x0 + j * g.dw;
            cp[(i * g.kw + j) * L] = yin && xx >= 0 && xx < W ? xp[y * W + xx] : (T)0;
        }
    }
}

/* Launched over (W, H, planes). */
__kernel void col2im(conv_geom g, long H, long W, long planes, __global T *x, long xoff,
                     __global const T *cols, long coff) {
    long xx = get_global_id(0), y = get_global_id(1), p = get_global_id(2);
    if (xx >= W || y >= H || p >= planes) return;
    long L = g.lh * g.lw, kk = g.kh * g.kw;
    __global const T *cp = cols + coff + p * kk * L;
    T sum = 0;
    for (long i = 0; i < g.kh; i++) {
        long t = y + g.ph - i * g.dh; /* = oh * sh */
        if (t < 0) break; /* t only falls as i grows */
        long oh = t;
        if (g.sh != 1) {
            if (t % g.sh) continue;
            oh = t / g.sh;
        }
        if (oh >= g.lh) continue;
        for (long j = 0; j < g.kw; j++) {
            long u = xx + g.pw - j * g.dw; /* = ow * sw */
            if (u < 0) break;
            long ow = u;
            if (g.sw != 1) {
                if (u % g.sw) continue;
                ow = u / g.sw;
            }
            if (ow >= g.lw) continue;
            sum += cp[(i * g.kw + j) * L + oh * g.lw + ow];
        }
    }
    x[xoff + (p * H + y) * W + xx] = sum;
}
