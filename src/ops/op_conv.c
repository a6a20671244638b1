/* op_conv.c - conv2d and conv_transpose2d (NCHW, stride, padding,
 * dilation, groups) by im2col + GEMM, the differentiable im2col/col2im pair
 * they are built from (needle's dilate/undilate are in op_dilate.c).
 *
 * conv2d:           cols = im2col(x)                 (N, C*kh*kw, oh*ow)
 *                   out  = w (G, O/G, K) @ cols as (G, K, N*L): one GEMM per
 *                          group over the whole batch, + bias
 * conv_transpose2d: cols = w^T (G, O/G*kh*kw, C/G) @ x as (G, C/G, N*H*W)
 *                   out  = col2im(cols as (N, O*kh*kw, H*W)) + bias
 * (for large images, a GEMM per (image, group) instead: ND_CONV_BATCHED_MAX_L).
 * Each is the other's adjoint in x, so their backward formulas (op_conv.h)
 * are made of the two of them plus im2col and matmul: differentiable to any
 * order. */
#include <limits.h>
#include <stdio.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"
#include "op_conv.h"

static const int64_t ONES2[2] = {1, 1}, ZEROS2[2] = {0, 0};

/* ------------------------------------------------------------ arguments */

nd_status nd_conv_pair_arg(const char *op, const char *what, const int64_t *v, const int64_t *def,
                          int64_t min, int64_t out[2]) {
    const int64_t *s = v ? v : def;
    out[0] = s[0];
    out[1] = s[1];
    if (out[0] < min || out[1] < min)
        return nd_fail(ND_ERR_ARG, "%s: %s must be >= %lld, got {%lld,%lld}", op, what,
                       (long long)min, (long long)out[0], (long long)out[1]);
    if (out[0] > INT_MAX || out[1] > INT_MAX)
        return nd_fail(ND_ERR_ARG, "%s: %s {%lld,%lld} is too large", op, what, (long long)out[0],
                       (long long)out[1]);
    return ND_OK;
}

nd_status nd_check_float_weights(const char *op, const nd_tensor *x, const nd_tensor *w,
                                 const nd_tensor *b) {
    ND_TRY(nd_check_same_device(op, x, w));
    if (b) ND_TRY(nd_check_same_device(op, x, b));
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: expected a float32 or float64 input, got %s", op,
                       nd_dtype_name(x->dtype));
    if (w->dtype != x->dtype)
        return nd_fail(ND_ERR_DTYPE, "%s: input (%s) and weight (%s) must have the same dtype", op,
                       nd_dtype_name(x->dtype), nd_dtype_name(w->dtype));
    if (b && b->dtype != x->dtype)
        return nd_fail(ND_ERR_DTYPE, "%s: input (%s) and bias (%s) must have the same dtype", op,
                       nd_dtype_name(x->dtype), nd_dtype_name(b->dtype));
    return ND_OK;
}

/* Checks conv2d / conv_transpose2d arguments (x 3-D or 4-D) and computes
 * the output's spatial size. half_w: the weight and bias may be float16 /
 * bfloat16 with a float32 x (half_weight_as_stored said so). */
