/* backend_call.c - the one way ops call a backend (backend_call.h): each
 * nd_call_<fn> checks the entry exists, records the call while a graph is
 * being captured, and runs it; nd_graph_rec_replay runs a record again with
 * the arguments it kept. Keep each wrapper and its replay case side by side
 * in argument order: the record's tensor slots are positional. */
#include <stdlib.h>
#include <string.h>
#include "graph_record.h"

static const char *const entry_names[] = {
#define ND_CALL_NAME_(name) #name,
    ND_CALL_ENTRIES(ND_CALL_NAME_)
#undef ND_CALL_NAME_
};

const char *nd_call_entry_name(nd_call_entry e) {
    return (unsigned)e < ND_CALL_COUNT ? entry_names[e] : "?";
}

static nd_status no_kernel(const nd_backend *be, const char *op) {
    return nd_fail(ND_ERR_UNSUPPORTED, "%s: no kernel on device '%s'", op, be->name);
}

/* The prologue of every wrapper: the entry must exist; r is the record
 * (NULL when not capturing). */
#define BEGIN(fn)                                                                   \
    if (!be->fn) return no_kernel(be, op);                                          \
    nd_graph_rec *r = nd_graph_capturing() ? nd_graph_rec_new(ND_CALL_##fn, be, op) : NULL
#define R(x) if (r) nd_graph_rec_tensor(r, (x), ND_ROLE_READ)
#define W(x) if (r) nd_graph_rec_tensor(r, (x), ND_ROLE_WRITE)
#define U(x) if (r) nd_graph_rec_tensor(r, (x), ND_ROLE_UPDATE)
#define DONE() if (r) nd_graph_rec_done(r)
#define T(k) (r->t[k])
/* a fused layer's residual: a fifth slot only the epilogue pass adds */
#define RES (r->nt > ND_LAYER_RES ? r->t[ND_LAYER_RES] : NULL)
/* A recorded call that fails poisons the capture: a replay would run it
 * (and fail, or write where eager never wrote) even if Lua caught the error. */
#define FINISH(call) finish(r, (call))

static nd_status finish(nd_graph_rec *r, nd_status st) {
    if (st != ND_OK && r) nd_graph_rec_failed(st);
    return st;
}

static void keep_value(nd_graph_rec *r, const void *v, nd_dtype dt) {
    if (r) memcpy(r->u.value, v, nd_dtype_size(dt));
}

nd_status nd_call_copy(const nd_backend *be, const char *op, nd_tensor *dst, const nd_tensor *src) {
    BEGIN(copy); W(dst); R(src); DONE();
    return FINISH(be->copy(dst, src));
}

nd_status nd_call_fused_elementwise(const nd_backend *be, const char *op, nd_ew_program *p,
                                    nd_tensor *const *ts) {
    if (!be->fused_elementwise) return no_kernel(be, op);
    if (nd_graph_capturing()) /* a record would need a program the graph owns: see the header */
        return nd_fail(ND_ERR_INTERNAL, "%s: an eager fused program while a graph is captured", op);
    return be->fused_elementwise(p, ts);
}

nd_status nd_call_fill(const nd_backend *be, const char *op, nd_tensor *dst, const void *value) {
    BEGIN(fill); W(dst); keep_value(r, value, dst->dtype); DONE();
    return FINISH(be->fill(dst, value));
}

nd_status nd_call_unary(const nd_backend *be, const char *op, nd_unary_op u, nd_tensor *out,
                        const nd_tensor *x) {
    BEGIN(unary); W(out); R(x); if (r) r->i[0] = u; DONE();
    return FINISH(be->unary(u, out, x));
}

nd_status nd_call_binary(const nd_backend *be, const char *op, nd_binary_op b, nd_tensor *out,
                         const nd_tensor *x, const nd_tensor *y) {
    BEGIN(binary); W(out); R(x); R(y); if (r) r->i[0] = b; DONE();
    return FINISH(be->binary(b, out, x, y));
}

nd_status nd_call_binary_scalar(const nd_backend *be, const char *op, nd_binary_op b, nd_tensor *out,
                                const nd_tensor *x, const void *s, int scalar_first) {
    BEGIN(binary_scalar); W(out); R(x);
    if (r) { r->i[0] = b; r->i[1] = scalar_first; }
    keep_value(r, s, x->dtype); DONE();
    return FINISH(be->binary_scalar(b, out, x, s, scalar_first));
}

nd_status nd_call_where(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *cond,
                        const nd_tensor *a, const nd_tensor *b) {
    BEGIN(where); W(out); R(cond); R(a); R(b); DONE();
    return FINISH(be->where(out, cond, a, b));
}

nd_status nd_call_clamp(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                        double lo, double hi) {
    BEGIN(clamp); W(out); R(x); if (r) { r->f[0] = lo; r->f[1] = hi; } DONE();
    return FINISH(be->clamp(out, x, lo, hi));
}

nd_status nd_call_reduce(const nd_backend *be, const char *op, nd_reduce_op rop, nd_tensor *out,
                         const nd_tensor *x, const bool *reduced, int correction) {
    BEGIN(reduce); W(out); R(x);
    if (r) {
        r->i[0] = rop;
        r->i[1] = correction;
        r->i[2] = reduced != NULL;
        if (reduced) memcpy(r->u.reduced, reduced, (size_t)x->ndim * sizeof *reduced);
    }
    DONE();
    return FINISH(be->reduce(rop, out, x, reduced, correction));
}

nd_status nd_call_max_dim(const nd_backend *be, const char *op, nd_tensor *values,
                          nd_tensor *indices, const nd_tensor *x, int dim, int is_min) {
    BEGIN(max_dim); W(values); W(indices); R(x); if (r) { r->i[0] = dim; r->i[1] = is_min; } DONE();
    return FINISH(be->max_dim(values, indices, x, dim, is_min));
}

nd_status nd_call_matmul(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *a,
                         const nd_tensor *b) {
    BEGIN(matmul); W(out); R(a); R(b); DONE();
    return FINISH(be->matmul(out, a, b));
}

nd_status nd_call_matmul_acc(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *a,
                             const nd_tensor *b) {
    BEGIN(matmul_acc); U(out); R(a); R(b); DONE();
    return FINISH(be->matmul_acc(out, a, b));
}

/* The indices' bounds as a host check (iv: the limit, the dim): the first
 * value outside [0, limit), named as the kernels name it. */
static nd_status check_index_bounds(const char *op, nd_tensor *const *t, int64_t *iv) {
    const nd_tensor *index = t[0];
    const int64_t n = nd_numel(index);
    if (n == 0 || index->dtype != ND_INT64) return ND_OK; /* (the kernel refuses another dtype) */
    int64_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return nd_fail(ND_ERR_MEMORY, "%s: out of memory checking the indices", op);
    nd_status st = nd_copy_to_buffer(index, v, (size_t)n * sizeof *v);
    for (int64_t i = 0; i < n && st == ND_OK; i++)
        if ((uint64_t)v[i] >= (uint64_t)iv[0]) st = nd_fail_index_bounds(op, index, i, v[i], (int)iv[1], iv[0]);
    free(v);
    return st;
}

/* While a capture records a CPU product of indices, their bounds also
 * become a host check record, before the op's own: graph_hoist.c moves it
 * to the top of a replay, so that a replay refused by an index out of range
 * (as the kernel would refuse it half way) changes nothing. (Eager calls,
 * and indices on a device, where the check would wait for the device, rely
 * on the kernel's own check.) */
static nd_status capture_index_check(const char *op, const nd_tensor *index, int64_t limit, int dim) {
    if (!nd_graph_capturing() || nd_get_device(index).type != ND_DEVICE_CPU) return ND_OK;
    nd_tensor *t[1] = {(nd_tensor *)index};
    int64_t iv[2] = {limit, dim};
    nd_status st = nd_host_check(op, check_index_bounds, t, 1, iv, 2);
    if (st != ND_OK) nd_graph_rec_failed(st); /* as the kernel's own failure would: the capture is invalid */
    return st;
}

nd_status nd_call_gather(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                         int dim, const nd_tensor *index) {
    if (be->gather) ND_TRY(capture_index_check(op, index, x->shape[dim], dim));
    BEGIN(gather); W(out); R(x); R(index); if (r) r->i[0] = dim; DONE();
    return FINISH(be->gather(out, x, dim, index));
}

nd_status nd_call_scatter(const nd_backend *be, const char *op, nd_tensor *out, int dim,
                          const nd_tensor *index, const nd_tensor *src, int accumulate) {
    if (be->scatter) ND_TRY(capture_index_check(op, index, out->shape[dim], dim));
    BEGIN(scatter); U(out); R(index); R(src); if (r) { r->i[0] = dim; r->i[1] = accumulate; } DONE();
    return FINISH(be->scatter(out, dim, index, src, accumulate));
}

nd_status nd_call_index_select(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, int dim, const nd_tensor *index) {
    if (be->index_select) ND_TRY(capture_index_check(op, index, x->shape[dim], dim));
    BEGIN(index_select); W(out); R(x); R(index); if (r) r->i[0] = dim; DONE();
    return FINISH(be->index_select(out, x, dim, index));
}

nd_status nd_call_index_add(const nd_backend *be, const char *op, nd_tensor *out, int dim,
                            const nd_tensor *index, const nd_tensor *src, double alpha) {
    if (be->index_add) ND_TRY(capture_index_check(op, index, out->shape[dim], dim));
    BEGIN(index_add); U(out); R(index); R(src); if (r) { r->i[0] = dim; r->f[0] = alpha; } DONE();
    return FINISH(be->index_add(out, dim, index, src, alpha));
}

nd_status nd_call_masked_fill(const nd_backend *be, const char *op, nd_tensor *out,
                              const nd_tensor *mask, double value) {
    BEGIN(masked_fill); U(out); R(mask); if (r) r->f[0] = value; DONE();
    return FINISH(be->masked_fill(out, mask, value));
}

nd_status nd_call_cumsum(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                         int dim) {
    BEGIN(cumsum); W(out); R(x); if (r) r->i[0] = dim; DONE();
    return FINISH(be->cumsum(out, x, dim));
}

nd_status nd_call_sort(const nd_backend *be, const char *op, nd_tensor *values, nd_tensor *indices,
                       const nd_tensor *x, int dim, int descending) {
    BEGIN(sort); W(values); W(indices); R(x); if (r) { r->i[0] = dim; r->i[1] = descending; } DONE();
    return FINISH(be->sort(values, indices, x, dim, descending));
}

nd_status nd_call_softmax(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                          int dim, bool log) {
    BEGIN(softmax); W(out); R(x); if (r) { r->i[0] = dim; r->i[1] = log; } DONE();
    return FINISH(be->softmax(out, x, dim, log));
}

nd_status nd_call_layer_norm(const nd_backend *be, const char *op, nd_tensor *y, nd_tensor *mean,
                             nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b, double eps) {
    BEGIN(layer_norm); W(y); W(mean); W(rstd); R(x); R(w); R(b); if (r) r->f[0] = eps; DONE();
    return FINISH(be->layer_norm(y, mean, rstd, x, w, b, eps));
}

nd_status nd_call_cross_entropy(const nd_backend *be, const char *op, nd_tensor *loss,
                                const nd_tensor *logits, const nd_tensor *labels, int64_t ignore,
                                double smoothing) {
    BEGIN(cross_entropy); W(loss); R(logits); R(labels);
    if (r) { r->i[0] = ignore; r->f[0] = smoothing; }
    DONE();
    return FINISH(be->cross_entropy(loss, logits, labels, ignore, smoothing));
}

nd_status nd_call_batch_norm(const nd_backend *be, const char *op, nd_tensor *y, nd_tensor *mean,
                             nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b, double eps, bool training) {
    BEGIN(batch_norm); W(y);
    if (training) { W(mean); W(rstd); } else { R(mean); R(rstd); }
    R(x); R(w); R(b);
    if (r) { r->f[0] = eps; r->i[0] = training; }
    DONE();
    return FINISH(be->batch_norm(y, mean, rstd, x, w, b, eps, training));
}

nd_status nd_call_layer_norm_backward(const nd_backend *be, const char *op, nd_tensor *dx,
                                      nd_tensor *dw, nd_tensor *db, const nd_tensor *g,
                                      const nd_tensor *x, const nd_tensor *w,
                                      const nd_tensor *mean, const nd_tensor *rstd) {
    BEGIN(layer_norm_backward); W(dx); W(dw); W(db); R(g); R(x); R(w); R(mean); R(rstd); DONE();
    return FINISH(be->layer_norm_backward(dx, dw, db, g, x, w, mean, rstd));
}

nd_status nd_call_batch_norm_backward(const nd_backend *be, const char *op, nd_tensor *dx,
                                      nd_tensor *dw, nd_tensor *db, const nd_tensor *g,
                                      const nd_tensor *x, const nd_tensor *w,
                                      const nd_tensor *mean, const nd_tensor *rstd, bool training) {
    BEGIN(batch_norm_backward); W(dx); W(dw); W(db); R(g); R(x); R(w); R(mean); R(rstd);
    if (r) r->i[0] = training;
    DONE();
    return FINISH(be->batch_norm_backward(dx, dw, db, g, x, w, mean, rstd, training));
}

nd_status nd_call_relu_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                const nd_tensor *g, const nd_tensor *y) {
    BEGIN(relu_backward); W(gx); R(g); R(y); DONE();
    return FINISH(be->relu_backward(gx, g, y));
}

