/* op_rnn_gru_layer.c - one direction of one nn.GRU layer over a whole
 * sequence as one op (needle.h's nd_gru_layer), as op_rnn_layer.c does for
 * the LSTM: the state's product (linear_fused with the bias; where a
 * backend has no linear_fused, the bias copied in and the product added,
 * matmul_acc) and the cell's kernels (gru_cell, gru_cell_backward).
 *
 *   hw_t = h_{t-1} W_hh^T + b_hh,  h_t = gru_cell(xw_t, hw_t, h_{t-1})
 *     (the composed steps' values bit for bit)           out = [h_1 .. h_T]
 *
 * Backward, steps in reverse, from G = out's gradient: dh_t = G_t + the
 * next step's direct part (its cell's dh, which that cell adds into G_t's
 * copy) + dhw_{t+1} W_hh (linear_fused with that sum as its residual,
 * against W_hh^T copied contiguous once; without linear_fused matmul_acc
 * into the sum),
 * then the cell's backward gives dxw_t, dhw_t and the direct part of
 * dh_{t-1};
 *   dW_hh = dhw_1^T h_0 + sum_{t>1} dhw_t^T h_{t-1};  db_hh = the sum of dhw;
 *   dh_0 = the first step's direct part + dhw_1 W_hh.
 * Two backend calls a step backward, as the LSTM's. Under create_graph the
 * backward recomputes the steps from differentiable ops and composes the
 * cell's formulas. */
#include "backend_call.h"
#include "op_rnn.h"

static const char *OP = "gru_layer";

/* saved: the inputs (xw for the cell's backward and a create_graph one;
 * SV_B only with a bias: iparams[1]), each step's hw and the result */
enum { SV_XW, SV_W, SV_H0, SV_HW, SV_OUT, SV_B };
/* the inputs, in grads[] order */
enum { IN_XW, IN_W, IN_B, IN_H0 };

static nd_status check_args(const nd_tensor *xw, const nd_tensor *w, const nd_tensor *b, const nd_tensor *h0) {
    char s1[ND_SHAPE_BUF], s2[ND_SHAPE_BUF], s3[ND_SHAPE_BUF], s4[ND_SHAPE_BUF];
    bool ok = xw->ndim == 3 && w->ndim == 2 && h0->ndim == 2 && (!b || b->ndim == 1);
    if (ok) {
        const int64_t T = xw->shape[0], B = xw->shape[1], H = w->shape[1];
        ok = T > 0 && B > 0 && H > 0 && xw->shape[2] == 3 * H && w->shape[0] == 3 * H &&
             (!b || b->shape[0] == 3 * H) && h0->shape[0] == B && h0->shape[1] == H;
    }
    if (!ok)
        return nd_fail(ND_ERR_SHAPE, "%s: expected the input's products (T, B, 3H) with T, B, H > 0, w_hh (3H, H), "
                       "b_hh (3H) or none and h0 (B, H), got %s, %s, %s and %s", OP,
                       nd_shape_str(xw->shape, xw->ndim, s1), nd_shape_str(w->shape, w->ndim, s2),
                       b ? nd_shape_str(b->shape, b->ndim, s3) : "none", nd_shape_str(h0->shape, h0->ndim, s4));
    const nd_tensor *all[4] = {xw, w, b, h0};
    for (int k = 1; k < 4; k++)
        if (all[k]) ND_TRY(nd_check_same_device(OP, xw, all[k]));
    bool same = xw->dtype == ND_FLOAT32 || xw->dtype == ND_FLOAT64;
    for (int k = 1; k < 4; k++) same = same && (!all[k] || all[k]->dtype == xw->dtype);
    if (!same)
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 products, weight, bias and state of one "
                       "dtype, got %s, %s, %s and %s", OP, nd_dtype_name(xw->dtype), nd_dtype_name(w->dtype),
                       b ? nd_dtype_name(b->dtype) : "none", nd_dtype_name(h0->dtype));
    return ND_OK;
}

/* The steps: hw (T, B, 3H; one step without a graph and with
 * linear_fused) gets each step's product, out (T, B, H) the h's. xw has
 * unit-stride rows, h0 is contiguous, w and b contiguous. */
