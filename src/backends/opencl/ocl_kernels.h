/* ocl_kernels.h - the OpenCL backend's entry points (one file per family),
 * gathered into the function table by ocl_backend.c. Signatures are those
 * of nd_backend (src/backend.h). */
#ifndef ND_OCL_KERNELS_H
#define ND_OCL_KERNELS_H

#include "ocl_runtime.h"

/* Sets args first.. of a strided kernel to (n, geom, ts[0] .. ts[nops-1])
 * with the geometry of ts (ts[0] the output) and launches it over numel(ts[0]). */
nd_status ocl_run_strided(ocl_device *d, cl_kernel k, const char *op, int first, int nops,
                          const nd_tensor *const *ts);

/* ocl_elementwise.c */
nd_status ocl_copy(nd_tensor *dst, const nd_tensor *src);
nd_status ocl_fill(nd_tensor *dst, const void *value);
nd_status ocl_unary(nd_unary_op op, nd_tensor *out, const nd_tensor *x);
nd_status ocl_binary(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
nd_status ocl_binary_scalar(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                            int scalar_first);
nd_status ocl_where(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b);
nd_status ocl_clamp(nd_tensor *out, const nd_tensor *x, double lo, double hi);

/* ocl_fused.c: fused elementwise programs as generated kernels (nd.compile) */
nd_status ocl_fused_elementwise(nd_ew_program *p, nd_tensor *const *ts);

/* ocl_reduce.c: reductions (kernels/reduce.cl) */
nd_status ocl_reduce(nd_reduce_op op, nd_tensor *out, const nd_tensor *x, const bool *reduced, int correction);
nd_status ocl_reduce_sum_acc(nd_tensor *out, const nd_tensor *x, const bool *reduced);
nd_status ocl_max_dim(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim, int is_min);

/* ocl_scan_sort.c: cumsum and sort (kernels/scan_sort.cl) */
nd_status ocl_cumsum(nd_tensor *out, const nd_tensor *x, int dim);
nd_status ocl_sort(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim, int descending);

/* ocl_norm.c: fused softmax, layer_norm, cross_entropy, batch_norm (kernels/norm.cl) */
nd_status ocl_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool log);
nd_status ocl_layer_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b, double eps);
/* ocl_rnn.c */
nd_status ocl_gru_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h);
nd_status ocl_gru_cell_backward(nd_tensor *dxw, nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, bool dh_add);
nd_status ocl_lstm_cell(nd_tensor *h, nd_tensor *c2, const nd_tensor *xw, const nd_tensor *hw,
                        const nd_tensor *c);
nd_status ocl_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *gh, const nd_tensor *gc,
                                 const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                 const nd_tensor *c2);
nd_status ocl_attention(nd_tensor *out, nd_tensor *lse, nd_tensor *keep, const nd_tensor *q,
                        const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                        const nd_attention_args *args);
nd_status ocl_attention_backward(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                 const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                 const nd_tensor *mask, const nd_tensor *out, const nd_tensor *lse,
                                 const nd_tensor *keep, const nd_attention_args *args);
nd_status ocl_cross_entropy(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels, int64_t ignore, double smoothing);
nd_status ocl_batch_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b, double eps, bool training);
nd_status ocl_layer_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db, const nd_tensor *g, const nd_tensor *x, const nd_tensor *w, const nd_tensor *mean, const nd_tensor *rstd);
nd_status ocl_cross_entropy_backward(nd_tensor *dlogits, const nd_tensor *logits, const nd_tensor *labels, const nd_tensor *wrow, int64_t ignore, double smoothing);

/* ocl_matmul.c: matmul: the tuned GEMM (kernels/gemm.cl) */
nd_status ocl_matmul(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
nd_status ocl_matmul_acc(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);

/* ocl_index.c: index ops (kernels/index.cl) */
nd_status ocl_gather(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
nd_status ocl_scatter(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src, int accumulate);
nd_status ocl_index_select(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
nd_status ocl_index_add(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src, double alpha);
nd_status ocl_masked_fill(nd_tensor *out, const nd_tensor *mask, double value);

/* ocl_random.c: random fills: Philox as on the CPU (kernels/random.cl) */
nd_status ocl_random(nd_tensor *out, nd_random_kind kind, double a, double b, const nd_tensor *p, uint64_t seed, uint64_t offset);

/* ocl_conv.c: im2col/col2im, depthwise conv2d and 2-D pooling (kernels/conv.cl,
 * kernels/conv_depthwise.cl, kernels/pooling.cl) */
nd_status ocl_im2col(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g);
nd_status ocl_col2im(nd_tensor *x, const nd_tensor *cols, const nd_conv_geom *g);
nd_status ocl_conv2d_depthwise(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                               const nd_tensor *b, const nd_conv_geom *g);
nd_status ocl_conv2d_depthwise_backward(nd_tensor *gx, nd_tensor *gw, const nd_tensor *dy,
                                        const nd_tensor *x, const nd_tensor *w,
                                        const nd_conv_geom *g);
nd_status ocl_max_pool2d(nd_tensor *out, nd_tensor *indices, const nd_tensor *x, const nd_pool_geom *p);
nd_status ocl_max_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices);
nd_status ocl_avg_pool2d(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p);
nd_status ocl_avg_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p);

#endif
