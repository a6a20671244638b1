/* cpu_kernels.h - the CPU backend's kernels; cpu_backend.c puts them in the
 * table. Each has the signature of its nd_backend entry (backend.h). */
#ifndef ND_CPU_KERNELS_H
#define ND_CPU_KERNELS_H

#include "backend.h"
#include "cpu_loop.h"
#include "cpu_threads.h"

/* cpu_copy.c */
nd_status nd_cpu_copy(nd_tensor *dst, const nd_tensor *src);
/* A fresh contiguous copy of t (a backend must not call the contiguous op). */
nd_status nd_cpu_contiguous(const nd_tensor *t, nd_tensor **out);
nd_status nd_cpu_fill(nd_tensor *dst, const void *value);
/* cpu_elementwise.c */
nd_status nd_cpu_unary(nd_unary_op op, nd_tensor *out, const nd_tensor *x);
nd_status nd_cpu_binary(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
nd_status nd_cpu_binary_scalar(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                               int scalar_first);
nd_status nd_cpu_where(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a,
                       const nd_tensor *b);
nd_status nd_cpu_clamp(nd_tensor *out, const nd_tensor *x, double lo, double hi);
nd_status nd_cpu_relu_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *y);
/* Their inner loops (cpu_loop.h), which fused runs reuse so that a fused
 * step computes exactly what its kernel does; NULL where no kernel exists.
 * where's ctx: the element size (size_t); clamp's: an nd_cpu_clamp_ctx. */
nd_inner_fn nd_cpu_unary_inner(nd_unary_op op, nd_dtype dt);
nd_inner_fn nd_cpu_binary_inner(nd_binary_op op, nd_dtype dt);
nd_inner_fn nd_cpu_relu_backward_inner(nd_dtype dt);
void nd_cpu_where_inner(char **p, const int64_t *s, int64_t n, void *ctx);
typedef struct { double lo, hi; nd_dtype dt; } nd_cpu_clamp_ctx;
void nd_cpu_clamp_inner(char **p, const int64_t *s, int64_t n, void *ctx);
/* cpu_fused_elementwise.c */
nd_status nd_cpu_fused_elementwise(nd_ew_program *p, nd_tensor *const *ts);
/* cpu_fused_rows.c */
nd_status nd_cpu_fused_rows(const nd_rows_op *op, nd_ew_program *p, nd_tensor *const *ts, int x_slot);
/* One row of the softmax / layer norm kernels (cpu_softmax.c, cpu_norm.c):
 * what their whole-tensor kernels compute for each row, contiguous rows. */
void nd_cpu_softmax_row(nd_dtype dt, const void *x, void *y, int64_t n, bool want_log);
void nd_cpu_layer_norm_row(nd_dtype dt, const void *x, void *y, int64_t cols, const void *w,
                           const void *b, double eps, void *mean, void *rstd);
nd_status nd_cpu_sgd_step(nd_tensor *p, const nd_tensor *grad, nd_tensor *buf,
                          const nd_sgd_hyper *h, bool first); /* cpu_optim.c */
nd_status nd_cpu_amp_unscale(nd_tensor *g, double inv, bool *found_inf);
nd_status nd_cpu_adam_step(nd_tensor *p, const nd_tensor *grad, nd_tensor *m, nd_tensor *v,
                           const nd_adam_hyper *h);             /* cpu_optim.c */
/* cpu_reduce.c */
nd_status nd_cpu_reduce(nd_reduce_op op, nd_tensor *out, const nd_tensor *x, const bool *reduced,
                        int correction);
nd_status nd_cpu_max_dim(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                         int is_min);
/* cpu_matmul.c */
nd_status nd_cpu_matmul(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
nd_status nd_cpu_matmul_acc(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
/* cpu_index.c */
nd_status nd_cpu_gather(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
nd_status nd_cpu_scatter(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                         int accumulate);
nd_status nd_cpu_index_select(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
nd_status nd_cpu_index_add(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                           double alpha);
nd_status nd_cpu_masked_fill(nd_tensor *out, const nd_tensor *mask, double value);
/* cpu_scan_sort.c */
nd_status nd_cpu_cumsum(nd_tensor *out, const nd_tensor *x, int dim);
nd_status nd_cpu_sort(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                      int descending);
/* cpu_linalg.c: nd.linalg's LAPACK calls (backend.h, nd_linalg_args) */
nd_status nd_cpu_linalg(const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in);
/* cpu_softmax.c */
nd_status nd_cpu_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool log);
/* cpu_norm.c */
nd_status nd_cpu_layer_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps);
nd_status nd_cpu_cross_entropy(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels,
                               int64_t ignore, double smoothing);
nd_status nd_cpu_batch_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps, bool training);
nd_status nd_cpu_layer_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd);
nd_status nd_cpu_batch_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd, bool training);
nd_status nd_cpu_cross_entropy_backward(nd_tensor *dlogits, const nd_tensor *logits,
                                        const nd_tensor *labels, const nd_tensor *wrow,
                                        int64_t ignore, double smoothing);