static nd_status conv_args(const char *op, bool tr, bool half_w, const nd_tensor *x,
                           const nd_tensor *w, const nd_tensor *b, const int64_t *stride,
                           const int64_t *padding, const int64_t *output_padding,
                           const int64_t *dilation, int64_t groups, nd_conv_params *cp,
                           int64_t ohw[2]) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (x->ndim != 3 && x->ndim != 4)
        return nd_fail(ND_ERR_SHAPE, "%s: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, "
                       "got shape %s", op, nd_shape_str(x->shape, x->ndim, b1));
    if (w->ndim != 4)
        return nd_fail(ND_ERR_SHAPE, "%s: expected a 4-D weight (%s, kH, kW), got shape %s", op,
                       tr ? "in_channels, out_channels/groups" : "out_channels, in_channels/groups",
                       nd_shape_str(w->shape, w->ndim, b1));
    if (half_w) {
        ND_TRY(nd_check_same_device(op, x, w));
        if (b) ND_TRY(nd_check_same_device(op, x, b));
    } else {
        ND_TRY(nd_check_float_weights(op, x, w, b));
    }
    if (groups < 1 || groups > INT_MAX)
        return nd_fail(ND_ERR_ARG, "%s: groups must be >= 1, got %lld", op, (long long)groups);
    ND_TRY(nd_conv_pair_arg(op, "stride", stride, ONES2, 1, cp->stride));
    ND_TRY(nd_conv_pair_arg(op, "padding", padding, ZEROS2, 0, cp->padding));
    ND_TRY(nd_conv_pair_arg(op, "dilation", dilation, ONES2, 1, cp->dilation));
    ND_TRY(nd_conv_pair_arg(op, "output_padding", output_padding, ZEROS2, 0, cp->output_padding));
    cp->groups = groups;
    int cd = x->ndim - 3;
    int64_t C = x->shape[cd], H = x->shape[cd + 1], W = x->shape[cd + 2];
    int64_t k[2] = {w->shape[2], w->shape[3]}, in[2] = {H, W};
    if (k[0] < 1 || k[1] < 1)
        return nd_fail(ND_ERR_SHAPE, "%s: the weight's kernel must be at least 1x1, got weight shape %s",
                       op, nd_shape_str(w->shape, w->ndim, b1));
    if (C % groups != 0)
        return nd_fail(ND_ERR_SHAPE, "%s: groups %lld does not divide the input's %lld channels "
                       "(input shape %s)", op, (long long)groups, (long long)C,
                       nd_shape_str(x->shape, x->ndim, b1));
    int64_t O;
    if (!tr) {
        O = w->shape[0];
        if (O % groups != 0)
            return nd_fail(ND_ERR_SHAPE, "%s: out_channels %lld (weight shape %s) is not divisible by "
                           "groups %lld", op, (long long)O, nd_shape_str(w->shape, w->ndim, b1),
                           (long long)groups);
        int64_t want; /* an empty weight's other dims may be huge: no overflow */
        bool over = __builtin_mul_overflow(w->shape[1], groups, &want);
        if (over || want != C) {
            char wb[48];
            if (over) snprintf(wb, sizeof wb, "%lld x %lld", (long long)w->shape[1], (long long)groups);
            else snprintf(wb, sizeof wb, "%lld", (long long)want);
            return nd_fail(ND_ERR_SHAPE, "%s: input has %lld channels but weight expects %s "
                           "(weight shape %s, groups %lld)", op, (long long)C, wb,
                           nd_shape_str(w->shape, w->ndim, b1), (long long)groups);
        }
    } else {
        if (w->shape[0] != C)
            return nd_fail(ND_ERR_SHAPE, "%s: input has %lld channels but weight expects %lld "
                           "(weight shape %s, groups %lld)", op, (long long)C,
                           (long long)w->shape[0], nd_shape_str(w->shape, w->ndim, b1),
                           (long long)groups);
        if (__builtin_mul_overflow(w->shape[1], groups, &O) || O > ND_MAX_NUMEL)
            return nd_fail(ND_ERR_SHAPE, "%s: weight shape %s with groups %lld gives more than "
                           "2^48 output channels", op, nd_shape_str(w->shape, w->ndim, b1),
                           (long long)groups);
    }
    if (b && (b->ndim != 1 || b->shape[0] != O))
        return nd_fail(ND_ERR_SHAPE, "%s: bias must have shape {%lld} (out_channels), got %s", op,
                       (long long)O, nd_shape_str(b->shape, b->ndim, b1));
    for (int a = 0; a < 2; a++) {
        const int64_t s = cp->stride[a], p = cp->padding[a], d = cp->dilation[a];
        double eff = (double)d * (double)(k[a] - 1) + 1;
        if (!tr) {
            if (eff > (double)(in[a] + 2 * p)) {
                char kd[64] = "";
                if (cp->dilation[0] > 1 || cp->dilation[1] > 1)
                    snprintf(kd, sizeof kd, " (%.0fx%.0f dilated)",
                             (double)cp->dilation[0] * (double)(k[0] - 1) + 1,
                             (double)cp->dilation[1] * (double)(k[1] - 1) + 1);
                return nd_fail(ND_ERR_SHAPE, "%s: kernel size %lldx%lld%s is larger than the padded "
                               "input %lldx%lld (input shape %s, padding {%lld,%lld})", op,
                               (long long)k[0], (long long)k[1], kd,
                               (long long)(H + 2 * cp->padding[0]), (long long)(W + 2 * cp->padding[1]),
                               nd_shape_str(x->shape, x->ndim, b2), (long long)cp->padding[0],
                               (long long)cp->padding[1]);
            }
            ohw[a] = (in[a] + 2 * p - (int64_t)eff) / s + 1;
        } else {
            int64_t op_ = cp->output_padding[a];
            if (op_ >= s && op_ >= d)
                return nd_fail(ND_ERR_ARG, "%s: output_padding {%lld,%lld} must be smaller than either "
                               "stride {%lld,%lld} or dilation {%lld,%lld}", op,
                               (long long)cp->output_padding[0], (long long)cp->output_padding[1],
                               (long long)cp->stride[0], (long long)cp->stride[1],
                               (long long)cp->dilation[0], (long long)cp->dilation[1]);
            double o = (double)(in[a] - 1) * (double)s - 2.0 * (double)p + eff + (double)op_;
            if (o < 1 || o > (double)ND_MAX_NUMEL)
                return nd_fail(ND_ERR_SHAPE, "%s: output size along %s would be %.0f (input shape %s, "
                               "weight shape %s, stride {%lld,%lld}, padding {%lld,%lld}, dilation "
                               "{%lld,%lld})", op, a ? "W" : "H", o,
                               nd_shape_str(x->shape, x->ndim, b1), nd_shape_str(w->shape, w->ndim, b2),
                               (long long)cp->stride[0], (long long)cp->stride[1],
                               (long long)cp->padding[0], (long long)cp->padding[1],
                               (long long)cp->dilation[0], (long long)cp->dilation[1]);
            ohw[a] = (int64_t)o;
        }
    }
    /* the result under the size rule, named after this op */
    int64_t osh[4] = {x->ndim == 4 ? x->shape[0] : 1, O, ohw[0], ohw[1]};
    return nd_check_shape(op, osh, 4, NULL);
}

