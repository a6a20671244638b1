/* graph_fold.c - the fold pass of a captured graph (nd_graph_pass "fold"):
 * constant folding, and batch norms folded into the layer before them.
 *
 * Constants are the storages that no record of the graph writes and that
 * are not the compiled function's inputs (nd_graph_mark_input): parameters
 * and buffers in inference, and whatever kernels make from them alone (a
 * batch norm's rstd from its running variance). A pure kernel that reads
 * constants only and writes whole storages made inside, which no other
 * record writes, moves into the graph's prologue; what it writes is a
 * constant in turn. A replay runs the prologue first, and only when the
 * storage version of one of its sources (the constants it reads that it
 * does not make) changed since it last ran: every write through needle's
 * ops bumps it (copy_, fill_, in-place ops, optimizer steps,
 * load_state_dict, other graphs' replays). The prologue computes the same
 * kernels on the same values, so folding alone changes no bit of a result.
 * (A C host that writes a parameter's memory through its raw pointer must
 * bump the storage version itself, as for autograd's saved tensors.)
 *
 * Batch-norm folding. An evaluation batch norm (running statistics) whose
 * input is the result of a convolution or linear layer's fused kernel
 * (conv2d_fused, linear_fused, no activation), read by the norm alone, and
 * whose weight, bias and statistics are constants, is folded into the
 * layer: nd_fold_batch_norm (the formula nd.nn.fuse uses) runs under a
 * capture of its own, whose records join the prologue, so the folded
 * weight follows the parameters when they change. The norm's kernel goes
 * and the layer writes the norm's result. This one changes results by
 * rounding: one product with a folded weight instead of a product and a
 * normalisation, about 1e-7 relative in float32. A linear layer's norm
 * folds only for 2-D results (BatchNorm1d over (N, C)). OpenCL's
 * convolution and linear layer are composed kernels (no fused kernel to
 * fold into): there only the constant folding applies. */
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

/* Kernels whose only effect is writing their outputs from their inputs. */
static bool pure_entry(const nd_graph_rec *r) {
    switch (r->entry) {
    case ND_CALL_copy: case ND_CALL_fill: case ND_CALL_unary: case ND_CALL_binary:
    case ND_CALL_binary_scalar: case ND_CALL_where: case ND_CALL_clamp: case ND_CALL_reduce:
    case ND_CALL_matmul: case ND_CALL_softmax: case ND_CALL_cumsum: case ND_CALL_im2col:
    case ND_CALL_conv2d_fused: case ND_CALL_linear_fused: case ND_CALL_fused_elementwise:
    case ND_CALL_fused_rows:
    case ND_CALL_conv2d_fused_packed: case ND_CALL_conv2d_prepack:
        return true;
    case ND_CALL_batch_norm:
        return r->i[0] == 0; /* evaluation: reads its statistics, writes y alone */
    default:
        return false;
    }
}

static bool pro_push(nd_graph *g, const nd_graph_rec *r) {
    if (g->npro == g->cappro) {
        size_t cap = g->cappro ? g->cappro * 2 : 16;
        nd_graph_rec *p = realloc(g->pro, cap * sizeof *p);
        if (!p) return false;
        g->pro = p;
        g->cappro = cap;
    }
    g->pro[g->npro++] = *r;
    return true;
}

void nd_graph_constants(const nd_graph *g, int *writers, bool *konst) {
    for (size_t k = 0; k < g->nstor; k++) writers[k] = 0;
    for (size_t i = 0; i < g->n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE)) writers[r->sid[k]]++;
    }
    /* not: storages the capture gave the memory of back (zeros made inside
     * and freed: nothing would bring their content back), nor borrowed
     * memory (its owner may write it without a version bump) */
    for (size_t k = 0; k < g->nstor; k++) {
        const stor_info *in = &g->stor[k];
        konst[k] = writers[k] == 0 && !in->input && !in->dropped && !in->s->release;
    }
}

/* Drops the records marked in moved, which now belong to someone else
 * (not released), keeping order. */
static void remove_moved(nd_graph *g, const bool *moved) {
    size_t out = 0;
    for (size_t i = 0; i < g->n; i++)
        if (!moved[i]) g->recs[out++] = g->recs[i];
    g->n = out;
}

