/* graph_plan.c - the memory plan of a captured graph (nd_graph_plan): the
 * intermediates that only the graph's kernels see share buffers by
 * liveness, greedy by size; zero fills stand in for the host-side zeros a
 * shared buffer no longer keeps. */
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

void nd_graph_uses(const nd_graph *g, int64_t *refs, size_t *first, size_t *last) {
    for (size_t k = 0; k < g->nstor; k++) {
        refs[k] = 0;
        first[k] = SIZE_MAX;
        last[k] = 0;
    }
    for (size_t i = 0; i < g->n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++) {
            if (!r->t[k]) continue;
            int id = r->sid[k];
            refs[id]++;
            if (first[id] == SIZE_MAX) first[id] = i;
            last[id] = i;
        }
    }
}


/* An arena: one device buffer; each planned storage gets an offset in one.
 * One per device, more where the device caps a buffer's size. */
typedef struct {
    nd_device_type device;
    int device_index;
    size_t nbytes;
    nd_storage *s;
} plan_buffer;

/* A storage placed in an arena: its bytes [off, off + size) during records
 * first .. last. */
typedef struct {
    size_t first, last, off, size;
    int arena;
} placed;

#define PLAN_ALIGN 64 /* bytes: a cache line; every dtype's size divides it */

static int by_offset(const void *a, const void *b) {
    size_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return x < y ? -1 : x > y;
}

static _Thread_local const nd_graph *qsort_ctx; /* the graph whose storages by_size_desc compares */

static int by_size_desc(const void *a, const void *b) {
    size_t x = qsort_ctx->stor[*(const int *)a].nbytes, y = qsort_ctx->stor[*(const int *)b].nbytes;
    if (x != y) return x < y ? 1 : -1;
    return *(const int *)a - *(const int *)b; /* stable: by storage number */
}

static nd_dtype dtype_of_size(size_t es) {
    return es == 8 ? ND_INT64 : es == 4 ? ND_INT32 : ND_UINT8;
}

/* A planned storage whose zeros some record read (a gradient filled in
 * part) shares its buffer: a fill record before its first use puts the
 * zeros back on every replay, as the eager call's zeros() did. */
static nd_status insert_zero_fills(nd_graph *g, const size_t *first, const int *buf_of,
                                   const size_t *off_of, const plan_buffer *bufs) {
    size_t extra = 0;
    for (size_t k = 0; k < g->nstor; k++) extra += buf_of[k] >= 0 && g->stor[k].zero_init;
    if (!extra) return ND_OK;
    nd_graph_rec *recs = calloc(g->n + extra, sizeof *recs);
    nd_graph_rec *fills = calloc(extra, sizeof *fills);
    size_t *at = malloc(extra * sizeof *at);
    if (!recs || !fills || !at) {
        free(recs); free(fills); free(at);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory planning the graph's memory");
    }
    size_t m = 0;
    nd_status st = ND_OK;
    for (size_t k = 0; k < g->nstor && st == ND_OK; k++) {
        stor_info *in = &g->stor[k];
        if (buf_of[k] < 0 || !in->zero_init) continue;
        nd_graph_rec *r = &fills[m];
        at[m++] = first[k];
        r->entry = ND_CALL_fill;
        r->be = nd_backend_for(in->s->device);
        r->op = "zeros";
        r->nt = 1;
        r->role[0] = ND_ROLE_WRITE;
        r->sid[0] = in->id;
        nd_dtype dt = dtype_of_size(in->es ? in->es : 1);
        int64_t numel = (int64_t)(in->nbytes / nd_dtype_size(dt)), stride = 1;
        st = nd_tensor_wrap(bufs[buf_of[k]].s, dt, &numel, &stride, 1,
                            (int64_t)(off_of[k] / nd_dtype_size(dt)), &r->t[0]);
    }
    if (st != ND_OK) { /* nothing has changed yet */
        for (size_t z = 0; z < m; z++) nd_release(fills[z].t[0]);
        free(recs); free(fills); free(at);
        return st;
    }
    size_t out = 0;
    for (size_t i = 0; i < g->n; i++) {
        for (size_t z = 0; z < extra; z++)
            if (at[z] == i) recs[out++] = fills[z];
        recs[out++] = g->recs[i];
    }
    free(fills);
    free(at);
    free(g->recs);
    g->recs = recs;
    g->n = out;
    g->cap = g->n;
    return ND_OK;
}