/* conv2d's checks under another op's name (op_fused.c's fused_conv2d) */
nd_status nd_conv2d_args(const char *op, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                         const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                         int64_t groups, nd_conv_params *cp, int64_t ohw[2]) {
    return conv_args(op, false, false, x, w, b, stride, padding, NULL, dilation, groups, cp, ohw);
}

/* -------------------------------------------------- im2col and col2im ops */

static bool is_pointwise(const nd_conv_geom *g, int64_t H, int64_t W) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
           g->lh == H && g->lw == W;
}

/* cols (N, C*kh*kw, lh*lw) of a 4-D x (any strides), grad mode off */
static nd_status im2col_forward(const nd_tensor *x, const nd_conv_geom *g, nd_tensor **out) {
    nd_tensor *xc;
    ND_TRY(nd_contiguous(x, &xc));
    int64_t shape[3] = {x->shape[0], x->shape[1] * g->kh * g->kw, g->lh * g->lw};
    nd_status st = nd_empty_on(nd_get_device(x), shape, 3, x->dtype, out);
    if (st == ND_OK) {
        st = ND_BACKEND_CALL(nd_backend_of(x), im2col, "im2col", *out, xc, g);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(xc);
    return st;
}

static nd_status col2im_forward(const nd_tensor *cols, int64_t C, int64_t H, int64_t W,
                                const nd_conv_geom *g, nd_tensor **out) {
    char b1[ND_SHAPE_BUF];
    if (cols->ndim != 3 || cols->shape[1] != C * g->kh * g->kw || cols->shape[2] != g->lh * g->lw)
        return nd_fail(ND_ERR_SHAPE, "col2im: expected cols of shape {N,%lld,%lld}, got %s",
                       (long long)(C * g->kh * g->kw), (long long)(g->lh * g->lw),
                       nd_shape_str(cols->shape, cols->ndim, b1));
    nd_tensor *cc;
    ND_TRY(nd_contiguous(cols, &cc));
    int64_t shape[4] = {cols->shape[0], C, H, W};
    nd_status st = nd_empty_on(nd_get_device(cols), shape, 4, cols->dtype, out);
    if (st == ND_OK) {
        st = ND_BACKEND_CALL(nd_backend_of(cols), col2im, "col2im", *out, cc, g);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(cc);
    return st;
}

nd_status nd_im2col_op(const nd_tensor *x, const nd_conv_geom *g, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(im2col_forward(x, g, out), nd_record_im2col(x, g, *out), out);
}

nd_status nd_col2im_op(const nd_tensor *cols, int64_t C, int64_t H, int64_t W,
                       const nd_conv_geom *g, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(col2im_forward(cols, C, H, W, g, out), nd_record_col2im(cols, g, *out),
                           out);
}

static nd_status bw_im2col(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_conv_geom geom = nd_node_conv_geom(n);
    const int64_t *xs = n->in_shape[0];
    return nd_col2im_op(g, xs[1], xs[2], xs[3], &geom, &grads[0]);
}

static nd_status bw_col2im(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_conv_geom geom = nd_node_conv_geom(n);
    return nd_im2col_op(g, &geom, &grads[0]);
}

nd_status nd_record_im2col(const nd_tensor *x, const nd_conv_geom *g, nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_im2col, bw_im2col, out, 1, in, &n));
    if (n) nd_node_put_conv_geom(n, g);
    return ND_OK;
}

nd_status nd_record_col2im(const nd_tensor *cols, const nd_conv_geom *g, nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {cols};
    ND_TRY(nd_record(ND_OP_col2im, bw_col2im, out, 1, in, &n));
    if (n) nd_node_put_conv_geom(n, g);
    return ND_OK;
}

/* ------------------------------------------------------ forward kernels */

/* out += bias viewed as (1, O, 1, 1), in place on a fresh output */
static nd_status add_bias(nd_tensor *out, const nd_tensor *b) {
    if (!b) return ND_OK;
    int64_t shape[4] = {1, b->shape[0], 1, 1};
    nd_tensor *bv;
    ND_TRY(nd_reshape(b, shape, 4, &bv));
    nd_status st = nd_binary_(ND_BINARY_add, out, bv);
    nd_release(bv);
    return st;
}

/* Two GEMM layouts. Small images (L = output pixels per image up to this):
 * one GEMM per group over the whole batch, (G, K, N*L) - a GEMM per image
 * would be tiny and dominated by overhead (ResNet9 on 32x32: 5x faster).
 * Large images: a GEMM per (image, group) on the im2col layout as it is -
 * each is big enough, and the batch layout would cost extra full-size
 * copies (56x56: about 1.5x faster). */
#define ND_CONV_BATCHED_MAX_L 1024

