/* grad_expr.h - a tiny expression context for backward formulas.
 *
 * Formulas chain several ops; each helper returns a borrowed tensor that the
 * context owns, and does nothing once an earlier step failed, so a formula
 * reads like math and still releases every temporary on every path:
 *
 *     nd_gx c = {0};
 *     nd_tensor *y = gx_saved(&c, n, 0);
 *     grads[0] = gx_out(&c, gx_bin(&c, ND_BINARY_mul, g, y));
 *     return gx_end(&c);
 *
 * The ops are the ordinary differentiable ones, so with create_graph the
 * formula itself is recorded. */
#ifndef ND_GRAD_EXPR_H
#define ND_GRAD_EXPR_H

#include "autograd.h"

#define ND_GX_MAX 64 /* (the LSTM cell's composed backward takes about 40) */

typedef struct {
    nd_tensor *tmp[ND_GX_MAX];
    int n;
    nd_status st;
} nd_gx;

/* Takes over *pt (a new reference, written by the call that produced st)
 * as a temporary of the context. A pointer, not the value: C leaves the
 * order of argument evaluation unspecified, so `gx_own(c, op(&r), r)` could
 * read r before op ran. */
static inline nd_tensor *gx_own(nd_gx *c, nd_status st, nd_tensor **pt) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *t = *pt;
    if (st != ND_OK) { c->st = st; return NULL; }
    if (c->n == ND_GX_MAX) {
        nd_release(t);
        c->st = nd_fail(ND_ERR_INTERNAL, "backward: formula too long");
        return NULL;
    }
    c->tmp[c->n++] = t;
    return t;
}

#define GX_GUARD(...) do { if (c->st != ND_OK) return NULL; } while (0)

static inline nd_tensor *gx_bin(nd_gx *c, nd_binary_op op, const nd_tensor *a, const nd_tensor *b) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_binary(op, a, b, &r), &r);
}

/* a op s, or s op a when scalar_first */
static inline nd_tensor *gx_sc(nd_gx *c, nd_binary_op op, const nd_tensor *a, double s,
                               int scalar_first) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_binary_scalar(op, a, s, scalar_first, &r), &r);
}

static inline nd_tensor *gx_un(nd_gx *c, nd_unary_op op, const nd_tensor *a) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_unary(op, a, &r), &r);
}

static inline nd_tensor *gx_saved(nd_gx *c, nd_node *n, int i) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_saved(n, i, &r), &r);
}

static inline nd_tensor *gx_sum_to(nd_gx *c, const nd_tensor *g, nd_node *n, int input) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_sum_to_shape(g, n->in_shape[input], n->in_ndim[input], &r), &r);
}

static inline nd_tensor *gx_reshape(nd_gx *c, const nd_tensor *t, const int64_t *shape, int nd) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_reshape(t, shape, nd, &r), &r);
}

static inline nd_tensor *gx_expand(nd_gx *c, const nd_tensor *t, const int64_t *shape, int nd) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_expand(t, shape, nd, &r), &r);
}

/* zeros on ref's device */
static inline nd_tensor *gx_zeros(nd_gx *c, const nd_tensor *ref, const int64_t *shape, int nd,
                                  nd_dtype dt) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_zeros_on(nd_get_device(ref), shape, nd, dt, &r), &r);
}

static inline nd_tensor *gx_where(nd_gx *c, const nd_tensor *cond, const nd_tensor *a,
                                  const nd_tensor *b) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_where(cond, a, b, &r), &r);
}

static inline nd_tensor *gx_to(nd_gx *c, const nd_tensor *t, nd_dtype dt) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_to_dtype(t, dt, &r), &r);
}

/* The result handed back to the engine: a new reference that outlives the
 * context (NULL if anything failed). */
static inline nd_tensor *gx_out(nd_gx *c, nd_tensor *t) {
    if (c->st != ND_OK || !t) return NULL;
    nd_retain(t);
    return t;
}

/* Releases the temporaries; returns the first failure. On failure the
 * caller's outputs (from gx_out) are released by the engine. */
static inline nd_status gx_end(nd_gx *c) {
    for (int i = 0; i < c->n; i++) nd_release(c->tmp[i]);
    c->n = 0;
    return c->st;
}

#endif