static nd_status hoist(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor;
    int *writers = malloc((ns + 1) * sizeof *writers);
    bool *konst = malloc(ns + 1), *moved = calloc(g->n + 1, 1);
    nd_status st = ND_OK;
    if (!writers || !konst || !moved) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        goto done;
    }
    nd_graph_constants(g, writers, konst);
    for (size_t i = 0; i < g->n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        if (!pure_entry(r)) continue;
        bool ok = true, writes = false;
        for (int k = 0; k < r->nt && ok; k++) {
            if (!r->t[k]) continue;
            const stor_info *in = &g->stor[r->sid[k]];
            if (r->role[k] == ND_ROLE_READ) ok = konst[r->sid[k]];
            else if (r->role[k] == ND_ROLE_WRITE) /* (not over content a record read first: a
                                                    * replay restores it, which the prologue's
                                                    * write would then not follow) */
                ok = writes = r->full[k] && in->internal && !in->input && writers[r->sid[k]] == 1 &&
                              !has_snapshot(in) && !in->observed;
            else ok = false; /* read and written in place */
        }
        if (!ok || !writes) continue;
        if (!pro_push(g, r)) {
            st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
            break;
        }
        moved[i] = true;
        (*changed)++;
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && r->role[k] == ND_ROLE_WRITE) {
                konst[r->sid[k]] = true;
                g->stor[r->sid[k]].folded = true;
            }
    }
    remove_moved(g, moved);
done:
    free(writers); free(konst); free(moved);
    return st;
}

/* The activation of a layer a norm can fold into (a fused convolution or a
 * 2-D linear layer, its weight present and float32/float64: a half weight
 * the kernel reads as it is stays unfolded), or NULL. */
static int64_t *foldable_layer(nd_graph_rec *a) {
    if (a->entry != ND_CALL_conv2d_fused && a->entry != ND_CALL_linear_fused) return NULL;
    if (a->entry == ND_CALL_linear_fused && (!a->t[0] || a->t[0]->ndim != 2))
        return NULL; /* the norm's channels are dim 1 */
    if (a->nt != 4 || !a->t[ND_LAYER_W]) return NULL;
    const nd_dtype wd = a->t[ND_LAYER_W]->dtype;
    if (wd != ND_FLOAT32 && wd != ND_FLOAT64) return NULL;
    return nd_graph_layer_act(a);
}