static nd_status run_forward(const nd_rnn_dims *d, bool fused, const nd_tensor *xw, const nd_tensor *w,
                             const nd_tensor *b, const nd_tensor *h0, nd_tensor *hw, nd_tensor *out) {
    const nd_backend *be = nd_backend_of(xw);
    const int64_t T = d->T, B = d->B, H = d->H;
    nd_tensor *wt = NULL, *bx = NULL;
    nd_status st = ND_OK;
    if (!fused) { /* hw = b_hh, then each step's product added */
        const int64_t wts[2] = {H, 3 * H}, wtst[2] = {w->strides[1], w->strides[0]};
        st = nd_rnn_view(w, 2, wts, wtst, 0, &wt);
        if (st == ND_OK && b) {
            const int64_t bs[3] = {T, B, 3 * H}, bst[3] = {0, 0, b->strides[0]};
            st = nd_rnn_view(b, 3, bs, bst, 0, &bx);
            if (st == ND_OK) st = nd_call_copy(be, OP, hw, bx);
        }
    }
    for (int64_t s = 0; s < T && st == ND_OK; s++) {
        const int64_t t = nd_rnn_time(d, s);
        nd_tensor *p = NULL, *x = NULL, *hp = NULL, *h = NULL;
        st = nd_rnn_rows(hw, nd_rnn_slot(d, hw->shape[0], s), 0, 3 * H, &p);
        if (st == ND_OK) st = nd_rnn_rows(xw, t, 0, 3 * H, &x);
        if (st == ND_OK) st = nd_rnn_rows(out, t, 0, H, &h);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(out, nd_rnn_time(d, s - 1), 0, H, &hp);
        const nd_tensor *prev = s > 0 ? hp : h0;
        if (st == ND_OK)
            st = fused ? nd_call_linear_fused(be, OP, p, prev, w, b, ND_ACT_NONE)
                 : b   ? nd_call_matmul_acc(be, OP, p, prev, wt)
                       : nd_call_matmul(be, OP, p, prev, wt);
        if (st == ND_OK) st = nd_call_gru_cell(be, OP, h, x, p, prev);
        nd_release(p), nd_release(x), nd_release(hp), nd_release(h);
    }
    nd_release(wt), nd_release(bx);
    return st;
}

