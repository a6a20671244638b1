/* op_rnn_layer.c - one direction of one nn.LSTM layer over a whole sequence
 * as one op (needle.h's nd_lstm_layer), made of backend calls that already
 * exist: the state's product (linear_fused with the bias, or the GEMM
 * adding into the gates, matmul_acc, where a backend has no linear_fused)
 * and the cell's kernels (lstm_cell, lstm_cell_backward).
 *
 * Composed step by step, a layer of T steps is T autograd nodes of the
 * recurrent product (each a copy of h, a GEMM with the bias and, backward,
 * two GEMMs and a bias sum) and T cells, with the views, selects and adds
 * that join them: about 14 backend calls a step, and as many GPU launches.
 * Here a step is two calls forward, the product and the cell, which writes h
 * straight into the op's result, and two backward, h's gradient added into
 * the step's incoming one and the cell's backward; the weight's gradient is
 * one GEMM over all T x B rows (the steps' products have B = 20 rows each
 * in the bench's language model) and the bias's one sum.
 *
 *   hw_t = h_{t-1} W_hh^T + b_hh,  [h_t, c_t] = lstm_cell(xw_t, hw_t, c_{t-1})
 *     (the composed steps' values bit for bit), or without linear_fused
 *   gates = xw + b_hh, gates_t += h_{t-1} W_hh^T, [h_t, c_t] = lstm_cell(gates_t, c_{t-1})
 *   out = [h_1 .. h_T ; c_T]                            (T + 1, B, H)
 *
 * Backward, steps in reverse, from G = out's gradient: dh_t = G_t +
 * dgates_{t+1} W_hh (the next step's; linear_fused with G_t as its residual,
 * against W_hh^T copied contiguous once, or without it G_t's copy and
 * matmul_acc), dc_T = G_{T+1}; then the cell's backward gives dgates_t and
 * writes dc_{t-1};
 *   dxw = dgates; dW_hh = dgates_1^T h_0 + sum_{t>1} dgates_t^T h_{t-1};
 *   db_hh = the sum of dgates over T and B; dh_0 = dgates_1 W_hh; dc_0.
 *
 * Under create_graph the backward recomputes the steps from differentiable
 * ops and composes the cell's formulas (op_rnn.h), so second derivatives
 * exist. */
#include "backend_call.h"
#include "op_rnn.h"

static const char *OP = "lstm_layer";

/* the node's saved tensors: the inputs (xw for a create_graph backward;
 * SV_B only with a bias: iparams[1]), the state's products (hw) or the
 * gates with them added (iparams[2]), the c's (T, B, H) and the result */
enum { SV_XW, SV_W, SV_H0, SV_C0, SV_PROD, SV_CS, SV_OUT, SV_B };
/* the inputs, in grads[] order */
enum { IN_XW, IN_W, IN_B, IN_H0, IN_C0 };

static nd_status check_args(const nd_tensor *xw, const nd_tensor *w, const nd_tensor *b, const nd_tensor *h0,
                            const nd_tensor *c0) {
    char s1[ND_SHAPE_BUF], s2[ND_SHAPE_BUF], s3[ND_SHAPE_BUF], s4[ND_SHAPE_BUF], s5[ND_SHAPE_BUF];
    bool ok = xw->ndim == 3 && w->ndim == 2 && h0->ndim == 2 && c0->ndim == 2 && (!b || b->ndim == 1);
    if (ok) {
        const int64_t T = xw->shape[0], B = xw->shape[1], H = w->shape[1];
        ok = T > 0 && B > 0 && H > 0 && xw->shape[2] == 4 * H && w->shape[0] == 4 * H &&
             (!b || b->shape[0] == 4 * H) && h0->shape[0] == B && h0->shape[1] == H && c0->shape[0] == B &&
             c0->shape[1] == H;
    }
    if (!ok)
        return nd_fail(ND_ERR_SHAPE, "%s: expected the input's products (T, B, 4H) with T, B, H > 0, w_hh (4H, H), "
                       "b_hh (4H) or none, h0 and c0 (B, H), got %s, %s, %s, %s and %s", OP,
                       nd_shape_str(xw->shape, xw->ndim, s1), nd_shape_str(w->shape, w->ndim, s2),
                       b ? nd_shape_str(b->shape, b->ndim, s3) : "none", nd_shape_str(h0->shape, h0->ndim, s4),
                       nd_shape_str(c0->shape, c0->ndim, s5));
    const nd_tensor *all[5] = {xw, w, b, h0, c0};
    for (int k = 1; k < 5; k++)
        if (all[k]) ND_TRY(nd_check_same_device(OP, xw, all[k]));
    bool same = xw->dtype == ND_FLOAT32 || xw->dtype == ND_FLOAT64;
    for (int k = 1; k < 5; k++) same = same && (!all[k] || all[k]->dtype == xw->dtype);
    if (!same)
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 products, weight, bias and state of one "
                       "dtype, got %s, %s, %s, %s and %s", OP, nd_dtype_name(xw->dtype), nd_dtype_name(w->dtype),
                       b ? nd_dtype_name(b->dtype) : "none", nd_dtype_name(h0->dtype), nd_dtype_name(c0->dtype));
    return ND_OK;
}