/* sum over the batch of a (N, G, M, K) @ b (N, G, K, P) -> (G, M, P) */
static nd_tensor *batch_gemm_sum(nd_gx *c, const nd_tensor *a, const nd_tensor *b) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *p = NULL, *s = NULL;
    p = gx_own(c, nd_matmul(a, b, &p), &p);
    if (c->st != ND_OK) return NULL;
    int d0 = 0;
    return gx_own(c, nd_reduce(ND_REDUCE_sum, p, &d0, 1, 0, 0, &s), &s);
}

/* Batch <-> GEMM-column layout, with the ordinary (differentiable) view and
 * copy ops, so backward formulas built from them differentiate again. */
static nd_tensor *gx_permute(nd_gx *c, const nd_tensor *t, const int *dims, int nd) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_permute(t, dims, nd, &r), &r);
}

static nd_tensor *gx_contig(nd_gx *c, const nd_tensor *t) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_contiguous(t, &r), &r);
}

static nd_tensor *gx_matmul(nd_gx *c, const nd_tensor *a, const nd_tensor *b) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_matmul(a, b, &r), &r);
}

static nd_tensor *transpose_last(nd_gx *c, const nd_tensor *t) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_transpose(t, t->ndim - 2, t->ndim - 1, &r), &r);
}

/* t (N, G*R, L...) viewed as (N, G, R, L) -> (G, R, N*L), contiguous */
static nd_tensor *batch_to_gemm(nd_gx *c, const nd_tensor *t, int64_t N, int64_t G, int64_t R,
                                int64_t L) {
    int64_t s4[4] = {N, G, R, L}, s3[3] = {G, R, N * L};
    static const int perm[4] = {1, 2, 0, 3};
    nd_tensor *t4 = gx_reshape(c, t, s4, 4);
    if (N == 1) return gx_reshape(c, t4, s3, 3);
    return gx_reshape(c, gx_contig(c, gx_permute(c, t4, perm, 4)), s3, 3);
}

/* t (G, R, N*L) -> (N, G*R, L), contiguous */
static nd_tensor *gemm_to_batch(nd_gx *c, const nd_tensor *t, int64_t N, int64_t G, int64_t R,
                                int64_t L) {
    int64_t s4[4] = {G, R, N, L}, s3[3] = {N, G * R, L};
    static const int perm[4] = {2, 0, 1, 3};
    nd_tensor *t4 = gx_reshape(c, t, s4, 4);
    return gx_reshape(c, gx_contig(c, gx_permute(c, t4, perm, 4)), s3, 3);
}

/* groups == in_channels, weight (C*M, 1, kh, kw): the backend's depthwise
 * kernels apply (backend.h conv2d_depthwise; the CPU routes these inside
 * conv2d_fused, cpu_conv_depthwise.c) */
static bool is_depthwise(const int64_t *xs, const int64_t *ws, int64_t groups) {
    return groups > 1 && groups == xs[1] && ws[1] == 1 && ws[0] % groups == 0;
}

/* conv2d by the backend's depthwise kernel (OpenCL: kernels/conv_depthwise.cl)
 * on a 4-D x, when it has one, the conv is depthwise and not empty. */
static nd_status conv2d_depthwise_by_backend(const nd_tensor *x, const nd_tensor *w,
                                             const nd_tensor *b, const nd_conv_geom *g,
                                             int64_t groups, bool *used, nd_tensor **out) {
    const nd_backend *be = nd_backend_of(x);
    *used = be->conv2d_depthwise && is_depthwise(x->shape, w->shape, groups) &&
            x->shape[0] > 0 && g->lh * g->lw > 0;
    if (!*used) return ND_OK;
    nd_tensor *xc = NULL, *wc = NULL, *bc = NULL, *r = NULL;
    int64_t shape[4] = {x->shape[0], w->shape[0], g->lh, g->lw};
    nd_status st = nd_contiguous(x, &xc);
    if (st == ND_OK) st = nd_contiguous(w, &wc);
    if (st == ND_OK && b) st = nd_contiguous(b, &bc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), shape, 4, x->dtype, &r);
    if (st == ND_OK) st = ND_BACKEND_CALL(be, conv2d_depthwise, "conv2d", r, xc, wc, bc, g);
    nd_release(xc);
    nd_release(wc);
    nd_release(bc);
    if (st != ND_OK) {
        nd_release(r);
        return st;
    }
    *out = r;
    return ND_OK;
}

/* The backend's own conv2d kernel (CPU: cpu_conv_gemm.c, chunked, with no
 * batch-sized im2col buffer or layout copies) on a 4-D x, when it has one
 * and the convolution is not empty; *used says whether it ran. Shared with
 * op_fused.c's fused_conv2d. */
nd_status nd_conv2d_by_backend(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               const nd_conv_geom *g, int64_t groups, nd_activation act,
                               bool *used, nd_tensor **out) {
    const nd_backend *be = nd_backend_of(x);
    *used = be->conv2d_fused && x->shape[0] > 0 && x->shape[1] > 0 && w->shape[0] > 0 &&
            g->lh * g->lw > 0;
    if (!*used) return ND_OK;
    nd_tensor *xc = NULL, *wc = NULL, *bc = NULL, *r = NULL;
    int64_t shape[4] = {x->shape[0], w->shape[0], g->lh, g->lw};
    nd_status st = nd_contiguous(x, &xc);
    if (st == ND_OK) st = nd_contiguous(w, &wc);
    if (st == ND_OK && b) st = nd_contiguous(b, &bc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), shape, 4, x->dtype, &r);
    if (st == ND_OK) st = ND_BACKEND_CALL(be, conv2d_fused, "conv2d", r, xc, wc, bc, g, groups, act);
    nd_release(xc);
    nd_release(wc);
    nd_release(bc);
    if (st != ND_OK) {
        nd_release(r);
        return st;
    }
    *out = r;
    return ND_OK;
}