nd_status nd_call_sgd_step(const nd_backend *be, const char *op, nd_tensor *p, const nd_tensor *grad,
                           nd_tensor *buf, const nd_sgd_hyper *h, bool first) {
    BEGIN(sgd_step); U(p); R(grad); U(buf);
    /* Replays never start a momentum buffer: the step after the captured
     * one finds it made, as the eager step would. */
    if (r) { r->u.sgd = *h; r->i[0] = 0; }
    DONE();
    return FINISH(be->sgd_step(p, grad, buf, h, first));
}

nd_status nd_call_adam_step(const nd_backend *be, const char *op, nd_tensor *p, const nd_tensor *grad,
                            nd_tensor *m, nd_tensor *v, const nd_adam_hyper *h) {
    if (!be->adam_step) return no_kernel(be, op);
    if (nd_graph_capturing())
        return nd_fail(ND_ERR_INTERNAL, "%s: the fused Adam step while a graph is captured", op);
    return be->adam_step(p, grad, m, v, h);
}

nd_status nd_call_amp_unscale(const nd_backend *be, const char *op, nd_tensor *g, double inv, bool *found_inf) {
    if (!be->amp_unscale) return no_kernel(be, op);
    if (nd_graph_capturing())
        return nd_fail(ND_ERR_INTERNAL, "%s: a gradient scaler's unscale while a graph is captured", op);
    return be->amp_unscale(g, inv, found_inf);
}