/* ------------------------------------------------------------- forward */

/* The steps: prod (T, B, 4H) gets each step's hw (with linear_fused) or
 * the gates (xw + b_hh, each step's product added: gates_mode), cs (T, B,
 * H) the c's, out (T + 1, B, H) the h's and the last c. Without a graph
 * prod may hold one step (not in gates_mode) and cs two (nd_rnn_slot()). xw has
 * unit-stride rows, h0 is contiguous, w and b contiguous with linear_fused. */
static nd_status run_forward(const nd_rnn_dims *d, bool gates_mode, const nd_tensor *xw, const nd_tensor *w,
                             const nd_tensor *b, const nd_tensor *h0, const nd_tensor *c0, nd_tensor *prod,
                             nd_tensor *cs, nd_tensor *out) {
    const nd_backend *be = nd_backend_of(xw);
    const int64_t T = d->T, B = d->B, H = d->H;
    nd_tensor *wt = NULL, *bx = NULL;
    nd_status st = ND_OK;
    if (gates_mode) {
        const int64_t wts[2] = {H, 4 * H}, wtst[2] = {w->strides[1], w->strides[0]};
        st = nd_rnn_view(w, 2, wts, wtst, 0, &wt); /* w_hh^T (H, 4H) */
        if (st == ND_OK && b) {
            const int64_t bs[3] = {T, B, 4 * H}, bst[3] = {0, 0, b->strides[0]};
            st = nd_rnn_view(b, 3, bs, bst, 0, &bx);
            if (st == ND_OK) st = nd_call_binary(be, OP, ND_BINARY_add, prod, xw, bx);
        } else if (st == ND_OK) {
            st = nd_call_copy(be, OP, prod, xw);
        }
    }
    for (int64_t s = 0; s < T && st == ND_OK; s++) {
        const int64_t t = nd_rnn_time(d, s), tp = s > 0 ? nd_rnn_time(d, s - 1) : 0;
        const int64_t kc = cs->shape[0];
        nd_tensor *p = NULL, *x = NULL, *hp = NULL, *cp = NULL, *h = NULL, *c = NULL;
        st = nd_rnn_rows(prod, nd_rnn_slot(d, prod->shape[0], s), 0, 4 * H, &p);
        if (st == ND_OK) st = nd_rnn_rows(out, t, 0, H, &h);
        if (st == ND_OK) st = nd_rnn_rows(cs, nd_rnn_slot(d, kc, s), 0, H, &c);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(out, tp, 0, H, &hp);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(cs, nd_rnn_slot(d, kc, s - 1), 0, H, &cp);
        if (st == ND_OK && !gates_mode) st = nd_rnn_rows(xw, t, 0, 4 * H, &x);
        if (st == ND_OK)
            st = gates_mode ? nd_call_matmul_acc(be, OP, p, s > 0 ? hp : h0, wt)
                            : nd_call_linear_fused(be, OP, p, s > 0 ? hp : h0, w, b, ND_ACT_NONE);
        if (st == ND_OK) st = nd_call_lstm_cell(be, OP, h, c, gates_mode ? p : x, gates_mode ? NULL : p,
                                                s > 0 ? cp : c0);
        nd_release(p), nd_release(x), nd_release(hp), nd_release(cp), nd_release(h), nd_release(c);
    }
    /* out[T + 1] = the last step's c */
    nd_tensor *oc = NULL, *sc = NULL;
    if (st == ND_OK) st = nd_rnn_rows(out, T, 0, H, &oc);
    if (st == ND_OK) st = nd_rnn_rows(cs, nd_rnn_slot(d, cs->shape[0], T - 1), 0, H, &sc);
    if (st == ND_OK) st = nd_call_copy(be, OP, oc, sc);
    nd_release(oc), nd_release(sc), nd_release(wt), nd_release(bx);
    return st;
}

