/* op_index_grad.c - backward formulas of gather, scatter, scatter_add,
 * index_select, index_add and masked_fill, and the recording of their nodes.
 *
 * The formulas are the ops' adjoints, written with the differentiable ops:
 *   gather        x: g scatter-added into zeros at index (nd_gather_backward)
 *   scatter       x: g with the scattered positions zeroed   src: gather(g)
 *   scatter_add   x: g                                        src: gather(g)
 *   index_select  x: g index-added into zeros
 *   index_add     x: g                                        src: index_select(g) * alpha
 *   masked_fill   x: g zeroed where mask (summed to x's shape); none for the value
 * Scatter-adding into zeros is recorded as a scatter_add whose src is g, and
 * index-adding as an index_add, so with create_graph their own gradients are
 * gather / index_select again: second derivatives work. Index tensors and
 * masks are saved (version-checked) for the formulas. */
#include "grad_expr.h"
#include "grad_fns.h"

/* ------------------------------------------------------------- helpers */

static nd_tensor *gx_gather(nd_gx *c, const nd_tensor *t, int dim, const nd_tensor *index) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_gather(t, dim, index, &r), &r);
}

static nd_tensor *gx_scatter(nd_gx *c, const nd_tensor *x, int dim, const nd_tensor *index,
                             const nd_tensor *src, int accumulate) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_scatter(x, dim, index, src, accumulate, &r), &r);
}

static nd_tensor *gx_index_select(nd_gx *c, const nd_tensor *t, int dim, const nd_tensor *index) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_index_select(t, dim, index, &r), &r);
}

static nd_tensor *gx_index_add(nd_gx *c, const nd_tensor *x, int dim, const nd_tensor *index,
                               const nd_tensor *src, double alpha) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_index_add(x, dim, index, src, alpha, &r), &r);
}

static nd_tensor *gx_sum_all(nd_gx *c, const nd_tensor *t) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_reduce(ND_REDUCE_sum, t, NULL, 0, 0, 0, &r), &r);
}

/* t (at most shape in every dim, same ndim) embedded at the start of zeros of
 * (shape, ndim): a pad at the end of each dim, itself differentiable. */
static nd_tensor *gx_embed_front(nd_gx *c, const nd_tensor *t, const int64_t *shape, int ndim) {
    if (c->st != ND_OK) return NULL;
    int64_t pads[2 * ND_MAX_DIMS];
    bool same = true;
    for (int i = 0; i < ndim; i++) {
        int d = ndim - 1 - i;
        pads[2 * i] = 0;
        pads[2 * i + 1] = shape[d] - t->shape[d];
        same = same && pads[2 * i + 1] == 0;
    }
    if (same) return (nd_tensor *)t;
    nd_tensor *r = NULL;
    return gx_own(c, nd_pad(t, pads, ndim, 0, &r), &r);
}

nd_status nd_gather_backward(const nd_tensor *g, const int64_t *shape, int ndim, int dim,
                             const nd_tensor *index, nd_tensor **out) {
    nd_tensor *z;
    ND_TRY(nd_zeros_on(nd_get_device(g), shape, ndim, g->dtype, &z));
    nd_status st = nd_scatter(z, dim, index, g, 1, out);
    nd_release(z);
    return st;
}

/* -------------------------------------------------------------- gather */

static nd_status bw_gather(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *index;
    ND_TRY(nd_saved(n, 0, &index));
    nd_status st = nd_gather_backward(g, n->in_shape[0], n->in_ndim[0], n->dims[0], index,
                                      &grads[0]);
    nd_release(index);
    return st;
}

nd_status nd_record_gather(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("gather", bw_gather, out, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("gather", dim, x->ndim, &n->dims[0]));
    return nd_save(n, index, false);
}

/* ------------------------------------------------ scatter, scatter_add */

/* inputs: x, (index), src */
static nd_status bw_scatter(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    int d = n->dims[0];
    bool accumulate = n->iparams[0] != 0;
    nd_tensor *index = gx_saved(&c, n, 0);
    if (n->needs_grad[0]) {
        if (accumulate) {
            grads[0] = gx_out(&c, g);
        } else { /* what was overwritten gets no gradient */
            nd_tensor *zero = gx_zeros(&c, g, NULL, 0, g->dtype);
            grads[0] = gx_out(&c, gx_scatter(&c, g, d, index, zero, 0));
        }
    }
    if (n->needs_grad[2]) {
        nd_tensor *r = gx_gather(&c, g, d, index);
        if (n->in_ndim[2] == 0 && n->in_ndim[0] > 0) /* one value scattered everywhere */
            r = gx_sum_all(&c, r);
        else /* src may be larger than index: the rest was not used */
            r = gx_embed_front(&c, r, n->in_shape[2], n->in_ndim[2]);
        grads[2] = gx_out(&c, r);
    }
    return gx_end(&c);
}

nd_status nd_record_scatter(const nd_tensor *x, int dim, const nd_tensor *index,
                            const nd_tensor *src, int accumulate, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    const char *name = accumulate ? "scatter_add" : "scatter";
    nd_node *n;
    /* an integer src cast to x's dtype carries no gradient */
    const nd_tensor *in[3] = {x, NULL, src};
    ND_TRY(nd_record(name, bw_scatter, out, 3, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &n->dims[0]));
    n->iparams[0] = accumulate;
    return nd_save(n, index, false);
}

/* ------------------------------------------------ index_select, index_add */

static nd_status bw_index_select(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *index = gx_saved(&c, n, 0);
    nd_tensor *z = gx_zeros(&c, g, n->in_shape[0], n->in_ndim[0], g->dtype);
    grads[0] = gx_out(&c, gx_index_add(&c, z, n->dims[0], index, g, 1.0));
    return gx_end(&c);
}

nd_status nd_record_index_select(const nd_tensor *x, int dim, const nd_tensor *index,
                                 nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("index_select", bw_index_select, out, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("index_select", dim, x->ndim, &n->dims[0]));
    return nd_save(n, index, false);
}

/* inputs: x, (index), src */
static nd_status bw_index_add(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    double alpha = n->fparams[0];
    if (n->needs_grad[0]) grads[0] = gx_out(&c, g);
    if (n->needs_grad[2]) {
        nd_tensor *index = gx_saved(&c, n, 0);
        nd_tensor *r = gx_index_select(&c, g, n->dims[0], index);
        if (alpha != 1.0) r = gx_sc(&c, ND_BINARY_mul, r, alpha, 0);
        grads[2] = gx_out(&c, r);
    }
    return gx_end(&c);
}

nd_status nd_record_index_add(const nd_tensor *x, int dim, const nd_tensor *index,
                              const nd_tensor *src, double alpha, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[3] = {x, NULL, src};
    ND_TRY(nd_record("index_add", bw_index_add, out, 3, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("index_add", dim, x->ndim, &n->dims[0]));
    n->fparams[0] = alpha;
    return nd_save(n, index, false);
}

/* ---------------------------------------------------------- masked_fill */

static nd_status bw_masked_fill(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *mask = gx_saved(&c, n, 0), *r = NULL;
    if (c.st == ND_OK) r = gx_own(&c, nd_masked_fill(g, mask, 0, &r), &r);
    grads[0] = gx_out(&c, gx_sum_to(&c, r, n, 0));
    return gx_end(&c);
}

nd_status nd_record_masked_fill(const nd_tensor *x, const nd_tensor *mask, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("masked_fill", bw_masked_fill, out, 1, in, &n));
    return n ? nd_save(n, mask, false) : ND_OK;
}