nd_status nd_graph_fold_call(nd_graph *g, nd_status (*fn)(void *ctx), void *ctx, nd_tensor **outs,
                             int nouts, int *sids) {
    nd_graph *tg = NULL;
    ND_TRY(nd_graph_begin(&tg));
    tg->keep_memory = true; /* its intermediates are the prologue's: keep their memory */
    nd_status st = fn(ctx);
    nd_status est = nd_graph_end(tg);
    if (st == ND_OK) st = est;
    for (size_t q = 0; q < tg->n && st == ND_OK; q++) {
        nd_graph_rec *r = &tg->recs[q];
        for (int k = 0; k < r->nt && st == ND_OK; k++) {
            if (!r->t[k]) continue;
            stor_info *in = nd_graph_adopt_storage(g, r->t[k]->storage);
            if (!in) { st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass"); break; }
            r->sid[k] = in->id;
            if (r->role[k] & ND_ROLE_WRITE) in->folded = true;
        }
    }
    size_t moved = 0;
    while (moved < tg->n && st == ND_OK) {
        if (!pro_push(g, &tg->recs[moved])) st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        else moved++;
    }
    /* the records moved belong to g now; tg releases the rest (none recorded: no recs) */
    if (tg->n > moved) memmove(tg->recs, tg->recs + moved, (tg->n - moved) * sizeof *tg->recs);
    tg->n -= moved;
    nd_graph_free(tg);
    for (int k = 0; k < nouts && st == ND_OK; k++) {
        stor_info *in = outs[k] ? nd_graph_adopt_storage(g, outs[k]->storage) : NULL;
        if (outs[k] && !in) st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        else if (in) {
            in->folded = true;
            sids[k] = in->id;
        }
    }
    if (st != ND_OK)
        for (int k = 0; k < nouts; k++) {
            nd_release(outs[k]);
            outs[k] = NULL;
        }
    return st;
}

typedef struct {
    const nd_graph_rec *a, *bn;
    nd_tensor *out[2];
} norm_fold;

static nd_status fold_norm_call(void *ctx) {
    norm_fold *f = ctx;
    const nd_graph_rec *a = f->a, *bn = f->bn;
    return nd_fold_batch_norm(a->t[2], a->t[3], bn->t[1], bn->t[2], bn->t[4], bn->t[5], &f->out[0],
                              &f->out[1]);
}

static nd_status fold_norms(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    int *writers = malloc((ns + 1) * sizeof *writers);
    bool *konst = malloc(ns + 1), *drop = calloc(n + 1, 1);
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    nd_status st = ND_OK;
    if (!writers || !konst || !drop || !refs || !first || !last) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        goto done;
    }
    nd_graph_constants(g, writers, konst);
    nd_graph_uses(g, refs, first, last);
    for (size_t i = 0; i < n && st == ND_OK; i++) {
        nd_graph_rec *bn = &g->recs[i];
        if (bn->entry != ND_CALL_batch_norm || bn->i[0] != 0 || bn->nt != 6 || !bn->t[0] ||
            !bn->t[3] || !bn->full[0])
            continue;
        int xs = bn->sid[3];
        /* the layer: x's only writer, x read by the norm alone and seen nowhere else */
        if (writers[xs] != 1 || refs[xs] != 2 || first[xs] >= i || nd_graph_live_out(g, (size_t)xs, refs))
            continue;
        nd_graph_rec *a = &g->recs[first[xs]];
        const int ws = ND_LAYER_W, bs = ND_LAYER_B;
        int64_t *act = foldable_layer(a);
        if (!act || *act != ND_ACT_NONE || a->sid[0] != xs ||
            !a->full[0] || !nd_graph_same_view(a->t[0], bn->t[3]))
            continue;
        bool consts = konst[a->sid[ws]] && (!a->t[bs] || konst[a->sid[bs]]);
        for (int k = 1; k < 6 && consts; k++)
            if (k != 3 && bn->t[k]) consts = konst[bn->sid[k]];
        if (!consts || !bn->t[1] || !bn->t[2]) continue;
        norm_fold f = {a, bn, {NULL, NULL}};
        int sids[2] = {-1, -1};
        st = nd_graph_fold_call(g, fold_norm_call, &f, f.out, 2, sids);
        if (st != ND_OK) break;
        nd_tensor *w2 = f.out[0], *b2 = f.out[1];
        const int wsid = sids[0], bsid = sids[1];
        nd_release(a->t[ws]);
        a->t[ws] = w2;
        a->sid[ws] = wsid;
        a->full[ws] = true;
        nd_release(a->t[bs]);
        a->t[bs] = b2;
        a->sid[bs] = bsid;
        a->full[bs] = true;
        a->role[bs] = ND_ROLE_READ;
        nd_release(a->t[0]); /* the layer now writes the norm's result */
        a->t[0] = bn->t[0];
        a->sid[0] = bn->sid[0];
        bn->t[0] = NULL;
        drop[i] = true;
        (*changed)++;
    }
    nd_graph_compact(g, drop);
done:
    free(writers); free(konst); free(drop); free(refs); free(first); free(last);
    return st;
}

/* Prepacked weights: a convolution whose weight is a constant gets it
 * packed once, by a conv2d_prepack record in the prologue, and reads the
 * packed panels (conv2d_fused_packed) instead of packing the weight on every
 * call - at batch 8 the packing was about as long as ResNet9's products.
 * The same arithmetic on the same panels: the same bits. */