static nd_status conv2d_forward(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                const nd_conv_params *cp, const int64_t *ohw, nd_tensor **out) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], kh = w->shape[2], kw = w->shape[3], G = cp->groups;
    int64_t K = (C / G) * kh * kw, L = ohw[0] * ohw[1];
    nd_conv_geom g = {kh, kw, cp->stride[0], cp->stride[1], cp->padding[0], cp->padding[1],
                      cp->dilation[0], cp->dilation[1], ohw[0], ohw[1]};
    int64_t wsh[3] = {G, O / G, K}, os[4] = {N, O, ohw[0], ohw[1]};
    bool direct;
    ND_TRY(conv2d_depthwise_by_backend(x, w, b, &g, G, &direct, out));
    if (direct) return ND_OK;
    ND_TRY(nd_conv2d_by_backend(x, w, b, &g, G, ND_ACT_NONE, &direct, out));
    if (direct) return ND_OK;
    nd_gx c = {0};
    nd_tensor *cols = NULL;
    if (is_pointwise(&g, H, W)) cols = (nd_tensor *)x; /* a 1x1 conv reads x as is */
    else cols = gx_own(&c, im2col_forward(x, &g, &cols), &cols);
    if (L > ND_CONV_BATCHED_MAX_L) { /* a GEMM per (image, group) */
        int64_t cs[4] = {N, G, K, L};
        nd_tensor *r = gx_matmul(&c, gx_reshape(&c, w, wsh, 3), gx_reshape(&c, cols, cs, 4));
        *out = gx_out(&c, gx_reshape(&c, r, os, 4));                 /* (N, G, O/G, L) */
    } else {
        nd_tensor *a = batch_to_gemm(&c, cols, N, G, K, L);             /* (G, K, N*L) */
        nd_tensor *r = gx_matmul(&c, gx_reshape(&c, w, wsh, 3), a);     /* (G, O/G, N*L) */
        *out = gx_out(&c, gx_reshape(&c, gemm_to_batch(&c, r, N, G, O / G, L), os, 4));
    }
    nd_status st = gx_end(&c);
    if (st == ND_OK && (st = add_bias(*out, b)) != ND_OK) { nd_release(*out); *out = NULL; }
    return st;
}

static nd_status conv_transpose2d_forward(const nd_tensor *x, const nd_tensor *w,
                                          const nd_tensor *b, const nd_conv_params *cp,
                                          const int64_t *ohw, nd_tensor **out) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Og = w->shape[1], kh = w->shape[2], kw = w->shape[3], G = cp->groups;
    int64_t Cg = C / G, O = Og * G;
    nd_conv_geom g = {kh, kw, cp->stride[0], cp->stride[1], cp->padding[0], cp->padding[1],
                      cp->dilation[0], cp->dilation[1], H, W};
    int64_t wsh[3] = {G, Cg, Og * kh * kw};
    nd_gx c = {0};
    nd_tensor *wt = transpose_last(&c, gx_reshape(&c, w, wsh, 3));
    nd_tensor *c3;
    if (H * W > ND_CONV_BATCHED_MAX_L) { /* a GEMM per (image, group) */
        int64_t xs[4] = {N, G, Cg, H * W}, cs[3] = {N, O * kh * kw, H * W};
        c3 = gx_reshape(&c, gx_matmul(&c, wt, gx_reshape(&c, x, xs, 4)), cs, 3);
    } else {
        nd_tensor *xr = batch_to_gemm(&c, x, N, G, Cg, H * W);        /* (G, C/G, N*HW) */
        nd_tensor *cols = gx_matmul(&c, wt, xr);                      /* (G, Og*k, N*HW) */
        c3 = gemm_to_batch(&c, cols, N, G, Og * kh * kw, H * W);      /* (N, O*k, HW) */
    }
    nd_status st = c.st;
    if (st == ND_OK) st = col2im_forward(c3, O, ohw[0], ohw[1], &g, out);
    gx_end(&c);
    if (st == ND_OK && (st = add_bias(*out, b)) != ND_OK) { nd_release(*out); *out = NULL; }
    return st;
}

/* --------------------------------------------------------------- backward */

static void put_conv_params(nd_node *n, const nd_conv_params *cp) {
    const int64_t k8[8] = {cp->stride[0], cp->stride[1], cp->padding[0], cp->padding[1],
                           cp->dilation[0], cp->dilation[1], cp->output_padding[0],
                           cp->output_padding[1]};
    nd_node_put_k8(n, k8);
    n->iparams[0] = cp->groups;
}

