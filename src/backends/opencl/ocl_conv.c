/* ocl_conv.c - im2col/col2im (kernels/conv.cl) and 2-D pooling
 * (kernels/pooling.cl) on OpenCL, float32 and float64, with the CPU's
 * semantics and summation order (cpu_conv.c, cpu_pool.c): results equal the
 * CPU's bit for bit. Every kernel runs one work-item per output element;
 * the adjoints (col2im, pooling backward) are gathers, so no two work-items
 * write one element and nothing needs atomics. Also depthwise conv2d and its
 * gradients (kernels/conv_depthwise.cl; backend.h conv2d_depthwise), which
 * sum in their own order: equal to the CPU's to rounding, not bit for bit. Tensors are contiguous (the
 * ops make them so) but may start at an offset, which is passed along. */
#include <string.h>
#include "ocl_kernels.h"

/* Layouts of conv_geom / pool_geom in the kernels. */
typedef struct {
    cl_long kh, kw, sh, sw, ph, pw, dh, dw, lh, lw;
} ocl_conv_geom;

typedef struct {
    cl_long kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
    cl_int count_include_pad, adaptive;
} ocl_pool_geom;

static nd_status cp_kernel(ocl_device *d, const char *file, nd_dtype dt, const char *name,
                           const char *op, cl_kernel *k) {
    if (dt != ND_FLOAT32 && dt != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: no OpenCL kernel for %s (expected float32 or float64)",
                       op, nd_dtype_name(dt));
    ND_TRY(ocl_check_dtype(d, dt, op));
    char defs[160];
    ocl_dtype_defines(dt, defs, sizeof defs);
    /* avg pools divide: IEEE division as the CPU's (OpenCL allows 2.5 ulp) */
    strncat(defs, " -cl-fp32-correctly-rounded-divide-sqrt", sizeof defs - strlen(defs) - 1);
    return ocl_kernel(d, file, defs, name, k);
}

static ocl_conv_geom conv_geom_of(const nd_conv_geom *g) {
    ocl_conv_geom c = {g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->lh, g->lw};
    return c;
}

static ocl_pool_geom pool_geom_of(const nd_pool_geom *p) {
    ocl_pool_geom c = {p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->oh, p->ow,
                       p->count_include_pad, p->adaptive};
    return c;
}

/* Sets args first.. to (buffer, element offset) for each tensor. */
static cl_int set_bufs(cl_kernel k, int first, int n, const nd_tensor *const *ts) {
    cl_int e = CL_SUCCESS;
    for (int i = 0; i < n; i++) {
        cl_mem m = ocl_mem(ts[i]);
        cl_long off = ts[i]->offset;
        e |= ocl_set_arg(k, first + 2 * i, sizeof m, &m);
        e |= ocl_set_arg(k, first + 2 * i + 1, sizeof off, &off);
    }
    return e;
}

/* Launches a kernel with args (n, geom, H, W, then buffer/offset pairs). */
static nd_status run_geom(ocl_device *d, cl_kernel k, const char *op, int64_t n, const void *geom,
                          size_t geom_size, int64_t H, int64_t W, int nt,
                          const nd_tensor *const *ts) {
    if (n == 0) return ND_OK;
    cl_long nn = n, h = H, w = W;
    cl_int e = OCL_ARG(k, 0, nn) | ocl_set_arg(k, 1, geom_size, geom) | OCL_ARG(k, 2, h) |
               OCL_ARG(k, 3, w) | set_bufs(k, 4, nt, ts);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return ocl_launch_1d(d, k, op, n);
}

/* ---------------------------------------------------------------- im2col, col2im */

/* Launches an im2col/col2im kernel over (w, h, planes) with args (geom, H,
 * W, planes, out, out offset, in, in offset). */
static nd_status run_conv(ocl_device *d, cl_kernel k, const char *op, const nd_conv_geom *g,
                          const nd_tensor *x, int64_t w, int64_t h, nd_tensor *out,
                          const nd_tensor *in) {
    int64_t planes = x->shape[0] * x->shape[1];
    if (planes == 0 || w == 0 || h == 0) return ND_OK;
    ocl_conv_geom cg = conv_geom_of(g);
    cl_long H = x->shape[2], W = x->shape[3], P = planes;
    const nd_tensor *ts[2] = {out, in};
    cl_int e = OCL_ARG(k, 0, cg) | OCL_ARG(k, 1, H) | OCL_ARG(k, 2, W) | OCL_ARG(k, 3, P) |
               set_bufs(k, 4, 2, ts);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    /* work-groups along rows (adjacent work-items touch adjacent elements) */
    size_t l0 = 1, l1 = 1;
    while (l0 < 64 && (int64_t)l0 < w) l0 *= 2;
    while (l1 < 4 && (int64_t)l1 < h && l0 * l1 * 2 <= d->max_wg) l1 *= 2;
    if (l0 > d->max_wg) l0 = d->max_wg;
    size_t global[3] = {(size_t)w, (size_t)h, (size_t)planes}, local[3] = {l0, l1, 1};
    return ocl_launch(d, k, op, 3, global, local);
}