/* ------------------------------------------------------------ backward */

nd_status nd_rnn_weight_grads(const nd_backend *be, const char *op, const nd_rnn_dims *d, const nd_tensor *dp,
                              const nd_tensor *h0, const nd_tensor *hs, bool want_w, bool want_b, nd_tensor **dw,
                              nd_tensor **db) {
    const int64_t T = d->T, B = d->B, H = d->H, K = dp->shape[2];
    const nd_device dev = nd_get_device(dp);
    const nd_dtype dt = dp->dtype;
    nd_tensor *first = NULL, *firstT = NULL, *rest = NULL, *hprev = NULL, *rows = NULL, *dbk = NULL;
    *dw = *db = NULL;
    nd_status st = ND_OK;
    if (want_w) {
        /* dp_1^T h_0, then the other steps' in one product: their rows are
         * (T - 1) B consecutive rows of dp, and their h_{t-1} as many rows
         * of hs, one step earlier (or later, reversed) */
        const int64_t ws[2] = {K, H}, fs[2] = {K, B}, fst[2] = {1, K};
        st = nd_empty_on(dev, ws, 2, dt, dw);
        if (st == ND_OK) st = nd_rnn_rows(dp, nd_rnn_time(d, 0), 0, K, &first);
        if (st == ND_OK) st = nd_rnn_view(first, 2, fs, fst, 0, &firstT);
        if (st == ND_OK) st = nd_call_matmul(be, op, *dw, firstT, h0);
        if (st == ND_OK && T > 1) {
            const int64_t R = (T - 1) * B;
            const int64_t rs[2] = {K, R}, rst[2] = {1, K}, ps[2] = {R, H}, pst[2] = {H, 1};
            st = nd_rnn_view(dp, 2, rs, rst, d->reverse ? 0 : B * K, &rest);
            if (st == ND_OK) st = nd_rnn_view(hs, 2, ps, pst, d->reverse ? B * H : 0, &hprev);
            if (st == ND_OK) st = nd_call_matmul_acc(be, op, *dw, rest, hprev);
        }
    }
    if (st == ND_OK && want_b) {
        const int64_t rs[2] = {T * B, K}, rst[2] = {K, 1}, ks[2] = {1, K}, bs[1] = {K};
        const bool reduced[2] = {true, false};
        st = nd_rnn_view(dp, 2, rs, rst, 0, &rows);
        if (st == ND_OK) st = nd_empty_on(dev, ks, 2, dt, &dbk);
        if (st == ND_OK) st = nd_call_reduce(be, op, ND_REDUCE_sum, dbk, rows, reduced, 0);
        if (st == ND_OK) st = nd_view(dbk, bs, 1, db);
    }
    nd_release(first), nd_release(firstT), nd_release(rest), nd_release(hprev), nd_release(rows), nd_release(dbk);
    if (st != ND_OK) {
        nd_release(*dw), nd_release(*db);
        *dw = *db = NULL;
    }
    return st;
}

