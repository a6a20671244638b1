/* op_optim.c - fused optimizer updates (needle.h, "optimizer updates":
 * SGD's and Adam's):
 * checks and dispatch; the kernels are the backends' (cpu_optim.c).
 * Anything the fused kernel does not cover answers *done = false, and
 * nd.optim composes the same update from tensor ops. */
#include "backend_call.h"

static bool same_layout(const nd_tensor *a, const nd_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || !nd_same_device(a, b)) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return nd_is_contiguous(b);
}

nd_status nd_sgd_step_(nd_tensor *p, const nd_tensor *grad, nd_tensor *buf, const nd_sgd_hyper *h,
                       bool first, bool *done) {
    *done = false;
    if (!p || !grad || !h) return nd_fail(ND_ERR_ARG, "sgd_step_: p, grad and the hyperparameters are required");
    if ((h->momentum != 0) != (buf != NULL))
        return nd_fail(ND_ERR_ARG, "sgd_step_: a momentum buffer goes with momentum != 0 (momentum %g, %s)",
                       h->momentum, buf ? "a buffer given" : "no buffer");
    ND_TRY(nd_check_inplace_grad("sgd_step_", p));
    const nd_backend *be = nd_backend_of(p);
    if (!be->sgd_step || (p->dtype != ND_FLOAT32 && p->dtype != ND_FLOAT64) || !nd_is_contiguous(p) ||
        !same_layout(p, grad) || (buf && !same_layout(p, buf)))
        return ND_OK;
    /* elements are read before they are written at the same index, so only
     * a partial overlap between the three could change the result */
    if (grad->storage == p->storage || (buf && (buf->storage == p->storage || buf->storage == grad->storage)))
        return ND_OK;
    ND_TRY(ND_BACKEND_CALL(be, sgd_step, "sgd_step_", p, grad, buf, h, first));
    nd_bump_version(p);
    if (buf) nd_bump_version(buf);
    *done = true;
    return ND_OK;
}

nd_status nd_amp_unscale_(nd_tensor *g, double inv, bool *found_inf, bool *done) {
    *done = false;
    if (!g || !found_inf) return nd_fail(ND_ERR_ARG, "amp_unscale_: a gradient and a found_inf flag are required");
    ND_TRY(nd_check_inplace_grad("amp_unscale_", g));
    const nd_backend *be = nd_backend_of(g);
    /* (a capture could not replay the flag: the scaler's unscale_ is a graph break) */
    if (!be->amp_unscale || nd_graph_capturing() || (g->dtype != ND_FLOAT32 && g->dtype != ND_FLOAT64) ||
        !nd_is_contiguous(g))
        return ND_OK;
    ND_TRY(ND_BACKEND_CALL(be, amp_unscale, "amp_unscale_", g, inv, found_inf));
    nd_bump_version(g);
    *done = true;
    return ND_OK;
}

nd_status nd_adam_step_(nd_tensor *p, const nd_tensor *grad, nd_tensor *m, nd_tensor *v,
                        const nd_adam_hyper *h, bool *done) {
    *done = false;
    if (!p || !grad || !m || !v || !h)
        return nd_fail(ND_ERR_ARG, "adam_step_: p, grad, exp_avg, exp_avg_sq and the hyperparameters are required");
    ND_TRY(nd_check_inplace_grad("adam_step_", p));
    const nd_backend *be = nd_backend_of(p);
    if (!be->adam_step || nd_graph_capturing() || (p->dtype != ND_FLOAT32 && p->dtype != ND_FLOAT64) ||
        !nd_is_contiguous(p) || !same_layout(p, grad) || !same_layout(p, m) || !same_layout(p, v))
        return ND_OK;
    /* each element is read before it is written at its index, so only
     * tensors sharing memory could change the result */
    const nd_storage *s[4] = {p->storage, grad->storage, m->storage, v->storage};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (s[i] == s[j]) return ND_OK;
    ND_TRY(ND_BACKEND_CALL(be, adam_step, "adam_step_", p, grad, m, v, h));
    nd_bump_version(p);
    nd_bump_version(m);
    nd_bump_version(v);
    *done = true;
    return ND_OK;
}
