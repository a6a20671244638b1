/* op_attention.c - attention: softmax(scale * q k^T + mask) v as one
 * backend kernel (backend.h), for F.scaled_dot_product_attention when no
 * gradient is wanted. It records no autograd node: asked for one it fails,
 * and the Lua side composes the differentiable ops instead. */
#include "autograd.h"
#include "backend_call.h"

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
    if (nd_grad_enabled() && (q->requires_grad || k->requires_grad || v->requires_grad ||
                              (mask && mask->requires_grad)))
        return nd_fail(ND_ERR_ARG, "%s: has no gradient (an input requires grad); "
                       "F.scaled_dot_product_attention composes differentiable ops then", op);
    return ND_OK;
}

/* t itself when its rows are unit-stride (split heads are such views of
 * the projections: copying them had cost a sixth of the kernel), else a
 * contiguous copy */
static nd_status rows_unit(const nd_tensor *t, nd_tensor **out) {
    if (t->strides[3] == 1 || t->shape[3] <= 1) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    return nd_contiguous(t, out);
}

nd_status nd_attention(const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                       const nd_tensor *mask, double scale, bool causal, nd_tensor **out) {
    const char *op = "attention";
    *out = NULL;
    ND_TRY(check_args(op, q, k, v, mask));
    nd_tensor *qc = NULL, *kc = NULL, *vc = NULL, *o = NULL;
    nd_status st = rows_unit(q, &qc);
    if (st == ND_OK) st = rows_unit(k, &kc);
    if (st == ND_OK) st = rows_unit(v, &vc);
    /* out (B1, B2, L, Ev) as a view of (B1, L, B2, Ev) memory: merging the
     * heads back, (N, H, L, D) -> (N, L, H * D), is then a view, not a copy
     * (PyTorch's fused kernels return this layout too) */
    const int64_t mem_shape[4] = {q->shape[0], q->shape[2], q->shape[1], v->shape[3]};
    const int swap[4] = {0, 2, 1, 3};
    nd_tensor *mem = NULL;
    if (st == ND_OK) st = nd_empty_on(nd_get_device(q), mem_shape, 4, q->dtype, &mem);
    if (st == ND_OK) st = nd_permute(mem, swap, 4, &o);
    nd_release(mem);
    if (st == ND_OK)
        st = ND_BACKEND_CALL(nd_backend_of(q), attention, op, o, qc, kc, vc, mask, scale, causal);
    nd_release(qc);
    nd_release(kc);
    nd_release(vc);
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}