nd_status nd_call_cross_entropy_backward(const nd_backend *be, const char *op, nd_tensor *dlogits,
                                         const nd_tensor *logits, const nd_tensor *labels,
                                         const nd_tensor *wrow, int64_t ignore, double smoothing) {
    BEGIN(cross_entropy_backward); W(dlogits); R(logits); R(labels); R(wrow);
    if (r) { r->i[0] = ignore; r->f[0] = smoothing; }
    DONE();
    return FINISH(be->cross_entropy_backward(dlogits, logits, labels, wrow, ignore, smoothing));
}

nd_status nd_call_random(const nd_backend *be, const char *op, nd_tensor *out, nd_random_kind kind,
                         double a, double b, const nd_tensor *p, uint64_t seed, uint64_t offset) {
    BEGIN(random); W(out); R(p);
    if (r) { r->i[0] = kind; r->f[0] = a; r->f[1] = b; }
    DONE();
    return FINISH(be->random(out, kind, a, b, p, seed, offset));
}

nd_status nd_call_im2col(const nd_backend *be, const char *op, nd_tensor *cols, const nd_tensor *x,
                         const nd_conv_geom *g) {
    BEGIN(im2col); W(cols); R(x); if (r) r->u.conv = *g; DONE();
    return FINISH(be->im2col(cols, x, g));
}

