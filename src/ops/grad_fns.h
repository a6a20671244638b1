/* grad_fns.h - recording of autograd nodes for the ops (their backward
 * formulas live next to each op family in *_grad.c). Each nd_record_* is
 * called by the op after its forward succeeded, with grad mode on; it
 * records a node when an input requires grad. */
#ifndef ND_GRAD_FNS_H
#define ND_GRAD_FNS_H

#include "autograd.h"

nd_status nd_record_unary(nd_unary_op op, const nd_tensor *x, nd_tensor *out);
nd_status nd_record_binary(nd_binary_op op, const nd_tensor *a, const nd_tensor *b, nd_tensor *out);
nd_status nd_record_binary_number(nd_binary_op op, const nd_tensor *a, nd_number s,
                                  int scalar_first, nd_tensor *out);
nd_status nd_record_where(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                          nd_tensor *out);
nd_status nd_record_clamp(const nd_tensor *x, double lo, double hi, nd_tensor *out);

nd_status nd_record_reduce(nd_reduce_op op, const nd_tensor *x, const int *dims, int ndims,
                           int keepdim, int correction, nd_tensor *out);
nd_status nd_record_max_dim(const nd_tensor *x, int dim, int keepdim, nd_tensor *values,
                            const nd_tensor *indices);
nd_status nd_record_matmul(const nd_tensor *a, const nd_tensor *b, nd_tensor *out);

/* views */
nd_status nd_record_reshape(nd_op op, const nd_tensor *x, nd_tensor *out);
nd_status nd_record_permute(const nd_tensor *x, const int *dims, int ndim, nd_tensor *out);
nd_status nd_record_transpose(const nd_tensor *x, int d0, int d1, nd_tensor *out);
nd_status nd_record_expand(const nd_tensor *x, nd_tensor *out);
nd_status nd_record_select(const nd_tensor *x, int dim, int64_t index, nd_tensor *out);
/* out = x.slice(dim, start, ..., step): out->shape[dim] elements from start */
nd_status nd_record_slice(const nd_tensor *x, int dim, int64_t start, int64_t step, nd_tensor *out);
/* The engine's shortcut for select and slice nodes (no create_graph): g is
 * added into the selected part of *slot (the input's pending gradient) in
 * place - made of zeros when empty, copied first when someone besides the
 * engine holds it - instead of the backward's zeros of the whole input per
 * node, summed afterwards: a loop over the T steps of a sequence costs T
 * slices, not T whole tensors each way. *done false: n is not such a node
 * (or its gradient has another dtype): run its backward. */
nd_status nd_view_grad_into(nd_node *n, nd_tensor *g, nd_tensor **slot, bool *done);
/* copies */
nd_status nd_record_identity(nd_op op, const nd_tensor *x, nd_tensor *out);
nd_status nd_record_to_dtype(const nd_tensor *x, nd_tensor *out);

/* index ops (op_index_grad.c) */
nd_status nd_record_gather(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor *out);
nd_status nd_record_scatter(const nd_tensor *x, int dim, const nd_tensor *index,
                            const nd_tensor *src, int accumulate, nd_tensor *out);
nd_status nd_record_index_select(const nd_tensor *x, int dim, const nd_tensor *index,
                                 nd_tensor *out);
nd_status nd_record_index_add(const nd_tensor *x, int dim, const nd_tensor *index,
                              const nd_tensor *src, double alpha, nd_tensor *out);
nd_status nd_record_masked_fill(const nd_tensor *x, const nd_tensor *mask, nd_tensor *out);
/* The gradient of gather: g scattered-added into zeros of (shape, ndim) at
 * index along dim (dim normalised). Differentiable in g (its gradient is
 * gather again), so the formulas that use it have second derivatives. */
nd_status nd_gather_backward(const nd_tensor *g, const int64_t *shape, int ndim, int dim,
                             const nd_tensor *index, nd_tensor **out);

/* joins (op_join_grad.c); cat and stack record one node with n inputs */
nd_status nd_record_cat(nd_tensor *const *ts, int n, int dim, nd_tensor *out);
nd_status nd_record_stack(nd_tensor *const *ts, int n, int dim, nd_tensor *out);
nd_status nd_record_flip(const nd_tensor *x, const int *dims, int ndims, nd_tensor *out);
nd_status nd_record_pad(const nd_tensor *x, const int64_t *pads, int npairs, nd_tensor *out);

/* cumsum, sort, topk (op_sort_grad.c). values = x gathered at indices along
 * dim: name is "sort" or "topk"; the indices get no node. */
nd_status nd_record_cumsum(const nd_tensor *x, int dim, nd_tensor *out);
nd_status nd_record_sort_values(nd_op op, const nd_tensor *x, int dim, nd_tensor *values,
                                const nd_tensor *indices);

/* Runs a forward expression with grad mode off, then records: the pattern
 * every differentiable op follows. */
#define ND_FORWARD_THEN_RECORD(forward_call, record_call, out)                 \
    do {                                                                      \
        bool grad_on_ = nd_set_grad_enabled(false);                           \
        nd_status st_ = (forward_call);                                       \
        nd_set_grad_enabled(grad_on_);                                        \
        if (st_ == ND_OK && grad_on_) {                                       \
            st_ = (record_call);                                              \
            if (st_ != ND_OK) { nd_release(*(out)); *(out) = NULL; }          \
        }                                                                     \
        return st_;                                                           \
    } while (0)

#endif
