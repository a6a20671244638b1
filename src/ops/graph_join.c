/* graph_join.c - the join pass of a captured graph (nd_graph_pass "join"):
 * horizontal fusion of linear layers that read the same input.
 *
 * Attention's query, key and value projections as separate nn.Linear
 * layers (BERT's, as Hugging Face writes them) are three products over one
 * input: three passes over it, three small GEMMs. Where two to eight
 * linear_fused kernels read the same view of one input with constant
 * weights (and biases: all or none) of one dtype and input width and the
 * same activation, they become one: the weights and biases are
 * concatenated once, in the prologue (graph_fold.c: again only when a
 * weight changes), the first kernel computes every layer's columns into
 * one (M, O1 + O2 + ...) result, and each later kernel that read a layer's
 * result reads its columns of that instead. Each output element is the
 * same dot product computed the same way, so the bits stay: where the
 * backend promises it for widths that are multiples of its
 * linear_join_align (backend.h; the CPU: 4 for float32 on needle's own
 * kernels, whose small-M kernel sums blocks of 4 weight rows in one order
 * and the rows left over in another; none for float64 or BLAS, whose
 * order may follow the width).
 *
 * Safe when: each layer's result is a whole contiguous (M, O) storage made
 * by it, seen nowhere after the call, and its readers take any strides for
 * it (elementwise kernels, copies, a GEMM's operands: a column slice of
 * the joined result is a strided view; not reductions, whose order over a
 * whole (M, O) result differs from theirs over its slice) through views
 * that stay within its rows; nothing writes the input between the first
 * layer and the others (they now run at the first). Inference only:
 * weights a training step updates are no constants. */
#include <stdlib.h>
#include "graph_internal.h"

#define MAX_JOIN 8   /* layers joined into one product */
#define WINDOW 64    /* records after the first layer searched for the others */

/* A layer the pass can join: a linear kernel with a constant weight (and
 * bias), no residual, whose result is a contiguous (M, O) storage it makes. */
static bool joinable(const nd_graph *g, const nd_graph_rec *a, const bool *konst, const int *writers,
                     const int64_t *refs, const size_t *first, size_t i) {
    if (a->entry != ND_CALL_linear_fused || a->nt != ND_LAYER_RES || !a->t[0] || !a->t[1] || !a->t[2] ||
        a->role[0] != ND_ROLE_WRITE || !a->full[0] || a->t[0]->ndim != 2 || !nd_is_contiguous(a->t[0]) ||
        !nd_is_contiguous(a->t[ND_LAYER_W]) || !konst[a->sid[ND_LAYER_W]] ||
        (a->t[ND_LAYER_B] && !konst[a->sid[ND_LAYER_B]]))
        return false;
    /* the same bits joined: widths (so every column offset) multiples of the backend's promise */
    int align = nd_call_linear_join_align(a->be, a->t[0]->dtype);
    if (align <= 0 || a->t[0]->shape[1] % align != 0) return false;
    int o = a->sid[0];
    return g->stor[o].internal && writers[o] == 1 && first[o] == i && !nd_graph_live_out(g, (size_t)o, refs) &&
           (size_t)nd_numel(a->t[0]) * nd_dtype_size(a->t[0]->dtype) == g->stor[o].nbytes;
}

/* Whether b can join a's product. */
static bool same_layer_kind(const nd_graph_rec *a, const nd_graph_rec *b) {
    return b->be == a->be && b->sid[1] == a->sid[1] && nd_graph_same_view(b->t[1], a->t[1]) &&
           b->i[0] == a->i[0] && b->t[0]->dtype == a->t[0]->dtype &&
           b->t[ND_LAYER_W]->dtype == a->t[ND_LAYER_W]->dtype &&
           b->t[ND_LAYER_W]->shape[1] == a->t[ND_LAYER_W]->shape[1] &&
           !b->t[ND_LAYER_B] == !a->t[ND_LAYER_B];
}