/* the fused backward: the steps back with the cell's kernel (header) */
static nd_status bw_gru_layer_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *w = NULL, *h0 = NULL, *xw = NULL, *hw = NULL, *out = NULL;
    nd_status st = nd_saved(n, SV_W, &w);
    if (st == ND_OK) st = nd_rnn_saved_rows(n, SV_H0, &h0);
    if (st == ND_OK) st = nd_rnn_saved_rows(n, SV_XW, &xw);
    if (st == ND_OK) st = nd_saved(n, SV_HW, &hw);
    if (st == ND_OK) st = nd_saved(n, SV_OUT, &out);
    if (st != ND_OK) {
        nd_release(w), nd_release(h0), nd_release(xw), nd_release(hw), nd_release(out);
        return st;
    }
    const nd_rnn_dims d = {out->shape[0], out->shape[1], out->shape[2], n->iparams[0] != 0};
    const int64_t T = d.T, B = d.B, H = d.H;
    const nd_backend *be = nd_backend_of(out);
    const nd_device dev = nd_get_device(out);
    const nd_dtype dt = out->dtype;
    /* gh (T, B, H) starts as G; step s's cell adds its direct part of
     * dh_{s-1} into row s - 1 (dh_add), so a step's state gradient is row
     * t plus dhw_{t+1} W_hh: by linear_fused (op_rnn.h's
     * nd_rnn_grad_by_linear: the CPU) one call into the slot sg against wt =
     * W_hh^T made contiguous once, else matmul_acc into the row itself. Two
     * backend calls a step. */
    const bool fused = nd_rnn_grad_by_linear(be);
    nd_tensor *gh = NULL, *dx = NULL, *dhw = NULL, *dh0 = NULL, *v = NULL, *wt = NULL, *sg = NULL;
    const int64_t hs[3] = {T, B, H}, xs[3] = {T, B, 3 * H};
    const int64_t gst[3] = {g->strides[0], g->strides[1], g->strides[2]};
    st = nd_empty_on(dev, hs, 3, dt, &gh);
    if (st == ND_OK && n->needs_grad[IN_XW]) st = nd_empty_on(dev, xs, 3, dt, &dx);
    if (st == ND_OK) st = nd_empty_on(dev, xs, 3, dt, &dhw);
    if (st == ND_OK) st = nd_empty_on(dev, h0->shape, 2, dt, &dh0);
    if (st == ND_OK) st = nd_rnn_view(g, 3, hs, gst, 0, &v);
    if (st == ND_OK) st = nd_call_copy(be, OP, gh, v);
    nd_release(v);
    v = NULL;
    if (st == ND_OK && fused) {
        const int64_t wts[2] = {H, 3 * H}, wtst[2] = {w->strides[1], w->strides[0]};
        st = nd_rnn_view(w, 2, wts, wtst, 0, &v);
        if (st == ND_OK) st = nd_empty_on(dev, wts, 2, dt, &wt);
        if (st == ND_OK) st = nd_call_copy(be, OP, wt, v);
        if (st == ND_OK) st = nd_empty_on(dev, h0->shape, 2, dt, &sg);
        nd_release(v);
    }
    for (int64_t s = T - 1; s >= 0 && st == ND_OK; s--) {
        const int64_t t = nd_rnn_time(&d, s);
        nd_tensor *gt = NULL, *dhn = NULL, *dxt = NULL, *dht = NULL, *before = NULL, *xt = NULL;
        nd_tensor *ht = NULL, *hp = NULL;
        st = nd_rnn_rows(gh, t, 0, H, &gt);
        const nd_tensor *dh = gt; /* dh_t: G_t, the next step's direct part and its product */
        if (st == ND_OK && s < T - 1) {
            st = nd_rnn_rows(dhw, nd_rnn_time(&d, s + 1), 0, 3 * H, &dhn);
            if (st == ND_OK && fused) st = nd_call_linear_fused_res(be, OP, sg, dhn, wt, NULL, ND_ACT_NONE, gt);
            else if (st == ND_OK) st = nd_call_matmul_acc(be, OP, gt, dhn, w);
            if (fused) dh = sg;
        }
        if (st == ND_OK && dx) st = nd_rnn_rows(dx, t, 0, 3 * H, &dxt);
        if (st == ND_OK) st = nd_rnn_rows(dhw, t, 0, 3 * H, &dht);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(gh, nd_rnn_time(&d, s - 1), 0, H, &before);
        if (st == ND_OK) st = nd_rnn_rows(xw, t, 0, 3 * H, &xt);
        if (st == ND_OK) st = nd_rnn_rows(hw, t, 0, 3 * H, &ht);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(out, nd_rnn_time(&d, s - 1), 0, H, &hp);
        if (st == ND_OK)
            st = nd_call_gru_cell_backward(be, OP, dxt, dht, s > 0 ? before : dh0, dh, xt, ht, s > 0 ? hp : h0,
                                           s > 0);
        nd_release(gt), nd_release(dhn), nd_release(dxt), nd_release(dht), nd_release(before);
        nd_release(xt), nd_release(ht), nd_release(hp);
    }
    nd_tensor *dw = NULL, *db = NULL, *first = NULL;
    if (st == ND_OK) st = nd_rnn_rows(dhw, nd_rnn_time(&d, 0), 0, 3 * H, &first);
    if (st == ND_OK)
        st = nd_rnn_weight_grads(be, OP, &d, dhw, h0, out, n->needs_grad[IN_W], n->needs_grad[IN_B], &dw, &db);
    /* dh_0 = its direct part + dhw_1 W_hh */
    if (st == ND_OK && n->needs_grad[IN_H0] && !fused) st = nd_call_matmul_acc(be, OP, dh0, first, w);
    if (st == ND_OK && n->needs_grad[IN_H0] && fused) {
        st = nd_call_linear_fused_res(be, OP, sg, first, wt, NULL, ND_ACT_NONE, dh0);
        nd_release(dh0);
        dh0 = sg;
        sg = NULL;
    }
    nd_release(first), nd_release(gh), nd_release(dhw), nd_release(w), nd_release(h0);
    nd_release(xw), nd_release(hw), nd_release(out), nd_release(wt), nd_release(sg);
    if (st != ND_OK) {
        nd_release(dx), nd_release(dw), nd_release(db), nd_release(dh0);
        return st;
    }
    grads[IN_XW] = dx, grads[IN_W] = dw, grads[IN_B] = db;
    if (n->needs_grad[IN_H0]) grads[IN_H0] = dh0;
    else nd_release(dh0);
    return ND_OK;
}