/* cpu_batch_norm_slab.c: cpu_norm.c's batch norm kernels hand over maps
 * with fewer pixels per channel than this */
#define BN_SLAB_MAX_SP 16
nd_status nd_cpu_batch_norm_slab(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd,
                                 const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                 double eps, bool training);
nd_status nd_cpu_batch_norm_backward_slab(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                          const nd_tensor *g, const nd_tensor *x,
                                          const nd_tensor *w, const nd_tensor *mean,
                                          const nd_tensor *rstd, bool training);
/* cpu_random.c */
nd_status nd_cpu_random(nd_tensor *out, nd_random_kind kind, double a, double b,
                        const nd_tensor *p, uint64_t seed, uint64_t offset);
/* cpu_conv.c */
nd_status nd_cpu_im2col(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g);
nd_status nd_cpu_col2im(nd_tensor *x, const nd_tensor *cols, const nd_conv_geom *g);
/* cpu_pool.c */
nd_status nd_cpu_max_pool2d(nd_tensor *out, nd_tensor *indices, const nd_tensor *x,
                            const nd_pool_geom *p);
nd_status nd_cpu_max_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices);
nd_status nd_cpu_avg_pool2d(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p);
nd_status nd_cpu_avg_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p);
/* cpu_conv_gemm.c */
nd_status nd_cpu_conv2d_backward(nd_tensor *gx, nd_tensor *gw, nd_tensor *gb, const nd_tensor *dy,
                                 const nd_tensor *x, const nd_tensor *w, const nd_conv_geom *g,
                                 int64_t groups);
nd_status nd_cpu_conv2d_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                              nd_activation act, const nd_tensor *res);
/* cpu_conv_depthwise.c: groups == in_channels, weight (C*M, 1, kh, kw);
 * nd_cpu_conv2d_fused and nd_cpu_conv2d_backward route such convs there
 * (nd_cpu_conv_is_depthwise; NEEDLE_CONV_BLAS=1: the GEMM path instead) */
bool nd_cpu_conv_is_depthwise(const int64_t *xshape, const int64_t *wshape, int64_t groups);
nd_status nd_cpu_conv2d_depthwise(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                                  const nd_tensor *b, const nd_conv_geom *g, bool relu);
nd_status nd_cpu_conv2d_depthwise_backward(nd_tensor *gx, nd_tensor *gw, const nd_tensor *dy,
                                           const nd_tensor *x, const nd_tensor *w,
                                           const nd_conv_geom *g);
/* cpu_linear_small.c: whether nd_cpu_linear_small takes w (O, K) in
 * float16/bfloat16 for this float32 x, converting it exactly as it loads */
bool nd_cpu_linear_half_weight(const nd_tensor *x, const nd_tensor *w);
/* cpu_linear_small.c: false when it does not apply (then use BLAS) */
bool nd_cpu_linear_small(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                         const nd_tensor *b, bool relu);
/* cpu_fused.c */
/* backend.h gemm_hint: how this thread's next products split their work */
void nd_cpu_gemm_hint(const nd_gemm_hint *h);
nd_status nd_cpu_linear_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, nd_activation act, const nd_tensor *res);
/* cpu_attention.c */
nd_status nd_cpu_attention(nd_tensor *out, nd_tensor *lse, nd_tensor *keep, const nd_tensor *q,
                           const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                           const nd_attention_args *a);
nd_status nd_cpu_attention_backward(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                    const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                    const nd_tensor *mask, const nd_tensor *out,
                                    const nd_tensor *lse, const nd_tensor *keep,
                                    const nd_attention_args *a);
/* cpu_rnn_cell.c */
nd_status nd_cpu_lstm_cell(nd_tensor *h, nd_tensor *c2, const nd_tensor *xw, const nd_tensor *hw,
                           const nd_tensor *c);
nd_status nd_cpu_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *gh,
                                    const nd_tensor *gc, const nd_tensor *xw, const nd_tensor *hw,
                                    const nd_tensor *c, const nd_tensor *c2);
nd_status nd_cpu_gru_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h);
nd_status nd_cpu_gru_cell_backward(nd_tensor *dxw, nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                   const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, bool dh_add);
/* cpu_random.c: keep[i] = whether uniform i of the stream at (seed, offset),
 * drawn as rand() draws it in dtype dt (float64: 53 bits, else float32's
 * 24), is below `below` (rounded to that dtype); on the calling thread */
void nd_cpu_uniform_below(uint64_t seed, uint64_t offset, int64_t n, nd_dtype dt, double below,
                          unsigned char *keep);
int nd_cpu_linear_join_align(nd_dtype dt);
/* What a fused kernel's path left to do after a product without it: the
 * activation other than relu (gelu: nd.gelu's kernel, in place), then the
 * residual (out += res; res contiguous in out's shape, or NULL). */
nd_status nd_cpu_finish_layer(nd_tensor *out, nd_activation act, const nd_tensor *res);

#endif
