/* graph.c - capturing a sequence of backend calls and replaying it (the
 * engine under nd.compile; docs/compile.md).
 *
 * While a graph captures, every backend call an op makes is also appended
 * to the graph as a record (backend_call.c) that keeps the call's tensors -
 * their storages retained - and its scalar arguments. A replay runs the
 * records in order on the same storages: no Lua, no op checks, no
 * allocation. What a replay must reproduce besides the kernels:
 *   - storages made during the capture and filled on the host, not by a
 *     recorded kernel (zeros, tensors from Lua tables): their first use
 *     takes a snapshot, restored before each replay if a record writes them;
 *   - leaf gradients: the tensors that backward left in leaf->grad during
 *     the capture are put back after each replay (the records rewrote them);
 *   - random kernels draw fresh counters (backend_call.c);
 *   - host checks (labels in range) run again (nd_host_check).
 * Everything else that Lua computes from tensor values is a graph break:
 * refused while capturing (nd_graph_check_host_read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"


static _Thread_local nd_graph *current;
static void (*opaque_release)(int64_t id);
static _Thread_local int paused;

bool nd_graph_capturing(void) {
    /* one relaxed load when nothing captures (thread-local access costs a call in a shared library) */
    if (!atomic_load_explicit(&nd_captures_running, memory_order_relaxed)) return false;
    return current && !paused;
}

bool nd_graph_set_paused(bool on) {
    bool was = paused > 0;
    paused = on;
    return was;
}

static void poison(nd_graph *g, nd_status st, const char *why) {
    if (g->error != ND_OK) return;
    g->error = st;
    snprintf(g->message, sizeof g->message, "%s", why);
}

nd_status nd_graph_check_host_read(const char *op) {
    if (!nd_graph_capturing()) return ND_OK;
    char why[400];
    snprintf(why, sizeof why, "%s: reads tensor values on the host inside a compiled function (a "
             "graph break): a replay would reuse the values read at capture. Move it out of the "
             "compiled function, or compile with {fallback = true}", op);
    poison(current, ND_ERR_UNSUPPORTED, why);
    if (current->fallback) { /* the call goes on eagerly; nd_graph_end reports the break */
        paused = 1;
        return ND_OK;
    }
    return nd_fail(ND_ERR_UNSUPPORTED, "%s", why);
}

nd_status nd_graph_break(const char *why) {
    if (!nd_graph_capturing()) return ND_OK;
    char msg[400];
    snprintf(msg, sizeof msg, "%s (a graph break): a replay would not run it again. Compile with "
             "{fallback = true} to run such calls eagerly", why);
    poison(current, ND_ERR_UNSUPPORTED, msg);
    if (current->fallback) {
        paused = 1;
        return ND_OK;
    }
    return nd_fail(ND_ERR_UNSUPPORTED, "%s", msg);
}

/* ------------------------------------------------------------ storages */

static size_t hash_ptr(const void *p, size_t mask) {
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= UINT64_C(0x9e3779b97f4a7c15);
    return (size_t)(x >> 20) & mask;
}

static bool grow_slots(nd_graph *g) {
    size_t ns = g->nslots ? g->nslots * 2 : 256;
    int *slots = calloc(ns, sizeof *slots);
    if (!slots) return false;
    for (size_t k = 0; k < g->nstor; k++) {
        size_t h = hash_ptr(g->stor[k].s, ns - 1);
        while (slots[h]) h = (h + 1) & (ns - 1);
        slots[h] = (int)k + 1;
    }
    free(g->slots);
    g->slots = slots;
    g->nslots = ns;
    return true;
}

/* The info of storage s, added (retained) on its first use; NULL on OOM. */
static stor_info *storage_info(nd_graph *g, nd_storage *s) {
    if (g->nslots == 0 || (g->nstor + 1) * 2 > g->nslots) {
        if (!grow_slots(g)) return NULL;
    }
    size_t h = hash_ptr(s, g->nslots - 1);
    while (g->slots[h]) {
        stor_info *in = &g->stor[g->slots[h] - 1];
        if (in->s == s) return in;
        h = (h + 1) & (g->nslots - 1);
    }
    if (g->nstor == g->capstor) {
        size_t cap = g->capstor ? g->capstor * 2 : 64;
        stor_info *st = realloc(g->stor, cap * sizeof *st);
        if (!st) return NULL;
        g->stor = st;
        g->capstor = cap;
    }
    stor_info *in = &g->stor[g->nstor];
    memset(in, 0, sizeof *in);
    nd_storage_retain(s);
    atomic_fetch_add(&s->graph_refs, 1);
    in->s = s;
    in->id = (int)g->nstor;
    in->internal = s->serial > g->start_serial;
    in->nbytes = s->nbytes;
    g->slots[h] = (int)g->nstor + 1;
    g->nstor++;
    return in;
}