/* create_graph: the steps again from differentiable ops (the inputs as
 * saved), then their gradients, a step at a time (op_rnn.h's formulas) */
static nd_status bw_gru_layer_composed(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx x = {0};
    nd_tensor *xw = gx_saved(&x, n, SV_XW), *w = gx_saved(&x, n, SV_W), *h0 = gx_saved(&x, n, SV_H0);
    nd_tensor *b = n->iparams[1] ? gx_saved(&x, n, SV_B) : NULL;
    nd_tensor *wt = gx_tr(&x, w);
    if (x.st != ND_OK) return gx_end(&x);
    const nd_rnn_dims d = {xw->shape[0], xw->shape[1], w->shape[1], n->iparams[0] != 0};
    const int64_t T = d.T, H = d.H;
    nd_rnn_held hd = {0};
    /* per step s: its hw and the h it started from; per time: dxw */
    nd_tensor **hws = calloc((size_t)(3 * T), sizeof(nd_tensor *));
    if (!hws) {
        gx_end(&x);
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory for the backward's steps", OP);
    }
    nd_tensor **hp = hws + T, **dxs = hws + 2 * T;
    nd_status st = ND_OK;
    nd_tensor *h = h0;
    for (int64_t s = 0; s < T && st == ND_OK; s++) {
        nd_gx y = {0};
        nd_tensor *xt = gx_at(&y, xw, nd_rnn_time(&d, s)), *hwt = gx_mm(&y, h, wt);
        if (b) hwt = gx_bin(&y, ND_BINARY_add, hwt, b);
        nd_tensor *p[6] = {0};
        for (int k = 0; k < 3 && y.st == ND_OK; k++) {
            nd_tensor *r = NULL;
            p[k] = gx_own(&y, nd_narrow(xt, 1, k * H, H, &r), &r);
            r = NULL;
            if (y.st == ND_OK) p[3 + k] = gx_own(&y, nd_narrow(hwt, 1, k * H, H, &r), &r);
        }
        nd_tensor *r = gx_un(&y, ND_UNARY_sigmoid, gx_bin(&y, ND_BINARY_add, p[0], p[3]));
        nd_tensor *z = gx_un(&y, ND_UNARY_sigmoid, gx_bin(&y, ND_BINARY_add, p[1], p[4]));
        nd_tensor *nn = gx_un(&y, ND_UNARY_tanh, gx_bin(&y, ND_BINARY_add, p[2], gx_bin(&y, ND_BINARY_mul, r, p[5])));
        /* h' = (1 - z) n + z h */
        nd_tensor *h2 = gx_bin(&y, ND_BINARY_add, gx_bin(&y, ND_BINARY_mul, gx_sc(&y, ND_BINARY_sub, z, 1, 1), nn),
                               gx_bin(&y, ND_BINARY_mul, z, h));
        hws[s] = gx_out(&y, hwt), hp[s] = gx_out(&y, h);
        nd_tensor *hk = gx_out(&y, h2);
        st = gx_end(&y);
        if (st == ND_OK) st = nd_rnn_hold(&hd, hk, OP);
        else nd_release(hk);
        h = hk;
    }
    nd_tensor *dh_next = NULL, *dw = NULL, *db = NULL; /* owned */
    for (int64_t s = T - 1; s >= 0 && st == ND_OK; s--) {
        nd_gx y = {0};
        const int64_t t = nd_rnn_time(&d, s);
        nd_tensor *gt = gx_at(&y, g, t);
        if (dh_next) gt = gx_bin(&y, ND_BINARY_add, gt, dh_next);
        nd_tensor *dxt = NULL, *dht = NULL, *direct = NULL;
        if (y.st == ND_OK)
            nd_gru_cell_grads_composed(&y, gx_at(&y, xw, t), hws[s], hp[s], gt, true, true, &dxt, &dht, &direct);
        nd_tensor *ndh = gx_bin(&y, ND_BINARY_add, direct, gx_mm(&y, dht, w));
        nd_tensor *pw = gx_mm(&y, gx_tr(&y, dht), hp[s]);
        if (dw) pw = gx_bin(&y, ND_BINARY_add, dw, pw);
        nd_tensor *pb = NULL;
        if (y.st == ND_OK) {
            const int dim0 = 0;
            nd_tensor *rr = NULL;
            pb = gx_own(&y, nd_reduce(ND_REDUCE_sum, dht, &dim0, 1, 0, 0, &rr), &rr);
        }
        if (db) pb = gx_bin(&y, ND_BINARY_add, db, pb);
        dxs[t] = gx_out(&y, dxt);
        nd_tensor *k1 = gx_out(&y, ndh), *k2 = gx_out(&y, pw), *k3 = gx_out(&y, pb);
        st = gx_end(&y);
        nd_release(dh_next), nd_release(dw), nd_release(db);
        dh_next = k1, dw = k2, db = k3;
    }
    nd_tensor *dxw = NULL;
    if (st == ND_OK && n->needs_grad[IN_XW]) st = nd_stack(dxs, (int)T, 0, &dxw);
    for (int64_t k = 0; k < 3 * T; k++) nd_release(hws[k]);
    free(hws);
    nd_rnn_drop(&hd);
    st = st == ND_OK ? gx_end(&x) : (gx_end(&x), st);
    if (st != ND_OK) {
        nd_release(dxw), nd_release(dh_next), nd_release(dw), nd_release(db);
        return st;
    }
    grads[IN_XW] = dxw;
    grads[IN_W] = n->needs_grad[IN_W] ? dw : (nd_release(dw), NULL);
    grads[IN_B] = n->needs_grad[IN_B] ? db : (nd_release(db), NULL);
    grads[IN_H0] = n->needs_grad[IN_H0] ? dh_next : (nd_release(dh_next), NULL);
    return ND_OK;
}