/* the fused backward: the steps back with the cell's kernel (header) */
static nd_status bw_lstm_layer_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const bool gates_mode = n->iparams[2] != 0;
    nd_tensor *w = NULL, *h0 = NULL, *c0 = NULL, *xw = NULL, *prod = NULL, *cs = NULL, *out = NULL;
    nd_status st = nd_saved(n, SV_W, &w);
    if (st == ND_OK) st = nd_rnn_saved_rows(n, SV_H0, &h0); /* (the kernels' layout, as the forward's) */
    if (st == ND_OK) st = nd_rnn_saved_rows(n, SV_C0, &c0);
    if (st == ND_OK && !gates_mode) st = nd_rnn_saved_rows(n, SV_XW, &xw);
    if (st == ND_OK) st = nd_saved(n, SV_PROD, &prod);
    if (st == ND_OK) st = nd_saved(n, SV_CS, &cs);
    if (st == ND_OK) st = nd_saved(n, SV_OUT, &out);
    if (st != ND_OK) {
        nd_release(w), nd_release(h0), nd_release(c0), nd_release(xw), nd_release(prod), nd_release(cs);
        nd_release(out);
        return st;
    }
    const nd_rnn_dims d = {cs->shape[0], cs->shape[1], cs->shape[2], n->iparams[0] != 0};
    const int64_t T = d.T, B = d.B, H = d.H;
    const nd_backend *be = nd_backend_of(cs);
    const bool by_linear = !gates_mode && nd_rnn_grad_by_linear(be);
    const nd_device dev = nd_get_device(cs);
    const nd_dtype dt = cs->dtype;
    /* gh (T, B, H): each step's dh; gc: step s's dc in slot s % 2 (two
     * slots, each step's cell writing the one before's), G_{T+1} for the
     * last step. With linear_fused (by_linear, op_rnn.h) a step's dh is
     * G_t + dgates_{t+1} W_hh in one call, the product against wt = W_hh^T
     * made contiguous once (the small-M kernel streams it unpacked, where the
     * GEMM would pack W_hh on every step), and the last step's dh is G's row
     * itself; else G is copied into gh and each product added. */
    nd_tensor *gh = NULL, *gc = NULL, *dg = NULL, *v1 = NULL, *v2 = NULL, *dc0 = NULL, *wt = NULL, *gu = NULL;
    const int64_t hs[3] = {T, B, H}, dgs[3] = {T, B, 4 * H}, gcs[3] = {2, B, H};
    st = nd_empty_on(dev, hs, 3, dt, &gh);
    if (st == ND_OK) st = nd_empty_on(dev, gcs, 3, dt, &gc);
    if (st == ND_OK) st = nd_empty_on(dev, dgs, 3, dt, &dg);
    if (st == ND_OK && n->needs_grad[IN_C0]) st = nd_empty_on(dev, c0->shape, 2, dt, &dc0);
    if (st == ND_OK && !by_linear) {
        const int64_t gst[3] = {g->strides[0], g->strides[1], g->strides[2]};
        st = nd_rnn_view(g, 3, hs, gst, 0, &v1);
        if (st == ND_OK) st = nd_call_copy(be, OP, gh, v1);
        nd_release(v1);
        v1 = NULL;
    } else if (st == ND_OK) {
        const int64_t wts[2] = {H, 4 * H}, wtst[2] = {w->strides[1], w->strides[0]};
        st = nd_contiguous(g, &gu);
        if (st == ND_OK) st = nd_rnn_view(w, 2, wts, wtst, 0, &v1);
        if (st == ND_OK) st = nd_empty_on(dev, wts, 2, dt, &wt);
        if (st == ND_OK) st = nd_call_copy(be, OP, wt, v1);
        nd_release(v1);
        v1 = NULL;
    }
    if (st == ND_OK) st = nd_rnn_rows(gc, (T - 1) % 2, 0, H, &v1);
    if (st == ND_OK) st = nd_rnn_rows(g, T, 0, H, &v2);
    if (st == ND_OK) st = nd_call_copy(be, OP, v1, v2);
    nd_release(v1), nd_release(v2);
    for (int64_t s = T - 1; s >= 0 && st == ND_OK; s--) {
        const int64_t t = nd_rnn_time(&d, s), tp = s > 0 ? nd_rnn_time(&d, s - 1) : 0;
        nd_tensor *dh = NULL, *dcn = NULL, *dgn = NULL, *dgt = NULL, *dcp = NULL, *cp = NULL, *pt = NULL;
        nd_tensor *xt = NULL, *ct = NULL, *git = NULL;
        st = nd_rnn_rows(by_linear && s == T - 1 ? gu : gh, t, 0, H, &dh);
        if (st == ND_OK && s < T - 1) { /* dh_t = G_t + dgates_{t+1} W_hh */
            st = nd_rnn_rows(dg, nd_rnn_time(&d, s + 1), 0, 4 * H, &dgn);
            if (st == ND_OK && !by_linear) st = nd_call_matmul_acc(be, OP, dh, dgn, w);
            if (st == ND_OK && by_linear) st = nd_rnn_rows(gu, t, 0, H, &git);
            if (st == ND_OK && by_linear) st = nd_call_linear_fused_res(be, OP, dh, dgn, wt, NULL, ND_ACT_NONE, git);
        }
        if (st == ND_OK) st = nd_rnn_rows(gc, s % 2, 0, H, &dcn);
        if (st == ND_OK) st = nd_rnn_rows(dg, t, 0, 4 * H, &dgt);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(gc, (s - 1) % 2, 0, H, &dcp);
        if (st == ND_OK && s > 0) st = nd_rnn_rows(cs, tp, 0, H, &cp);
        if (st == ND_OK) st = nd_rnn_rows(prod, t, 0, 4 * H, &pt);
        if (st == ND_OK && !gates_mode) st = nd_rnn_rows(xw, t, 0, 4 * H, &xt);
        if (st == ND_OK) st = nd_rnn_rows(cs, t, 0, H, &ct);
        if (st == ND_OK)
            st = nd_call_lstm_cell_backward(be, OP, dgt, s > 0 ? dcp : dc0, dh, dcn, gates_mode ? pt : xt,
                                            gates_mode ? NULL : pt, s > 0 ? cp : c0, ct);
        nd_release(dh), nd_release(dcn), nd_release(dgn), nd_release(dgt), nd_release(dcp), nd_release(cp);
        nd_release(pt), nd_release(xt), nd_release(ct), nd_release(git);
    }
    nd_tensor *dw = NULL, *db = NULL, *dh0 = NULL, *first = NULL;
    if (st == ND_OK) st = nd_rnn_rows(dg, nd_rnn_time(&d, 0), 0, 4 * H, &first);
    if (st == ND_OK)
        st = nd_rnn_weight_grads(be, OP, &d, dg, h0, out, n->needs_grad[IN_W], n->needs_grad[IN_B], &dw, &db);
    if (st == ND_OK && n->needs_grad[IN_H0]) {
        st = nd_empty_on(dev, h0->shape, 2, dt, &dh0);
        if (st == ND_OK)
            st = !by_linear ? nd_call_matmul(be, OP, dh0, first, w)
                            : nd_call_linear_fused(be, OP, dh0, first, wt, NULL, ND_ACT_NONE);
    }
    nd_release(first), nd_release(gh), nd_release(gc), nd_release(w), nd_release(h0), nd_release(c0);
    nd_release(wt), nd_release(gu);
    nd_release(xw), nd_release(prod), nd_release(cs), nd_release(out);
    if (st != ND_OK) {
        nd_release(dg), nd_release(dw), nd_release(db), nd_release(dh0), nd_release(dc0);
        return st;
    }
    if (n->needs_grad[IN_XW]) grads[IN_XW] = dg;
    else nd_release(dg);
    grads[IN_W] = dw, grads[IN_B] = db, grads[IN_H0] = dh0, grads[IN_C0] = dc0;
    return ND_OK;
}

