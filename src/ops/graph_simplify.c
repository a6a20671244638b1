/* graph_simplify.c - the simplify pass of a captured graph (nd_graph_pass
 * "simplify"): algebraic identities at the level of kernels.
 *
 * A kernel whose result is exactly its input goes, and later kernels read
 * the input instead of the result: x * 1, x / 1, x - (+0), x + (-0) in a
 * float dtype (bit for bit x, signed zeros included; x + (+0) is not: it
 * turns -0 into +0), and a copy without a cast (clone of a contiguous
 * tensor). Views (transpose of transpose, reshape chains) are no kernels at
 * all in a captured graph, so there is nothing to simplify there.
 *
 * Safe when: the result is a whole storage made inside, written once and
 * not seen outside the graph; the input is a whole contiguous storage of the
 * same dtype and size (so every view of one is the same elements of the
 * other); and no later kernel writes the input (a reader of the result
 * would see the change). One difference remains: x * 1 quiets a signaling
 * NaN, which the simplified graph passes on as it is. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

static bool whole_contiguous(const nd_tensor *t) {
    return t->offset == 0 && nd_is_contiguous(t) &&
           (size_t)nd_numel(t) * nd_dtype_size(t->dtype) == t->storage->nbytes;
}

/* The record returns its input unchanged (see the top of the file). */
static bool is_identity(const nd_graph_rec *r) {
    if (r->nt != 2 || !r->t[0] || !r->t[1] || r->t[0]->dtype != r->t[1]->dtype) return false;
    if (r->entry == ND_CALL_copy) return true;
    if (r->entry != ND_CALL_binary_scalar || r->i[1] /* scalar first */) return false;
    nd_dtype dt = r->t[1]->dtype;
    double v;
    if (dt == ND_FLOAT32) {
        float f;
        memcpy(&f, r->u.value, sizeof f);
        v = f;
    } else if (dt == ND_FLOAT64) {
        memcpy(&v, r->u.value, sizeof v);
    } else {
        return false;
    }
    switch ((nd_binary_op)r->i[0]) {
    case ND_BINARY_mul: case ND_BINARY_div: return v == 1.0;
    case ND_BINARY_sub: return v == 0.0 && !signbit(v);
    case ND_BINARY_add: return v == 0.0 && signbit(v);
    default: return false;
    }
}

nd_status nd_graph_pass_simplify(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    int64_t *refs = malloc((ns + 1) * sizeof *refs), *writers = calloc(ns + 1, sizeof *writers);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    size_t *lastw = calloc(ns + 1, sizeof *lastw); /* the last record writing it, + 1 (0: none) */
    int *alias = malloc((ns + 1) * sizeof *alias);
    bool *drop = calloc(n + 1, 1);
    nd_status st = ND_OK;
    if (!refs || !writers || !first || !last || !lastw || !alias || !drop) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the simplify pass");
        goto done;
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t k = 0; k < ns; k++) alias[k] = (int)k;
    for (size_t i = 0; i < n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE)) {
                writers[r->sid[k]]++;
                lastw[r->sid[k]] = i + 1;
            }
    }
    for (size_t i = 0; i < n; i++) {
        nd_graph_rec *r = &g->recs[i];
        nd_graph_redirect_reads(g, r, alias); /* reads of a result that went read its input */
        if (!is_identity(r) || r->role[0] != ND_ROLE_WRITE || r->role[1] != ND_ROLE_READ) continue;
        int o = r->sid[0], in = r->sid[1];
        const stor_info *out = &g->stor[o];
        if (o == in || !out->internal || nd_graph_live_out(g, (size_t)o, refs) || writers[o] != 1 ||
            !r->full[0] || !whole_contiguous(r->t[0]) || !whole_contiguous(r->t[1]) ||
            r->t[0]->storage->nbytes != r->t[1]->storage->nbytes || lastw[in] > i + 1)
            continue;
        alias[o] = alias[in];
        drop[i] = true;
        (*changed)++;
    }
    nd_graph_compact(g, drop);
done:
    free(refs); free(writers); free(first); free(last); free(lastw); free(alias); free(drop);
    return st;
}