/* The view of the joined result (rows x tot, contiguous) that holds what v
 * held of a contiguous (rows x cols) result, its columns starting at off:
 * false unless each of v's dims steps by whole rows or within a row, and
 * its steps within a row stay in the row. */
static bool remap_view(const nd_tensor *v, int64_t cols, int64_t tot, int64_t off, int64_t *offset,
                       int64_t *strides) {
    if (v->offset < 0 || cols <= 0) return false;
    int64_t c0 = v->offset % cols, reach = c0;
    for (int d = 0; d < v->ndim; d++) {
        int64_t s = v->strides[d];
        if (v->shape[d] <= 1) { strides[d] = 0; continue; }
        if (s < 0) return false;
        if (s % cols == 0) strides[d] = s / cols * tot;
        else if (s < cols) { strides[d] = s; reach += (v->shape[d] - 1) * s; }
        else return false;
    }
    if (reach >= cols) return false;
    *offset = v->offset / cols * tot + off + c0;
    return true;
}

/* Whether slot k of record r may read (or write) a strided view. */
static bool any_strides(const nd_graph_rec *r, int k) {
    switch (r->entry) {
    case ND_CALL_unary: case ND_CALL_binary: case ND_CALL_binary_scalar: case ND_CALL_where:
    case ND_CALL_clamp: case ND_CALL_copy:
        return true;
    case ND_CALL_matmul: case ND_CALL_matmul_acc:
        return k == 1 || k == 2;
    default:
        return false;
    }
}

/* Whether every later use of layer a's result can read its columns of a
 * joined result (of any width: remap_view's answer does not depend on it). */
static bool readers_remap(const nd_graph *g, const nd_graph_rec *a, size_t i) {
    int o = a->sid[0];
    int64_t cols = a->t[0]->shape[1], off, strides[ND_MAX_DIMS];
    for (size_t j = i + 1; j < g->n; j++) {
        const nd_graph_rec *r = &g->recs[j];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && r->sid[k] == o &&
                (!any_strides(r, k) || !remap_view(r->t[k], cols, cols, 0, &off, strides)))
                return false;
    }
    return true;
}

typedef struct {
    nd_tensor *ws[MAX_JOIN], *bs[MAX_JOIN];
    int n;
    bool bias;
    nd_tensor *out[2];
} join_cat;

static nd_status cat_weights(void *ctx) {
    join_cat *c = ctx;
    ND_TRY(nd_cat(c->ws, c->n, 0, &c->out[0]));
    return c->bias ? nd_cat(c->bs, c->n, 0, &c->out[1]) : ND_OK;
}

