/* op_attention.c - attention: dropout(softmax(scale * q k^T + mask)) v as one
 * backend kernel (backend.h), for F.scaled_dot_product_attention.
 *
 * With a gradient wanted the forward also keeps each query's log-sum-exp
 * and the node's backward is the backend's fused one, which remakes the
 * weights from it block by block (no (L, S) tensor kept between the two).
 * Under create_graph the backward composes differentiable ops instead (the
 * same formulas), so gradients of gradients work. Dropout draws from the
 * global Philox stream at the counters rand() would have taken for the
 * (B1, B2, L, S) weights; the node keeps them and the backward draws the
 * same keeps again. The mask takes no gradient here (the Lua side composes
 * the ops for one that requires it). */
#include <math.h>
#include "autograd.h"
#include "backend_call.h"
#include "grad_expr.h"

static nd_status check_args(const char *op, const nd_tensor *q, const nd_tensor *k,
                            const nd_tensor *v, const nd_tensor *mask) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF], b3[ND_SHAPE_BUF];
    const nd_tensor *all[4] = {q, k, v, mask};
    const char *names[4] = {"query", "key", "value", "mask"};
    for (int t = 0; t < 4; t++) {
        if (!all[t]) continue;
        if (all[t]->ndim != 4)
            return nd_fail(ND_ERR_SHAPE, "%s: expected a 4-D %s (batch, heads, rows, features), got shape %s",
                           op, names[t], nd_shape_str(all[t]->shape, all[t]->ndim, b1));
        if (t > 0) ND_TRY(nd_check_same_device(op, q, all[t]));
        if (all[t]->dtype != q->dtype)
            return nd_fail(ND_ERR_DTYPE, "%s: query (%s) and %s (%s) must have the same dtype", op,
                           nd_dtype_name(q->dtype), names[t], nd_dtype_name(all[t]->dtype));
    }
    if (q->dtype != ND_FLOAT32 && q->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 tensors, got %s", op,
                       nd_dtype_name(q->dtype));
    const int64_t *qs = q->shape, *ks = k->shape, *vs = v->shape;
    bool ok = ks[0] == qs[0] && ks[1] == qs[1] && ks[3] == qs[3] && vs[0] == qs[0] &&
              vs[1] == qs[1] && vs[2] == ks[2];
    if (!ok)
        return nd_fail(ND_ERR_SHAPE, "%s: query %s, key %s and value %s do not fit (expected (B, H, L, E), "
                       "(B, H, S, E) and (B, H, S, Ev))", op, nd_shape_str(qs, 4, b1),
                       nd_shape_str(ks, 4, b2), nd_shape_str(vs, 4, b3));
    if (mask && (mask->shape[0] != qs[0] || mask->shape[1] != qs[1] || mask->shape[2] != qs[2] ||
                 mask->shape[3] != ks[2]))
        return nd_fail(ND_ERR_SHAPE, "%s: the mask must have shape {%lld,%lld,%lld,%lld} (B, H, L, S), "
                       "got %s", op, (long long)qs[0], (long long)qs[1], (long long)qs[2],
                       (long long)ks[2], nd_shape_str(mask->shape, 4, b1));
    if (nd_grad_enabled() && mask && mask->requires_grad)
        return nd_fail(ND_ERR_ARG, "%s: gives the mask no gradient (it requires grad); "
                       "F.scaled_dot_product_attention composes differentiable ops then", op);
    return ND_OK;
}


/* the node's saved tensors: these five, then the mask and the keeps where
 * there are (their places in iparams[4] and [5], -1 for none) */
enum { SAVED_Q, SAVED_K, SAVED_V, SAVED_OUT, SAVED_LSE, SAVED_FIXED };

static nd_status saved_opt(nd_node *n, int64_t slot, nd_tensor **out) {
    *out = NULL;
    return slot < 0 ? ND_OK : nd_saved(n, (int)slot, out);
}

/* An uninitialised tensor of t's shape and dtype whose memory is laid out as
 * t's when t is a permutation of dense memory with unit-stride rows (split
 * heads are: (B, L, H, E) memory seen as (B, H, L, E)), else contiguous: a
 * gradient so made goes back through the head split as views, where a
 * contiguous one had to be copied there. */
