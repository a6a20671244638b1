/* op_rnn_cell.c - nn.LSTM's and nn.GRU's cells after their products as one backend kernel each
 * (backend.h's lstm_cell and gru_cell), each with a backward of one kernel.
 *
 * Composed, a step of the cell is about a dozen elementwise ops forward
 * (the sum of the input's and the state's products, four narrows of the
 * gates, three sigmoids, two tanhs, three products, a sum) and as many
 * backward, each one call and on a GPU one launch: 70 cells a step of the
 * 2-layer, 35-step language model. The kernels compute every value as those
 * ops do (the same functions, in the same order), so the cell changes no
 * result on the CPU:
 *
 *   gates = xw + hw
 *   i, f, o = sigmoid(gates), g = tanh(gates)   (PyTorch's order i, f, g, o)
 *   c' = f * c + i * g,  h = o * tanh(c')       -> out (B, 2H) = [h | c']
 *
 * and from g = [dh | dc']:
 *   dc2 = dc' + (dh * o) * (1 - tc * tc)      tc = tanh(c')
 *   di = dc2 * g, df = dc2 * c, dg = dc2 * i, do = dh * tc, dc = dc2 * f
 *   dgates = [di * (i (1 - i)), df * (f (1 - f)), dg * (1 - g g), do * (o (1 - o))]
 *   (xw's gradient and hw's, one tensor as the sum's backward gives both)
 *
 * Under create_graph the backward composes the same formulas from
 * differentiable ops. */
#include "autograd.h"
#include "backend_call.h"
#include "grad_expr.h"
#include "op_rnn.h"

static const char *OP = "lstm_cell";

static nd_status check_args(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF], b3[ND_SHAPE_BUF];
    const bool hw_ok = !hw || (hw->ndim == 2 && xw->ndim == 2 && hw->shape[0] == xw->shape[0] &&
                               hw->shape[1] == xw->shape[1]);
    if (xw->ndim != 2 || c->ndim != 2 || xw->shape[0] != c->shape[0] || xw->shape[1] != 4 * c->shape[1] ||
        !hw_ok)
        return nd_fail(ND_ERR_SHAPE, "%s: expected gates (B, 4H), the state's products (B, 4H) or none, and "
                       "c (B, H), got gates %s, products %s and c %s", OP,
                       nd_shape_str(xw->shape, xw->ndim, b1), hw ? nd_shape_str(hw->shape, hw->ndim, b2) : "none",
                       nd_shape_str(c->shape, c->ndim, b3));
    ND_TRY(nd_check_same_device(OP, xw, c));
    if (hw) ND_TRY(nd_check_same_device(OP, xw, hw));
    if (xw->dtype != c->dtype || (hw && hw->dtype != c->dtype) ||
        (xw->dtype != ND_FLOAT32 && xw->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 gates, products and c of one dtype, got "
                       "%s, %s and %s", OP, nd_dtype_name(xw->dtype), hw ? nd_dtype_name(hw->dtype) : "none",
                       nd_dtype_name(c->dtype));
    return ND_OK;
}


/* saved: xw, c, the output, then hw when there is one (iparams[0]) */
enum { SAVED_XW, SAVED_C, SAVED_OUT, SAVED_HW };