static nd_status take_snapshot(stor_info *in) {
    size_t n = in->s->nbytes;
    in->snapshot = malloc(n ? n : 1);
    if (!in->snapshot) return nd_fail(ND_ERR_MEMORY, "compile: out of memory copying a constant");
    if (in->s->device == ND_DEVICE_CPU) {
        if (n) memcpy(in->snapshot, in->s->data, n);
    } else if (n) {
        ND_TRY(nd_backend_for(in->s->device)->read(in->s, 0, in->snapshot, n));
    }
    /* zeros (the common constant: a gradient filled in part) need no copy */
    const unsigned char *b = in->snapshot;
    bool zero = true;
    for (size_t i = 0; i < n && zero; i++) zero = b[i] == 0;
    if (zero) {
        free(in->snapshot);
        in->snapshot = NULL;
        in->snap_zero = true;
    }
    return ND_OK;
}

static nd_status restore_snapshot(const stor_info *in) {
    size_t n = in->s->nbytes;
    if (!n) return ND_OK;
    if (in->s->device == ND_DEVICE_CPU) {
        if (in->snapshot) memcpy(in->s->data, in->snapshot, n);
        else memset(in->s->data, 0, n);
        return ND_OK;
    }
    const nd_backend *be = nd_backend_for(in->s->device);
    if (in->snapshot) return be->write(in->s, 0, in->snapshot, n);
    void *zeros = calloc(n, 1);
    if (!zeros) return nd_fail(ND_ERR_MEMORY, "compile: out of memory restoring a constant");
    nd_status st = be->write(in->s, 0, zeros, n);
    free(zeros);
    return st;
}

/* ------------------------------------------------------------ coverage */

static void track_stop(stor_info *in) {
    free(in->wbits);
    free(in->rbw);
    in->wbits = in->rbw = NULL;
}

static void track_start(stor_info *in, const nd_tensor *t) {
    in->es = nd_dtype_size(t->dtype);
    size_t bytes = in->s->nbytes / in->es / 8 + 1;
    in->wbits = calloc(bytes, 1);
    in->rbw = calloc(bytes, 1);
    if (!in->wbits || !in->rbw) {
        track_stop(in);
        in->untracked = true;
    }
}