static nd_status prepack_convs(nd_graph *g) {
    size_t ns = g->nstor;
    int *writers = malloc((ns + 1) * sizeof *writers);
    bool *konst = malloc(ns + 1);
    nd_status st = ND_OK;
    if (!writers || !konst) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        goto done;
    }
    nd_graph_constants(g, writers, konst);
    for (size_t i = 0; i < g->n && st == ND_OK; i++) {
        nd_graph_rec *a = &g->recs[i];
        if (a->entry != ND_CALL_conv2d_fused || a->nt != 4 || !a->t[1] || !a->t[2] || a->t[1]->ndim != 4 ||
            !konst[a->sid[2]] || a->t[1]->dtype != a->t[2]->dtype)
            continue;
        int64_t numel = nd_call_conv2d_packed_numel(a->be, a->t[1]->shape, a->t[2]->shape, a->t[1]->dtype,
                                                    &a->u.conv, a->i[0]);
        if (numel <= 0) continue;
        nd_tensor *pk = NULL, *wv = NULL, *pv = NULL;
        nd_device dev = nd_get_device(a->t[2]);
        st = nd_empty_on(dev, &numel, 1, a->t[2]->dtype, &pk);
        if (st == ND_OK) st = nd_tensor_view_of(a->t[2], a->t[2]->shape, a->t[2]->strides, a->t[2]->ndim,
                                                a->t[2]->offset, &wv);
        if (st == ND_OK) st = nd_tensor_view_of(pk, pk->shape, pk->strides, 1, 0, &pv);
        stor_info *in = st == ND_OK ? nd_graph_adopt_storage(g, pk->storage) : NULL;
        if (st == ND_OK && !in) st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        nd_graph_rec r;
        memset(&r, 0, sizeof r);
        if (st == ND_OK) {
            in->folded = true;
            r.entry = ND_CALL_conv2d_prepack;
            r.be = a->be;
            r.op = "conv2d_prepack";
            r.nt = 2;
            r.t[0] = pk, r.role[0] = ND_ROLE_WRITE, r.full[0] = true, r.sid[0] = in->id;
            r.t[1] = wv, r.role[1] = ND_ROLE_READ, r.full[1] = a->full[2], r.sid[1] = a->sid[2];
            for (int d = 0; d < 4; d++) r.i[d] = a->t[1]->shape[d];
            r.i[4] = a->i[0];
            r.u.conv = a->u.conv;
            pk = wv = NULL; /* the record's now */
            st = nd_graph_rec_replay(&r); /* the panels for the first replay */
            if (st == ND_OK && !pro_push(g, &r)) st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
        }
        if (st != ND_OK) {
            nd_graph_rec_release(&r);
            nd_release(pk); nd_release(wv); nd_release(pv);
            break;
        }
        nd_release(a->t[2]);
        a->t[2] = pv;
        a->sid[2] = in->id;
        a->full[2] = true;
        a->entry = ND_CALL_conv2d_fused_packed; /* (not counted in *changed: no record goes) */
    }
done:
    free(writers); free(konst);
    return st;
}

/* The storages the prologue writes that no kernel of the replay reads and
 * nobody else holds (a fold's float64 intermediates, a norm's rstd): their
 * memory goes back after each prologue run. */
static nd_status collect_temporaries(nd_graph *g) {
    free(g->pro_tmp);
    g->pro_tmp = NULL;
    g->npro_tmp = 0;
    int64_t *prefs = calloc(g->nstor + 1, sizeof *prefs), *refs = malloc((g->nstor + 1) * sizeof *refs);
    size_t *first = malloc((g->nstor + 1) * sizeof *first), *last = malloc((g->nstor + 1) * sizeof *last);
    g->pro_tmp = malloc((g->nstor + 1) * sizeof *g->pro_tmp);
    if (!prefs || !refs || !first || !last || !g->pro_tmp) {
        free(prefs); free(refs); free(first); free(last);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t i = 0; i < g->npro; i++)
        for (int k = 0; k < g->pro[i].nt; k++)
            if (g->pro[i].t[k]) prefs[g->pro[i].sid[k]]++;
    for (size_t k = 0; k < g->nstor; k++) {
        const stor_info *in = &g->stor[k];
        if (in->folded && refs[k] == 0 && !in->s->release &&
            (int64_t)atomic_load(&in->s->refcount) == 1 + prefs[k]) {
            g->pro_tmp[g->npro_tmp++] = (int)k;
            nd_storage_drop_data(in->s);
        }
    }
    free(prefs); free(refs); free(first); free(last);
    return ND_OK;
}

