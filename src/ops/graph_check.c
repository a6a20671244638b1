/* graph_check.c - the consistency check of a captured graph's records
 * (nd_graph_check; nd.compile's verify option runs it after the passes).
 *
 * The passes rewrite records in place: they move tensors between records,
 * point views at other storages, add and drop slots. What every later stage
 * (the memory plan, the replay, the next pass) takes for granted is checked
 * here for each record of the replay and of the prologue: every tensor's
 * storage number names its storage, its role is read, write or both, its
 * view stays inside its storage, a write marked whole covers the storage
 * once, and a fused layer record has its four slots and at most a residual
 * after them. */
#include <stdio.h>
#include "graph_internal.h"

static nd_status bad(const char *where, size_t i, const nd_graph_rec *r, int k, const char *what) {
    return nd_fail(ND_ERR_INTERNAL, "compile: the graph is inconsistent: %s record %zu (%s) slot %d: %s",
                   where, i, nd_call_entry_name(r->entry), k, what);
}

static nd_status check_record(const nd_graph *g, const char *where, size_t i, const nd_graph_rec *r) {
    if (r->nt < 0 || r->nt > ND_REC_MAX_TENSORS) return bad(where, i, r, -1, "bad tensor count");
    if (nd_graph_layer_act((nd_graph_rec *)r) &&
        (r->nt < ND_LAYER_RES || r->nt > ND_LAYER_RES + 1 || (r->nt > ND_LAYER_RES && !r->t[ND_LAYER_RES])))
        return bad(where, i, r, r->nt, "a fused layer has out, x, w, b and at most a residual");
    for (int k = 0; k < r->nt; k++) {
        const nd_tensor *t = r->t[k];
        if (!t) continue;
        if (r->sid[k] < 0 || (size_t)r->sid[k] >= g->nstor || g->stor[r->sid[k]].s != t->storage)
            return bad(where, i, r, k, "its storage number names another storage");
        if (r->role[k] != ND_ROLE_READ && r->role[k] != ND_ROLE_WRITE && r->role[k] != ND_ROLE_UPDATE)
            return bad(where, i, r, k, "no role");
        size_t es = nd_dtype_size(t->dtype);
        int64_t total = es ? (int64_t)(t->storage->nbytes / es) : 0, n;
        if (nd_numel(t) == 0) continue;
        int64_t lo = t->offset, hi = t->offset;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] <= 1) continue;
            int64_t span = (t->shape[d] - 1) * t->strides[d];
            if (span < 0) lo += span;
            else hi += span;
        }
        if (lo < 0 || hi >= total) return bad(where, i, r, k, "its view reaches past its storage");
        if (r->full[k] && (r->role[k] & ND_ROLE_WRITE) &&
            (!nd_graph_view_injective(t, total, &n) || n != total))
            return bad(where, i, r, k, "a write marked whole does not cover its storage once");
    }
    return ND_OK;
}

nd_status nd_graph_check(const nd_graph *g) {
    if (!g || !g->ended) return nd_fail(ND_ERR_ARG, "compile: check of a graph that was not captured");
    for (size_t i = 0; i < g->npro; i++) ND_TRY(check_record(g, "prologue", i, &g->pro[i]));
    for (size_t i = 0; i < g->n; i++) ND_TRY(check_record(g, "replay", i, &g->recs[i]));
    return ND_OK;
}