static nd_status bw_lstm_cell_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    const bool has_hw = n->iparams[0] != 0;
    nd_tensor *xw = NULL, *hw = NULL, *c = NULL, *out = NULL, *gc = NULL, *xu = NULL, *hu = NULL, *cu = NULL;
    nd_tensor *dgates = NULL, *dc = NULL;
    nd_status st = nd_saved(n, SAVED_XW, &xw);
    if (st == ND_OK) st = nd_saved(n, SAVED_C, &c);
    if (st == ND_OK) st = nd_saved(n, SAVED_OUT, &out);
    if (st == ND_OK && has_hw) st = nd_saved(n, SAVED_HW, &hw);
    if (st == ND_OK) st = nd_unit_rows(xw, &xu);
    if (st == ND_OK && hw) st = nd_unit_rows(hw, &hu);
    if (st == ND_OK) st = nd_unit_rows(c, &cu);
    if (st == ND_OK) st = nd_unit_rows(g, &gc);
    if (st == ND_OK && (n->needs_grad[0] || (has_hw && n->needs_grad[1])))
        st = nd_empty_on(nd_get_device(xw), xw->shape, 2, xw->dtype, &dgates);
    if (st == ND_OK && n->needs_grad[2]) st = nd_empty_on(nd_get_device(c), c->shape, 2, c->dtype, &dc);
    const int64_t H = c ? c->shape[1] : 0;
    nd_tensor *gh = NULL, *gcn = NULL, *c2 = NULL;
    if (st == ND_OK) st = nd_narrow(gc, 1, 0, H, &gh);
    if (st == ND_OK) st = nd_narrow(gc, 1, H, H, &gcn);
    if (st == ND_OK) st = nd_narrow(out, 1, H, H, &c2);
    if (st == ND_OK)
        st = ND_BACKEND_CALL(nd_backend_of(xw), lstm_cell_backward, OP, dgates, dc, gh, gcn, xu, hu, cu, c2);
    nd_release(xw), nd_release(hw), nd_release(c), nd_release(out);
    nd_release(xu), nd_release(hu), nd_release(cu), nd_release(gc);
    nd_release(gh), nd_release(gcn), nd_release(c2);
    if (st != ND_OK) {
        nd_release(dgates), nd_release(dc);
        return st;
    }
    /* the gates' gradient is both xw's and hw's (as the sum's backward gives it) */
    if (n->needs_grad[0]) {
        grads[0] = dgates;
        nd_retain(dgates);
    }
    if (has_hw && n->needs_grad[1]) {
        grads[1] = dgates;
        nd_retain(dgates);
    }
    nd_release(dgates);
    grads[2] = dc;
    return ND_OK;
}

static nd_tensor *gx_narrow(nd_gx *c, const nd_tensor *t, int64_t start, int64_t len) {
    GX_GUARD();
    nd_tensor *r = NULL;
    return gx_own(c, nd_narrow(t, 1, start, len, &r), &r);
}

/* The formulas of the header from differentiable ops (create_graph), for
 * the gates' pre-activations, the state c before the step and the step's
 * gradient [dh | dc'] given as its two halves: *dgates (when want_gates)
 * and *dc, borrowed from x. nn.LSTM's layer (op_rnn_layer.c) runs them a
 * step at a time. */
void nd_lstm_cell_grads_composed(nd_gx *x, const nd_tensor *gates, const nd_tensor *c, const nd_tensor *dh,
                                 const nd_tensor *dcn, bool want_gates, nd_tensor **dgates, nd_tensor **dc) {
    const int64_t H = c ? c->shape[1] : 0;
    *dgates = *dc = NULL;
    nd_tensor *i = gx_un(x, ND_UNARY_sigmoid, gx_narrow(x, gates, 0, H));
    nd_tensor *f = gx_un(x, ND_UNARY_sigmoid, gx_narrow(x, gates, H, H));
    nd_tensor *gg = gx_un(x, ND_UNARY_tanh, gx_narrow(x, gates, 2 * H, H));
    nd_tensor *o = gx_un(x, ND_UNARY_sigmoid, gx_narrow(x, gates, 3 * H, H));
    nd_tensor *c2 = gx_bin(x, ND_BINARY_add, gx_bin(x, ND_BINARY_mul, f, c), gx_bin(x, ND_BINARY_mul, i, gg));
    nd_tensor *tc = gx_un(x, ND_UNARY_tanh, c2);
    nd_tensor *one_m_tc2 = gx_sc(x, ND_BINARY_sub, gx_bin(x, ND_BINARY_mul, tc, tc), 1, 1);
    nd_tensor *dc2 = gx_bin(x, ND_BINARY_add, dcn,
                            gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dh, o), one_m_tc2));
    if (want_gates && x->st == ND_OK) {
        /* sigmoid' = y (1 - y), tanh' = 1 - y y */
#define SIG_D(y) gx_bin(x, ND_BINARY_mul, y, gx_sc(x, ND_BINARY_sub, y, 1, 1))
        nd_tensor *parts[4] = {
            gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dc2, gg), SIG_D(i)),
            gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dc2, c), SIG_D(f)),
            gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dc2, i),
                   gx_sc(x, ND_BINARY_sub, gx_bin(x, ND_BINARY_mul, gg, gg), 1, 1)),
            gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dh, tc), SIG_D(o)),
        };