/* a new reference to t out of x (x's failure: NULL) */
static nd_tensor *keep(nd_gx *x, nd_tensor *t) { return gx_out(x, t); }

/* create_graph: the steps again from differentiable ops (the inputs as
 * saved), then their gradients, a step at a time (the header's formulas) */
static nd_status bw_lstm_layer_composed(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx x = {0};
    nd_tensor *xw = gx_saved(&x, n, SV_XW), *w = gx_saved(&x, n, SV_W), *h0 = gx_saved(&x, n, SV_H0);
    nd_tensor *c0 = gx_saved(&x, n, SV_C0), *b = n->iparams[1] ? gx_saved(&x, n, SV_B) : NULL;
    nd_tensor *wt = gx_tr(&x, w);
    if (x.st != ND_OK) return gx_end(&x);
    const nd_rnn_dims d = {xw->shape[0], xw->shape[1], w->shape[1], n->iparams[0] != 0};
    const int64_t T = d.T;
    /* per step s: its gates, and the h and c it started from (held) */
    nd_rnn_held hd = {0};
    nd_tensor **gates = calloc((size_t)(3 * T + T), sizeof(nd_tensor *));
    if (!gates) {
        gx_end(&x);
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory for the backward's steps", OP);
    }
    nd_tensor **hp = gates + T, **cp = gates + 2 * T, **dgs = gates + 3 * T;
    nd_status st = ND_OK;
    nd_tensor *h = h0, *c = c0; /* borrowed from x or held */
    for (int64_t s = 0; s < T && st == ND_OK; s++) {
        nd_gx y = {0};
        nd_tensor *gt = gx_at(&y, xw, nd_rnn_time(&d, s));
        if (b) gt = gx_bin(&y, ND_BINARY_add, gt, b);
        gt = gx_bin(&y, ND_BINARY_add, gt, gx_mm(&y, h, wt));
        const int64_t H = d.H;
        nd_tensor *i = NULL, *f = NULL, *gg = NULL, *o = NULL;
        if (y.st == ND_OK) {
            nd_tensor *p[4] = {0};
            for (int k = 0; k < 4 && y.st == ND_OK; k++) {
                nd_tensor *r = NULL;
                p[k] = gx_own(&y, nd_narrow(gt, 1, k * H, H, &r), &r);
            }
            i = gx_un(&y, ND_UNARY_sigmoid, p[0]), f = gx_un(&y, ND_UNARY_sigmoid, p[1]);
            gg = gx_un(&y, ND_UNARY_tanh, p[2]), o = gx_un(&y, ND_UNARY_sigmoid, p[3]);
        }
        nd_tensor *c2 = gx_bin(&y, ND_BINARY_add, gx_bin(&y, ND_BINARY_mul, f, c), gx_bin(&y, ND_BINARY_mul, i, gg));
        nd_tensor *h2 = gx_bin(&y, ND_BINARY_mul, o, gx_un(&y, ND_UNARY_tanh, c2));
        gates[s] = keep(&y, gt), hp[s] = keep(&y, h), cp[s] = keep(&y, c);
        nd_tensor *hk = keep(&y, h2), *ck = keep(&y, c2);
        st = gx_end(&y);
        if (st == ND_OK) st = nd_rnn_hold(&hd, hk, OP);
        else nd_release(hk);
        if (st == ND_OK) st = nd_rnn_hold(&hd, ck, OP);
        else nd_release(ck);
        h = hk, c = ck;
    }
    /* back: dh, dc of the step, its gates' gradient, and what flows on */
    nd_tensor *dh_rec = NULL, *dc = NULL, *dw = NULL, *db = NULL; /* owned */
    for (int64_t s = T - 1; s >= 0 && st == ND_OK; s--) {
        nd_gx y = {0};
        nd_tensor *dh = gx_at(&y, g, nd_rnn_time(&d, s));
        if (dh_rec) dh = gx_bin(&y, ND_BINARY_add, dh, dh_rec);
        nd_tensor *dcn = s == T - 1 ? gx_at(&y, g, T) : dc;
        nd_tensor *dgt = NULL, *dcp = NULL;
        if (y.st == ND_OK) nd_lstm_cell_grads_composed(&y, gates[s], cp[s], dh, dcn, true, &dgt, &dcp);
        nd_tensor *ndh = gx_mm(&y, dgt, w);
        nd_tensor *pw = gx_mm(&y, gx_tr(&y, dgt), hp[s]);
        if (dw) pw = gx_bin(&y, ND_BINARY_add, dw, pw);
        nd_tensor *pb = NULL;
        if (y.st == ND_OK) {
            const int dim0 = 0;
            nd_tensor *r = NULL;
            pb = gx_own(&y, nd_reduce(ND_REDUCE_sum, dgt, &dim0, 1, 0, 0, &r), &r);
        }
        if (db) pb = gx_bin(&y, ND_BINARY_add, db, pb);
        dgs[nd_rnn_time(&d, s)] = keep(&y, dgt);
        nd_tensor *k1 = keep(&y, ndh), *k2 = keep(&y, dcp), *k3 = keep(&y, pw), *k4 = keep(&y, pb);
        st = gx_end(&y);
        nd_release(dh_rec), nd_release(dc), nd_release(dw), nd_release(db);
        dh_rec = k1, dc = k2, dw = k3, db = k4;
    }
    nd_tensor *dxw = NULL;
    if (st == ND_OK && n->needs_grad[IN_XW]) st = nd_stack(dgs, (int)T, 0, &dxw);
    for (int64_t k = 0; k < 4 * T; k++) nd_release(gates[k]);
    free(gates);
    nd_rnn_drop(&hd);
    st = st == ND_OK ? gx_end(&x) : (gx_end(&x), st);
    if (st != ND_OK) {
        nd_release(dxw), nd_release(dh_rec), nd_release(dc), nd_release(dw), nd_release(db);
        return st;
    }
    grads[IN_XW] = dxw;
    grads[IN_W] = n->needs_grad[IN_W] ? dw : (nd_release(dw), NULL);
    grads[IN_B] = n->needs_grad[IN_B] ? db : (nd_release(db), NULL);
    grads[IN_H0] = n->needs_grad[IN_H0] ? dh_rec : (nd_release(dh_rec), NULL);
    grads[IN_C0] = n->needs_grad[IN_C0] ? dc : (nd_release(dc), NULL);
    return ND_OK;
}

