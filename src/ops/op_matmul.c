/* op_matmul.c - matmul with PyTorch's rules: 1-D operands are promoted to
 * matrices and the added dim removed again, batch dims broadcast. */
#include "backend.h"
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
    if (c == ND_FLOAT16 || c == ND_BFLOAT16) c = ND_FLOAT32;
    if (c == ND_BOOL) c = ND_INT64;
    nd_tensor *ac = NULL, *bc = NULL, *av = NULL, *bv = NULL, *ae = NULL, *bex = NULL, *r = NULL;
    nd_status st = nd_as_dtype(a, c, &ac);
    if (st == ND_OK) st = nd_as_dtype(b, c, &bc);
    if (st == ND_OK) st = nd_reshape(ac, as, an, &av);
    if (st == ND_OK) st = nd_reshape(bc, bs, bn, &bv);
    if (st == ND_OK) st = nd_expand(av, ash, nb + 2, &ae);
    if (st == ND_OK) st = nd_expand(bv, bsh, nb + 2, &bex);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(a), osh, nb + 2, c, &r);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(a);
        st = ND_BACKEND_CALL(be, matmul, "matmul", r, ae, bex);
    }
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