#undef SIG_D
        nd_tensor *dg = NULL;
        if (x->st == ND_OK) *dgates = gx_own(x, nd_cat(parts, 4, 1, &dg), &dg);
    }
    *dc = gx_bin(x, ND_BINARY_mul, dc2, f);
}

/* create_graph: the formulas of the header from differentiable ops */
static nd_status bw_lstm_cell_composed(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx x = {0};
    nd_tensor *gates = gx_saved(&x, n, SAVED_XW), *c = gx_saved(&x, n, SAVED_C);
    if (n->iparams[0]) gates = gx_bin(&x, ND_BINARY_add, gates, gx_saved(&x, n, SAVED_HW));
    const int64_t H = c ? c->shape[1] : 0;
    nd_tensor *dh = gx_narrow(&x, g, 0, H), *dcn = gx_narrow(&x, g, H, H), *dg = NULL, *dc = NULL;
    const bool want_gates = n->needs_grad[0] || (n->iparams[0] && n->needs_grad[1]);
    if (x.st == ND_OK) nd_lstm_cell_grads_composed(&x, gates, c, dh, dcn, want_gates, &dg, &dc);
    if (n->needs_grad[0]) grads[0] = gx_out(&x, dg);
    if (n->iparams[0] && n->needs_grad[1]) grads[1] = gx_out(&x, dg);
    if (n->needs_grad[2]) grads[2] = gx_out(&x, dc);
    return gx_end(&x);
}

static nd_status bw_lstm_cell(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (nd_grad_enabled() || !nd_backend_of(g)->lstm_cell_backward) return bw_lstm_cell_composed(n, g, grads);
    return bw_lstm_cell_fused(n, g, grads);
}

nd_status nd_lstm_cell(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_args(xw, hw, c));
    const bool grad_on = nd_set_grad_enabled(false);
    const int64_t shape[2] = {c->shape[0], 2 * c->shape[1]};
    nd_tensor *xu = NULL, *hu = NULL, *cu = NULL, *o = NULL;
    nd_status st = nd_unit_rows(xw, &xu);
    if (st == ND_OK && hw) st = nd_unit_rows(hw, &hu);
    if (st == ND_OK) st = nd_unit_rows(c, &cu);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(c), shape, 2, c->dtype, &o);
    nd_tensor *oh = NULL, *oc = NULL; /* the result's two halves */
    if (st == ND_OK) st = nd_narrow(o, 1, 0, c->shape[1], &oh);
    if (st == ND_OK) st = nd_narrow(o, 1, c->shape[1], c->shape[1], &oc);
    if (st == ND_OK) st = ND_BACKEND_CALL(nd_backend_of(c), lstm_cell, OP, oh, oc, xu, hu, cu);
    nd_release(xu), nd_release(hu), nd_release(cu), nd_release(oh), nd_release(oc);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on && (xw->requires_grad || (hw && hw->requires_grad) || c->requires_grad)) {
        nd_node *n = NULL;
        const nd_tensor *in[3] = {xw, hw, c};
        st = nd_record(ND_OP_lstm_cell, bw_lstm_cell, o, 3, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = hw != NULL;
            st = nd_save(n, xw, false);                   /* SAVED_XW */
            if (st == ND_OK) st = nd_save(n, c, false);   /* SAVED_C */
            if (st == ND_OK) st = nd_save(n, o, true);    /* SAVED_OUT */
            if (st == ND_OK && hw) st = nd_save(n, hw, false); /* SAVED_HW */
        }
    }
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}