nd_status ocl_im2col(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g) {
    ocl_device *d = ocl_dev(cols);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "conv", x->dtype, "im2col", "im2col", &k));
    return run_conv(d, k, "im2col", g, x, g->lw, g->lh, cols, x);
}

nd_status ocl_col2im(nd_tensor *x, const nd_tensor *cols, const nd_conv_geom *g) {
    ocl_device *d = ocl_dev(x);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "conv", x->dtype, "col2im", "col2im", &k));
    return run_conv(d, k, "col2im", g, x, x->shape[3], x->shape[2], x, cols);
}

/* ---------------------------------------------------------------- pooling */

nd_status ocl_max_pool2d(nd_tensor *out, nd_tensor *indices, const nd_tensor *x,
                         const nd_pool_geom *p) {
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "pooling", x->dtype, "max_pool", "max_pool2d", &k));
    ocl_pool_geom pg = pool_geom_of(p);
    const nd_tensor *ts[3] = {out, indices, x};
    return run_geom(d, k, "max_pool2d", nd_numel(out), &pg, sizeof pg, x->shape[2], x->shape[3],
                    3, ts);
}

nd_status ocl_max_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices) {
    const char *op = "max_pool2d_backward";
    ocl_device *d = ocl_dev(gx);
    int64_t planes = gx->shape[0] * gx->shape[1], H = gx->shape[2], W = gx->shape[3];
    int64_t OH = g->shape[2], OW = g->shape[3];
    if (planes == 0 || H * W == 0) return ND_OK;
    cl_kernel krows, kbw;
    ND_TRY(cp_kernel(d, "pooling", gx->dtype, "max_pool_rows", op, &krows));
    ND_TRY(cp_kernel(d, "pooling", gx->dtype, "max_pool_backward", op, &kbw));
    /* pass 1: the input rows each output row's indices reach */
    int64_t nrows = planes * OH;
    nd_tensor *rows = NULL;
    if (nrows > 0) {
        int64_t shape[1] = {2 * nrows};
        ND_TRY(nd_empty_on(nd_get_device(gx), shape, 1, ND_INT64, &rows));
        cl_long n = nrows, oh = OH, ow = OW, h = H, w = W;
        cl_mem rm = ocl_mem(rows);
        cl_int e = OCL_ARG(krows, 0, n) | OCL_ARG(krows, 1, oh) | OCL_ARG(krows, 2, ow) |
                   OCL_ARG(krows, 3, h) | OCL_ARG(krows, 4, w) |
                   set_bufs(krows, 5, 1, &indices) | OCL_ARG(krows, 7, rm);
        nd_status st = e != CL_SUCCESS ? ocl_fail(e, op, "setting kernel arguments", d)
                                       : ocl_launch_1d(d, krows, op, nrows);
        if (st != ND_OK) {
            nd_release(rows);
            return st;
        }
    }
    /* pass 2: one work-item per input row; with no outputs it only zeroes */
    cl_long n = planes * H, oh = OH, ow = OW, h = H, w = W;
    cl_mem rm = rows ? ocl_mem(rows) : ocl_mem(gx); /* unread when OH*OW == 0 */
    const nd_tensor *ts[3] = {gx, g, indices};
    cl_int e = OCL_ARG(kbw, 0, n) | OCL_ARG(kbw, 1, oh) | OCL_ARG(kbw, 2, ow) |
               OCL_ARG(kbw, 3, h) | OCL_ARG(kbw, 4, w) | set_bufs(kbw, 5, 3, ts) |
               OCL_ARG(kbw, 11, rm);
    nd_status st = e != CL_SUCCESS ? ocl_fail(e, op, "setting kernel arguments", d)
                                   : ocl_launch_1d(d, kbw, op, n);
    /* the queue keeps rows' buffer alive until the kernel ran: releasing it
     * returns it to the pool, which is in-order with the queue */
    nd_release(rows);
    return st;
}

nd_status ocl_avg_pool2d(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p) {
    const char *op = p->adaptive ? "adaptive_avg_pool2d" : "avg_pool2d";
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "pooling", x->dtype, "avg_pool", op, &k));
    ocl_pool_geom pg = pool_geom_of(p);
    const nd_tensor *ts[2] = {out, x};
    return run_geom(d, k, op, nd_numel(out), &pg, sizeof pg, x->shape[2], x->shape[3], 2, ts);
}

