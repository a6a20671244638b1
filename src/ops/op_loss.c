/* op_loss.c - fused cross_entropy: checks, forward and backward.
 *
 * The forward is a single fused kernel (one loss per row, then the
 * reduction). The backward is written by hand (the closed form, not the
 * composite's graph) with differentiable ops, so it is also fast and still
 * has second derivatives:
 *
 *   cross_entropy: dlogits = (softmax(logits) - target) * row_weight
 *
 * With create_graph the same formula is built from differentiable ops (the
 * target is a constant); without it one fused backend pass computes it. */
#include <string.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

/* Every label in range: iv = {classes, ignore, expected kept (-1: any,
 * -2: learn it), kept}. A host check (backend_call.h): a compiled call runs
 * it again on each batch's labels, and, when the mean divides by the count
 * of rows kept, also refuses a batch whose count differs from the captured
 * one (the divisor is part of the recorded kernels). */
static nd_status ce_check_labels(const char *op, nd_tensor *const *t, int64_t *iv) {
    const nd_tensor *labels = t[0];
    int64_t c = iv[0], ignore = iv[1];
    nd_tensor *host;
    ND_TRY(nd_to_host(labels, &host));
    int64_t n = labels->shape[0], kept = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const char *)nd_ptr(host) + i * host->strides[0] * 8, 8);
        kept += v != ignore;
        if (v != ignore && (v < 0 || v >= c)) {
            nd_release(host);
            return nd_fail(ND_ERR_INDEX, "%s: label " ND_IXF " of row " ND_IXF " is out "
                           "of range for %lld classes (expected " ND_IXF ".." ND_IXF ")", op, ND_IX(v),
                           ND_IX(i), (long long)c, ND_IX(0), ND_IX(c - 1));
        }
    }
    nd_release(host);
    if (iv[2] >= 0 && kept != iv[2])
        return nd_fail(ND_ERR_UNSUPPORTED, "%s: this batch has %lld rows not equal to ignore_index "
                       "where the compiled call was captured with %lld (the mean divides by that "
                       "count): use reduction 'sum' and divide outside, or keep the count fixed",
                       op, (long long)kept, (long long)iv[2]);
    if (iv[2] == -2) iv[2] = kept;
    iv[3] = kept;
    return ND_OK;
}

/* Checks the arguments and every label; *kept counts the rows not ignored
 * (the mean's divisor), from the same single read of the labels. */
static nd_status ce_check(const nd_tensor *logits, const nd_tensor *labels, int64_t ignore,
                          double smoothing, int reduction, int64_t *kept) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (logits->ndim != 2 || (logits->dtype != ND_FLOAT32 && logits->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_SHAPE, "cross_entropy: expected float32/float64 logits of shape "
                       "(N, C), got %s %s", nd_dtype_name(logits->dtype),
                       nd_shape_str(logits->shape, logits->ndim, b1));
    if (labels->dtype != ND_INT64 || labels->ndim != 1 || labels->shape[0] != logits->shape[0])
        return nd_fail(ND_ERR_SHAPE, "cross_entropy: expected %lld int64 labels (one per row of "
                       "logits %s), got %s %s", (long long)logits->shape[0],
                       nd_shape_str(logits->shape, 2, b1), nd_dtype_name(labels->dtype),
                       nd_shape_str(labels->shape, labels->ndim, b2));
    if (!(smoothing >= 0 && smoothing <= 1))
        return nd_fail(ND_ERR_ARG, "cross_entropy: label_smoothing must be in [0, 1], got %g", smoothing);
    if (reduction < 0 || reduction > 2)
        return nd_fail(ND_ERR_ARG, "cross_entropy: invalid reduction %d", reduction);
    ND_TRY(nd_check_same_device("cross_entropy", logits, labels));
    /* Labels are read on the host (a device copies them over: N values). */
    nd_tensor *t[1] = {(nd_tensor *)labels};
    int64_t iv[4] = {logits->shape[1], ignore, reduction == 1 ? -2 : -1, 0};
    ND_TRY(nd_host_check("cross_entropy", ce_check_labels, t, 1, iv, 4));
    *kept = iv[3];
    return ND_OK;
}

