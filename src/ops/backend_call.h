/* backend_call.h - how ops call a backend, and the graph capture behind it.
 *
 * Every op ends in one backend call through ND_BACKEND_CALL (never be->fn
 * directly): nd_call_<fn> checks that the backend has the entry, and while a
 * graph is being captured (nd.compile, graph.c) it also appends a record of
 * the call - the entry, its tensors (headers copied, storages retained) and
 * its scalar arguments - so that nd_graph_replay can run the same kernels on
 * the same buffers again without Lua, op checks or allocations. */
#ifndef ND_BACKEND_CALL_H
#define ND_BACKEND_CALL_H

#include "backend.h"

/* Calls be->fn (recording it while a capture is on), or fails with
 * "<op>: no kernel on device <name>" when the backend lacks it. */
#define ND_BACKEND_CALL(be, fn, opname, ...) nd_call_##fn((be), (opname), __VA_ARGS__)

/* The backend entries a record can hold (the order is the enum's).
 * fused_elementwise and fused_rows records are made by the fuse pass (graph_fuse.c) and
 * reduce_sum_acc ones by the epilogue pass (graph_epilogue.c), never by an
 * op; matmul_acc ones by that pass and by nn.LSTM's layer (op_rnn_layer.c). */
#define ND_CALL_ENTRIES(X) \
    X(copy) X(fill) X(unary) X(binary) X(binary_scalar) X(where) X(clamp) X(reduce) X(max_dim) \
    X(matmul) X(gather) X(scatter) X(index_select) X(index_add) X(masked_fill) X(cumsum) X(sort) \
    X(softmax) X(layer_norm) X(cross_entropy) X(batch_norm) X(layer_norm_backward) \
    X(batch_norm_backward) X(relu_backward) X(sgd_step) X(cross_entropy_backward) X(random) \
    X(im2col) X(col2im) X(max_pool2d) X(max_pool2d_backward) X(avg_pool2d) X(avg_pool2d_backward) \
    X(conv2d_fused) X(conv2d_backward) X(linear_fused) X(write) X(read) X(host_check) \
    X(conv2d_prepack) X(conv2d_fused_packed) X(conv2d_depthwise) X(conv2d_depthwise_backward) \
    X(fused_elementwise) X(matmul_acc) X(reduce_sum_acc) X(attention) X(fused_rows) \
    X(attention_backward) X(lstm_cell) X(lstm_cell_backward) X(gru_cell) X(gru_cell_backward)

typedef enum {
#define ND_CALL_ENUM_(name) ND_CALL_##name,
    ND_CALL_ENTRIES(ND_CALL_ENUM_)
#undef ND_CALL_ENUM_
    ND_CALL_COUNT
} nd_call_entry;

const char *nd_call_entry_name(nd_call_entry e);

/* An eager run of a fused elementwise program (ts[0] written, the rest
 * read), for ops whose formula is a chain of elementwise kernels. Not while
 * a graph is being captured (an error then: the caller runs the unfused
 * kernels, which the capture records and its fuse pass fuses itself). */
nd_status nd_call_fused_elementwise(const nd_backend *be, const char *op, nd_ew_program *p,
                                    nd_tensor *const *ts);
nd_status nd_call_copy(const nd_backend *be, const char *op, nd_tensor *dst, const nd_tensor *src);
nd_status nd_call_fill(const nd_backend *be, const char *op, nd_tensor *dst, const void *value);
nd_status nd_call_unary(const nd_backend *be, const char *op, nd_unary_op u, nd_tensor *out,
                        const nd_tensor *x);
nd_status nd_call_binary(const nd_backend *be, const char *op, nd_binary_op b, nd_tensor *out,
                         const nd_tensor *x, const nd_tensor *y);
nd_status nd_call_binary_scalar(const nd_backend *be, const char *op, nd_binary_op b, nd_tensor *out,
                                const nd_tensor *x, const void *s, int scalar_first);
nd_status nd_call_where(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *cond,
                        const nd_tensor *a, const nd_tensor *b);
nd_status nd_call_clamp(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                        double lo, double hi);
nd_status nd_call_reduce(const nd_backend *be, const char *op, nd_reduce_op r, nd_tensor *out,
                         const nd_tensor *x, const bool *reduced, int correction);
nd_status nd_call_max_dim(const nd_backend *be, const char *op, nd_tensor *values,
                          nd_tensor *indices, const nd_tensor *x, int dim, int is_min);
nd_status nd_call_matmul(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *a,
                         const nd_tensor *b);
/* out += a @ b (bit for bit a matmul then an add; nn.LSTM's layer adds each
 * step's product into its gates, and its weight gradient's second part) */
nd_status nd_call_matmul_acc(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *a,
                             const nd_tensor *b);
nd_status nd_call_gather(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                         int dim, const nd_tensor *index);
nd_status nd_call_scatter(const nd_backend *be, const char *op, nd_tensor *out, int dim,
                          const nd_tensor *index, const nd_tensor *src, int accumulate);