static nd_status empty_in_layout(const nd_tensor *t, nd_tensor **out) {
    int perm[4] = {0, 1, 2, 3};
    for (int i = 1; i < 4; i++) /* dims by stride, largest first (stable) */
        for (int j = i; j > 0 && t->strides[perm[j - 1]] < t->strides[perm[j]]; j--) {
            const int x = perm[j];
            perm[j] = perm[j - 1], perm[j - 1] = x;
        }
    int64_t shape[4], expect = 1;
    bool dense = perm[3] == 3;
    for (int i = 3; i >= 0; i--) {
        shape[i] = t->shape[perm[i]];
        if (shape[i] > 1 && t->strides[perm[i]] != expect) dense = false;
        expect *= shape[i];
    }
    if (!dense) return nd_empty_on(nd_get_device(t), t->shape, 4, t->dtype, out);
    int inv[4];
    for (int m = 0; m < 4; m++) inv[perm[m]] = m;
    nd_tensor *mem = NULL;
    ND_TRY(nd_empty_on(nd_get_device(t), shape, 4, t->dtype, &mem));
    nd_status st = nd_permute(mem, inv, 4, out);
    nd_release(mem);
    return st;
}

static nd_attention_args args_of_node(const nd_node *n) {
    return (nd_attention_args){.scale = n->fparams[0], .causal = n->iparams[0] != 0,
                               .dropout_p = n->fparams[1], .seed = (uint64_t)n->iparams[2],
                               .offset = (uint64_t)n->iparams[3]};
}

/* No create_graph: the backend's fused backward. */
static nd_status bw_attention_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const char *op = "attention";
    const nd_attention_args a = args_of_node(n);
    nd_tensor *sv[SAVED_FIXED] = {0}, *mask = NULL, *keep = NULL;
    nd_tensor *qc = NULL, *kc = NULL, *vc = NULL, *gc = NULL, *d[3] = {0};
    nd_status st = ND_OK;
    for (int i = 0; i < SAVED_FIXED && st == ND_OK; i++) st = nd_saved(n, i, &sv[i]);
    if (st == ND_OK) st = saved_opt(n, n->iparams[4], &mask);
    if (st == ND_OK) st = saved_opt(n, n->iparams[5], &keep);
    if (st == ND_OK) st = nd_unit_rows(sv[SAVED_Q], &qc);
    if (st == ND_OK) st = nd_unit_rows(sv[SAVED_K], &kc);
    if (st == ND_OK) st = nd_unit_rows(sv[SAVED_V], &vc);
    if (st == ND_OK) st = nd_unit_rows(g, &gc);
    const nd_tensor *src[3] = {qc, kc, vc};
    for (int i = 0; i < 3 && st == ND_OK; i++)
        if (n->needs_grad[i]) st = empty_in_layout(src[i], &d[i]);
    if (st == ND_OK)
        st = ND_BACKEND_CALL(nd_backend_of(qc), attention_backward, op, d[0], d[1], d[2], gc, qc, kc,
                             vc, mask, sv[SAVED_OUT], sv[SAVED_LSE], keep, &a);
    for (int i = 0; i < SAVED_FIXED; i++) nd_release(sv[i]);
    nd_release(mask), nd_release(keep);
    nd_release(qc), nd_release(kc), nd_release(vc), nd_release(gc);
    if (st != ND_OK) {
        for (int i = 0; i < 3; i++) nd_release(d[i]);
        return st;
    }
    for (int i = 0; i < 3; i++) grads[i] = d[i];
    return ND_OK;
}

/* the (L, S) additive causal mask (-inf where key j > query i) on t's device */
static nd_status causal_mask(const nd_tensor *t, int64_t L, int64_t S, nd_tensor **out) {
    const int64_t shape[2] = {L, S};
    nd_tensor *h = NULL;
    ND_TRY(nd_empty_on(nd_cpu_device(), shape, 2, t->dtype, &h));
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < S; j++) {
            const double v = j > i ? -INFINITY : 0.0;
            if (t->dtype == ND_FLOAT32) ((float *)nd_ptr(h))[i * S + j] = (float)v;
            else ((double *)nd_ptr(h))[i * S + j] = v;
        }
    nd_status st = nd_to_device(h, nd_get_device(t), out);
    nd_release(h);
    return st;
}