nd_status ocl_avg_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p) {
    const char *op = "avg_pool2d_backward";
    ocl_device *d = ocl_dev(gx);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "pooling", gx->dtype, "avg_pool_backward", op, &k));
    ocl_pool_geom pg = pool_geom_of(p);
    const nd_tensor *ts[2] = {gx, g};
    return run_geom(d, k, op, nd_numel(gx), &pg, sizeof pg, gx->shape[2], gx->shape[3], 2, ts);
}

/* ---------------------------------------------------------------- depthwise conv */

/* kernels/conv_depthwise.cl: groups == C, w (C*M, 1, kh, kw). x, w, b, dy
 * contiguous; out, gx, gw fresh. */

/* Launches a depthwise kernel over (w, h, planes) with args (geom, C, M, H,
 * W, planes, then nt buffer/offset pairs); *next: the next argument index. */
static nd_status run_dw(ocl_device *d, cl_kernel k, const char *op, const nd_conv_geom *g,
                        int64_t C, int64_t M, int64_t H, int64_t W, int64_t w, int64_t h,
                        int64_t planes, int nt, const nd_tensor *const *ts, int *next) {
    ocl_conv_geom cg = conv_geom_of(g);
    cl_long c = C, m = M, hh = H, ww = W, p = planes;
    cl_int e = OCL_ARG(k, 0, cg) | OCL_ARG(k, 1, c) | OCL_ARG(k, 2, m) | OCL_ARG(k, 3, hh) |
               OCL_ARG(k, 4, ww) | OCL_ARG(k, 5, p) | set_bufs(k, 6, nt, ts);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    if (next) *next = 6 + 2 * nt;
    if (w == 0 || h == 0 || planes == 0) return ND_OK;
    size_t l0 = 1, l1 = 1;
    while (l0 < 64 && (int64_t)l0 < w) l0 *= 2;
    while (l1 < 4 && (int64_t)l1 < h && l0 * l1 * 2 <= d->max_wg) l1 *= 2;
    if (l0 > d->max_wg) l0 = d->max_wg;
    size_t global[3] = {(size_t)w, (size_t)h, (size_t)planes}, local[3] = {l0, l1, 1};
    return ocl_launch(d, k, op, 3, global, local);
}

nd_status ocl_conv2d_depthwise(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                               const nd_tensor *b, const nd_conv_geom *g) {
    const char *op = "conv2d";
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(cp_kernel(d, "conv_depthwise", x->dtype, "dw_forward", op, &k));
    const int64_t N = x->shape[0], C = x->shape[1], M = w->shape[0] / C;
    const nd_tensor *ts[4] = {out, x, w, b ? b : x}; /* no bias: an unread buffer */
    cl_int has = b != NULL;
    cl_int e = set_bufs(k, 6, 4, ts) | OCL_ARG(k, 14, has);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return run_dw(d, k, op, g, C, M, x->shape[2], x->shape[3], g->lw, g->lh, N * C * M, 4, ts,
                  NULL);
}

nd_status ocl_conv2d_depthwise_backward(nd_tensor *gx, nd_tensor *gw, const nd_tensor *dy,
                                        const nd_tensor *x, const nd_tensor *w,
                                        const nd_conv_geom *g) {
    const char *op = "conv2d_backward";
    ocl_device *d = ocl_dev(dy);
    const int64_t *xs = gx ? gx->shape : x->shape;
    const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], M = dy->shape[1] / C;
    if (gx) {
        cl_kernel k;
        ND_TRY(cp_kernel(d, "conv_depthwise", dy->dtype, "dw_grad_x", op, &k));
        const nd_tensor *ts[3] = {gx, dy, w};
        ND_TRY(run_dw(d, k, op, g, C, M, H, W, W, H, N * C, 3, ts, NULL));
    }
    if (gw) {
        cl_kernel k;
        ND_TRY(cp_kernel(d, "conv_depthwise", dy->dtype, "dw_grad_w", op, &k));
        if (ocl_max_group(d, k, 64) < 64)
            return nd_fail(ND_ERR_ARG, "%s: the depthwise weight gradient needs work-groups of "
                           "64, which this OpenCL device does not allow", op);
        ocl_conv_geom cg = conv_geom_of(g);
        cl_long c = C, m = M, hh = H, ww = W, n = N;
        const nd_tensor *ts[3] = {gw, dy, x};
        cl_int e = OCL_ARG(k, 0, cg) | OCL_ARG(k, 1, c) | OCL_ARG(k, 2, m) | OCL_ARG(k, 3, hh) |
                   OCL_ARG(k, 4, ww) | OCL_ARG(k, 5, n) | set_bufs(k, 6, 3, ts);
        if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
        const int64_t groups = nd_numel(gw);
        size_t global[1] = {(size_t)groups * 64}, local[1] = {64};
        if (groups > 0) ND_TRY(ocl_launch(d, k, op, 1, global, local));
    }
    return ND_OK;
}
