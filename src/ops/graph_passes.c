/* graph_passes.c - passes over a captured graph's records, each its own
 * unit (nd_graph_pass): run after nd_graph_end and before nd_graph_plan.
 *
 *   dce  dead kernels: a record none of whose writes is read later or seen
 *        outside the graph (a parameter, an output, a gradient, a tensor
 *        Lua keeps) goes; kernels with effects beyond their outputs (random
 *        draws, which advance the stream; host checks; transfers; optimizer
 *        updates) always stay.
 *   cse  common subexpressions: a pure kernel that repeats an earlier one
 *        (same entry and scalars, the same inputs unchanged since) goes,
 *        and later readers of its output read the earlier output instead.
 *
 * Both keep results exactly the same: they only skip work whose result is
 * never seen or already there. */
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

/* Kept even when their outputs are dead: random draws advance the stream,
 * host checks and the index kernels' bounds checks refuse bad values (a
 * replay must refuse what eager refuses), transfers and optimizer updates
 * write outside the graph. */
static bool has_effects(nd_call_entry e) {
    return e == ND_CALL_random || e == ND_CALL_host_check || e == ND_CALL_write || e == ND_CALL_read ||
           e == ND_CALL_sgd_step || e == ND_CALL_gather || e == ND_CALL_index_select ||
           e == ND_CALL_scatter || e == ND_CALL_index_add;
}

/* Removes the records marked in drop (keeping order). */
void nd_graph_compact(nd_graph *g, const bool *drop) {
    size_t out = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (drop[i]) { nd_graph_rec_release(&g->recs[i]); continue; }
        g->recs[out++] = g->recs[i];
    }
    g->n = out;
}

void nd_graph_redirect_reads(nd_graph *g, nd_graph_rec *r, const int *alias) {
    for (int k = 0; k < r->nt; k++) {
        if (!r->t[k] || alias[r->sid[k]] == r->sid[k]) continue;
        stor_info *to = &g->stor[alias[r->sid[k]]];
        nd_storage_retain(to->s);
        nd_storage_release(r->t[k]->storage);
        r->t[k]->storage = to->s;
        r->sid[k] = to->id;
    }
}

static nd_status pass_dce(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    bool *live = malloc(ns + 1), *drop = calloc(n + 1, 1);
    if (!refs || !first || !last || !live || !drop) {
        free(refs); free(first); free(last); free(live); free(drop);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the dce pass");
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t k = 0; k < ns; k++) live[k] = nd_graph_live_out(g, k, refs);
    for (size_t i = n; i-- > 0;) {
        nd_graph_rec *r = &g->recs[i];
        bool needed = has_effects(r->entry);
        for (int k = 0; k < r->nt && !needed; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE) && live[r->sid[k]]) needed = true;
        if (!needed) { drop[i] = true; (*changed)++; continue; }
        /* a whole write defines the value: what was there before is dead (a
         * partial write keeps the rest of the old value as live as it was) */
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && r->role[k] == ND_ROLE_WRITE && r->full[k]) live[r->sid[k]] = false;
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_READ)) live[r->sid[k]] = true;
    }
    nd_graph_compact(g, drop);
    free(refs); free(first); free(last); free(live); free(drop);
    return ND_OK;
}

/* ---------------------------------------------------------------- cse */

static bool pure_single_output(nd_call_entry e) {
    switch (e) {
    case ND_CALL_unary: case ND_CALL_binary: case ND_CALL_binary_scalar: case ND_CALL_where:
    case ND_CALL_clamp: case ND_CALL_reduce: case ND_CALL_matmul: case ND_CALL_softmax:
    case ND_CALL_linear_fused: case ND_CALL_conv2d_fused: case ND_CALL_conv2d_fused_packed:
    case ND_CALL_im2col: case ND_CALL_gather:
    case ND_CALL_index_select: case ND_CALL_cumsum: case ND_CALL_copy:
        return true;
    default:
        return false;
    }
}

/* Same kernel on the same inputs (storage and view) with the same scalars. */
static bool same_call(const nd_graph_rec *a, const nd_graph_rec *b) {
    if (a->entry != b->entry || a->be != b->be || a->nt != b->nt) return false;
    if (memcmp(a->i, b->i, sizeof a->i) || memcmp(a->f, b->f, sizeof a->f) ||
        memcmp(&a->u, &b->u, sizeof a->u))
        return false;
    for (int k = 0; k < a->nt; k++) {
        if (a->role[k] != b->role[k] || !nd_graph_same_view(a->t[k], b->t[k])) return false;
        if ((a->role[k] & ND_ROLE_READ) && a->t[k] && a->sid[k] != b->sid[k]) return false;
    }
    return true;
}