/* The prologue's sources: what its records read that it does not write. */
static nd_status collect_sources(nd_graph *g) {
    for (size_t k = 0; k < g->nsrc; k++) nd_storage_release(g->src[k]);
    free(g->src);
    free(g->src_ver);
    g->src = NULL;
    g->src_ver = NULL;
    g->nsrc = 0;
    if (!g->npro) return ND_OK;
    bool *seen = calloc(g->nstor + 1, 1);
    size_t cap = 0;
    for (size_t i = 0; i < g->npro; i++) cap += (size_t)g->pro[i].nt;
    g->src = malloc((cap + 1) * sizeof *g->src);
    g->src_ver = malloc((cap + 1) * sizeof *g->src_ver);
    if (!seen || !g->src || !g->src_ver) {
        free(seen);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fold pass");
    }
    for (size_t i = 0; i < g->npro; i++) {
        const nd_graph_rec *r = &g->pro[i];
        for (int k = 0; k < r->nt; k++) {
            if (!r->t[k] || !(r->role[k] & ND_ROLE_READ)) continue;
            const stor_info *in = &g->stor[r->sid[k]];
            if (in->folded || seen[in->id]) continue;
            seen[in->id] = true;
            nd_storage_retain(in->s);
            g->src[g->nsrc] = in->s;
            g->src_ver[g->nsrc++] = in->s->version;
        }
    }
    free(seen);
    return ND_OK;
}

/* The capture gave back the memory of storages only it held (graph.c's
 * idle hook) - the constants moved into the prologue among them: they get
 * memory again, and the prologue runs to fill it. */
static nd_status refill(nd_graph *g) {
    bool any = false;
    for (size_t k = 0; k < g->npro_tmp; k++) { /* an earlier fold pass's temporaries */
        ND_TRY(nd_storage_refill_data(g->stor[g->pro_tmp[k]].s));
        any = true;
    }
    for (size_t k = 0; k < g->nstor; k++) {
        stor_info *in = &g->stor[k];
        if (!in->folded || !in->dropped) continue;
        ND_TRY(nd_storage_refill_data(in->s));
        in->dropped = false;
        g->dropped--;
        any = true;
    }
    for (size_t i = 0; i < g->npro && any; i++) ND_TRY(nd_graph_rec_replay(&g->pro[i]));
    return ND_OK;
}

nd_status nd_graph_fold_settle(nd_graph *g) {
    ND_TRY(collect_sources(g));
    return collect_temporaries(g);
}

nd_status nd_graph_pass_fold(nd_graph *g, int64_t *changed) {
    ND_TRY(hoist(g, changed));
    ND_TRY(refill(g));
    ND_TRY(fold_norms(g, changed));
    ND_TRY(prepack_convs(g));
    return nd_graph_fold_settle(g);
}

nd_status nd_graph_run_prologue(nd_graph *g) {
    bool stale = false;
    for (size_t k = 0; k < g->nsrc && !stale; k++) stale = g->src[k]->version != g->src_ver[k];
    if (!stale) return ND_OK;
    nd_status st = ND_OK;
    for (size_t k = 0; k < g->npro_tmp && st == ND_OK; k++)
        st = nd_storage_refill_data(g->stor[g->pro_tmp[k]].s);
    for (size_t i = 0; i < g->npro && st == ND_OK; i++) {
        const nd_graph_rec *r = &g->pro[i];
        st = nd_graph_rec_replay(r);
        for (int k = 0; k < r->nt && st == ND_OK; k++)
            if (r->t[k] && (r->role[k] & ND_ROLE_WRITE)) r->t[k]->storage->version++;
    }
    for (size_t k = 0; k < g->npro_tmp; k++) nd_storage_drop_data(g->stor[g->pro_tmp[k]].s);
    if (st != ND_OK) return st; /* (the versions stay: the next replay tries again) */
    for (size_t k = 0; k < g->nsrc; k++) g->src_ver[k] = g->src[k]->version;
    g->refolds++;
    return ND_OK;
}