static nd_status bw_cross_entropy(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *logits = gx_saved(&c, n, 0), *labels = gx_saved(&c, n, 1);
    if (c.st != ND_OK || !logits || !labels) return gx_end(&c);
    int64_t ignore = n->iparams[0], reduction = n->iparams[1], N = logits->shape[0], C = logits->shape[1];
    double eps = n->fparams[0], kept = n->fparams[1];
    /* row weights (N): g per row (none), g (sum), g / kept (mean); 0 for
     * ignored rows. Small, and differentiable in g. */
    bool grad_on = nd_set_grad_enabled(false);
    nd_tensor *keep = gx_to(&c, gx_sc(&c, ND_BINARY_ne, labels, (double)ignore, 0), logits->dtype);
    nd_set_grad_enabled(grad_on);
    nd_tensor *w = reduction == 1 ? gx_bin(&c, ND_BINARY_mul, keep, gx_sc(&c, ND_BINARY_div, g, kept > 0 ? kept : 1, 0))
                                  : gx_bin(&c, ND_BINARY_mul, keep, g);
    if (!nd_grad_enabled() && c.st == ND_OK) { /* one fused pass over the logits */
        nd_tensor *lc = NULL, *wc = NULL, *d = NULL;
        nd_status st = nd_contiguous(logits, &lc);
        if (st == ND_OK) st = nd_contiguous(w, &wc);
        if (st == ND_OK) st = nd_empty_on(nd_get_device(logits), logits->shape, 2, logits->dtype, &d);
        if (st == ND_OK) {
            const nd_backend *be = nd_backend_of(logits);
            st = ND_BACKEND_CALL(be, cross_entropy_backward, "cross_entropy", d, lc, labels, wc,
                                 ignore, eps);
        }
        nd_release(lc); nd_release(wc);
        if (st != ND_OK) { nd_release(d); d = NULL; c.st = st; }
        grads[0] = d;
        return gx_end(&c);
    }
    /* create_graph: the same formula with differentiable ops; the target is a constant */
    grad_on = nd_set_grad_enabled(false);
    nd_tensor *valid = gx_where(&c, gx_sc(&c, ND_BINARY_eq, labels, (double)ignore, 0),
                                gx_zeros(&c, labels, NULL, 0, ND_INT64), labels);
    nd_tensor *oh = NULL;
    if (c.st == ND_OK) oh = gx_own(&c, nd_one_hot(valid, C, &oh), &oh);
    nd_tensor *target = gx_sc(&c, ND_BINARY_add, gx_sc(&c, ND_BINARY_mul, gx_to(&c, oh, logits->dtype), 1 - eps, 0), eps / (double)C, 0);
    nd_set_grad_enabled(grad_on);
    int64_t col[2] = {N, 1};
    nd_tensor *p = NULL;
    if (c.st == ND_OK) p = gx_own(&c, nd_softmax(logits, 1, &p), &p);
    nd_tensor *d = gx_bin(&c, ND_BINARY_sub, p, target);
    grads[0] = gx_out(&c, gx_bin(&c, ND_BINARY_mul, d, gx_reshape(&c, w, col, 2)));
    return gx_end(&c);
}

nd_status nd_cross_entropy(const nd_tensor *logits, const nd_tensor *labels, int64_t ignore_index,
                           double label_smoothing, int reduction, nd_tensor **out) {
    int64_t kept = 0;
    ND_TRY(ce_check(logits, labels, ignore_index, label_smoothing, reduction, &kept));
    bool grad_on = nd_set_grad_enabled(false);
    nd_tensor *lc = NULL, *yc = NULL, *rows = NULL;
    int64_t N = logits->shape[0];
    nd_status st = nd_contiguous(logits, &lc);
    if (st == ND_OK) st = nd_contiguous(labels, &yc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(logits), &N, 1, logits->dtype, &rows);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(logits);
        st = ND_BACKEND_CALL(be, cross_entropy, "cross_entropy", rows, lc, yc, ignore_index,
                             label_smoothing);
    }
    if (st == ND_OK) {
        if (reduction == 0) { *out = rows; rows = NULL; }
        else {
            nd_tensor *s;
            st = nd_reduce(ND_REDUCE_sum, rows, NULL, 0, 0, 0, &s);
            if (st == ND_OK && reduction == 1) { /* mean over rows not ignored (nan if none) */
                st = nd_binary_scalar(ND_BINARY_div, s, (double)kept, 0, out);
                nd_release(s);
            } else if (st == ND_OK) {
                *out = s;
            }
        }
    }
    nd_release(rows);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on) {
        nd_node *n;
        const nd_tensor *in[1] = {logits};
        st = nd_record(ND_OP_cross_entropy, bw_cross_entropy, *out, 1, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = ignore_index;
            n->iparams[1] = reduction;
            n->fparams[0] = label_smoothing;
            n->fparams[1] = (double)kept;
            /* the caller's logits (not the contiguous copy): the softmax in the
             * backward must connect to them for second derivatives */
            st = nd_save(n, logits, false);
            if (st == ND_OK) st = nd_save(n, yc, false);
        }
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(lc);
    nd_release(yc);
    return st;
}
