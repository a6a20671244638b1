/* autograd_node.h - the autograd graph's node (core; the engine that builds
 * and runs the graph is ops/autograd.{h,c}).
 *
 * Every op result that needs a gradient gets a node (its grad_fn). A node
 * knows, for each differentiable input, where the gradient goes next: the
 * input's own grad_fn (an edge to another node) or, for a leaf that requires
 * grad, the leaf tensor itself (gradients accumulate into leaf->grad).
 * Nodes do NOT hold their input tensors - only what their backward formula
 * needs (saved tensors), so activations that no formula needs are freed.
 *
 * Backward formulas are written with the ordinary differentiable ops, so when
 * backward runs with create_graph the formulas record nodes of their own and
 * gradients of gradients work.
 *
 * Saved tensors carry the storage version seen at save time: a tensor that
 * was modified in place afterwards makes backward fail with a clear error
 * instead of giving a wrong gradient. A saved OUTPUT of the node itself is
 * stored without its grad_fn (that would be a reference cycle) and is
 * re-attached to the node when unpacked. */
#ifndef ND_AUTOGRAD_NODE_H
#define ND_AUTOGRAD_NODE_H

#include "tensor.h"

/* A node may have any number of inputs (cat and stack of many tensors): the
 * per-input arrays below live in the node's own allocation, sized by its
 * ninputs, so a unary node pays for one input and a wide one for all of
 * them. Inputs up to ND_NODE_INLINE_INPUTS need no extra allocation in the
 * engine. */
#define ND_NODE_INLINE_INPUTS 8
#define ND_NODE_MAX_SAVED 8 /* attention: q, k, v, out, its log-sum-exp, the mask, the dropout keeps */

typedef struct nd_node nd_node;

/* grads[i] receives a new reference to the gradient for input i (only where
 * n->needs_grad[i]; may be left NULL for "zero"). grad is the gradient of the
 * node's output. grads has n->ninputs entries. */
typedef nd_status (*nd_backward_fn)(nd_node *n, nd_tensor *grad, nd_tensor **grads);

struct nd_node {
    atomic_int refcount;
    const char *name;           /* the op, for errors */
    nd_backward_fn backward;
    int ninputs;
    /* per input i < ninputs (arrays in the node's allocation, see above) */
    bool *needs_grad;
    nd_node **next;             /* input's grad_fn (retained) */
    nd_tensor **leaf;           /* or the leaf itself (retained) */
    /* input geometry: broadcasting and view formulas need it */
    int64_t (*in_shape)[ND_MAX_DIMS];
    int *in_ndim;
    nd_dtype *in_dtype;
    /* output geometry */
    int64_t out_shape[ND_MAX_DIMS];
    int out_ndim;
    nd_dtype out_dtype;
    /* saved tensors */
    int nsaved;
    nd_tensor *saved[ND_NODE_MAX_SAVED];
    uint64_t saved_version[ND_NODE_MAX_SAVED];
    bool saved_is_output[ND_NODE_MAX_SAVED];
    bool released;              /* saved tensors freed after a backward */
    /* op parameters */
    int dims[ND_MAX_DIMS];
    int ndims;
    int64_t iparams[ND_MAX_DIMS]; /* one per dim for pad */
    double fparams[4];
    /* a backward's own state beyond the fields above (compiled_forward's
     * graphs), freed with the node by ctx_free */
    void *ctx;
    void (*ctx_free)(void *ctx);
    bool hooked;                /* nd_hook_tensor on its output: its gradient passes the hooks */
    int8_t precision;           /* the float32 matmul precision at the forward (nd_matmul_precision):
                                 * the backward's products run at it */
    int8_t opencl_operands;     /* nd_get_opencl_matmul_dtype() at the forward, likewise */
    /* engine scratch (one backward at a time per graph) */
    nd_tensor *pending;         /* accumulated gradient of the output */
    int deps;
    int mark;
};

/* A tensor's grad_fn holds one reference; so does every node whose input it
 * is. Releasing the last one frees the node and, iteratively (no recursion
 * along long chains), the nodes only it kept alive. */
void nd_node_retain(nd_node *n);
void nd_node_release(nd_node *n);

#endif