/* Marks view t's elements: written, or read before written. */
static void track_use(stor_info *in, const nd_tensor *t, bool reads) {
    if (!in->wbits) return;
    size_t es = nd_dtype_size(t->dtype), units = in->s->nbytes / es;
    if (es != in->es) { track_stop(in); in->untracked = true; return; }
    int64_t idx[ND_MAX_DIMS] = {0}, numel = nd_numel(t);
    for (int64_t n = 0; n < numel; n++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        if (off < 0 || (size_t)off >= units) { track_stop(in); in->untracked = true; return; }
        unsigned char bit = (unsigned char)(1u << (off & 7));
        if (reads) {
            if (!(in->wbits[off >> 3] & bit)) in->rbw[off >> 3] |= bit;
        } else {
            in->wbits[off >> 3] |= bit;
        }
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* At the end of the capture: is the snapshot needed, and did any record
 * see the initial content? */
static void track_finish(stor_info *in, bool *restore, bool *observed) {
    *restore = *observed = in->untracked;
    if (!in->wbits) return;
    size_t bytes = in->s->nbytes / in->es / 8 + 1;
    for (size_t b = 0; b < bytes; b++) {
        if (in->rbw[b]) *observed = true;
        if (in->rbw[b] & in->wbits[b]) *restore = true;
    }
    track_stop(in);
}

/* Decides what a tracked storage needs, once no record can use it again:
 * its snapshot only if a replay must restore it (else it goes: no copy per
 * replay); zero_init when records read its zeros (the plan re-zeroes it). */
static void settle(stor_info *in) {
    if (in->settled || !has_snapshot(in)) return;
    in->settled = true;
    bool restore, observed;
    track_finish(in, &restore, &observed);
    in->observed = observed;
    in->zero_init = observed && !restore && in->snap_zero;
    if (!restore) {
        free(in->snapshot);
        in->snapshot = NULL;
        in->snap_zero = false;
    }
}

static stor_info *find_info(nd_graph *g, const nd_storage *s) {
    if (!g->nslots) return NULL;
    size_t h = hash_ptr(s, g->nslots - 1);
    while (g->slots[h]) {
        stor_info *in = &g->stor[g->slots[h] - 1];
        if (in->s == s) return in;
        h = (h + 1) & (g->nslots - 1);
    }
    return NULL;
}

/* nd_storage_idle_hook: only the capturing graph refers to s now, so no
 * record can use it again and eager would have freed it. A storage the
 * memory plan will place (its initial content unseen) gives its memory back
 * now: a capture then needs about what the eager call needs. */
static void graph_idle(nd_storage *s) {
    nd_graph *g = current;
    if (!g || !g->capturing || g->error != ND_OK || g->keep_memory) return;
    stor_info *in = find_info(g, s);
    if (!in || !in->internal || in->dropped || s->release) return;
    settle(in);
    if (!initial_unseen(in)) return;
    nd_storage_drop_data(s);
    in->dropped = true;
    g->dropped++;
}

/* ------------------------------------------------------------- records */

nd_graph_rec *nd_graph_rec_new(nd_call_entry e, const nd_backend *be, const char *op) {
    nd_graph *g = current;
    if (!g || g->error != ND_OK) return NULL;
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 256;
        nd_graph_rec *recs = realloc(g->recs, cap * sizeof *recs);
        if (!recs) {
            poison(g, ND_ERR_MEMORY, "compile: out of memory recording the graph");
            return NULL;
        }
        g->recs = recs;
        g->cap = cap;
    }
    nd_graph_rec *r = &g->recs[g->n++];
    memset(r, 0, sizeof *r);
    r->entry = e;
    r->be = be;
    r->op = op;
    return r;
}

void nd_graph_rec_failed(nd_status st) {
    if (current) poison(current, st, nd_last_error());
}

/* Adds t to the graph's watched tensors (once; nd_graph_stale). */
static void watch(nd_graph *g, nd_tensor *t) {
    if (g->nwatch * 2 >= g->nwatch_set) { /* grow the set (and rehash) */
        size_t n = g->nwatch_set ? g->nwatch_set * 2 : 64;
        void **set = calloc(n, sizeof *set);
        if (!set) { poison(g, ND_ERR_MEMORY, "compile: out of memory recording a tensor"); return; }
        for (size_t k = 0; k < g->nwatch; k++) {
            size_t h = hash_ptr(g->watch[k].t, n - 1);
            while (set[h]) h = (h + 1) & (n - 1);
            set[h] = g->watch[k].t;
        }
        free(g->watch_set);
        g->watch_set = set;
        g->nwatch_set = n;
    }
    size_t h = hash_ptr(t, g->nwatch_set - 1);
    while (g->watch_set[h]) {
        if (g->watch_set[h] == t) return;
        h = (h + 1) & (g->nwatch_set - 1);
    }
    if (g->nwatch == g->capwatch) {
        size_t cap = g->capwatch ? g->capwatch * 2 : 32;
        struct watched *w = realloc(g->watch, cap * sizeof *w);
        if (!w) { poison(g, ND_ERR_MEMORY, "compile: out of memory recording a tensor"); return; }
        g->watch = w;
        g->capwatch = cap;
    }
    g->watch_set[h] = t;
    nd_retain(t);
    g->watch[g->nwatch++] = (struct watched){t, t->storage, t->requires_grad, t->tensor_hooks};
}

bool nd_graph_stale(const nd_graph *g, char *why, size_t n) {
    for (size_t k = 0; g && k < g->nwatch; k++) {
        const struct watched *w = &g->watch[k];
        char shape[ND_SHAPE_BUF];
        const char *what = w->t->storage != w->s ? "got new memory (set_data_)"
                         : w->t->requires_grad != w->requires_grad ? "changed requires_grad"
                         : w->t->tensor_hooks && !w->hooks ? "got a tensor hook (register_hook)" : NULL;
        if (what) {
            snprintf(why, n, "a %s %s tensor the graph uses %s", nd_shape_str(w->t->shape, w->t->ndim, shape),
                     nd_dtype_name(w->t->dtype), what);
            return true;
        }
    }
    return false;
}

static bool covers_storage(const nd_tensor *t) {
    return t->offset == 0 && nd_is_contiguous(t) &&
           (size_t)nd_numel(t) * nd_dtype_size(t->dtype) == t->storage->nbytes;
}

void nd_graph_rec_tensor(nd_graph_rec *r, const nd_tensor *t, nd_rec_role role) {
    nd_graph *g = current;
    if (r->nt == ND_REC_MAX_TENSORS) {
        poison(g, ND_ERR_INTERNAL, "compile: a backend call with too many tensors");
        return;
    }
    int k = r->nt++;
    r->role[k] = (unsigned char)role;
    if (!t) return;
    if (nd_tensor_view_of(t, t->shape, t->strides, t->ndim, t->offset, &r->t[k]) != ND_OK) {
        poison(g, ND_ERR_MEMORY, "compile: out of memory recording a tensor");
        return;
    }
    r->full[k] = covers_storage(t);
    atomic_fetch_add(&t->storage->graph_refs, 1);
    if (t->storage->serial <= g->start_serial) watch(g, (nd_tensor *)t);
}

/* Classifies each storage at its first use: reads (and partial writes) of a
 * storage made during the capture see what the host put there, so it is
 * kept; reads come before writes (an in-place op reads first). */
void nd_graph_rec_done(nd_graph_rec *r) {
    nd_graph *g = current;
    for (int pass = 0; pass < 2 && g->error == ND_OK; pass++) {
        for (int k = 0; k < r->nt; k++) {
            if (!r->t[k]) continue;
            bool reads = r->role[k] & ND_ROLE_READ, writes = r->role[k] & ND_ROLE_WRITE;
            if (pass == 0 ? !reads : reads) continue;
            stor_info *in = storage_info(g, r->t[k]->storage);
            if (!in) { poison(g, ND_ERR_MEMORY, "compile: out of memory recording a storage"); return; }
            r->sid[k] = in->id;
            bool first_use = !in->seen_write && !in->produced && !has_snapshot(in);
            if (in->internal && first_use) {
                if (!reads && r->full[k]) in->produced = true;
                else {
                    nd_status st = take_snapshot(in);
                    if (st != ND_OK) { poison(g, st, nd_last_error()); return; }
                    track_start(in, r->t[k]);
                }
            }
            track_use(in, r->t[k], reads);
            if (reads && writes) track_use(in, r->t[k], false);
            if (writes) in->seen_write = true;
        }
    }
}

nd_status nd_host_check(const char *op, nd_host_check_fn fn, nd_tensor *const *t, int nt,
                        int64_t *iv, int ni) {
    int was = paused;
    paused = 1; /* its reads are its own: not graph breaks, not records */
    nd_status st = fn(op, t, iv);
    paused = was;
    if (st != ND_OK || !nd_graph_capturing()) return st;
    nd_graph_rec *r = nd_graph_rec_new(ND_CALL_host_check, NULL, op);
    if (!r) return ND_OK;
    r->check = fn;
    if (current->where_fn) {
        const char *w = current->where_fn(current->where_ud);
        if (w) snprintf(r->where, sizeof r->where, "%s", w);
    }
    for (int k = 0; k < nt && k < ND_REC_MAX_TENSORS; k++) nd_graph_rec_tensor(r, t[k], ND_ROLE_READ);
    for (int k = 0; k < ni && k < 6; k++) r->i[k] = iv[k];
    nd_graph_rec_done(r);
    return ND_OK;
}

/* ------------------------------------------------------------- leaves */

nd_status nd_graph_note_leaf_grad(nd_tensor *leaf, bool reads_old) {
    if (!atomic_load_explicit(&nd_captures_running, memory_order_relaxed)) return ND_OK;
    nd_graph *g = current;
    if (!g || paused || g->error != ND_OK) return ND_OK;
    leaf_grad *l = NULL;
    for (size_t k = 0; k < g->nleaves && !l; k++)
        if (g->leaves[k].leaf == leaf) l = &g->leaves[k];
    if (reads_old && leaf->grad && leaf->grad->storage->serial <= g->start_serial) {
        nd_status st = nd_fail(ND_ERR_UNSUPPORTED,
                               "backward: adds to a gradient that existed before the compiled call "
                               "(a replay would add to the gradient left at capture): clear the "
                               "gradients inside the compiled function (opt:zero_grad()) or set "
                               "them to nil before calling it");
        poison(g, st, nd_last_error());
        return st;
    }
    if (!l) {
        if (g->nleaves == g->capleaves) {
            size_t cap = g->capleaves ? g->capleaves * 2 : 32;
            leaf_grad *nl = realloc(g->leaves, cap * sizeof *nl);
            if (!nl) return nd_fail(ND_ERR_MEMORY, "compile: out of memory noting a gradient");
            g->leaves = nl;
            g->capleaves = cap;
        }
        nd_retain(leaf);
        l = &g->leaves[g->nleaves++];
        memset(l, 0, sizeof *l);
        l->leaf = leaf;
    }
    if (!reads_old) l->cleared = true;
    else if (!leaf->grad && !l->cleared) l->needs_null = true;
    return ND_OK;
}

/* ------------------------------------------------------------ lifecycle */

void nd_graph_set_fallback(nd_graph *g, bool on) { if (g) g->fallback = on; }

void nd_graph_set_where(nd_graph *g, nd_graph_where_fn fn, void *ud) {
    if (!g) return;
    g->where_fn = fn;
    g->where_ud = ud;
}

nd_status nd_graph_begin(nd_graph **out) {
    *out = NULL;
    if (current)
        return nd_fail(ND_ERR_UNSUPPORTED, "compile: a graph is already being captured on this "
                       "thread (compiled functions cannot be captured inside each other)");
    nd_graph *g = calloc(1, sizeof *g);
    if (!g) return nd_fail(ND_ERR_MEMORY, "compile: out of memory starting a capture");
    atomic_init(&g->refs, 1);
    atomic_fetch_add(&nd_captures_running, 1); /* before the serial: storages made from here count as new */
    g->start_serial = nd_storage_serial();
    g->capturing = true;
    nd_storage_idle_hook = graph_idle;
    current = g;
    paused = 0;
    *out = g;
    return ND_OK;
}

nd_status nd_graph_end(nd_graph *g) {
    if (!g || !g->capturing) return nd_fail(ND_ERR_ARG, "compile: this graph is not capturing");
    g->capturing = false;
    g->ended = true;
    g->where_fn = NULL; /* (its state is the capture's caller's) */
    atomic_fetch_sub(&nd_captures_running, 1);
    if (current == g) current = NULL;
    if (paused && g->error == ND_OK) /* not a graph break: someone paused and never resumed */
        poison(g, ND_ERR_UNSUPPORTED, "compile: the capture ended while paused (an error between "
               "a pause and its resume?): the kernels after the pause were not recorded");
    paused = 0;
    for (size_t k = 0; k < g->nstor; k++) /* the idle hook is for captures only */
        atomic_store(&g->stor[k].s->graph_refs, 0);
    if (g->error != ND_OK) return nd_fail(g->error, "%s", g->message);
    g->captured = (int64_t)g->n;
    for (size_t k = 0; k < g->nleaves; k++) {
        g->leaves[k].grad = g->leaves[k].leaf->grad;
        if (g->leaves[k].grad) nd_retain(g->leaves[k].grad);
    }
    for (size_t k = 0; k < g->nstor; k++) settle(&g->stor[k]);
    return ND_OK;
}

nd_status nd_graph_replay(nd_graph *g) {
    if (!g || !g->ended || g->error != ND_OK)
        return nd_fail(ND_ERR_ARG, "compile: replay of a graph that was not captured successfully");
    if (current)
        return nd_fail(ND_ERR_UNSUPPORTED, "compile: a compiled function called while a graph is "
                       "being captured (compiled functions cannot be nested)");
    if (g->dropped && !g->plan_done) ND_TRY(nd_graph_plan(g)); /* storages without memory */
    for (size_t k = 0; k < g->nleaves; k++)
        if (g->leaves[k].needs_null && g->leaves[k].leaf->grad)
            return nd_fail(ND_ERR_UNSUPPORTED, "compile: a parameter has a gradient from before this "
                           "call, which backward would add to; the compiled function was captured "
                           "with its gradients cleared (set them to nil before each call, or call "
                           "opt:zero_grad() inside the function)");
    for (size_t k = 0; k < g->nstor; k++)
        if (has_snapshot(&g->stor[k])) ND_TRY(restore_snapshot(&g->stor[k]));
    ND_TRY(nd_graph_run_prologue(g));
    bool profiling = nd_profiler_on_; /* each kernel its own row: "compiled:binary.add" */
    for (size_t k = 0; k < g->n; k++) {
        nd_graph_rec *r = &g->recs[k];
        int depth = -1;
        if (profiling) {
            if (!r->profile_id) {
                char name[192];
                const char *detail = r->entry == ND_CALL_unary ? nd_unary_name((nd_unary_op)r->i[0])
                    : (r->entry == ND_CALL_binary || r->entry == ND_CALL_binary_scalar)
                        ? nd_binary_name((nd_binary_op)r->i[0])
                    : r->entry == ND_CALL_reduce ? nd_reduce_name((nd_reduce_op)r->i[0])
                    : r->entry == ND_CALL_fused_elementwise || r->entry == ND_CALL_fused_rows
                        ? r->prog->desc : NULL;
                snprintf(name, sizeof name, "compiled:%s%s%s", nd_call_entry_name(r->entry),
                         detail ? "." : "", detail ? detail : "");
                r->profile_id = nd_profiler_intern(name) + 1;
            }
            if (r->profile_id > 0) depth = nd_profiler_push(r->profile_id - 1);
        }
        nd_status st = nd_graph_rec_run(r);
        if (depth >= 0) nd_profiler_pop(depth);
        if (st != ND_OK && r->entry == ND_CALL_host_check && r->where[0]) {
            char msg[900]; /* the line that made the check: the replay runs no Lua to point at it */
            snprintf(msg, sizeof msg, "%s", nd_last_error_raw());
            return nd_fail(st, "%s (the check of %s recorded at %s)", msg, r->op, r->where);
        }
        if (st != ND_OK) return st;
        /* as eager in-place writes do: a saved tensor this changed fails its backward */
        for (int j = 0; j < r->nt; j++)
            if (r->t[j] && (r->role[j] & ND_ROLE_WRITE)) r->t[j]->storage->version++;
    }
    g->replays++;
    for (size_t k = 0; k < g->nleaves; k++) {
        leaf_grad *l = &g->leaves[k];
        if (l->leaf->grad == l->grad) continue;
        if (l->grad) nd_retain(l->grad);
        nd_release(l->leaf->grad);
        l->leaf->grad = l->grad;
    }
    return ND_OK;
}

void nd_graph_retain(nd_graph *g) { if (g) atomic_fetch_add(&g->refs, 1); }

void nd_graph_free(nd_graph *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    if (g->capturing) atomic_fetch_sub(&nd_captures_running, 1); /* freed without an end */
    if (current == g) { current = NULL; paused = 0; }
    if (g->capturing) /* an ended graph reset its counts at its end */
        for (size_t k = 0; k < g->nstor; k++) atomic_store(&g->stor[k].s->graph_refs, 0);
    for (size_t k = 0; k < g->n; k++) {
        if (nd_graph_rec_opaque(&g->recs[k]) && opaque_release) opaque_release(g->recs[k].i[0]);
        nd_graph_rec_release(&g->recs[k]);
    }
    for (size_t k = 0; k < g->npro; k++) nd_graph_rec_release(&g->pro[k]);
    for (size_t k = 0; k < g->nsrc; k++) nd_storage_release(g->src[k]);
    free(g->pro);
    free(g->src);
    free(g->src_ver);
    free(g->pro_tmp);
    for (size_t k = 0; k < g->nstor; k++) {
        free(g->stor[k].snapshot);
        track_stop(&g->stor[k]);
        nd_storage_release(g->stor[k].s);
    }
    for (size_t k = 0; k < g->nleaves; k++) {
        nd_release(g->leaves[k].leaf);
        nd_release(g->leaves[k].grad);
    }
    for (size_t k = 0; k < g->nwatch; k++) nd_release(g->watch[k].t);
    free(g->watch);
    free(g->watch_set);
    free(g->recs);
    free(g->stor);
    free(g->slots);
    free(g->leaves);
    free(g);
}

/* --------------------------------------------------------- introspection */

size_t nd_graph_size(const nd_graph *g) { return g ? g->n : 0; }

void nd_graph_stats(const nd_graph *g, nd_graph_stat *out) {
    memset(out, 0, sizeof *out);
    if (!g) return;
    out->records = (int64_t)g->n;
    out->storages = (int64_t)g->nstor;
    for (size_t k = 0; k < g->nstor; k++) {
        const stor_info *in = &g->stor[k];
        if (in->internal) out->internal_bytes += (int64_t)in->nbytes;
        if (has_snapshot(in)) {
            out->restored++;
            out->restored_bytes += (int64_t)in->nbytes;
        }
    }
    out->leaves = (int64_t)g->nleaves;
    out->planned_bytes = g->planned_bytes;
    out->fixed_bytes = g->fixed_bytes;
    out->buffers = g->nbuffers;
    out->bound_bytes = g->bound_bytes;
    out->captured = g->captured ? g->captured : (int64_t)g->n;
    out->fused_runs = g->fused_runs;
    out->fused_rows = g->fused_rows;
    out->fused_registers = g->fused_registers;
    out->fused_register_bytes = g->fused_register_bytes;
    for (size_t i = 0; i < g->n; i++) out->prepared += g->recs[i].prep_state == ND_PREP_READY;
    out->folded = (int64_t)g->npro;
    out->fold_sources = (int64_t)g->nsrc;
    out->refolds = g->refolds;
}

stor_info *nd_graph_adopt_storage(nd_graph *g, nd_storage *s) {
    stor_info *in = storage_info(g, s);
    if (in) atomic_store(&s->graph_refs, 0); /* counted while capturing only */
    return in;
}

void nd_graph_mark_input(nd_graph *g, const nd_tensor *t) {
    stor_info *in = g && t ? find_info(g, t->storage) : NULL;
    if (in) in->input = true;
}

nd_status nd_graph_record(const nd_graph *g, size_t i, nd_graph_rec_info *out) {
    if (!g || i >= g->n) return nd_fail(ND_ERR_INDEX, "compile: no record %zu", i);
    const nd_graph_rec *r = &g->recs[i];
    memset(out, 0, sizeof *out);
    out->entry = nd_call_entry_name(r->entry);
    out->op = r->op;
    out->device = r->be ? r->be->name : "host";
    out->ntensors = r->nt;
    for (int k = 0; k < r->nt; k++) {
        out->tensors[k] = r->t[k];
        out->roles[k] = r->role[k];
        out->storage[k] = -1;
        if (!r->t[k]) continue;
        const stor_info *in = &g->stor[r->sid[k]];
        out->storage[k] = in->id;
        out->storage_kind[k] = has_snapshot(in) ? 'c' : in->folded ? 'f'
                             : in->internal ? (in->planned ? 'p' : 'i') : 'e';
        out->outside[k] = in->internal && in->outside;
    }
    switch (r->entry) {
    case ND_CALL_unary: out->detail = nd_unary_name((nd_unary_op)r->i[0]); break;
    case ND_CALL_binary: case ND_CALL_binary_scalar: out->detail = nd_binary_name((nd_binary_op)r->i[0]); break;
    case ND_CALL_reduce: out->detail = nd_reduce_name((nd_reduce_op)r->i[0]); break;
    case ND_CALL_fused_rows: out->detail = r->prog->desc; break;
    case ND_CALL_fused_elementwise:
        out->detail = r->prog->desc;
        out->tune_size = r->prog->tune_size;
        out->tune_serial = r->prog->tune_serial;
        break;
    case ND_CALL_matmul: case ND_CALL_matmul_acc: case ND_CALL_linear_fused:
        out->gemm_threads = r->hint.threads;
        out->gemm_mc = r->hint.mc;
        out->gemm_order = r->hint.order;
        out->gemm_split = r->hint.split;
        break;
    case ND_CALL_host_check:
        if (nd_graph_rec_opaque(r)) {
            out->detail = r->i[3] ? "opaque_backward" : "opaque_forward";
            out->device = "lua";
        }
        break;
    default: out->detail = NULL;
    }
    return ND_OK;
}


/* ---------------------------------------------------------- opaque nodes */

static nd_graph_opaque_fn opaque_fn;

void nd_graph_set_opaque_hooks(nd_graph_opaque_fn fn, void (*release)(int64_t id)) {
    opaque_fn = fn;
    opaque_release = release;
}

void nd_graph_set_opaque(nd_graph *g, bool on) { if (g) g->opaque = on; }

bool nd_graph_opaque_ok(void) { return nd_graph_capturing() && current->opaque && opaque_fn; }

static nd_status opaque_check(const char *op, nd_tensor *const *t, int64_t *iv) {
    if (!opaque_fn)
        return nd_fail(ND_ERR_UNSUPPORTED, "compile: autograd.Function '%s': no Lua to run its opaque node", op);
    int nin = (int)iv[1], nout = (int)iv[2];
    return opaque_fn(op, iv[0], (int)iv[3], t, nin, t + nin, nout);
}

bool nd_graph_rec_opaque(const nd_graph_rec *r) {
    return r->entry == ND_CALL_host_check && r->check == opaque_check;
}

/* The names of opaque nodes (record ops are static text): interned for the
 * program's life; a program names few Functions (past the table's size they
 * share "autograd.Function"). */
#define OPAQUE_NAMES 256
static char *opaque_names[OPAQUE_NAMES];
static size_t nopaque_names;

static const char *opaque_name(const char *name) {
    if (!name) return "autograd.Function";
    for (size_t k = 0; k < nopaque_names; k++)
        if (!strcmp(opaque_names[k], name)) return opaque_names[k];
    if (nopaque_names == OPAQUE_NAMES) return "autograd.Function";
    size_t n = strlen(name) + 1;
    char *copy = malloc(n);
    if (!copy) return "autograd.Function";
    memcpy(copy, name, n);
    opaque_names[nopaque_names++] = copy;
    return copy;
}

nd_status nd_graph_opaque(const char *name, int64_t id, int kind, nd_tensor *const *ins, int nin,
                          nd_tensor **outs, int nout) {
    if (!nd_graph_opaque_ok())
        return nd_fail(ND_ERR_UNSUPPORTED, "compile: an opaque node outside a capture that allows them");
    nd_graph *g = current;
    if (nin < 0 || nout < 0 || nin + nout > ND_REC_MAX_TENSORS)
        return nd_fail(ND_ERR_UNSUPPORTED, "autograd.Function '%s': %d tensors in and out, more than an "
                       "opaque node holds (%d)", name, nin + nout, ND_REC_MAX_TENSORS);
    nd_tensor *fresh[ND_REC_MAX_TENSORS] = {0};
    nd_status st = ND_OK;
    for (int k = 0; k < nout && st == ND_OK; k++) {
        nd_tensor *o = outs[k];
        bool ok = o->storage->serial > g->start_serial && !find_info(g, o->storage) && covers_storage(o);
        for (int j = 0; j < nin && ok; j++) ok = ins[j]->storage != o->storage;
        for (int j = 0; j < k && ok; j++) ok = fresh[j]->storage != o->storage;
        if (ok) {
            nd_retain(o);
            fresh[k] = o;
        } else { /* a view, an input, a constant: the node writes a copy of its own */
            int was = paused;
            paused = 1;
            st = nd_clone(o, &fresh[k]);
            paused = was;
        }
    }
    if (st != ND_OK) {
        for (int k = 0; k < nout; k++) nd_release(fresh[k]);
        return st;
    }
    nd_graph_rec *r = nd_graph_rec_new(ND_CALL_host_check, NULL, opaque_name(name));
    if (!r) {
        for (int k = 0; k < nout; k++) nd_release(fresh[k]);
        return nd_fail(g->error != ND_OK ? g->error : ND_ERR_MEMORY, "%s",
                       g->error != ND_OK ? g->message : "compile: out of memory recording the graph");
    }
    r->check = opaque_check;
    r->i[0] = id;
    r->i[1] = nin;
    r->i[2] = nout;
    r->i[3] = kind;
    for (int k = 0; k < nin; k++) nd_graph_rec_tensor(r, ins[k], ND_ROLE_READ);
    for (int k = 0; k < nout; k++) nd_graph_rec_tensor(r, fresh[k], ND_ROLE_WRITE);
    nd_graph_rec_done(r);
    for (int k = 0; k < nout; k++) outs[k] = fresh[k];
    return ND_OK;
}
