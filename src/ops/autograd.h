/* autograd.h - the autograd engine (ops layer): grad mode, recording nodes
 * for op results, saved tensors, and running backward. The node itself and
 * its lifetime are core (autograd_node.h); see there for the design. */
#ifndef ND_AUTOGRAD_H
#define ND_AUTOGRAD_H

#include "autograd_node.h"

/* ---- grad mode (thread-local) ---- */
bool nd_grad_enabled(void);
/* Sets grad mode, returns the previous one. */
bool nd_set_grad_enabled(bool on);

/* ---- recording (used by ops) ----
 * If grad mode is on and any input requires grad, creates the node, makes it
 * out's grad_fn (out->requires_grad = true) and returns it in *node; else
 * *node = NULL. Inputs may be NULL (non-tensor arguments). The node is
 * named after op (needle_ops.h): errors, the profiler and grad_fn use it. */
nd_status nd_record(nd_op op, nd_backward_fn fn, nd_tensor *out, int ninputs,
                    const nd_tensor *const *inputs, nd_node **node);
/* Saves t for backward (retained; version stamped). is_output: t is the
 * node's own output (saved without its grad_fn to avoid a cycle). */
nd_status nd_save(nd_node *n, const nd_tensor *t, bool is_output);
/* The i-th saved tensor for use in a backward formula: a new reference, or
 * an error if it was freed (backward ran without retain_graph) or modified
 * in place since it was saved. */
nd_status nd_saved(nd_node *n, int i, nd_tensor **out);

/* ---- running backward ---- */
/* root.backward(grad): grad NULL means 1 for a one-element root. */
nd_status nd_backward(nd_tensor *root, const nd_tensor *grad, bool retain_graph,
                      bool create_graph);
/* Gradients of outputs w.r.t. inputs without touching .grad.
 * grad_outputs entries may be NULL (1 for one-element outputs). result[i]
 * is a new reference or NULL when the input is unused and allow_unused. */
nd_status nd_grad(nd_tensor *const *outputs, nd_tensor *const *grad_outputs, int noutputs,
                  nd_tensor *const *inputs, int ninputs, bool retain_graph, bool create_graph,
                  bool allow_unused, nd_tensor **result);

/* ---- formula helpers ---- */
/* Sums g over the dims that broadcasting expanded, giving shape (shape, ndim). */
nd_status nd_sum_to_shape(const nd_tensor *g, const int64_t *shape, int ndim, nd_tensor **out);

#endif
