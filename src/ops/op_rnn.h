/* op_rnn.h - internals shared by op_rnn_cell.c, op_rnn_layer.c and
 * op_rnn_gru_layer.c: the cells' gradient formulas composed from
 * differentiable ops, which a cell's create_graph backward runs once and a
 * layer's once a step, and the layers' step bookkeeping. */
#ifndef ND_OP_RNN_H
#define ND_OP_RNN_H

#include <stdlib.h>
#include "backend.h"
#include "grad_expr.h"

/* From the gates' pre-activations (B, 4H), the state c (B, H) before the
 * step and the step's gradients dh, dc' (B, H): *dgates (B, 4H; NULL unless
 * want_gates) and *dc (B, H), borrowed from x (NULL once x failed). */
void nd_lstm_cell_grads_composed(nd_gx *x, const nd_tensor *gates, const nd_tensor *c, const nd_tensor *dh,
                                 const nd_tensor *dcn, bool want_gates, nd_tensor **dgates, nd_tensor **dc);

/* The GRU cell's (op_rnn_cell.c) from its products xw, hw (B, 3H), its
 * state h (B, H) and the new state's gradient g: *dxw and *dhw (B, 3H;
 * each NULL unless wanted) and *dh (B, H, the direct path), borrowed from x. */
void nd_gru_cell_grads_composed(nd_gx *x, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h,
                                const nd_tensor *g, bool want_x, bool want_hw, nd_tensor **dxw, nd_tensor **dhw,
                                nd_tensor **dh);

/* ---- the layers' steps (op_rnn_layer.c: LSTM, op_rnn_gru_layer.c: GRU) ---- */

/* a layer's sizes: T steps of B rows, H units; steps run back in time when reverse */
typedef struct {
    int64_t T, B, H;
    bool reverse;
} nd_rnn_dims;

/* the time step s runs at */
static inline int64_t nd_rnn_time(const nd_rnn_dims *d, int64_t s) { return d->reverse ? d->T - 1 - s : s; }

/* Whether a layer's backward takes each step's product against W_hh from
 * linear_fused, against a contiguous copy of W_hh^T (the CPU's small-rows
 * kernel streams it; the GEMM would pack W_hh every step), rather than
 * matmul_acc. Not at float32 matmul precision "medium": nd.autocast's
 * weight cache would take that copy eagerly (its own storage) and not in a
 * compiled replay (a view of the arena), so the two would round the
 * products differently; matmul_acc decides by the product's shape alone. */
static inline bool nd_rnn_grad_by_linear(const nd_backend *be) {
    return be->linear_fused && nd_get_float32_matmul_precision() != ND_MATMUL_MEDIUM;
}

/* where step s's rows are in a buffer of `kept` steps: its time when the
 * buffer holds all T (kept for the backward), else s modulo kept (a
 * forward without a graph needs the step before's state and nothing else) */
static inline int64_t nd_rnn_slot(const nd_rnn_dims *d, int64_t kept, int64_t s) {
    return kept == d->T ? nd_rnn_time(d, s) : s % kept;
}

/* rows (B, n) of t (T, B, W) at time `time`, from column col */
static inline nd_status nd_rnn_rows(const nd_tensor *t, int64_t time, int64_t col, int64_t n, nd_tensor **out) {
    const int64_t shape[2] = {t->shape[1], n}, strides[2] = {t->strides[1], t->strides[2]};
    return nd_tensor_view_of(t, shape, strides, 2, t->offset + time * t->strides[0] + col * t->strides[2], out);
}

/* a view of t with the given geometry, offset counted from t's */
static inline nd_status nd_rnn_view(const nd_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                                    int64_t off, nd_tensor **out) {
    return nd_tensor_view_of(t, shape, strides, ndim, t->offset + off, out);
}

/* saved tensor i of n with unit-stride rows (a copy only where it had none) */
static inline nd_status nd_rnn_saved_rows(nd_node *n, int i, nd_tensor **out) {
    nd_tensor *t = NULL;
    ND_TRY(nd_saved(n, i, &t));
    nd_status st = nd_unit_rows(t, out);
    nd_release(t);
    return st;
}

/* A layer's weight and bias gradients (op_rnn_layer.c) from its steps'
 * product gradients dp (T, B, K; contiguous), h0 (B, H) and hs, the steps'
 * h's as the first T of hs's rows of B (contiguous): *dw (K, H) = the sum
 * over steps of dp_t^T h_{t-1}, as one product for the first step and one
 * for all the others; *db (K) = dp summed over T and B. Each only when
 * wanted (else NULL). */
nd_status nd_rnn_weight_grads(const nd_backend *be, const char *op, const nd_rnn_dims *d, const nd_tensor *dp,
                              const nd_tensor *h0, const nd_tensor *hs, bool want_w, bool want_b, nd_tensor **dw,
                              nd_tensor **db);

/* A growing list of tensors a composed backward owns across steps. */
typedef struct {
    nd_tensor **t;
    int64_t n, cap;
} nd_rnn_held;

/* h takes over t (NULL: nothing); on failure t is released */
static inline nd_status nd_rnn_hold(nd_rnn_held *h, nd_tensor *t, const char *op) {
    if (!t) return ND_OK;
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        nd_tensor **p = realloc(h->t, sizeof(*p) * (size_t)cap);
        if (!p) {
            nd_release(t);
            return nd_fail(ND_ERR_MEMORY, "%s: out of memory for the backward's steps", op);
        }
        h->t = p, h->cap = cap;
    }
    h->t[h->n++] = t;
    return ND_OK;
}

static inline void nd_rnn_drop(nd_rnn_held *h) {
    for (int64_t i = 0; i < h->n; i++) nd_release(h->t[i]);
    free(h->t);
}

/* t's slice at time `time` (dim 0), a @ b, a^T (2-D): held by x */
static inline nd_tensor *gx_at(nd_gx *x, const nd_tensor *t, int64_t time) {
    if (x->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(x, nd_select(t, 0, time, &r), &r);
}

static inline nd_tensor *gx_mm(nd_gx *x, const nd_tensor *a, const nd_tensor *b) {
    if (x->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(x, nd_matmul(a, b, &r), &r);
}

static inline nd_tensor *gx_tr(nd_gx *x, const nd_tensor *a) {
    if (x->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(x, nd_transpose(a, 0, 1, &r), &r);
}


#endif