/* Record i may write storage out_sid over storage in_sid, which dies there:
 * its kernel reads each input element before writing the output element in
 * the same place, and no other. True of cross_entropy_backward (the
 * gradient over the logits; backend.h) and of the single elementwise
 * kernels when output and input are the same view; not of the CPU's fused
 * runs, whose executor may store a tile before a later step reads it. Then
 * the two share a buffer although both are live at record i. */
static bool in_place_ok(const nd_graph *g, size_t i, int in_sid, int out_sid) {
    const nd_graph_rec *r = &g->recs[i];
    bool fused = false;
    switch (r->entry) {
    case ND_CALL_cross_entropy_backward: case ND_CALL_unary: case ND_CALL_binary:
    case ND_CALL_binary_scalar: case ND_CALL_clamp: /* (not copy: OpenCL refuses overlapping copies) */
        break;
    case ND_CALL_fused_elementwise: /* OpenCL's kernel loads every input before its stores */
        if (!(r->be && r->be->prepare_begin)) return false;
        fused = true;
        break;
    default:
        return false;
    }
    if (in_sid == out_sid || g->stor[in_sid].nbytes != g->stor[out_sid].nbytes) return false;
    int oslot = -1, islot = -1; /* each storage in exactly one slot */
    for (int k = 0; k < r->nt; k++) {
        if (!r->t[k]) continue;
        if (r->sid[k] == out_sid) {
            if (oslot >= 0) return false;
            oslot = k;
        }
        if (r->sid[k] == in_sid) {
            if (islot >= 0) return false;
            islot = k;
        }
    }
    if (oslot < 0 || islot < 0 || r->role[oslot] != ND_ROLE_WRITE || !r->full[oslot] ||
        r->role[islot] != ND_ROLE_READ)
        return false;
    /* a fused record's tensors come in any order; the others' output is slot 0 */
    if (!fused && (oslot != 0 || (r->entry == ND_CALL_cross_entropy_backward && islot != 1))) return false;
    return nd_graph_same_view(r->t[oslot], r->t[islot]);
}

/* Storages made inside the capture, produced by a kernel and held by
 * nothing but the graph's records (no Lua tensor, gradient or output) live
 * from their first to their last record: storages whose lives do not
 * overlap share one buffer (greedy, by first use, best fit). Call after
 * nd_graph_end, once Lua has collected what the capture left behind. */
