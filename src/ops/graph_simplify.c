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
 * NaN, which the simplified graph passes on as it is.
 *
 * Reads of zeros. Autograd adds the gradients of slices into a zeros tensor
 * (the LSTM's four gates, its time steps), so a replay fills a buffer with
 * zeros and then reads those zeros back to add them. Where a kernel adds
 * an element known to be zero (its storage was filled with zeros, or held
 * zeros when the capture began, and no write since touched that view),
 * z + x becomes x + (+0): the same bits (the add turns -0 into +0 as
 * before) from a kernel that reads only x - a scalar add the fuse pass
 * keeps in registers. Then a zero fill (or the zeros put back before each
 * replay) whose storage is written all over, by views that share no
 * element, before any kernel reads it, goes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

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

/* ---------------------------------------------------------------- reads of zeros */

#define MAX_ZERO_WRITES 64 /* views written into a zeros storage that are followed */

typedef struct {
    bool zero;   /* the storage was all zero, then written only through views[] */
    bool zero_at_start; /* zeros at the start of every replay (made inside, nothing else holds it) */
    int nw;
    const nd_tensor *views[MAX_ZERO_WRITES];
} zero_state;

static bool float_dtype(nd_dtype dt) { return dt == ND_FLOAT32 || dt == ND_FLOAT64; }

/* A zero fill of the whole storage of its tensor. */
static bool zero_fill(const nd_graph_rec *r) {
    if (r->entry != ND_CALL_fill || r->nt != 1 || !r->t[0] || !r->full[0]) return false;
    size_t es = nd_dtype_size(r->t[0]->dtype);
    for (size_t b = 0; b < es; b++)
        if (r->u.value[b]) return false;
    return true;
}

/* Every element of view t is still zero. */
static bool known_zero(const zero_state *z, const nd_tensor *t) {
    if (!z->zero || !float_dtype(t->dtype)) return false;
    for (int w = 0; w < z->nw; w++)
        if (!nd_graph_views_disjoint(z->views[w], t)) return false;
    return true;
}

/* z + x or x + z with z known zero: x + (+0) (see the top of the file). */
static bool fold_zero_add(nd_graph_rec *r, const zero_state *zs) {
    if (r->entry != ND_CALL_binary || r->i[0] != ND_BINARY_add || r->nt != 3) return false;
    for (int k = 1; k <= 2; k++) {
        const nd_tensor *z = r->t[k], *x = r->t[3 - k];
        if (!z || !x || r->role[k] != ND_ROLE_READ || !known_zero(&zs[r->sid[k]], z)) continue;
        if (x->dtype != r->t[0]->dtype || z->dtype != x->dtype) return false;
        nd_tensor *gone = r->t[k];
        r->t[1] = r->t[3 - k];
        r->role[1] = r->role[3 - k];
        r->sid[1] = r->sid[3 - k];
        r->full[1] = r->full[3 - k];
        r->t[2] = NULL;
        r->nt = 2;
        nd_release(gone);
        r->entry = ND_CALL_binary_scalar;
        r->i[0] = ND_BINARY_add;
        r->i[1] = 0; /* x + s */
        memset(r->u.value, 0, sizeof r->u.value); /* +0 in float32 and float64 */
        return true;
    }
    return false;
}

static void note_writes(const nd_graph_rec *r, zero_state *zs) {
    for (int k = 0; k < r->nt; k++) {
        if (!r->t[k] || !(r->role[k] & ND_ROLE_WRITE)) continue;
        zero_state *z = &zs[r->sid[k]];
        if (zero_fill(r)) {
            z->zero = true;
            z->nw = 0;
        } else if (z->zero) {
            if (z->nw == MAX_ZERO_WRITES) z->zero = false;
            else z->views[z->nw++] = r->t[k];
        }
    }
}

/* Whether records from `from` on write every element of storage sid, through
 * views of one dtype that share no element, before any record reads it. */
static bool overwritten_before_read(const nd_graph *g, size_t from, int sid) {
    const nd_tensor *seen[MAX_ZERO_WRITES];
    int nseen = 0;
    int64_t covered = 0, total = -1;
    for (size_t j = from; j < g->n; j++) {
        const nd_graph_rec *r = &g->recs[j];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && r->sid[k] == sid && (r->role[k] & ND_ROLE_READ)) return false;
        for (int k = 0; k < r->nt; k++) {
            const nd_tensor *t = r->t[k];
            if (!t || r->sid[k] != sid) continue;
            size_t es = nd_dtype_size(t->dtype);
            if (total < 0) {
                if (t->storage->nbytes % es) return false;
                total = (int64_t)(t->storage->nbytes / es);
            }
            if (nseen && t->dtype != seen[0]->dtype) return false;
            bool fresh = true; /* shares no element with the views counted */
            for (int v = 0; v < nseen && fresh; v++) fresh = nd_graph_views_disjoint(seen[v], t);
            if (!fresh) continue;
            int64_t n;
            if (nseen == MAX_ZERO_WRITES || !nd_graph_view_injective(t, total, &n)) return false;
            seen[nseen++] = t;
            covered += n;
            if (covered == total) return true;
        }
    }
    return false;
}

/* Rewrites adds of known zeros, then drops the zero fills (and the zeros
 * restored before each replay) nothing reads any more. */
static nd_status fold_zero_reads(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    zero_state *zs = calloc(ns + 1, sizeof *zs);
    bool *drop = calloc(n + 1, 1);
    if (!zs || !drop) {
        free(zs);
        free(drop);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the simplify pass");
    }
    /* Zeros when the capture first saw them, and at the start of every replay: made
     * inside and held by nothing else (state Lua keeps from call to call holds what
     * the last call left; the capture refuses the kind it must) */
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    if (!refs || !first || !last) {
        free(zs); free(drop); free(refs); free(first); free(last);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the simplify pass");
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t k = 0; k < ns; k++) {
        const stor_info *in = &g->stor[k];
        bool held_outside = (int64_t)atomic_load(&in->s->refcount) > 1 + refs[k] || in->s->release;
        zs[k].zero = in->internal && !held_outside && !in->snapshot && (in->snap_zero || in->zero_init);
    }
    free(refs); free(first); free(last);
    for (size_t k = 0; k < ns; k++) zs[k].zero_at_start = zs[k].zero;
    bool folded = false;
    for (size_t i = 0; i < n; i++) {
        folded |= fold_zero_add(&g->recs[i], zs);
        note_writes(&g->recs[i], zs);
    }
    if (folded) {
        for (size_t i = 0; i < n; i++)
            if (zero_fill(&g->recs[i]) && overwritten_before_read(g, i + 1, g->recs[i].sid[0])) {
                drop[i] = true;
                (*changed)++;
            }
        for (size_t k = 0; k < ns; k++) {
            stor_info *in = &g->stor[k];
            /* zeros restored before each replay that no record reads any more */
            if (zs[k].zero_at_start && overwritten_before_read(g, 0, (int)k)) {
                in->snap_zero = in->zero_init = in->observed = false;
            }
        }
        nd_graph_compact(g, drop);
    }
    free(zs);
    free(drop);
    return ND_OK;
}

nd_status nd_graph_pass_simplify(nd_graph *g, int64_t *changed) {
    ND_TRY(fold_zero_reads(g, changed));
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
            !r->full[0] || !nd_graph_whole(r->t[0]) || !nd_graph_whole(r->t[1]) ||
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