nd_status nd_call_col2im(const nd_backend *be, const char *op, nd_tensor *x, const nd_tensor *cols,
                         const nd_conv_geom *g) {
    BEGIN(col2im); W(x); R(cols); if (r) r->u.conv = *g; DONE();
    return FINISH(be->col2im(x, cols, g));
}

nd_status nd_call_max_pool2d(const nd_backend *be, const char *op, nd_tensor *out,
                             nd_tensor *indices, const nd_tensor *x, const nd_pool_geom *p) {
    BEGIN(max_pool2d); W(out); W(indices); R(x); if (r) r->u.pool = *p; DONE();
    return FINISH(be->max_pool2d(out, indices, x, p));
}

nd_status nd_call_max_pool2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                      const nd_tensor *g, const nd_tensor *indices) {
    BEGIN(max_pool2d_backward); W(gx); R(g); R(indices); DONE();
    return FINISH(be->max_pool2d_backward(gx, g, indices));
}

nd_status nd_call_avg_pool2d(const nd_backend *be, const char *op, nd_tensor *out,
                             const nd_tensor *x, const nd_pool_geom *p) {
    BEGIN(avg_pool2d); W(out); R(x); if (r) r->u.pool = *p; DONE();
    return FINISH(be->avg_pool2d(out, x, p));
}

nd_status nd_call_avg_pool2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                      const nd_tensor *g, const nd_pool_geom *p) {
    BEGIN(avg_pool2d_backward); W(gx); R(g); if (r) r->u.pool = *p; DONE();
    return FINISH(be->avg_pool2d_backward(gx, g, p));
}

nd_status nd_call_conv2d_fused(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               const nd_conv_geom *g, int64_t groups, nd_activation act) {
    BEGIN(conv2d_fused); W(out); R(x); R(w); R(b);
    if (r) { r->u.conv = *g; r->i[0] = groups; r->i[1] = act; }
    DONE();
    return FINISH(be->conv2d_fused(out, x, w, b, g, groups, act, NULL));
}

nd_status nd_call_conv2d_depthwise(const nd_backend *be, const char *op, nd_tensor *out,
                                   const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                   const nd_conv_geom *g) {
    BEGIN(conv2d_depthwise); W(out); R(x); R(w); R(b);
    if (r) r->u.conv = *g;
    DONE();
    return FINISH(be->conv2d_depthwise(out, x, w, b, g));
}

nd_status nd_call_conv2d_depthwise_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                            nd_tensor *gw, const nd_tensor *dy,
                                            const nd_tensor *x, const nd_tensor *w,
                                            const nd_conv_geom *g) {
    BEGIN(conv2d_depthwise_backward); W(gx); W(gw); R(dy); R(x); R(w);
    if (r) r->u.conv = *g;
    DONE();
    return FINISH(be->conv2d_depthwise_backward(gx, gw, dy, x, w, g));
}