static nd_conv_params node_conv_params(const nd_node *n) {
    int64_t k[8];
    nd_node_get_k8(n, k);
    nd_conv_params cp = {{k[0], k[1]}, {k[2], k[3]}, {k[4], k[5]}, {k[6], k[7]}, n->iparams[0]};
    return cp;
}

static nd_tensor *bias_grad(nd_gx *c, const nd_tensor *g) {
    if (c->st != ND_OK) return NULL;
    int dims[3] = {0, 2, 3};
    nd_tensor *r = NULL;
    return gx_own(c, nd_reduce(ND_REDUCE_sum, g, dims, 3, 0, 0, &r), &r);
}

/* conv2d's gradients by the backend's own kernel (CPU: cpu_conv_gemm.c),
 * when it has one, the backward is not itself recorded (create_graph: the
 * formulas below must be differentiable) and the convolution is not empty;
 * *used says whether it ran. */
static nd_status bw_conv2d_direct(nd_node *n, const nd_tensor *g, const nd_conv_params *cp,
                                  bool *used, nd_tensor **grads) {
    const nd_backend *be = nd_backend_of(g);
    const int64_t *xs = n->in_shape[0], *ws = n->in_shape[1];
    const bool want_x = n->needs_grad[0], want_w = n->needs_grad[1];
    const bool want_b = n->ninputs > 2 && n->needs_grad[2];
    /* (a backend with conv2d_backward routes depthwise convs itself) */
    const bool dw = !be->conv2d_backward && be->conv2d_depthwise_backward &&
                    is_depthwise(xs, ws, cp->groups);
    *used = (be->conv2d_backward || dw) && !nd_grad_enabled() && xs[0] > 0 && xs[1] > 0 &&
            ws[0] > 0 && g->shape[2] * g->shape[3] > 0;
    if (!*used) return ND_OK;
    nd_conv_geom geom = {ws[2], ws[3], cp->stride[0], cp->stride[1], cp->padding[0],
                         cp->padding[1], cp->dilation[0], cp->dilation[1], g->shape[2],
                         g->shape[3]};
    nd_tensor *gc = NULL, *x = NULL, *w = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    const nd_device dev = nd_get_device(g);
    nd_status st = nd_contiguous(g, &gc);
    if (st == ND_OK && want_w) st = nd_saved(n, (int)n->iparams[1], &x);
    if (st == ND_OK && want_x) st = nd_saved(n, (int)n->iparams[2], &w);
    if (st == ND_OK && want_x) st = nd_empty_on(dev, xs, 4, g->dtype, &gx);
    if (st == ND_OK && want_w) st = nd_empty_on(dev, ws, 4, g->dtype, &gw);
    if (st == ND_OK && want_b && !dw) st = nd_empty_on(dev, &ws[0], 1, g->dtype, &gb);
    if (st == ND_OK && want_b && dw) {
        int dims[3] = {0, 2, 3};
        st = nd_reduce(ND_REDUCE_sum, g, dims, 3, 0, 0, &gb);
    }
    nd_tensor *xc = NULL, *wc = NULL;
    if (st == ND_OK && x) st = nd_contiguous(x, &xc);
    if (st == ND_OK && w) st = nd_contiguous(w, &wc);
    if (st == ND_OK && dw && (gx || gw))
        st = ND_BACKEND_CALL(be, conv2d_depthwise_backward, "conv2d", gx, gw, gc, xc, wc, &geom);
    else if (st == ND_OK && !dw)
        st = ND_BACKEND_CALL(be, conv2d_backward, "conv2d", gx, gw, gb, gc, xc, wc, &geom, cp->groups);
    nd_release(gc);
    nd_release(x);
    nd_release(w);
    nd_release(xc);
    nd_release(wc);
    if (st != ND_OK) {
        nd_release(gx);
        nd_release(gw);
        nd_release(gb);
        return st;
    }
    grads[0] = gx;
    grads[1] = gw;
    if (n->ninputs > 2) grads[2] = gb;
    return ND_OK;
}

/* conv2d: gx = conv_transpose2d(g, w) (output_padding restores H, W),
 * gw = g as (G, O/G, N*L) @ (im2col(x) as (G, K, N*L))^T, gb = sum of g
 * over N, H, W. */
