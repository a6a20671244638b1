/* broadcast.c - shape broadcasting and the "give me t as X" helpers that
 * every op uses to line its operands up before calling a kernel. */
#include "autograd.h"
#include "backend_call.h"

nd_status nd_broadcast_shape(const char *op, const int64_t *a, int na, const int64_t *b, int nb,
                             int64_t *out, int *nout) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da == db || db == 1) out[i] = da;
        else if (da == 1) out[i] = db;
        else {
            char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
            return nd_fail(ND_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast (dim %d: "
                           "%lld vs %lld)", op, nd_shape_str(a, na, b1), nd_shape_str(b, nb, b2),
                           i - n, (long long)da, (long long)db);
        }
    }
    *nout = n;
    /* two shapes within the size rule can broadcast to one beyond it
     * ({2^40, 1} and {1, 2^40}): refused here, before any op multiplies */
    return nd_check_shape(op, out, n, NULL);
}

nd_status nd_expand_to(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    return nd_expand(t, shape, ndim, out);
}

nd_status nd_as_dtype(const nd_tensor *t, nd_dtype dt, nd_tensor **out) {
    return nd_to_dtype(t, dt, out); /* already returns t itself when dt matches */
}

nd_status nd_check_writable(const char *op, const nd_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->strides[i] == 0 && t->shape[i] > 1) {
            char b[ND_SHAPE_BUF];
            return nd_fail(ND_ERR_ARG, "%s: cannot write in place into an expanded tensor (shape "
                           "%s, dim " ND_IXF " has stride 0); clone() it first", op,
                           nd_shape_str(t->shape, t->ndim, b), ND_IX(i));
        }
    return ND_OK;
}

nd_status nd_check_inplace_grad(const char *op, const nd_tensor *t) {
    if (!t->requires_grad || !nd_grad_enabled()) return ND_OK;
    return nd_fail(ND_ERR_ARG, "%s: in-place operation on a tensor that requires grad (%s); "
                   "use the out-of-place form, or run it under no_grad", op,
                   t->grad_fn ? "its gradient graph would be wrong" : "a leaf");
}