/* create_graph: the same gradients from differentiable ops */
static nd_status bw_attention_composed(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const nd_attention_args a = args_of_node(n);
    nd_gx c = {0};
    nd_tensor *q = gx_saved(&c, n, SAVED_Q), *k = gx_saved(&c, n, SAVED_K);
    nd_tensor *v = gx_saved(&c, n, SAVED_V);
    nd_tensor *mask = n->iparams[4] >= 0 ? gx_saved(&c, n, (int)n->iparams[4]) : NULL;
    nd_tensor *kt = NULL, *vt = NULL, *s = NULL, *p = NULL, *keep = NULL, *cm = NULL;
    if (c.st == ND_OK) kt = gx_own(&c, nd_transpose(k, 2, 3, &kt), &kt);
    if (c.st == ND_OK) vt = gx_own(&c, nd_transpose(v, 2, 3, &vt), &vt);
    if (c.st == ND_OK) s = gx_own(&c, nd_matmul(q, kt, &s), &s);
    s = gx_sc(&c, ND_BINARY_mul, s, a.scale, 0);
    if (mask) s = gx_bin(&c, ND_BINARY_add, s, mask);
    if (a.causal && c.st == ND_OK) {
        cm = gx_own(&c, causal_mask(q, q->shape[2], k->shape[2], &cm), &cm);
        s = gx_bin(&c, ND_BINARY_add, s, cm);
    }
    if (c.st == ND_OK) p = gx_own(&c, nd_softmax(s, 3, &p), &p);
    nd_tensor *pd = p;
    const double inv = 1.0 / (1.0 - a.dropout_p);
    if (a.dropout_p > 0 && c.st == ND_OK) { /* the forward's keeps (saved with every dropout) */
        keep = gx_saved(&c, n, (int)n->iparams[5]);
        pd = gx_sc(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_mul, p, keep), inv, 0);
    }
    if (n->needs_grad[2] && c.st == ND_OK) { /* dV = Pd^T dO */
        nd_tensor *pdt = NULL, *dv = NULL;
        pdt = gx_own(&c, nd_transpose(pd, 2, 3, &pdt), &pdt);
        if (c.st == ND_OK) dv = gx_own(&c, nd_matmul(pdt, g, &dv), &dv);
        grads[2] = gx_out(&c, dv);
    }
    if ((n->needs_grad[0] || n->needs_grad[1]) && c.st == ND_OK) {
        nd_tensor *dp = NULL, *dsum = NULL, *ds;
        dp = gx_own(&c, nd_matmul(g, vt, &dp), &dp);
        if (keep) dp = gx_sc(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_mul, dp, keep), inv, 0);
        const int last = 3;
        nd_tensor *pdp = gx_bin(&c, ND_BINARY_mul, dp, p);
        if (c.st == ND_OK) dsum = gx_own(&c, nd_reduce(ND_REDUCE_sum, pdp, &last, 1, 1, 0, &dsum), &dsum);
        ds = gx_sc(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_mul, p, gx_bin(&c, ND_BINARY_sub, dp, dsum)),
                   a.scale, 0);
        if (n->needs_grad[0] && c.st == ND_OK) {
            nd_tensor *dq = NULL;
            dq = gx_own(&c, nd_matmul(ds, k, &dq), &dq);
            grads[0] = gx_out(&c, dq);
        }
        if (n->needs_grad[1] && c.st == ND_OK) {
            nd_tensor *dst = NULL, *dk = NULL;
            dst = gx_own(&c, nd_transpose(ds, 2, 3, &dst), &dst);
            if (c.st == ND_OK) dk = gx_own(&c, nd_matmul(dst, q, &dk), &dk);
            grads[1] = gx_out(&c, dk);
        }
    }
    return gx_end(&c);
}

static nd_status bw_attention(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (nd_grad_enabled() || !nd_backend_of(g)->attention_backward) return bw_attention_composed(n, g, grads);
    return bw_attention_fused(n, g, grads);
}