static nd_status bw_conv2d(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_conv_params cp = node_conv_params(n);
    const int64_t *xs = n->in_shape[0], *ws = n->in_shape[1];
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    int64_t O = ws[0], kh = ws[2], kw = ws[3], G = cp.groups;
    int64_t OH = n->out_shape[2], OW = n->out_shape[3];
    bool direct;
    ND_TRY(bw_conv2d_direct(n, g, &cp, &direct, grads));
    if (direct) return ND_OK;
    nd_gx c = {0};
    if (n->needs_grad[0]) {
        nd_tensor *w = gx_saved(&c, n, (int)n->iparams[2]), *r = NULL;
        int64_t op[2] = {
            H - ((OH - 1) * cp.stride[0] - 2 * cp.padding[0] + cp.dilation[0] * (kh - 1) + 1),
            W - ((OW - 1) * cp.stride[1] - 2 * cp.padding[1] + cp.dilation[1] * (kw - 1) + 1)};
        if (c.st == ND_OK)
            r = gx_own(&c, nd_conv_transpose2d(g, w, NULL, cp.stride, cp.padding, op, cp.dilation,
                                               G, &r), &r);
        grads[0] = gx_out(&c, r);
    }
    if (n->needs_grad[1]) {
        nd_tensor *x = gx_saved(&c, n, (int)n->iparams[1]), *cols = NULL;
        nd_conv_geom geom = {kh, kw, cp.stride[0], cp.stride[1], cp.padding[0], cp.padding[1],
                             cp.dilation[0], cp.dilation[1], OH, OW};
        int64_t K = (C / G) * kh * kw, L = OH * OW;
        int64_t wsh[4] = {ws[0], ws[1], ws[2], ws[3]};
        if (c.st == ND_OK) {
            if (is_pointwise(&geom, H, W)) cols = x;
            else cols = gx_own(&c, nd_im2col_op(x, &geom, &cols), &cols);
        }
        nd_tensor *s;
        if (L > ND_CONV_BATCHED_MAX_L) { /* per image, summed over the batch */
            int64_t cs[4] = {N, G, K, L}, gs[4] = {N, G, O / G, L};
            nd_tensor *ct = transpose_last(&c, gx_reshape(&c, cols, cs, 4));
            s = batch_gemm_sum(&c, gx_reshape(&c, g, gs, 4), ct);
        } else {
            nd_tensor *ct = transpose_last(&c, batch_to_gemm(&c, cols, N, G, K, L)); /* (G, N*L, K) */
            s = gx_matmul(&c, batch_to_gemm(&c, g, N, G, O / G, L), ct);              /* (G, O/G, K) */
        }
        grads[1] = gx_out(&c, gx_reshape(&c, s, wsh, 4));
    }
    if (n->ninputs > 2 && n->needs_grad[2]) grads[2] = gx_out(&c, bias_grad(&c, g));
    return gx_end(&c);
}

/* conv_transpose2d: gx = conv2d(g, w) (cut to H, W when output_padding
 * reached past the stride), gw = x as (G, C/G, N*HW) @ (im2col(g) as
 * (G, Og*k, N*HW))^T, gb = sum of g. */
static nd_status bw_conv_transpose2d(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_conv_params cp = node_conv_params(n);
    const int64_t *xs = n->in_shape[0], *ws = n->in_shape[1];
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    int64_t Og = ws[1], kh = ws[2], kw = ws[3], G = cp.groups;
    nd_gx c = {0};
    if (n->needs_grad[0]) {
        nd_tensor *w = gx_saved(&c, n, (int)n->iparams[2]), *r = NULL;
        if (c.st == ND_OK)
            r = gx_own(&c, nd_conv2d(g, w, NULL, cp.stride, cp.padding, cp.dilation, G, &r), &r);
        for (int a = 0; a < 2 && c.st == ND_OK; a++) {
            if (r->shape[2 + a] == xs[2 + a]) continue;
            nd_tensor *v = NULL;
            r = gx_own(&c, nd_narrow(r, 2 + a, 0, xs[2 + a], &v), &v);
        }
        grads[0] = gx_out(&c, r);
    }
    if (n->needs_grad[1]) {
        nd_tensor *x = gx_saved(&c, n, (int)n->iparams[1]), *gcols = NULL;
        nd_conv_geom geom = {kh, kw, cp.stride[0], cp.stride[1], cp.padding[0], cp.padding[1],
                             cp.dilation[0], cp.dilation[1], H, W};
        int64_t wsh[4] = {ws[0], ws[1], ws[2], ws[3]};
        if (c.st == ND_OK) gcols = gx_own(&c, nd_im2col_op(g, &geom, &gcols), &gcols);
        nd_tensor *s;
        if (H * W > ND_CONV_BATCHED_MAX_L) { /* per image, summed over the batch */
            int64_t cs[4] = {N, G, Og * kh * kw, H * W}, xr[4] = {N, G, C / G, H * W};
            nd_tensor *ct = transpose_last(&c, gx_reshape(&c, gcols, cs, 4));
            s = batch_gemm_sum(&c, gx_reshape(&c, x, xr, 4), ct);
        } else {
            nd_tensor *ct = transpose_last(&c, batch_to_gemm(&c, gcols, N, G, Og * kh * kw, H * W));
            s = gx_matmul(&c, batch_to_gemm(&c, x, N, G, C / G, H * W), ct);
        }
        grads[1] = gx_out(&c, gx_reshape(&c, s, wsh, 4));
    }
    if (n->ninputs > 2 && n->needs_grad[2]) grads[2] = gx_out(&c, bias_grad(&c, g));
    return gx_end(&c);
}