/* ---------------------------------------------------------------- GRU
 *
 *   r = sigmoid(xw_r + hw_r), z = sigmoid(xw_z + hw_z)
 *   n = tanh(xw_n + r * hw_n),  h' = (1 - z) * n + z * h
 *
 * and from g = dh':
 *   dn = g * (1 - z), dz = g * h - g * n (as the sum of -(g n) and g h)
 *   dpn = dn * (1 - n n), dpz = dz * (z (1 - z)), dpr = (dpn * hw_n) * (r (1 - r))
 *   dxw = [dpr, dpz, dpn], dhw = [dpr, dpz, dpn * r], dh = g * z */

static const char *GRU = "gru_cell";

static nd_status gru_check_args(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF], b3[ND_SHAPE_BUF];
    if (xw->ndim != 2 || hw->ndim != 2 || h->ndim != 2 || xw->shape[0] != h->shape[0] ||
        hw->shape[0] != h->shape[0] || xw->shape[1] != 3 * h->shape[1] || hw->shape[1] != xw->shape[1])
        return nd_fail(ND_ERR_SHAPE, "%s: expected the input's and the state's products (B, 3H) and h (B, H), "
                       "got %s, %s and h %s", GRU, nd_shape_str(xw->shape, xw->ndim, b1),
                       nd_shape_str(hw->shape, hw->ndim, b2), nd_shape_str(h->shape, h->ndim, b3));
    ND_TRY(nd_check_same_device(GRU, xw, h));
    ND_TRY(nd_check_same_device(GRU, hw, h));
    if (xw->dtype != h->dtype || hw->dtype != h->dtype || (h->dtype != ND_FLOAT32 && h->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 products and h of one dtype, got %s, %s "
                       "and %s", GRU, nd_dtype_name(xw->dtype), nd_dtype_name(hw->dtype), nd_dtype_name(h->dtype));
    return ND_OK;
}

enum { GRU_SAVED_XW, GRU_SAVED_HW, GRU_SAVED_H };

static nd_status bw_gru_cell_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *sv[3] = {0}, *un[3] = {0}, *gc = NULL, *d[3] = {0};
    nd_status st = ND_OK;
    for (int k = 0; k < 3 && st == ND_OK; k++) st = nd_saved(n, k, &sv[k]);
    for (int k = 0; k < 3 && st == ND_OK; k++) st = nd_unit_rows(sv[k], &un[k]);
    if (st == ND_OK) st = nd_unit_rows(g, &gc);
    for (int k = 0; k < 3 && st == ND_OK; k++)
        if (n->needs_grad[k]) st = nd_empty_on(nd_get_device(sv[k]), sv[k]->shape, 2, sv[k]->dtype, &d[k]);
    if (st == ND_OK)
        st = ND_BACKEND_CALL(nd_backend_of(sv[0]), gru_cell_backward, GRU, d[0], d[1], d[2], gc, un[0], un[1],
                             un[2], false);
    for (int k = 0; k < 3; k++) nd_release(sv[k]), nd_release(un[k]);
    nd_release(gc);
    if (st != ND_OK) {
        for (int k = 0; k < 3; k++) nd_release(d[k]);
        return st;
    }
    for (int k = 0; k < 3; k++) grads[k] = d[k];
    return ND_OK;
}

/* The formulas above from differentiable ops (create_graph), for the
 * step's products xw, hw, its state h and the new state's gradient g: *dxw, *dhw (each
 * when wanted) and *dh, borrowed from x. nn.GRU's layer runs them a step at
 * a time. */