nd_status nd_attention(const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                       const nd_tensor *mask, double scale, bool causal, double dropout_p,
                       nd_tensor **out) {
    const char *op = "attention";
    *out = NULL;
    ND_TRY(check_args(op, q, k, v, mask));
    if (!(dropout_p >= 0 && dropout_p < 1))
        return nd_fail(ND_ERR_ARG, "%s: dropout_p must be in [0, 1), got %g", op, dropout_p);
    nd_attention_args a = {.scale = scale, .causal = causal, .dropout_p = dropout_p};
    const int64_t B = q->shape[0] * q->shape[1], L = q->shape[2], S = k->shape[2];
    if (dropout_p > 0) nd_rng_reserve(B * L * S, &a.seed, &a.offset);
    const bool grad_on = nd_set_grad_enabled(false);
    const bool wants = grad_on && (q->requires_grad || k->requires_grad || v->requires_grad);
    nd_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL, *lse = NULL, *keep = NULL;
    nd_status st = nd_unit_rows(q, &qc);
    if (st == ND_OK) st = nd_unit_rows(k, &kc);
    if (st == ND_OK) st = nd_unit_rows(v, &vc);
    /* out (B1, B2, L, Ev) as a view of (B1, L, B2, Ev) memory: merging the
     * heads back, (N, H, L, D) -> (N, L, H * D), is then a view, not a copy
     * (PyTorch's fused kernels return this layout too) */
    const int64_t mem_shape[4] = {q->shape[0], q->shape[2], q->shape[1], v->shape[3]};
    const int swap[4] = {0, 2, 1, 3};
    nd_tensor *mem = NULL;
    if (st == ND_OK) st = nd_empty_on(nd_get_device(q), mem_shape, 4, q->dtype, &mem);
    if (st == ND_OK) st = nd_permute(mem, swap, 4, &o);
    nd_release(mem);
    if (st == ND_OK && wants) st = nd_empty_on(nd_get_device(q), q->shape, 3, q->dtype, &lse);
    /* With dropout the backward reads the forward's keeps, a byte a weight
     * (a quarter of the scores the composition kept): drawing them again
     * costs about 2 ns a weight on a CPU, half the time of the backward of
     * BERT-base's attention at sequence 128 */
    const int64_t keep_shape[4] = {q->shape[0], q->shape[1], L, S};
    if (st == ND_OK && wants && dropout_p > 0)
        st = nd_empty_on(nd_get_device(q), keep_shape, 4, ND_BOOL, &keep);
    /* (a captured forward's replays take fresh counters, backend_call.c;
     * its backward's replays read the keeps, so both are recorded) */
    if (st == ND_OK)
        st = ND_BACKEND_CALL(nd_backend_of(q), attention, op, o, lse, keep, qc, kc, vc, mask, &a);
    nd_release(qc);
    nd_release(kc);
    nd_release(vc);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && wants) {
        nd_node *n = NULL;
        const nd_tensor *in[4] = {q, k, v, mask};
        st = nd_record(ND_OP_attention, bw_attention, o, 4, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = causal;
            n->iparams[2] = (int64_t)a.seed;
            n->iparams[3] = (int64_t)a.offset;
            n->fparams[0] = scale;
            n->fparams[1] = dropout_p;
            st = nd_save(n, q, false);                       /* SAVED_Q */
            if (st == ND_OK) st = nd_save(n, k, false);      /* SAVED_K */
            if (st == ND_OK) st = nd_save(n, v, false);      /* SAVED_V */
            if (st == ND_OK) st = nd_save(n, o, true);       /* SAVED_OUT */
            if (st == ND_OK) st = nd_save(n, lse, false);    /* SAVED_LSE */
            int next = SAVED_FIXED;
            n->iparams[4] = mask ? next++ : -1;
            if (st == ND_OK && mask) st = nd_save(n, mask, false);
            n->iparams[5] = keep ? next++ : -1;
            if (st == ND_OK && keep) st = nd_save(n, keep, false);
        }
    }
    nd_release(lse);
    nd_release(keep);
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}