int64_t nd_call_conv2d_packed_numel(const nd_backend *be, const int64_t *xshape,
                                    const int64_t *wshape, nd_dtype dt, const nd_conv_geom *g,
                                    int64_t groups) {
    if (!be || !be->conv2d_packed_numel || !be->conv2d_prepack || !be->conv2d_fused_packed) return 0;
    return be->conv2d_packed_numel(xshape, wshape, dt, g, groups);
}

nd_status nd_call_conv2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                  nd_tensor *gw, nd_tensor *gb, const nd_tensor *dy,
                                  const nd_tensor *x, const nd_tensor *w, const nd_conv_geom *g,
                                  int64_t groups) {
    BEGIN(conv2d_backward); W(gx); W(gw); W(gb); R(dy); R(x); R(w);
    if (r) { r->u.conv = *g; r->i[0] = groups; }
    DONE();
    return FINISH(be->conv2d_backward(gx, gw, gb, dy, x, w, g, groups));
}

int nd_call_linear_join_align(const nd_backend *be, nd_dtype dt) {
    return be && be->linear_fused && be->linear_join_align ? be->linear_join_align(dt) : 0;
}

bool nd_call_linear_half_weight(const nd_backend *be, const nd_tensor *x, const nd_tensor *w) {
    return be && be->linear_fused && be->linear_half_weight && be->linear_half_weight(x, w);
}

nd_status nd_call_linalg(const nd_backend *be, const char *op, const nd_linalg_args *a,
                         nd_tensor *const *out, const nd_tensor *const *in) {
    if (!be->linalg) return no_kernel(be, op);
    if (nd_graph_capturing())
        return nd_fail(ND_ERR_INTERNAL, "%s: a LAPACK call cannot be recorded in a graph", op);
    return be->linalg(a, out, in);
}

nd_status nd_call_linear_fused(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               nd_activation act) {
    return nd_call_linear_fused_res(be, op, out, x, w, b, act, NULL);
}

nd_status nd_call_linear_fused_res(const nd_backend *be, const char *op, nd_tensor *out,
                                   const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                   nd_activation act, const nd_tensor *res) {
    BEGIN(linear_fused); W(out); R(x); R(w); R(b);
    if (res) R(res); /* the fifth slot, as the epilogue pass fills it (RES) */
    if (r) r->i[0] = act;
    DONE();
    return FINISH(be->linear_fused(out, x, w, b, act, res));
}

/* the fused attention's scalars in a record and back. Its dropout's
 * counters are not kept: a replay of the forward takes fresh ones, as the
 * eager call would (and as the random entry's replays do), and the
 * backward reads the forward's keeps, never the counters. */
static void attention_args_to_rec(nd_graph_rec *r, const nd_attention_args *a) {
    r->f[0] = a->scale;
    r->f[1] = a->dropout_p;
    r->i[0] = a->causal;
}
static nd_attention_args attention_args_of_rec(const nd_graph_rec *r) {
    return (nd_attention_args){.scale = r->f[0], .causal = r->i[0] != 0, .dropout_p = r->f[1]};
}

nd_status nd_call_attention(const nd_backend *be, const char *op, nd_tensor *out, nd_tensor *lse,
                            nd_tensor *keep, const nd_tensor *q, const nd_tensor *k,
                            const nd_tensor *v, const nd_tensor *mask, const nd_attention_args *a) {
    BEGIN(attention); W(out); W(lse); W(keep); R(q); R(k); R(v); R(mask);
    if (r) attention_args_to_rec(r, a);
    DONE();
    return FINISH(be->attention(out, lse, keep, q, k, v, mask, a));
}

nd_status nd_call_attention_backward(const nd_backend *be, const char *op, nd_tensor *dq,
                                     nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                     const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                     const nd_tensor *mask, const nd_tensor *out,
                                     const nd_tensor *lse, const nd_tensor *keep,
                                     const nd_attention_args *a) {
    if (a->dropout_p > 0 && !keep) /* (the op always keeps them) */
        return nd_fail(ND_ERR_INTERNAL, "%s: a backward with dropout needs the forward's keeps", op);
    BEGIN(attention_backward); W(dq); W(dk); W(dv); R(g); R(q); R(k); R(v); R(mask); R(out); R(lse);
    R(keep);
    if (r) attention_args_to_rec(r, a);
    DONE();
    return FINISH(be->attention_backward(dq, dk, dv, g, q, k, v, mask, out, lse, keep, a));
}

nd_status nd_call_lstm_cell(const nd_backend *be, const char *op, nd_tensor *h, nd_tensor *c2,
                            const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c) {
    BEGIN(lstm_cell); W(h); W(c2); R(xw); R(hw); R(c); DONE();
    return FINISH(be->lstm_cell(h, c2, xw, hw, c));
}

nd_status nd_call_lstm_cell_backward(const nd_backend *be, const char *op, nd_tensor *dgates,
                                     nd_tensor *dc, const nd_tensor *gh, const nd_tensor *gc,
                                     const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                     const nd_tensor *c2) {
    BEGIN(lstm_cell_backward); W(dgates); W(dc); R(gh); R(gc); R(xw); R(hw); R(c); R(c2); DONE();
    return FINISH(be->lstm_cell_backward(dgates, dc, gh, gc, xw, hw, c, c2));
}