void nd_gru_cell_grads_composed(nd_gx *x, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h,
                                const nd_tensor *g, bool want_x, bool want_hw, nd_tensor **dxw, nd_tensor **dhw,
                                nd_tensor **dh) {
    const int64_t H = h ? h->shape[1] : 0;
    *dxw = *dhw = *dh = NULL;
    nd_tensor *hn = gx_narrow(x, hw, 2 * H, H);
    nd_tensor *r = gx_un(x, ND_UNARY_sigmoid, gx_bin(x, ND_BINARY_add, gx_narrow(x, xw, 0, H), gx_narrow(x, hw, 0, H)));
    nd_tensor *z = gx_un(x, ND_UNARY_sigmoid, gx_bin(x, ND_BINARY_add, gx_narrow(x, xw, H, H), gx_narrow(x, hw, H, H)));
    nd_tensor *nn = gx_un(x, ND_UNARY_tanh, gx_bin(x, ND_BINARY_add, gx_narrow(x, xw, 2 * H, H),
                                                   gx_bin(x, ND_BINARY_mul, r, hn)));
    nd_tensor *dn = gx_bin(x, ND_BINARY_mul, g, gx_sc(x, ND_BINARY_sub, z, 1, 1));
    nd_tensor *dz = gx_bin(x, ND_BINARY_sub, gx_bin(x, ND_BINARY_mul, g, h), gx_bin(x, ND_BINARY_mul, g, nn));
    nd_tensor *dpn = gx_bin(x, ND_BINARY_mul, dn, gx_sc(x, ND_BINARY_sub, gx_bin(x, ND_BINARY_mul, nn, nn), 1, 1));
    nd_tensor *dpz = gx_bin(x, ND_BINARY_mul, dz, gx_bin(x, ND_BINARY_mul, z, gx_sc(x, ND_BINARY_sub, z, 1, 1)));
    nd_tensor *dpr = gx_bin(x, ND_BINARY_mul, gx_bin(x, ND_BINARY_mul, dpn, hn),
                            gx_bin(x, ND_BINARY_mul, r, gx_sc(x, ND_BINARY_sub, r, 1, 1)));
    if (want_x && x->st == ND_OK) {
        nd_tensor *parts[3] = {dpr, dpz, dpn}, *d = NULL;
        *dxw = gx_own(x, nd_cat(parts, 3, 1, &d), &d);
    }
    if (want_hw && x->st == ND_OK) {
        nd_tensor *parts[3] = {dpr, dpz, gx_bin(x, ND_BINARY_mul, dpn, r)}, *d = NULL;
        if (x->st == ND_OK) *dhw = gx_own(x, nd_cat(parts, 3, 1, &d), &d);
    }
    *dh = gx_bin(x, ND_BINARY_mul, g, z);
}

/* create_graph: the formulas above from differentiable ops */
static nd_status bw_gru_cell_composed(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx x = {0};
    nd_tensor *xw = gx_saved(&x, n, GRU_SAVED_XW), *hw = gx_saved(&x, n, GRU_SAVED_HW);
    nd_tensor *h = gx_saved(&x, n, GRU_SAVED_H), *d[3] = {0};
    if (x.st == ND_OK)
        nd_gru_cell_grads_composed(&x, xw, hw, h, g, n->needs_grad[0], n->needs_grad[1], &d[0], &d[1], &d[2]);
    for (int k = 0; k < 3; k++)
        if (n->needs_grad[k]) grads[k] = gx_out(&x, d[k]);
    return gx_end(&x);
}

static nd_status bw_gru_cell(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (nd_grad_enabled() || !nd_backend_of(g)->gru_cell_backward) return bw_gru_cell_composed(n, g, grads);
    return bw_gru_cell_fused(n, g, grads);
}

nd_status nd_gru_cell(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, nd_tensor **out) {
    *out = NULL;
    ND_TRY(gru_check_args(xw, hw, h));
    const bool grad_on = nd_set_grad_enabled(false);
    nd_tensor *xu = NULL, *hu = NULL, *su = NULL, *o = NULL;
    nd_status st = nd_unit_rows(xw, &xu);
    if (st == ND_OK) st = nd_unit_rows(hw, &hu);
    if (st == ND_OK) st = nd_unit_rows(h, &su);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(h), h->shape, 2, h->dtype, &o);
    if (st == ND_OK) st = ND_BACKEND_CALL(nd_backend_of(h), gru_cell, GRU, o, xu, hu, su);
    nd_release(xu), nd_release(hu), nd_release(su);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on && (xw->requires_grad || hw->requires_grad || h->requires_grad)) {
        nd_node *n = NULL;
        const nd_tensor *in[3] = {xw, hw, h};
        st = nd_record(ND_OP_gru_cell, bw_gru_cell, o, 3, in, &n);
        for (int k = 0; k < 3 && st == ND_OK && n; k++) st = nd_save(n, in[k], false); /* GRU_SAVED_* */
    }
    if (st != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}
