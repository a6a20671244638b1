/* graph_reorder.c - the reorder pass of a captured graph (nd_graph_pass
 * "reorder"): moves elementwise records up, next to an earlier elementwise
 * record of the same shape, device and dtype, so that the fuse pass (which
 * fuses consecutive records only) finds longer runs.
 *
 * The order autograd runs kernels in is not the only one that computes the
 * same values: in the LSTM's backward each time step adds its output's
 * gradient to the recurrent one, then accumulates the weight and bias
 * gradients (other shapes), then starts the gate gradients - the add and
 * the gate arithmetic are one kernel's worth of work split by two
 * unrelated adds. A record may move above records it shares no storage
 * with, or only reads along with them: then every read still sees the
 * version it saw before (no read moves across a write of its storage, no
 * write across a read or write of its storage). It never moves across
 * records that talk to the host (checks, reads, writes) or draw random
 * numbers, and looks back at most WINDOW records. A run that makes the
 * input of the softmax or layer norm after it stays there (feeds_row_op):
 * fused into that row kernel, its result is never stored. */
#include <string.h>
#include "graph_internal.h"

#define WINDOW 24

/* Whether a and b must keep their order: a barrier, or a storage one writes. */
static bool conflict(const nd_graph_rec *a, const nd_graph_rec *b) {
    return nd_graph_rec_barrier(a) || nd_graph_rec_barrier(b) || nd_graph_recs_conflict(a, b);
}

/* Whether the fuse pass could put a and b (both fusable) in one run. */
static bool joinable(const nd_graph_rec *a, nd_dtype da, const nd_graph_rec *b, nd_dtype db) {
    return da == db && a->be == b->be &&
           a->t[0]->storage->device_index == b->t[0]->storage->device_index &&
           nd_graph_same_shape(a->t[0], b->t[0]);
}

/* Whether record j starts or continues a run of joinable records that the
 * softmax or layer norm right after it reads, on a backend that fuses such
 * a run into the row kernel (graph_fuse.c): moving j away would cost that
 * prologue. */
static bool feeds_row_op(const nd_graph *g, size_t j, nd_dtype dj) {
    size_t k = j;
    nd_dtype dk = dj, dn;
    while (k + 1 < g->n && nd_graph_fusable(&g->recs[k + 1], &dn) && joinable(&g->recs[k], dk, &g->recs[k + 1], dn)) {
        k++;
        dk = dn;
    }
    if (k + 1 >= g->n) return false;
    const nd_graph_rec *r = &g->recs[k + 1];
    const int xs = nd_graph_row_input_slot(r);
    if (xs < 0 || !r->t[xs] || !r->be || !r->be->fused_rows) return false;
    for (size_t q = j; q <= k; q++)
        if (g->recs[q].sid[0] == r->sid[xs]) return true;
    return false;
}

nd_status nd_graph_pass_reorder(nd_graph *g, int64_t *changed) {
    for (size_t j = 1; j < g->n; j++) {
        nd_dtype dx, dp;
        nd_graph_rec *x = &g->recs[j];
        if (!nd_graph_fusable(x, &dx) || feeds_row_op(g, j, dx)) continue;
        if (nd_graph_fusable(&g->recs[j - 1], &dp) && joinable(&g->recs[j - 1], dp, x, dx)) continue;
        size_t lo = j > WINDOW ? j - WINDOW : 0;
        for (size_t q = j - 1; q > lo; q--) { /* x would go to q, above records q .. j-1 */
            if (conflict(&g->recs[q], x)) break;
            if (!nd_graph_fusable(&g->recs[q - 1], &dp) || !joinable(&g->recs[q - 1], dp, x, dx)) continue;
            nd_graph_rec moved = *x;
            memmove(&g->recs[q + 1], &g->recs[q], (j - q) * sizeof *g->recs);
            g->recs[q] = moved;
            (*changed)++;
            break;
        }
    }
    return ND_OK;
}
