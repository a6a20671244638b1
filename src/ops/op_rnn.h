/* op_rnn.h - internals shared by op_rnn_cell.c and op_rnn_layer.c: the LSTM
 * cell's gradient formulas composed from differentiable ops, which the
 * cell's create_graph backward runs once and the layer's once a step. */
#ifndef ND_OP_RNN_H
#define ND_OP_RNN_H

#include "grad_expr.h"

/* From the gates' pre-activations (B, 4H), the state c (B, H) before the
 * step and the step's gradients dh, dc' (B, H): *dgates (B, 4H; NULL unless
 * want_gates) and *dc (B, H), borrowed from x (NULL once x failed). */
void nd_lstm_cell_grads_composed(nd_gx *x, const nd_tensor *gates, const nd_tensor *c, const nd_tensor *dh,
                                 const nd_tensor *dcn, bool want_gates, nd_tensor **dgates, nd_tensor **dc);

#endif