static nd_status bw_gru_layer(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const nd_backend *be = nd_backend_of(g);
    if (nd_grad_enabled() || !be->gru_cell_backward || !be->matmul_acc) return bw_gru_layer_composed(n, g, grads);
    return bw_gru_layer_fused(n, g, grads);
}

nd_status nd_gru_layer(const nd_tensor *xw, const nd_tensor *w_hh, const nd_tensor *b_hh, const nd_tensor *h0,
                       bool reverse, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_args(xw, w_hh, b_hh, h0));
    const nd_rnn_dims d = {xw->shape[0], xw->shape[1], w_hh->shape[1], reverse};
    const nd_backend *be = nd_backend_of(xw);
    const nd_device dev = nd_get_device(xw);
    const nd_dtype dt = xw->dtype;
    const bool fused = be->linear_fused != NULL; /* (the composed steps' bits) */
    const bool grad_on = nd_set_grad_enabled(false);
    const nd_tensor *in[4] = {xw, w_hh, b_hh, h0};
    bool wants = false;
    for (int k = 0; k < 4; k++) wants = wants || (in[k] && in[k]->requires_grad);
    const bool record = grad_on && wants; /* else hw need not last */
    const int64_t ps[3] = {record || !fused ? d.T : 1, d.B, 3 * d.H}, os[3] = {d.T, d.B, d.H};
    nd_tensor *hw = NULL, *o = NULL, *xu = NULL, *hu = NULL, *wc = NULL, *bc = NULL;
    nd_status st = nd_unit_rows(xw, &xu);
    if (st == ND_OK) st = nd_contiguous(h0, &hu);
    if (st == ND_OK) st = nd_contiguous(w_hh, &wc);
    if (st == ND_OK && b_hh) st = nd_contiguous(b_hh, &bc);
    if (st == ND_OK) st = nd_empty_on(dev, ps, 3, dt, &hw);
    if (st == ND_OK) st = nd_empty_on(dev, os, 3, dt, &o);
    if (st == ND_OK) st = run_forward(&d, fused, xu, wc, bc, hu, hw, o);
    nd_release(xu), nd_release(hu), nd_release(wc), nd_release(bc);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && record) {
        nd_node *n = NULL;
        st = nd_record(ND_OP_gru_layer, bw_gru_layer, o, 4, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = reverse, n->iparams[1] = b_hh != NULL;
            st = nd_save(n, xw, false);                        /* SV_XW */
            if (st == ND_OK) st = nd_save(n, w_hh, false);     /* SV_W */
            if (st == ND_OK) st = nd_save(n, h0, false);       /* SV_H0 */
            if (st == ND_OK) st = nd_save(n, hw, false);       /* SV_HW */
            if (st == ND_OK) st = nd_save(n, o, true);         /* SV_OUT */
            if (st == ND_OK && b_hh) st = nd_save(n, b_hh, false); /* SV_B */
        }
    }
    nd_release(hw);
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}