nd_status nd_call_gru_cell(const nd_backend *be, const char *op, nd_tensor *out,
                           const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h) {
    BEGIN(gru_cell); W(out); R(xw); R(hw); R(h); DONE();
    return FINISH(be->gru_cell(out, xw, hw, h));
}

nd_status nd_call_gru_cell_backward(const nd_backend *be, const char *op, nd_tensor *dxw,
                                    nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                    const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h,
                                    bool dh_add) {
    BEGIN(gru_cell_backward); W(dxw); W(dhw);
    if (r) nd_graph_rec_tensor(r, dh, dh_add ? ND_ROLE_UPDATE : ND_ROLE_WRITE); /* added into: read too */
    R(g); R(xw); R(hw); R(h);
    if (r) r->i[0] = dh_add;
    DONE();
    return FINISH(be->gru_cell_backward(dxw, dhw, dh, g, xw, hw, h, dh_add));
}

static size_t bytes_of(const nd_tensor *t) { return (size_t)nd_numel(t) * nd_dtype_size(t->dtype); }
static size_t byte_offset(const nd_tensor *t) { return (size_t)t->offset * nd_dtype_size(t->dtype); }

nd_status nd_call_write(const nd_backend *be, const char *op, nd_tensor *dst, const nd_tensor *host) {
    BEGIN(write); W(dst); R(host); DONE();
    size_t n = bytes_of(dst);
    return FINISH(n ? be->write(dst->storage, byte_offset(dst), nd_ptr(host), n) : ND_OK);
}

nd_status nd_call_read(const nd_backend *be, const char *op, nd_tensor *host, const nd_tensor *src) {
    BEGIN(read); W(host); R(src); DONE();
    size_t n = bytes_of(src);
    return FINISH(n ? be->read(src->storage, byte_offset(src), nd_ptr(host), n) : ND_OK);
}

/* ---- prepared launches ----
 * A record on a backend with prepared launches (OpenCL) is recorded on two
 * replays; when both enqueued the same commands with the same arguments
 * over the same buffers, later replays enqueue them directly, without the
 * backend call (no kernel lookup, geometry or argument setting). Calls that
 * run host code (checks, reads, writes) or draw random numbers (their
 * counter changes each call) are never prepared. */
static bool preparable(const nd_graph_rec *r) {
    const nd_call_entry e = r->entry;
    if (e == ND_CALL_attention && r->f[1] > 0) return false; /* its dropout draws */
    return e != ND_CALL_host_check && e != ND_CALL_read && e != ND_CALL_write && e != ND_CALL_random;
}

static bool same_buffers(const nd_graph_rec *r) {
    for (int k = 0; k < r->nt; k++)
        if ((r->t[k] ? r->t[k]->storage->data : NULL) != r->prep_data[k]) return false;
    return true;
}

void nd_graph_rec_unprepare(nd_graph_rec *r) {
    if (r->prepared && r->be && r->be->prepared_free) r->be->prepared_free(r->prepared);
    r->prepared = NULL;
    r->prep_state = ND_PREP_NONE;
}

nd_status nd_graph_rec_run(nd_graph_rec *r) {
    const nd_backend *be = r->be;
    if (!be || !be->prepare_begin || r->prep_state == ND_PREP_NEVER || !preparable(r))
        return nd_graph_rec_replay(r);
    if (r->prep_state == ND_PREP_READY) {
        if (same_buffers(r)) return be->prepared_run(r->prepared);
        nd_graph_rec_unprepare(r); /* the plan gave it new buffers: record again */
    }
    ND_TRY(be->prepare_begin());
    nd_status st = nd_graph_rec_replay(r);
    void *p = be->prepare_end(st == ND_OK);
    if (st != ND_OK || !p) {
        if (p) be->prepared_free(p);
        if (st == ND_OK) {
            nd_graph_rec_unprepare(r);
            r->prep_state = ND_PREP_NEVER;
        }
        return st;
    }
    if (r->prep_state == ND_PREP_NONE) {
        r->prepared = p;
        r->prep_state = ND_PREP_FIRST;
        for (int k = 0; k < r->nt; k++) r->prep_data[k] = r->t[k] ? r->t[k]->storage->data : NULL;
        return ND_OK;
    }
    bool agree = same_buffers(r) && be->prepared_equal(r->prepared, p);
    be->prepared_free(p);
    if (agree) r->prep_state = ND_PREP_READY;
    else {
        nd_graph_rec_unprepare(r);
        r->prep_state = ND_PREP_NEVER;
    }
    return ND_OK;
}

void nd_graph_rec_release(nd_graph_rec *r) {
    nd_graph_rec_unprepare(r);
    for (int k = 0; k < r->nt; k++) nd_release(r->t[k]);
    r->nt = 0;
    free(r->prog);
    r->prog = NULL;
}