nd_status nd_call_index_select(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, int dim, const nd_tensor *index);
nd_status nd_call_index_add(const nd_backend *be, const char *op, nd_tensor *out, int dim,
                            const nd_tensor *index, const nd_tensor *src, double alpha);
nd_status nd_call_masked_fill(const nd_backend *be, const char *op, nd_tensor *out,
                              const nd_tensor *mask, double value);
nd_status nd_call_cumsum(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                         int dim);
nd_status nd_call_sort(const nd_backend *be, const char *op, nd_tensor *values, nd_tensor *indices,
                       const nd_tensor *x, int dim, int descending);
nd_status nd_call_softmax(const nd_backend *be, const char *op, nd_tensor *out, const nd_tensor *x,
                          int dim, bool log);
nd_status nd_call_layer_norm(const nd_backend *be, const char *op, nd_tensor *y, nd_tensor *mean,
                             nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b, double eps);
nd_status nd_call_cross_entropy(const nd_backend *be, const char *op, nd_tensor *loss,
                                const nd_tensor *logits, const nd_tensor *labels, int64_t ignore,
                                double smoothing);
nd_status nd_call_batch_norm(const nd_backend *be, const char *op, nd_tensor *y, nd_tensor *mean,
                             nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b, double eps, bool training);
nd_status nd_call_layer_norm_backward(const nd_backend *be, const char *op, nd_tensor *dx,
                                      nd_tensor *dw, nd_tensor *db, const nd_tensor *g,
                                      const nd_tensor *x, const nd_tensor *w,
                                      const nd_tensor *mean, const nd_tensor *rstd);
nd_status nd_call_batch_norm_backward(const nd_backend *be, const char *op, nd_tensor *dx,
                                      nd_tensor *dw, nd_tensor *db, const nd_tensor *g,
                                      const nd_tensor *x, const nd_tensor *w,
                                      const nd_tensor *mean, const nd_tensor *rstd, bool training);
nd_status nd_call_relu_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                const nd_tensor *g, const nd_tensor *y);
nd_status nd_call_sgd_step(const nd_backend *be, const char *op, nd_tensor *p, const nd_tensor *grad,
                           nd_tensor *buf, const nd_sgd_hyper *h, bool first);
/* Eager only: its factors change with the step count, so a replay could not
 * repeat it (an error while a graph is captured; nd.optim.Adam composes the
 * update there, from factors a hook refreshes). */
nd_status nd_call_adam_step(const nd_backend *be, const char *op, nd_tensor *p, const nd_tensor *grad,
                            nd_tensor *m, nd_tensor *v, const nd_adam_hyper *h);
/* Eager only: its result is a flag on the host, which a replay could not
 * give back (an error while a graph is captured; the scaler's unscale_ is a
 * graph break). */
nd_status nd_call_amp_unscale(const nd_backend *be, const char *op, nd_tensor *g, double inv, bool *found_inf);
nd_status nd_call_cross_entropy_backward(const nd_backend *be, const char *op, nd_tensor *dlogits,
                                         const nd_tensor *logits, const nd_tensor *labels,
                                         const nd_tensor *wrow, int64_t ignore, double smoothing);
nd_status nd_call_random(const nd_backend *be, const char *op, nd_tensor *out, nd_random_kind kind,
                         double a, double b, const nd_tensor *p, uint64_t seed, uint64_t offset);
nd_status nd_call_im2col(const nd_backend *be, const char *op, nd_tensor *cols, const nd_tensor *x,
                         const nd_conv_geom *g);
nd_status nd_call_col2im(const nd_backend *be, const char *op, nd_tensor *x, const nd_tensor *cols,
                         const nd_conv_geom *g);
nd_status nd_call_max_pool2d(const nd_backend *be, const char *op, nd_tensor *out,
                             nd_tensor *indices, const nd_tensor *x, const nd_pool_geom *p);
nd_status nd_call_max_pool2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                      const nd_tensor *g, const nd_tensor *indices);
nd_status nd_call_avg_pool2d(const nd_backend *be, const char *op, nd_tensor *out,
                             const nd_tensor *x, const nd_pool_geom *p);
nd_status nd_call_avg_pool2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                      const nd_tensor *g, const nd_pool_geom *p);
nd_status nd_call_conv2d_fused(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               const nd_conv_geom *g, int64_t groups, nd_activation act);
/* The elements of conv2d_fused's weight prepacked for an input of shape
 * xshape (0: none; a query, not recorded). */
int64_t nd_call_conv2d_packed_numel(const nd_backend *be, const int64_t *xshape,
                                    const int64_t *wshape, nd_dtype dt, const nd_conv_geom *g,
                                    int64_t groups);
nd_status nd_call_conv2d_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                  nd_tensor *gw, nd_tensor *gb, const nd_tensor *dy,
                                  const nd_tensor *x, const nd_tensor *w, const nd_conv_geom *g,
                                  int64_t groups);
