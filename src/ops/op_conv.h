/* op_conv.h - internals shared by op_conv.c and op_pool.c: the
 * differentiable building blocks of convolution and pooling, and the
 * recording of their autograd nodes (as grad_fns.h does for the other ops).
 *
 * Every block below is an op of its own with a backward made of the others,
 * so gradients of any order exist:
 *   im2col  <-> col2im                  (adjoint pair: each is the other's backward)
 *   conv2d: x -> conv_transpose2d(g, w), w -> sum_n g @ im2col(x)^T, b -> sum g
 *   conv_transpose2d: x -> conv2d(g, w), w -> sum_n x @ im2col(g)^T, b -> sum g
 *   max_pool2d -> max_pool2d_backward (scatter to the argmax) <-> max_pool2d_gather
 *   avg_pool2d <-> avg_pool2d_backward (adjoint pair; adaptive too)
 * Tensors here are 4-D (N, C, H, W); the public functions (needle.h) add
 * the unbatched 3-D form. */
#ifndef ND_OP_CONV_H
#define ND_OP_CONV_H

#include "autograd.h"
#include "backend.h"

/* conv2d / conv_transpose2d parameters (output_padding: transpose only) */
typedef struct {
    int64_t stride[2], padding[2], dilation[2], output_padding[2];
    int64_t groups;
} nd_conv_params;

/* A {h, w} argument (def when v is NULL), each >= min and at most INT_MAX
 * (nodes keep them in int fields); errors name op and what. */
nd_status nd_conv_pair_arg(const char *op, const char *what, const int64_t *v,
                           const int64_t *def, int64_t min, int64_t out[2]);

/* x, w and b (or NULL) on one device, x float32/float64 and w, b of x's dtype;
 * errors named op (conv2d, fused_linear, ...). */
nd_status nd_check_float_weights(const char *op, const nd_tensor *x, const nd_tensor *w,
                                 const nd_tensor *b);

/* conv2d's argument checks (x 3-D or 4-D) and output size {oh, ow}, errors
 * named op: for ops built on conv2d (op_fused.c). */
nd_status nd_conv2d_args(const char *op, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                         const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                         int64_t groups, nd_conv_params *cp, int64_t ohw[2]);

/* act(conv2d(x, w) + b) of a 4-D x by the backend's conv2d_fused kernel,
 * when it has one and the convolution is not empty (*used: whether it ran;
 * if not, nothing was done). No autograd. */
nd_status nd_conv2d_by_backend(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               const nd_conv_geom *g, int64_t groups, nd_activation act,
                               bool *used, nd_tensor **out);

/* ---- building blocks (4-D, any strides in; contiguous out) ---- */
/* cols (N, C*kh*kw, lh*lw): torch's unfold with an explicit position grid. */
nd_status nd_im2col_op(const nd_tensor *x, const nd_conv_geom *g, nd_tensor **out);
/* (N, C, H, W) from cols (N, C*kh*kw, lh*lw): torch's fold. */
nd_status nd_col2im_op(const nd_tensor *cols, int64_t C, int64_t H, int64_t W,
                       const nd_conv_geom *g, nd_tensor **out);
/* (N, C, H, W) gradient of max_pool2d from g (N, C, oh, ow) and the argmax
 * indices (int64, flat within each plane). */
nd_status nd_max_pool2d_backward_op(const nd_tensor *g, const nd_tensor *indices, int64_t H,
                                    int64_t W, nd_tensor **out);
/* (N, C, oh, ow): x (N, C, H, W) read at the indices (indices' shape). */
nd_status nd_max_pool2d_gather_op(const nd_tensor *x, const nd_tensor *indices, nd_tensor **out);
/* Average pooling with a resolved geometry (p->oh, p->ow set). */
nd_status nd_avg_pool2d_op(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out);
/* Its adjoint: (N, C, H, W) from g (N, C, p->oh, p->ow). */
nd_status nd_avg_pool2d_backward_op(const nd_tensor *g, const nd_pool_geom *p, int64_t H,
                                    int64_t W, nd_tensor **out);

/* ---- recording (called by the ops after their forward, grad mode on) ---- */
nd_status nd_record_conv2d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                           const nd_conv_params *cp, nd_tensor *out);
nd_status nd_record_conv_transpose2d(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                     const nd_conv_params *cp, nd_tensor *out);
nd_status nd_record_im2col(const nd_tensor *x, const nd_conv_geom *g, nd_tensor *out);
nd_status nd_record_col2im(const nd_tensor *cols, const nd_conv_geom *g, nd_tensor *out);
nd_status nd_record_max_pool2d(const nd_tensor *x, const nd_tensor *indices, nd_tensor *out);
nd_status nd_record_max_pool2d_backward(const nd_tensor *g, const nd_tensor *indices,
                                        nd_tensor *out);
nd_status nd_record_max_pool2d_gather(const nd_tensor *x, const nd_tensor *indices,
                                      nd_tensor *out);
nd_status nd_record_avg_pool2d(nd_op op, const nd_tensor *x, const nd_pool_geom *p,
                               nd_tensor *out);
nd_status nd_record_avg_pool2d_backward(const nd_tensor *g, const nd_pool_geom *p,
                                        nd_tensor *out);

/* ---- geometry kept in a node: the 8 kernel fields (kh..dw, each checked
 * to fit an int by the ops) in dims[], the rest in iparams[] ---- */
static inline void nd_node_put_k8(nd_node *n, const int64_t *k8) {
    for (int i = 0; i < 8; i++) n->dims[i] = (int)k8[i];
    n->ndims = 8;
}
static inline void nd_node_get_k8(const nd_node *n, int64_t *k8) {
    for (int i = 0; i < 8; i++) k8[i] = n->dims[i];
}
static inline void nd_node_put_conv_geom(nd_node *n, const nd_conv_geom *g) {
    const int64_t k8[8] = {g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
    nd_node_put_k8(n, k8);
    n->iparams[0] = g->lh;
    n->iparams[1] = g->lw;
}
static inline nd_conv_geom nd_node_conv_geom(const nd_node *n) {
    int64_t k[8];
    nd_node_get_k8(n, k);
    nd_conv_geom g = {k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], n->iparams[0], n->iparams[1]};
    return g;
}
static inline void nd_node_put_pool_geom(nd_node *n, const nd_pool_geom *p) {
    const int64_t k8[8] = {p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw};
    nd_node_put_k8(n, k8);
    n->iparams[0] = p->oh;
    n->iparams[1] = p->ow;
    n->iparams[2] = (p->count_include_pad ? 1 : 0) | (p->adaptive ? 2 : 0);
}
static inline nd_pool_geom nd_node_pool_geom(const nd_node *n) {
    int64_t k[8];
    nd_node_get_k8(n, k);
    nd_pool_geom p = {k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], n->iparams[0], n->iparams[1],
                      (n->iparams[2] & 1) != 0, (n->iparams[2] & 2) != 0};
    return p;
}

#endif