bool nd_graph_rec_gemm(const nd_graph_rec *r) {
    const nd_call_entry e = r->entry;
    return r->be && r->be->gemm_hint &&
           (e == ND_CALL_matmul || e == ND_CALL_matmul_acc || e == ND_CALL_linear_fused);
}

static nd_status gemm_call(const nd_graph_rec *r) {
    const nd_backend *be = r->be;
    if (r->entry == ND_CALL_matmul) return be->matmul(T(0), T(1), T(2));
    if (r->entry == ND_CALL_matmul_acc) return be->matmul_acc(T(0), T(1), T(2));
    return be->linear_fused(T(0), T(1), T(2), T(3), (nd_activation)r->i[0], RES);
}

/* A product with its tuned hint set around the call (none: as eager runs it) */
static nd_status gemm_replay(const nd_graph_rec *r) {
    const nd_gemm_hint *h = &r->hint;
    if (!nd_graph_rec_gemm(r) || !(h->threads || h->mc || h->order || h->split)) return gemm_call(r);
    r->be->gemm_hint(h);
    nd_status st = gemm_call(r);
    r->be->gemm_hint(NULL);
    return st;
}

nd_status nd_graph_rec_replay(const nd_graph_rec *r) {
    const nd_backend *be = r->be;
    switch (r->entry) {
    case ND_CALL_copy: return be->copy(T(0), T(1));
    case ND_CALL_fill: return be->fill(T(0), r->u.value);
    case ND_CALL_unary: return be->unary((nd_unary_op)r->i[0], T(0), T(1));
    case ND_CALL_binary: return be->binary((nd_binary_op)r->i[0], T(0), T(1), T(2));
    case ND_CALL_binary_scalar:
        return be->binary_scalar((nd_binary_op)r->i[0], T(0), T(1), r->u.value, (int)r->i[1]);
    case ND_CALL_where: return be->where(T(0), T(1), T(2), T(3));
    case ND_CALL_clamp: return be->clamp(T(0), T(1), r->f[0], r->f[1]);
    case ND_CALL_reduce:
        return be->reduce((nd_reduce_op)r->i[0], T(0), T(1), r->i[2] ? r->u.reduced : NULL, (int)r->i[1]);
    case ND_CALL_max_dim: return be->max_dim(T(0), T(1), T(2), (int)r->i[0], (int)r->i[1]);
    case ND_CALL_matmul: case ND_CALL_matmul_acc: case ND_CALL_linear_fused: return gemm_replay(r);
    case ND_CALL_reduce_sum_acc: return be->reduce_sum_acc(T(0), T(1), r->i[2] ? r->u.reduced : NULL);
    case ND_CALL_gather: return be->gather(T(0), T(1), (int)r->i[0], T(2));
    case ND_CALL_scatter: return be->scatter(T(0), (int)r->i[0], T(1), T(2), (int)r->i[1]);
    case ND_CALL_index_select: return be->index_select(T(0), T(1), (int)r->i[0], T(2));
    case ND_CALL_index_add: return be->index_add(T(0), (int)r->i[0], T(1), T(2), r->f[0]);
    case ND_CALL_masked_fill: return be->masked_fill(T(0), T(1), r->f[0]);
    case ND_CALL_cumsum: return be->cumsum(T(0), T(1), (int)r->i[0]);
    case ND_CALL_sort: return be->sort(T(0), T(1), T(2), (int)r->i[0], (int)r->i[1]);
    case ND_CALL_softmax: return be->softmax(T(0), T(1), (int)r->i[0], r->i[1] != 0);
    case ND_CALL_layer_norm: return be->layer_norm(T(0), T(1), T(2), T(3), T(4), T(5), r->f[0]);
    case ND_CALL_cross_entropy: return be->cross_entropy(T(0), T(1), T(2), r->i[0], r->f[0]);
    case ND_CALL_batch_norm:
        return be->batch_norm(T(0), T(1), T(2), T(3), T(4), T(5), r->f[0], r->i[0] != 0);
    case ND_CALL_layer_norm_backward:
        return be->layer_norm_backward(T(0), T(1), T(2), T(3), T(4), T(5), T(6), T(7));
    case ND_CALL_batch_norm_backward:
        return be->batch_norm_backward(T(0), T(1), T(2), T(3), T(4), T(5), T(6), T(7), r->i[0] != 0);
    case ND_CALL_relu_backward: return be->relu_backward(T(0), T(1), T(2));
    case ND_CALL_sgd_step: return be->sgd_step(T(0), T(1), T(2), &r->u.sgd, r->i[0] != 0);
    case ND_CALL_cross_entropy_backward:
        return be->cross_entropy_backward(T(0), T(1), T(2), T(3), r->i[0], r->f[0]);
    case ND_CALL_random: {
        uint64_t seed, offset; /* fresh counters, as the eager call would take */
        nd_rng_reserve(nd_numel(T(0)), &seed, &offset);
        return be->random(T(0), (nd_random_kind)r->i[0], r->f[0], r->f[1], T(1), seed, offset);
    }
    case ND_CALL_im2col: return be->im2col(T(0), T(1), &r->u.conv);
    case ND_CALL_col2im: return be->col2im(T(0), T(1), &r->u.conv);
    case ND_CALL_max_pool2d: return be->max_pool2d(T(0), T(1), T(2), &r->u.pool);
    case ND_CALL_max_pool2d_backward: return be->max_pool2d_backward(T(0), T(1), T(2));
    case ND_CALL_avg_pool2d: return be->avg_pool2d(T(0), T(1), &r->u.pool);
    case ND_CALL_avg_pool2d_backward: return be->avg_pool2d_backward(T(0), T(1), &r->u.pool);
    case ND_CALL_conv2d_fused:
        return be->conv2d_fused(T(0), T(1), T(2), T(3), &r->u.conv, r->i[0], (nd_activation)r->i[1], RES);
    case ND_CALL_conv2d_prepack: /* i: the input's shape, then groups */
        return be->conv2d_prepack(T(0), T(1), r->i, &r->u.conv, r->i[4]);
    case ND_CALL_conv2d_fused_packed:
        return be->conv2d_fused_packed(T(0), T(1), T(2), T(3), &r->u.conv, r->i[0], (nd_activation)r->i[1], RES);
    case ND_CALL_conv2d_backward:
        return be->conv2d_backward(T(0), T(1), T(2), T(3), T(4), T(5), &r->u.conv, r->i[0]);
    case ND_CALL_conv2d_depthwise: return be->conv2d_depthwise(T(0), T(1), T(2), T(3), &r->u.conv);
    case ND_CALL_conv2d_depthwise_backward:
        return be->conv2d_depthwise_backward(T(0), T(1), T(2), T(3), T(4), &r->u.conv);
    case ND_CALL_attention: {
        nd_attention_args a = attention_args_of_rec(r);
        if (a.dropout_p > 0) /* fresh counters: the weights of q (T(3)) by the keys (k, T(4)) */
            nd_rng_reserve(T(3)->shape[0] * T(3)->shape[1] * T(3)->shape[2] * T(4)->shape[2], &a.seed,
                           &a.offset);
        return be->attention(T(0), T(1), T(2), T(3), T(4), T(5), T(6), &a);
    }
    case ND_CALL_lstm_cell: return be->lstm_cell(T(0), T(1), T(2), T(3), T(4));
    case ND_CALL_lstm_cell_backward:
        return be->lstm_cell_backward(T(0), T(1), T(2), T(3), T(4), T(5), T(6), T(7));
    case ND_CALL_gru_cell: return be->gru_cell(T(0), T(1), T(2), T(3));
    case ND_CALL_gru_cell_backward:
        return be->gru_cell_backward(T(0), T(1), T(2), T(3), T(4), T(5), T(6), r->i[0] != 0);
    case ND_CALL_attention_backward: {
        nd_attention_args a = attention_args_of_rec(r);
        return be->attention_backward(T(0), T(1), T(2), T(3), T(4), T(5), T(6), T(7), T(8), T(9), T(10),
                                      &a);
    }
    case ND_CALL_write: {
        size_t n = bytes_of(T(0));
        return n ? be->write(T(0)->storage, byte_offset(T(0)), nd_ptr(T(1)), n) : ND_OK;
    }
    case ND_CALL_read: {
        size_t n = bytes_of(T(1));
        return n ? be->read(T(1)->storage, byte_offset(T(1)), nd_ptr(T(0)), n) : ND_OK;
    }
    case ND_CALL_host_check: {
        int64_t iv[6];
        memcpy(iv, r->i, sizeof iv);
        return r->check(r->op, r->t, iv);
    }
    case ND_CALL_fused_elementwise: return be->fused_elementwise(r->prog, r->t);
    case ND_CALL_fused_rows: {
        nd_rows_op op = {.y = T(0)};
        if (r->i[ND_ROWS_REC_ENTRY] == ND_CALL_softmax) {
            op.kind = ND_ROWS_SOFTMAX;
            op.log = r->i[1] != 0;
        } else {
            op.kind = ND_ROWS_LAYER_NORM;
            op.mean = T(1);
            op.rstd = T(2);
            op.w = T(4);
            op.b = T(5);
            op.eps = r->f[0];
        }
        return be->fused_rows(&op, r->prog, r->t + r->i[ND_ROWS_REC_BASE], (int)r->i[ND_ROWS_REC_X]);
    }
    case ND_CALL_COUNT: break;
    }
    return nd_fail(ND_ERR_INTERNAL, "graph replay: record of unknown kind %d", (int)r->entry);
}