static nd_status record_conv(nd_op op, nd_backward_fn fn, const nd_tensor *x,
                             const nd_tensor *w, const nd_tensor *b, const nd_conv_params *cp,
                             nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[3] = {x, w, b};
    ND_TRY(nd_record(op, fn, out, 3, in, &n));
    if (!n) return ND_OK;
    put_conv_params(n, cp);
    /* keep only what the formulas need: x for gw, w for gx */
    n->iparams[1] = n->iparams[2] = -1;
    if (n->needs_grad[1]) {
        n->iparams[1] = n->nsaved;
        ND_TRY(nd_save(n, x, false));
    }
    if (n->needs_grad[0]) {
        n->iparams[2] = n->nsaved;
        ND_TRY(nd_save(n, w, false));
    }
    return ND_OK;
}

nd_status nd_record_conv2d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                           const nd_conv_params *cp, nd_tensor *out) {
    return record_conv(ND_OP_conv2d, bw_conv2d, x, w, b, cp, out);
}

nd_status nd_record_conv_transpose2d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                     const nd_conv_params *cp, nd_tensor *out) {
    return record_conv(ND_OP_conv_transpose2d, bw_conv_transpose2d, x, w, b, cp, out);
}

/* ----------------------------------------------------------- public ops */

static nd_status conv2d_4d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                           const nd_conv_params *cp, const int64_t *ohw, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(conv2d_forward(x, w, b, cp, ohw, out),
                           nd_record_conv2d(x, w, b, cp, *out), out);
}

static nd_status conv_transpose2d_4d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                     const nd_conv_params *cp, const int64_t *ohw,
                                     nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(conv_transpose2d_forward(x, w, b, cp, ohw, out),
                           nd_record_conv_transpose2d(x, w, b, cp, *out), out);
}

typedef nd_status (*conv4d_fn)(const nd_tensor *, const nd_tensor *, const nd_tensor *,
                               const nd_conv_params *, const int64_t *, nd_tensor **);

/* A 3-D (C, H, W) input runs as a batch of one (recorded views). */
static nd_status run_maybe_unbatched(conv4d_fn fn, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *b, const nd_conv_params *cp,
                                     const int64_t *ohw, nd_tensor **out) {
    if (x->ndim == 4) return fn(x, w, b, cp, ohw, out);
    nd_tensor *x4, *r;
    ND_TRY(nd_unsqueeze(x, 0, &x4));
    nd_status st = fn(x4, w, b, cp, ohw, &r);
    nd_release(x4);
    ND_TRY(st);
    st = nd_squeeze(r, 0, out);
    nd_release(r);
    return st;
}

/* A float16 / bfloat16 weight (and a float32 or half bias) of a float32
 * input, on a backend whose matmul reads half operands as stored (OpenCL)
 * and where the convolution is its im2col product (no conv kernel of the
 * backend's own takes it, and for conv2d it is not depthwise): the product
 * reads the weight unconverted, half the bytes and no float32 copy per
 * call; the bias add computes a half bias in float32, and autograd gives
 * the weight and bias gradients of their own dtypes. Elsewhere half
 * operands compute in float32 copies (nd_half_operands). */
static bool half_weight_as_stored(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                  int64_t groups, bool tr) {
    const nd_backend *be = nd_backend_of(x);
    if (!be->matmul_reads_half || be->conv2d_fused || x->dtype != ND_FLOAT32 ||
        !nd_dtype_is_half(w->dtype) || (b && b->dtype != ND_FLOAT32 && !nd_dtype_is_half(b->dtype)) ||
        (x->ndim != 3 && x->ndim != 4) || w->ndim != 4)
        return false;
    const int64_t xs[2] = {1, x->shape[x->ndim - 3]}; /* (is_depthwise reads the channels) */
    return tr || !(be->conv2d_depthwise && is_depthwise(xs, w->shape, groups));
}

nd_status nd_conv2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, nd_tensor **out) {
    const bool half_w = half_weight_as_stored(x, weight, bias, groups, false);
    /* float16 / bfloat16 operands compute in float32 (nd_half_operands) */
    if (!half_w)
        ND_RETURN_IF_HALF3(x, weight, bias, nd_conv2d(HX, HW, HB, stride, padding, dilation, groups, out));
    nd_conv_params cp;
    int64_t ohw[2];
    ND_TRY(conv_args("conv2d", false, half_w, x, weight, bias, stride, padding, NULL, dilation,
                     groups, &cp, ohw));
    return run_maybe_unbatched(conv2d_4d, x, weight, bias, &cp, ohw, out);
}

nd_status nd_conv_transpose2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                              const int64_t *stride, const int64_t *padding,
                              const int64_t *output_padding, const int64_t *dilation,
                              int64_t groups, nd_tensor **out) {
    const bool half_w = half_weight_as_stored(x, weight, bias, groups, true);
    /* float16 / bfloat16 operands compute in float32 (nd_half_operands) */
    if (!half_w)
        ND_RETURN_IF_HALF3(x, weight, bias, nd_conv_transpose2d(HX, HW, HB, stride, padding,
                                                                output_padding, dilation, groups, out));
    nd_conv_params cp;
    int64_t ohw[2];
    ND_TRY(conv_args("conv_transpose2d", true, half_w, x, weight, bias, stride, padding,
                     output_padding, dilation, groups, &cp, ohw));
    return run_maybe_unbatched(conv_transpose2d_4d, x, weight, bias, &cp, ohw, out);
}
