/* op_matmul.c - matmul with PyTorch's rules: 1-D operands are promoted to
 * matrices and the added dim removed again, batch dims broadcast; and its
 * backward. */
#include <string.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

static nd_status matmul_forward(const nd_tensor *a, const nd_tensor *b, nd_tensor **out) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    ND_TRY(nd_check_same_device("matmul", a, b));
    if (a->ndim == 0 || b->ndim == 0)
        return nd_fail(ND_ERR_SHAPE, "matmul: both arguments need at least 1 dim, got shapes %s and %s",
                       nd_shape_str(a->shape, a->ndim, b1), nd_shape_str(b->shape, b->ndim, b2));
    /* View both as (batch..., rows, cols). */
    int64_t as[ND_MAX_DIMS] = {0}, bs[ND_MAX_DIMS] = {0};
    int an = a->ndim, bn = b->ndim;
    for (int i = 0; i < an; i++) as[i] = a->shape[i];
    for (int i = 0; i < bn; i++) bs[i] = b->shape[i];
    bool a_vec = an == 1, b_vec = bn == 1;
    if (a_vec) { as[1] = as[0]; as[0] = 1; an = 2; }
    if (b_vec) { bs[1] = 1; bn = 2; }
    int64_t K = as[an - 1];
    if (bs[bn - 2] != K)
        return nd_fail(ND_ERR_SHAPE, "matmul: shapes %s and %s do not match (%lld ~= %lld)",
                       nd_shape_str(a->shape, a->ndim, b1), nd_shape_str(b->shape, b->ndim, b2),
                       (long long)K, (long long)bs[bn - 2]);
    int64_t batch[ND_MAX_DIMS];
    int nb;
    nd_status bst = nd_broadcast_shape("matmul", as, an - 2, bs, bn - 2, batch, &nb);
    if (bst != ND_OK && bst != ND_ERR_SHAPE) return bst; /* too large: its own message */
    if (bst != ND_OK)
        return nd_fail(ND_ERR_SHAPE, "matmul: batch dims of shapes %s and %s cannot be broadcast",
                       nd_shape_str(a->shape, a->ndim, b1), nd_shape_str(b->shape, b->ndim, b2));
    if (nb + 2 > ND_MAX_DIMS) return nd_fail(ND_ERR_SHAPE, "matmul: too many dims");
    int64_t ash[ND_MAX_DIMS], bsh[ND_MAX_DIMS], osh[ND_MAX_DIMS];
    for (int i = 0; i < nb; i++) ash[i] = bsh[i] = osh[i] = batch[i];
    ash[nb] = as[an - 2]; ash[nb + 1] = K;
    bsh[nb] = K; bsh[nb + 1] = bs[bn - 1];
    osh[nb] = as[an - 2]; osh[nb + 1] = bs[bn - 1];
    /* the expanded operands and the result, each under the size rule */
    ND_TRY(nd_check_shape("matmul", ash, nb + 2, NULL));
    ND_TRY(nd_check_shape("matmul", bsh, nb + 2, NULL));
    ND_TRY(nd_check_shape("matmul", osh, nb + 2, NULL));

    nd_dtype c = nd_promote(a->dtype, b->dtype);
    if (nd_dtype_is_half(c)) c = ND_FLOAT32;
    if (c == ND_BOOL) c = ND_INT64;
    /* half operands of a float32 product stay as they are where the backend
     * reads them so (no conversion pass, half the bytes read) */
    const nd_backend *be = nd_backend_of(a);
    bool keep_half = c == ND_FLOAT32 && be->matmul_reads_half;
    nd_tensor *ac = NULL, *bc = NULL, *av = NULL, *bv = NULL, *ae = NULL, *bex = NULL, *r = NULL;
    nd_status st = nd_as_dtype(a, keep_half && nd_dtype_is_half(a->dtype) ? a->dtype : c, &ac);
    if (st == ND_OK) st = nd_as_dtype(b, keep_half && nd_dtype_is_half(b->dtype) ? b->dtype : c, &bc);
    if (st == ND_OK) st = nd_reshape(ac, as, an, &av);
    if (st == ND_OK) st = nd_reshape(bc, bs, bn, &bv);
    if (st == ND_OK) st = nd_expand(av, ash, nb + 2, &ae);
    if (st == ND_OK) st = nd_expand(bv, bsh, nb + 2, &bex);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(a), osh, nb + 2, c, &r);
    if (st == ND_OK) st = ND_BACKEND_CALL(be, matmul, "matmul", r, ae, bex);
    nd_release(ac); nd_release(bc); nd_release(av); nd_release(bv); nd_release(ae); nd_release(bex);
    if (st != ND_OK) { nd_release(r); return st; }
    if (!a_vec && !b_vec) { *out = r; return ND_OK; }
    /* drop the dims that 1-D operands added */
    int64_t fs[ND_MAX_DIMS];
    int fn = 0;
    for (int i = 0; i < nb; i++) fs[fn++] = batch[i];
    if (!a_vec) fs[fn++] = osh[nb];
    if (!b_vec) fs[fn++] = osh[nb + 1];
    st = nd_view(r, fs, fn, out);
    nd_release(r);
    return st;
}