static size_t call_hash(const nd_graph_rec *r) {
    size_t h = (size_t)r->entry * 31u + (size_t)r->i[0] * 131u;
    for (int k = 0; k < r->nt; k++)
        if (r->t[k] && (r->role[k] & ND_ROLE_READ)) h = h * 1000003u + (size_t)r->sid[k] + 7u;
    return h;
}

static int output_slot(const nd_graph_rec *r) {
    int out = -1;
    for (int k = 0; k < r->nt; k++) {
        if (!(r->role[k] & ND_ROLE_WRITE)) continue;
        if (out >= 0 || r->role[k] != ND_ROLE_WRITE || !r->t[k] || !r->full[k]) return -1;
        out = k;
    }
    return out;
}

static nd_status pass_cse(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n, nb = 1;
    while (nb < 2 * n + 2) nb *= 2;
    int64_t *refs = malloc((ns + 1) * sizeof *refs), *writers = calloc(ns + 1, sizeof *writers);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    size_t *lastw = malloc((ns + 1) * sizeof *lastw);
    int *alias = malloc((ns + 1) * sizeof *alias); /* a storage's reads go to this one instead */
    long *bucket = malloc(nb * sizeof *bucket), *chain = malloc((n + 1) * sizeof *chain);
    bool *drop = calloc(n + 1, 1);
    nd_status st = ND_OK;
    if (!refs || !writers || !first || !last || !lastw || !alias || !bucket || !chain || !drop) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the cse pass");
        goto done;
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t k = 0; k < ns; k++) { lastw[k] = SIZE_MAX; alias[k] = (int)k; }
    for (size_t i = 0; i < n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE)) writers[r->sid[k]]++;
    }
    for (size_t b = 0; b < nb; b++) bucket[b] = -1;
    for (size_t i = 0; i < n; i++) {
        nd_graph_rec *r = &g->recs[i];
        nd_graph_redirect_reads(g, r, alias); /* reads of a merged storage go to the one it repeats */
        int o = pure_single_output(r->entry) ? output_slot(r) : -1;
        bool candidate = false;
        if (o >= 0) {
            const stor_info *out = &g->stor[r->sid[o]];
            bool outside = (int64_t)atomic_load(&out->s->refcount) > 1 + refs[r->sid[o]];
            candidate = out->internal && !outside && !has_snapshot(out) && writers[r->sid[o]] == 1;
        }
        size_t h = candidate ? call_hash(r) & (nb - 1) : 0;
        if (candidate) {
            for (long j = bucket[h]; j >= 0; j = chain[j]) {
                const nd_graph_rec *e = &g->recs[j];
                if (!same_call(e, r)) continue;
                bool unchanged = true; /* its inputs not written since */
                for (int k = 0; k < e->nt && unchanged; k++)
                    if (e->t[k] && (e->role[k] & ND_ROLE_READ) && lastw[e->sid[k]] != SIZE_MAX &&
                        lastw[e->sid[k]] > (size_t)j)
                        unchanged = false;
                if (!unchanged) continue;
                alias[r->sid[o]] = e->sid[output_slot(e)];
                drop[i] = true;
                (*changed)++;
                break;
            }
        }
        if (drop[i]) continue;
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE)) lastw[r->sid[k]] = i;
        if (candidate) { chain[i] = bucket[h]; bucket[h] = (long)i; }
    }
    nd_graph_compact(g, drop);
done:
    free(refs); free(writers); free(first); free(last); free(lastw); free(alias);
    free(bucket); free(chain); free(drop);
    return st;
}

nd_status nd_graph_pass(nd_graph *g, const char *name, int64_t *changed) {
    *changed = 0;
    if (!g || !g->ended || g->error != ND_OK)
        return nd_fail(ND_ERR_ARG, "compile: pass over a graph that was not captured successfully");
    if (g->plan_done)
        return nd_fail(ND_ERR_ARG, "compile: passes run before the memory plan");
    if (!strcmp(name, "dce")) return pass_dce(g, changed);
    if (!strcmp(name, "cse")) return pass_cse(g, changed);
    if (!strcmp(name, "fuse")) return nd_graph_pass_fuse(g, changed);
    if (!strcmp(name, "simplify")) return nd_graph_pass_simplify(g, changed);
    if (!strcmp(name, "reorder")) return nd_graph_pass_reorder(g, changed);
    if (!strcmp(name, "epilogue")) return nd_graph_pass_epilogue(g, changed);
    if (!strcmp(name, "fold")) return nd_graph_pass_fold(g, changed);
    if (!strcmp(name, "join")) return nd_graph_pass_join(g, changed);
    return nd_fail(ND_ERR_ARG, "compile: unknown pass '%s' (expected fold, simplify, cse, dce, "
                   "epilogue, join, reorder or fuse)", name);
}