/* Joins the layers at idx[0 .. n) (records of g, in order) into the first. */
static nd_status join_group(nd_graph *g, const size_t *idx, int n, bool *drop) {
    nd_graph_rec *a = &g->recs[idx[0]];
    join_cat c = {.n = n, .bias = a->t[ND_LAYER_B] != NULL};
    int64_t cols[MAX_JOIN], tot = 0, rows = a->t[0]->shape[0];
    for (int m = 0; m < n; m++) {
        const nd_graph_rec *b = &g->recs[idx[m]];
        c.ws[m] = b->t[ND_LAYER_W];
        c.bs[m] = b->t[ND_LAYER_B];
        cols[m] = b->t[0]->shape[1];
        tot += cols[m];
    }
    int sids[2] = {-1, -1};
    ND_TRY(nd_graph_fold_call(g, cat_weights, &c, c.out, 2, sids));
    nd_tensor *joined = NULL;
    int64_t shape[2] = {rows, tot};
    nd_status st = nd_empty_on(nd_get_device(a->t[0]), shape, 2, a->t[0]->dtype, &joined);
    stor_info *in = st == ND_OK ? nd_graph_adopt_storage(g, joined->storage) : NULL;
    if (st == ND_OK && !in) st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the join pass");
    if (st != ND_OK) {
        nd_release(c.out[0]); nd_release(c.out[1]); nd_release(joined);
        return st;
    }
    in->produced = in->seen_write = true; /* the joined kernel writes it whole, first */
    /* every later use of each layer's result: its columns of the joined one */
    int64_t off = 0;
    for (int m = 0; m < n; m++) {
        const nd_graph_rec *b = &g->recs[idx[m]];
        int o = b->sid[0];
        for (size_t j = idx[m] + 1; j < g->n && st == ND_OK; j++) {
            nd_graph_rec *r = &g->recs[j];
            for (int k = 0; k < r->nt && st == ND_OK; k++) {
                if (!r->t[k] || r->sid[k] != o) continue;
                int64_t voff, strides[ND_MAX_DIMS];
                nd_tensor *v;
                remap_view(r->t[k], cols[m], tot, off, &voff, strides); /* (readers_remap checked it) */
                st = nd_tensor_view_of(joined, r->t[k]->shape, strides, r->t[k]->ndim, voff, &v);
                if (st != ND_OK) break;
                nd_release(r->t[k]);
                r->t[k] = v;
                r->sid[k] = in->id;
                r->full[k] = false;
            }
        }
        off += cols[m];
    }
    if (st != ND_OK) { /* (views made so far keep the joined storage: nothing writes it) */
        nd_release(c.out[0]); nd_release(c.out[1]); nd_release(joined);
        return st;
    }
    nd_release(a->t[0]);
    a->t[0] = joined;
    a->sid[0] = in->id;
    nd_release(a->t[ND_LAYER_W]);
    a->t[ND_LAYER_W] = c.out[0];
    a->sid[ND_LAYER_W] = sids[0];
    a->full[ND_LAYER_W] = true;
    if (c.bias) {
        nd_release(a->t[ND_LAYER_B]);
        a->t[ND_LAYER_B] = c.out[1];
        a->sid[ND_LAYER_B] = sids[1];
        a->full[ND_LAYER_B] = true;
    }
    for (int m = 1; m < n; m++) drop[idx[m]] = true;
    return ND_OK;
}

nd_status nd_graph_pass_join(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    int *writers = malloc((ns + 1) * sizeof *writers);
    bool *konst = malloc(ns + 1), *drop = calloc(n + 1, 1), *used = calloc(n + 1, 1);
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    nd_status st = ND_OK;
    int64_t joined = 0;
    if (!writers || !konst || !drop || !used || !refs || !first || !last) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the join pass");
        goto done;
    }
    nd_graph_constants(g, writers, konst);
    nd_graph_uses(g, refs, first, last);
    for (size_t i = 0; i < n && st == ND_OK; i++) {
        const nd_graph_rec *a = &g->recs[i];
        if (used[i] || !joinable(g, a, konst, writers, refs, first, i)) continue;
        size_t idx[MAX_JOIN] = {i};
        int cnt = 1;
        int xs = a->sid[1];
        for (size_t j = i + 1; j < n && j <= i + WINDOW && cnt < MAX_JOIN; j++) {
            const nd_graph_rec *b = &g->recs[j];
            bool writes_x = false;
            for (int k = 0; k < b->nt; k++)
                writes_x |= b->t[k] && b->sid[k] == xs && (b->role[k] & ND_ROLE_WRITE);
            if (writes_x) break; /* the input changes: later layers read another value */
            if (used[j] || !joinable(g, b, konst, writers, refs, first, j) || !same_layer_kind(a, b)) continue;
            idx[cnt++] = j;
        }
        if (cnt < 2) continue;
        int keep = 0; /* the layers whose readers take their columns */
        for (int m = 0; m < cnt; m++)
            if (readers_remap(g, &g->recs[idx[m]], idx[m])) idx[keep++] = idx[m];
        if (keep < 2) continue;
        st = join_group(g, idx, keep, drop);
        for (int m = 0; m < keep; m++) used[idx[m]] = true;
        joined += keep - 1;
    }
    if (joined) {
        nd_graph_compact(g, drop);
        if (st == ND_OK) st = nd_graph_fold_settle(g);
    }
    *changed += joined;
done:
    free(writers); free(konst); free(drop); free(used); free(refs); free(first); free(last);
    return st;
}