nd_status nd_call_conv2d_depthwise(const nd_backend *be, const char *op, nd_tensor *out,
                                   const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                   const nd_conv_geom *g);
nd_status nd_call_conv2d_depthwise_backward(const nd_backend *be, const char *op, nd_tensor *gx,
                                            nd_tensor *gw, const nd_tensor *dy,
                                            const nd_tensor *x, const nd_tensor *w,
                                            const nd_conv_geom *g);
/* The backend's linear_join_align(dt), 0 where it has none (a query, not recorded). */
int nd_call_linear_join_align(const nd_backend *be, nd_dtype dt);
/* The backend's linear_half_weight(x, w), false where it has none (a query,
 * not recorded: a capture records the linear_fused call it leads to). */
bool nd_call_linear_half_weight(const nd_backend *be, const nd_tensor *x, const nd_tensor *w);
nd_status nd_call_linear_fused(const nd_backend *be, const char *op, nd_tensor *out,
                               const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               nd_activation act);
/* the same with res (M, O) contiguous, not out's memory, added last:
 * out = act(x w^T + b) + res (nn.LSTM's and nn.GRU's layers add each step's
 * state gradient into the one that flows in) */
nd_status nd_call_linear_fused_res(const nd_backend *be, const char *op, nd_tensor *out,
                                   const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                   nd_activation act, const nd_tensor *res);
nd_status nd_call_attention(const nd_backend *be, const char *op, nd_tensor *out, nd_tensor *lse,
                            nd_tensor *keep, const nd_tensor *q, const nd_tensor *k,
                            const nd_tensor *v, const nd_tensor *mask, const nd_attention_args *a);
nd_status nd_call_lstm_cell(const nd_backend *be, const char *op, nd_tensor *h, nd_tensor *c2,
                            const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c);
nd_status nd_call_lstm_cell_backward(const nd_backend *be, const char *op, nd_tensor *dgates,
                                     nd_tensor *dc, const nd_tensor *gh, const nd_tensor *gc,
                                     const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                     const nd_tensor *c2);
nd_status nd_call_gru_cell(const nd_backend *be, const char *op, nd_tensor *out,
                           const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h);
/* dh_add: dh += the state's gradient (backend.h) */
nd_status nd_call_gru_cell_backward(const nd_backend *be, const char *op, nd_tensor *dxw,
                                    nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                    const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h,
                                    bool dh_add);
nd_status nd_call_attention_backward(const nd_backend *be, const char *op, nd_tensor *dq,
                                     nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                     const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                     const nd_tensor *mask, const nd_tensor *out,
                                     const nd_tensor *lse, const nd_tensor *keep,
                                     const nd_attention_args *a);
/* nd.linalg's LAPACK call (op_linalg.c). Never recorded: the op refuses a
 * capture before it (a graph break: its errors come from the factorization's
 * info, read on the host), so a capture reaching here is an internal error. */
nd_status nd_call_linalg(const nd_backend *be, const char *op, const nd_linalg_args *a,
                         nd_tensor *const *out, const nd_tensor *const *in);
/* Transfers as tensors (the backend's read/write take storages and bytes):
 * dst (device, contiguous) = host (cpu, contiguous, same numel), and the
 * reverse. Recorded with both tensors, so a replay moves the current
 * contents, never the bytes seen at capture. */
nd_status nd_call_write(const nd_backend *be, const char *op, nd_tensor *dst, const nd_tensor *host);
nd_status nd_call_read(const nd_backend *be, const char *op, nd_tensor *host, const nd_tensor *src);

/* ---- host checks ----
 * A check an op makes by reading tensor values on the host (labels in
 * range, ...). nd_host_check runs fn now and, while capturing, records it so
 * that every replay runs it again on the then-current values: a replay must
 * refuse what eager would refuse. fn may update iv (ni values, kept in the
 * record as fn left them). Reading values on the host any other way while
 * capturing is a graph break (nd_graph_check_host_read). */
typedef nd_status (*nd_host_check_fn)(const char *op, nd_tensor *const *t, int64_t *iv);
nd_status nd_host_check(const char *op, nd_host_check_fn fn, nd_tensor *const *t, int nt,
                        int64_t *iv, int ni);

/* ---- the capture state (graph.c) ---- */
/* leaf->grad is about to change (the autograd engine accumulates into it,
 * or it is assigned): a capture notes the leaf so that every replay restores
 * leaf->grad to the tensor the capture left there. With reads_old, fails
 * when the old gradient predates the capture (the step would add to a
 * gradient from before the call, which a replay cannot see). */
nd_status nd_graph_note_leaf_grad(nd_tensor *leaf, bool reads_old);
/* The next n values of the global random stream (op_random.c); replays of a
 * random kernel draw fresh counters as eager calls do. */
void nd_rng_reserve(int64_t count, uint64_t *seed, uint64_t *offset);

#endif