nd_status nd_matmul(const nd_tensor *a, const nd_tensor *b, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(matmul_forward(a, b, out), nd_record_matmul(a, b, *out), out);
}

/* ------------------------------------------------------------ matmul */

static nd_status bw_matmul(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
    if (c.st != ND_OK || !a || !b) return gx_end(&c);
    /* 1-D operands as a row / a column, and g with those dims put back */
    bool a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    int64_t as[ND_MAX_DIMS], bs[ND_MAX_DIMS], gs[ND_MAX_DIMS];
    int an = a->ndim, bn = b->ndim, gn = 0;
    memcpy(as, a->shape, sizeof as);
    memcpy(bs, b->shape, sizeof bs);
    if (a_vec) { as[1] = as[0]; as[0] = 1; an = 2; }
    if (b_vec) { bs[1] = 1; bn = 2; }
    int nb = g->ndim - !a_vec - !b_vec;
    for (int i = 0; i < nb; i++) gs[gn++] = g->shape[i];
    gs[gn++] = as[an - 2];
    gs[gn++] = bs[bn - 1];
    nd_tensor *a2 = gx_reshape(&c, a, as, an), *b2 = gx_reshape(&c, b, bs, bn);
    nd_tensor *g2 = gx_reshape(&c, g, gs, gn);
    if (n->needs_grad[0] && c.st == ND_OK) { /* g b^T, summed over broadcast batch dims */
        nd_tensor *bt = NULL, *r = NULL;
        bt = gx_own(&c, nd_transpose(b2, -1, -2, &bt), &bt);
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(g2, bt, &r), &r);
        nd_tensor *rs = NULL;
        if (c.st == ND_OK) rs = gx_own(&c, nd_sum_to_shape(r, as, an, &rs), &rs);
        grads[0] = gx_out(&c, gx_reshape(&c, rs, n->in_shape[0], n->in_ndim[0]));
    }
    if (n->needs_grad[1] && c.st == ND_OK) { /* a^T g */
        nd_tensor *at = NULL, *r = NULL;
        at = gx_own(&c, nd_transpose(a2, -1, -2, &at), &at);
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(at, g2, &r), &r);
        nd_tensor *rs = NULL;
        if (c.st == ND_OK) rs = gx_own(&c, nd_sum_to_shape(r, bs, bn, &rs), &rs);
        grads[1] = gx_out(&c, gx_reshape(&c, rs, n->in_shape[1], n->in_ndim[1]));
    }
    return gx_end(&c);
}

nd_status nd_record_matmul(const nd_tensor *a, const nd_tensor *b, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[2] = {a, b};
    ND_TRY(nd_record(ND_OP_matmul, bw_matmul, out, 2, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_save(n, a, false));
    return nd_save(n, b, false);
}