nd_status nd_graph_plan(nd_graph *g) {
    if (!g || !g->ended || g->error != ND_OK)
        return nd_fail(ND_ERR_ARG, "compile: plan of a graph that was not captured successfully");
    if (g->plan_done) return ND_OK;
    nd_graph_hoist_checks(g); /* first, so that liveness sees the checks where they run */
    size_t ns = g->nstor;
    int64_t *refs = calloc(ns + 1, sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = calloc(ns + 1, sizeof *last);
    int *order = malloc((ns + 1) * sizeof *order), *buf_of = malloc((ns + 1) * sizeof *buf_of);
    size_t *off_of = calloc(ns + 1, sizeof *off_of); /* bytes into its arena */
    plan_buffer *bufs = calloc(ns + 1, sizeof *bufs);
    nd_status st = ND_OK;
    int nb = 0;
    if (!refs || !first || !last || !order || !buf_of || !off_of || !bufs) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory planning the graph's memory");
        goto done;
    }
    nd_graph_uses(g, refs, first, last);
    int n = 0;
    for (size_t k = 0; k < ns; k++) {
        stor_info *in = &g->stor[k];
        buf_of[k] = -1;
        bool only_graph = (int64_t)atomic_load(&in->s->refcount) == 1 + refs[k];
        in->outside = !only_graph;
        /* (zero_init ones are re-zeroed before their first use, below) */
        if (in->folded) { /* the prologue's constants live across replays (its temporaries not) */
            if (in->s->data) g->fixed_bytes += (int64_t)in->s->nbytes;
        }
        else if (in->internal && initial_unseen(in) && only_graph && !in->s->release && first[k] != SIZE_MAX)
            order[n++] = (int)k;
        else if (in->internal && only_graph && first[k] == SIZE_MAX && !in->s->release)
            nd_storage_drop_data(in->s); /* no kernel uses it any more (the passes removed them) */
        else if (in->internal)
            g->fixed_bytes += (int64_t)in->s->nbytes;
    }
    /* An in-place pair (the gradient written over the logits that die at
     * that kernel) goes into one buffer: the second joins the first, which
     * then lives until the second's last use. */
    int *joins = malloc((ns + 1) * sizeof *joins);
    size_t *until = malloc((ns + 1) * sizeof *until);
    bool *planned = calloc(ns + 1, 1), *taken = calloc(ns + 1, 1); /* taken: overwritten in place */
    int64_t *delta = calloc(g->n + 1, sizeof *delta);
    if (!joins || !until || !planned || !taken || !delta) {
        free(joins); free(until); free(planned); free(taken); free(delta);
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory planning the graph's memory");
        goto done;
    }
    for (size_t k = 0; k < ns; k++) {
        joins[k] = -1;
        until[k] = last[k];
    }
    for (int a = 0; a < n; a++) planned[order[a]] = true;
    for (size_t i = 0; i < g->n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int o = 0; o < r->nt; o++) {
            if (!r->t[o] || r->role[o] != ND_ROLE_WRITE) continue;
            int out = r->sid[o];
            if (!planned[out] || first[out] != i || joins[out] >= 0 || g->stor[out].zero_init) continue;
            for (int j = 0; j < r->nt; j++) {
                if (!r->t[j] || j == o) continue;
                int src = r->sid[j]; /* a dying input takes one output at most */
                if (src == out || taken[src] || !planned[src] || last[src] != i || !in_place_ok(g, i, src, out))
                    continue;
                int root = src; /* a chain (a GEMM's result, its bias added, an activation) shares one */
                while (joins[root] >= 0) root = joins[root];
                joins[out] = root;
                taken[src] = true;
                if (last[out] > until[root]) until[root] = last[out];
                break;
            }
        }
    }
    /* the least any plan could do: the most bytes live at one record (an
     * input overwritten in place counts as gone there) */
    {
        int64_t live = 0;
        for (int a = 0; a < n; a++) {
            int k = order[a];
            delta[first[k]] += (int64_t)g->stor[k].nbytes;
            delta[taken[k] ? last[k] : last[k] + 1] -= (int64_t)g->stor[k].nbytes;
        }
        for (size_t i = 0; i <= g->n; i++) {
            live += delta[i];
            if (live > g->bound_bytes) g->bound_bytes = live;
        }
    }
    free(planned);
    free(taken);
    free(delta);
    /* Greedy by size into one arena per device: the largest storages first,
     * each at the lowest offset (aligned) where no storage placed before it
     * that lives at the same time has bytes. */
    qsort_ctx = g;
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    placed *pl = malloc((size_t)(n + 1) * sizeof *pl), *near = malloc((size_t)(n + 1) * sizeof *near);
    if (!pl || !near) {
        free(pl); free(near); free(joins); free(until);
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory planning the graph's memory");
        goto done;
    }
    int npl = 0;
    for (int a = 0; a < n; a++) {
        int k = order[a];
        if (joins[k] >= 0) continue; /* placed with the storage it overwrites */
        const nd_storage *sk = g->stor[k].s;
        size_t need = sk->nbytes, f = first[k], l = until[k];
        /* an arena is one device buffer: no larger than the device allows one to be */
        size_t cap = SIZE_MAX;
        nd_opencl_info info;
        if (sk->device == ND_DEVICE_OPENCL && nd_opencl_device_info(sk->device_index, &info) == ND_OK &&
            info.max_alloc_bytes > 0)
            cap = (size_t)info.max_alloc_bytes;
        int ar = -1;
        size_t off = 0;
        for (int b = 0; b <= nb && ar < 0; b++) {
            if (b == nb) { /* a new arena */
                ar = nb++;
                bufs[ar].device = sk->device;
                bufs[ar].device_index = sk->device_index;
                bufs[ar].nbytes = 0;
                off = 0;
                break;
            }
            if (bufs[b].device != sk->device || bufs[b].device_index != sk->device_index) continue;
            int nn = 0; /* the placed storages of that arena alive at the same time */
            for (int q = 0; q < npl; q++)
                if (pl[q].arena == b && pl[q].first <= l && f <= pl[q].last) near[nn++] = pl[q];
            qsort(near, (size_t)nn, sizeof *near, by_offset);
            off = 0;
            for (int q = 0; q < nn; q++) {
                if (off + need <= near[q].off) break; /* the gap before it holds this one */
                size_t end = near[q].off + near[q].size;
                end = (end + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
                if (end > off) off = end;
            }
            if (off + need <= cap || (off == 0 && bufs[b].nbytes == 0)) ar = b;
        }
        pl[npl++] = (placed){f, l, off, need, ar};
        if (off + need > bufs[ar].nbytes) bufs[ar].nbytes = off + need;
        buf_of[k] = ar;
        off_of[k] = off;
    }
    free(pl);
    free(near);
    for (size_t k = 0; k < ns; k++)
        if (joins[k] >= 0) {
            buf_of[k] = buf_of[joins[k]];
            off_of[k] = off_of[joins[k]];
        }
    free(joins);
    free(until);
    for (size_t k = 0; k < ns && st == ND_OK; k++)
        if (g->stor[k].dropped && buf_of[k] < 0 && first[k] != SIZE_MAX)
            st = nd_fail(ND_ERR_INTERNAL, "compile: storage %zu gave its memory back but has no place "
                         "in the plan", k);
    for (int b = 0; b < nb && st == ND_OK; b++) {
        nd_device dev = {bufs[b].device, bufs[b].device_index};
        st = nd_storage_new_on(dev, bufs[b].nbytes, &bufs[b].s);
    }
    if (st != ND_OK) goto done;
    /* the zero fills first (a failure there leaves the graph as it was), then
     * every record's tensors onto the buffers */
    st = insert_zero_fills(g, first, buf_of, off_of, bufs);
    if (st != ND_OK) goto done;
    for (size_t i = 0; i < g->n; i++) {
        nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++) {
            if (!r->t[k] || buf_of[r->sid[k]] < 0) continue;
            if (r->t[k]->storage == bufs[buf_of[r->sid[k]]].s)
                continue; /* a zero fill insert_zero_fills made over the arena, offset included */
            nd_storage *nb_s = bufs[buf_of[r->sid[k]]].s;
            nd_storage_retain(nb_s);
            nd_storage_release(r->t[k]->storage);
            r->t[k]->storage = nb_s;
            r->t[k]->offset += (int64_t)(off_of[r->sid[k]] / nd_dtype_size(r->t[k]->dtype));
        }
    }
    for (size_t k = 0; k < ns; k++) {
        if (buf_of[k] < 0) continue;
        stor_info *in = &g->stor[k];
        nd_storage *nb_s = bufs[buf_of[k]].s;
        nd_storage_retain(nb_s);
        nd_storage_release(in->s);
        in->s = nb_s;
        in->planned = true;
    }
    for (int b = 0; b < nb; b++) g->planned_bytes += (int64_t)bufs[b].nbytes;
    g->nbuffers = nb;
    g->plan_done = true;
done:
    for (int b = 0; b < nb; b++) {
        nd_storage_release(bufs[b].s); /* the records hold them */
    }
    free(refs);
    free(first);
    free(last);
    free(order);
    free(buf_of);
    free(off_of);
    free(bufs);
    return st;
}