static nd_status bw_lstm_layer(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const nd_backend *be = nd_backend_of(g);
    if (nd_grad_enabled() || !be->lstm_cell_backward || !be->matmul_acc) return bw_lstm_layer_composed(n, g, grads);
    return bw_lstm_layer_fused(n, g, grads);
}

nd_status nd_lstm_layer(const nd_tensor *xw, const nd_tensor *w_hh, const nd_tensor *b_hh, const nd_tensor *h0,
                        const nd_tensor *c0, bool reverse, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_args(xw, w_hh, b_hh, h0, c0));
    const nd_rnn_dims d = {xw->shape[0], xw->shape[1], w_hh->shape[1], reverse};
    const nd_backend *be = nd_backend_of(xw);
    const nd_device dev = nd_get_device(xw);
    const nd_dtype dt = xw->dtype;
    /* the state's product by linear_fused (its bias in the GEMM's epilogue:
     * the composed steps' bits), else added into the gates */
    const bool gates_mode = !be->linear_fused;
    const bool grad_on = nd_set_grad_enabled(false);
    const nd_tensor *in[5] = {xw, w_hh, b_hh, h0, c0};
    bool wants = false;
    for (int k = 0; k < 5; k++) wants = wants || (in[k] && in[k]->requires_grad);
    const bool record = grad_on && wants; /* else the steps' buffers need not last */
    const int64_t ps[3] = {record || gates_mode ? d.T : 1, d.B, 4 * d.H};
    const int64_t cs_[3] = {record ? d.T : (d.T < 2 ? d.T : 2), d.B, d.H}, os[3] = {d.T + 1, d.B, d.H};
    nd_tensor *prod = NULL, *cs = NULL, *o = NULL, *xu = NULL, *hu = NULL, *cu = NULL, *wc = NULL, *bc = NULL;
    nd_status st = nd_unit_rows(xw, &xu);
    if (st == ND_OK) st = nd_contiguous(h0, &hu);
    if (st == ND_OK) st = nd_unit_rows(c0, &cu);
    if (st == ND_OK) st = nd_contiguous(w_hh, &wc); /* (linear_fused's layout) */
    if (st == ND_OK && b_hh) st = nd_contiguous(b_hh, &bc);
    if (st == ND_OK) st = nd_empty_on(dev, ps, 3, dt, &prod);
    if (st == ND_OK) st = nd_empty_on(dev, cs_, 3, dt, &cs);
    if (st == ND_OK) st = nd_empty_on(dev, os, 3, dt, &o);
    if (st == ND_OK) st = run_forward(&d, gates_mode, xu, wc, bc, hu, cu, prod, cs, o);
    nd_release(xu), nd_release(hu), nd_release(cu), nd_release(wc), nd_release(bc);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && record) {
        nd_node *n = NULL;
        st = nd_record(ND_OP_lstm_layer, bw_lstm_layer, o, 5, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = reverse, n->iparams[1] = b_hh != NULL, n->iparams[2] = gates_mode;
            st = nd_save(n, xw, false);                        /* SV_XW */
            if (st == ND_OK) st = nd_save(n, w_hh, false);     /* SV_W */
            if (st == ND_OK) st = nd_save(n, h0, false);       /* SV_H0 */
            if (st == ND_OK) st = nd_save(n, c0, false);       /* SV_C0 */
            if (st == ND_OK) st = nd_save(n, prod, false);     /* SV_PROD */
            if (st == ND_OK) st = nd_save(n, cs, false);       /* SV_CS */
            if (st == ND_OK) st = nd_save(n, o, true);         /* SV_OUT */
            if (st == ND_OK && b_hh) st = nd_save(n, b_hh, false); /* SV_B */
        }
    }
    nd_release(prod), nd_release(cs);
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}
