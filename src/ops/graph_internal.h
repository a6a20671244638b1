/* graph_internal.h - the captured graph's own state, shared by the files
 * that build it (graph.c), plan its memory (graph_plan.c) and rewrite it
 * (graph_passes.c). Private to src/ops. */
#ifndef ND_GRAPH_INTERNAL_H
#define ND_GRAPH_INTERNAL_H

#include "graph_record.h"

typedef struct {
    nd_storage *s;      /* retained */
    int id;
    bool internal;      /* made during the capture */
    bool seen_write;    /* some record wrote it */
    bool produced;      /* its first use was a whole-storage write */
    void *snapshot;     /* host copy taken at its first use (internal, not produced) */
    bool snap_zero;     /* ... which was all zero bytes: kept as this flag, not as a copy */
    bool settled;       /* tracking done (at the end, or once only the graph held it) */
    bool dropped;       /* its memory went back while capturing (planned later) */
    bool outside;       /* at the plan, someone besides the graph held it */
    /* Storages made inside whose first use is not a whole write (zeros
     * filled in part, cat, stack): which elements (of es bytes) some record
     * wrote, and which one read before any record wrote them. Their
     * snapshot is restored before each replay only if an element read
     * before being written is also written (else the records never see
     * what it held, or it never changes); only a storage whose initial
     * content no record reads can share a buffer of the memory plan. */
    unsigned char *wbits, *rbw;
    size_t es;
    bool untracked;     /* a use the bitmaps could not follow: assume the worst */
    bool observed;      /* some record read its initial content */
    bool zero_init;     /* ... and that content was all zero bytes (zeros filled in part) */
    bool planned;       /* moved into a buffer of the memory plan */
    size_t nbytes;      /* its own size (a planned buffer may be larger) */
    bool input;         /* one of the compiled function's inputs (nd_graph_mark_input) */
    bool folded;        /* written by the prologue (graph_fold.c): lives across replays */
} stor_info;

typedef struct {
    nd_tensor *leaf, *grad;
    bool cleared;     /* the function set its grad (to nil: zero_grad) during the capture */
    bool needs_null;  /* backward found no grad and the function had not cleared it: the
                       * caller did, and must before every replay (else eager would add) */
} leaf_grad;

struct nd_graph {
    atomic_int refs;     /* the owner's, and each compiled output's autograd node's */
    uint64_t replays;    /* replays so far (an output's backward checks that none came since) */
    atomic_llong pending; /* outputs' backward nodes alive that have not run (graph_backward.c) */
    nd_graph_rec *recs;
    size_t n, cap;
    stor_info *stor;
    size_t nstor, capstor;
    int *slots;          /* open addressing: index + 1 into stor, 0 empty */
    size_t nslots;
    leaf_grad *leaves;
    size_t nleaves, capleaves;
    /* The tensor objects from before the capture that its kernels were given
     * (parameters, buffers, a closure's tensors: retained), as they were then:
     * set_data_, requires_grad_ or a first tensor hook on one makes the graph
     * stale (nd_graph_stale), since a replay would go on as captured. */
    struct watched { nd_tensor *t; nd_storage *s; bool requires_grad, hooks; } *watch;
    size_t nwatch, capwatch;
    void **watch_set;    /* open addressing over watch's tensors (NULL empty) */
    size_t nwatch_set;
    uint64_t start_serial;
    bool capturing;
    bool ended;
    int64_t dropped;     /* storages whose memory went back while capturing */
    bool plan_done;
    bool fallback;       /* a graph break stops the recording instead of failing the op */
    nd_graph_where_fn where_fn; /* the caller's source position for host checks (nd_graph_set_where) */
    void *where_ud;
    int64_t planned_bytes, fixed_bytes; /* after nd_graph_plan: its buffers, and the rest */
    int64_t bound_bytes;  /* the most bytes of planned storages live at one record */
    int64_t captured;     /* records the capture made (the plan adds zero fills) */
    int nbuffers;
    int64_t fused_runs;             /* fused_elementwise records the fuse pass made */
    int64_t fused_rows;             /* ... and fused_rows records (a run into a row op) */
    int64_t fused_registers, fused_register_bytes; /* values they never store (and their bytes) */
    /* The prologue (graph_fold.c): records that read constants only (parameters,
     * buffers, running statistics), run before a replay only when one of their
     * sources changed since they last ran (its storage version). */
    nd_graph_rec *pro;
    size_t npro, cappro;
    nd_storage **src;     /* the sources, retained */
    uint64_t *src_ver;    /* their versions when the prologue last ran */
    size_t nsrc;
    int *pro_tmp;         /* storages only the prologue uses: memory only while it runs */
    size_t npro_tmp;
    int64_t refolds;      /* prologue runs at replays */
    bool keep_memory;     /* a helper capture (the fold pass's): the idle hook drops nothing */
    bool opaque;          /* nd_graph_set_opaque: Lua Functions become opaque nodes */
    nd_status error;     /* the first failure while recording: the capture is invalid */
    char message[512];
};

static inline bool has_snapshot(const stor_info *in) { return in->snapshot || in->snap_zero; }

/* No record reads what the storage held before the graph first wrote it
 * (or it held zeros, which the plan puts back): it may share a buffer. */
static inline bool initial_unseen(const stor_info *in) {
    return in->produced || (in->seen_write && !in->observed && !has_snapshot(in)) || in->zero_init;
}

/* The storage's value is seen after the graph runs: it existed before, Lua
 * (or a gradient, an output) holds it, it is a constant, or it is borrowed
 * (its owner reads it). refs as nd_graph_uses. */
static inline bool nd_graph_live_out(const nd_graph *g, size_t k, const int64_t *refs) {
    const stor_info *in = &g->stor[k];
    bool outside = (int64_t)atomic_load(&in->s->refcount) > 1 + refs[k];
    return !in->internal || outside || has_snapshot(in) || in->s->release;
}

/* The same shape (strides, offsets and dtypes not compared). */
/* Records no pass moves anything across: they talk to the host (checks,
 * reads, writes) or draw random numbers (graph_reorder.c, graph_hoist.c). */
static inline bool nd_graph_rec_barrier(const nd_graph_rec *r) {
    return r->entry == ND_CALL_host_check || r->entry == ND_CALL_read || r->entry == ND_CALL_write ||
           r->entry == ND_CALL_random;
}

/* Whether a and b touch a storage that one of them writes (then their order
 * matters). */
static inline bool nd_graph_recs_conflict(const nd_graph_rec *a, const nd_graph_rec *b) {
    for (int i = 0; i < a->nt; i++) {
        if (!a->t[i]) continue;
        for (int j = 0; j < b->nt; j++)
            if (b->t[j] && a->sid[i] == b->sid[j] && ((a->role[i] & ND_ROLE_WRITE) || (b->role[j] & ND_ROLE_WRITE)))
                return true;
    }
    return false;
}

static inline bool nd_graph_same_shape(const nd_tensor *a, const nd_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* The same dtype, offset, shape and strides (storages not compared). */
static inline bool nd_graph_same_view(const nd_tensor *a, const nd_tensor *b) {
    if (!a || !b) return a == b;
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d]) return false;
    return true;
}

/* t covers its whole storage, contiguous from offset 0 (element i of one
 * such view of a storage is element i of any other of the same dtype). */
static inline bool nd_graph_whole(const nd_tensor *t) {
    return t->offset == 0 && nd_is_contiguous(t) &&
           (size_t)nd_numel(t) * nd_dtype_size(t->dtype) == t->storage->nbytes;
}

/* An opaque node's record (nd_graph_opaque): a host_check record whose
 * check calls back into the bindings; i[0] its id, i[1] inputs (its first
 * tensors), i[2] outputs (after them, written whole), i[3] 0 forward / 1
 * backward. The passes treat host_check records as barriers with effects. */
bool nd_graph_rec_opaque(const nd_graph_rec *r);

/* Shared by the passes (graph_passes.c): removes the records marked in drop
 * (keeping order); points r's tensors of storage k at storage alias[k]
 * (a pass that removed k's writer: its readers read alias[k] instead). */
void nd_graph_compact(nd_graph *g, const bool *drop);
void nd_graph_redirect_reads(nd_graph *g, nd_graph_rec *r, const int *alias);

/* The simplify pass (graph_simplify.c): kernels whose result is their input
 * (x * 1, a copy without a cast) go; *changed counts them. */
nd_status nd_graph_pass_simplify(nd_graph *g, int64_t *changed);

/* The fuse pass (graph_fuse.c): runs of elementwise records become one
 * fused_elementwise record each; *changed counts the records it removed. */
nd_status nd_graph_pass_fuse(nd_graph *g, int64_t *changed);
/* Views a and b of one storage provably share no element (graph_fuse.c):
 * the same dtype, shape and strides, positive nested strides, offsets no
 * element distance apart (the slices of a narrow, the steps of a select). */
bool nd_graph_views_disjoint(const nd_tensor *a, const nd_tensor *b);
/* View t reaches distinct elements only (positive nested strides), all in
 * [0, total) elements of its storage; *n its element count (graph_fuse.c). */
bool nd_graph_view_injective(const nd_tensor *t, int64_t total, int64_t *n);
/* Whether record r could be a step of a fused run (graph_fuse.c); *dt its
 * float dtype. */
bool nd_graph_fusable(const nd_graph_rec *r, nd_dtype *dt);

/* The fused layer kernels (conv2d_fused, conv2d_fused_packed, linear_fused):
 * their tensors are (out, x, w, b[, res]) (ND_LAYER_*, graph_record.h), and
 * this points at the record's activation scalar (nd_activation); NULL for
 * any other record. */
static inline int64_t *nd_graph_layer_act(nd_graph_rec *r) {
    if (r->entry == ND_CALL_conv2d_fused || r->entry == ND_CALL_conv2d_fused_packed) return &r->i[1];
    if (r->entry == ND_CALL_linear_fused) return &r->i[0];
    return NULL;
}

/* The slot of row kernel record r's input x (softmax: out, x; layer_norm: y,
 * mean, rstd, x, w, b), or -1 when r is no row kernel a fused_rows record
 * can absorb (graph_fuse.c; graph_reorder.c keeps their producers in place). */
static inline int nd_graph_row_input_slot(const nd_graph_rec *r) {
    if (r->entry == ND_CALL_softmax && r->nt == 2) return 1;
    if (r->entry == ND_CALL_layer_norm && r->nt == 6) return 3;
    return -1;
}

/* The epilogue pass (graph_epilogue.c): a matmul whose result an add puts
 * into an accumulator becomes a matmul that adds into it; *changed counts
 * the adds removed. */
nd_status nd_graph_pass_epilogue(nd_graph *g, int64_t *changed);

/* Moves each host check up to just below the last record that writes what
 * it reads (graph_hoist.c), so that a refused replay leaves the parameters
 * as they were; nd_graph_plan runs it. */
void nd_graph_hoist_checks(nd_graph *g);

/* The reorder pass (graph_reorder.c): elementwise records move up next to
 * an earlier one the fuse pass could join them to; *changed counts moves. */
nd_status nd_graph_pass_reorder(nd_graph *g, int64_t *changed);

/* The fold pass (graph_fold.c): records that read only constants move into
 * the prologue, and an evaluation batch norm after a convolution or linear
 * layer is folded into its weight and bias; *changed counts records moved or
 * removed. */
nd_status nd_graph_pass_fold(nd_graph *g, int64_t *changed);
/* writers[k]: the records writing storage k; konst[k]: whether it is a
 * constant (graph_fold.c: written by no record, not an input, its memory
 * the graph's own). */
void nd_graph_constants(const nd_graph *g, int *writers, bool *konst);
/* Runs fn(ctx) - ops on constants - under a capture of its own and moves
 * its records into g's prologue; outs[0 .. nouts), which fn set, become
 * prologue results (sids: their storage numbers in g). On failure outs are
 * released and NULL. */
nd_status nd_graph_fold_call(nd_graph *g, nd_status (*fn)(void *ctx), void *ctx, nd_tensor **outs,
                             int nouts, int *sids);
/* After records joined the prologue: what it reads, and the temporaries
 * whose memory goes back after each run. */
nd_status nd_graph_fold_settle(nd_graph *g);
/* The join pass (graph_join.c): linear layers reading one input with
 * constant weights become one product; *changed counts the layers gone. */
nd_status nd_graph_pass_join(nd_graph *g, int64_t *changed);
/* The info of storage s in ended graph g, added (retained) if new (graph.c);
 * NULL when out of memory. */
stor_info *nd_graph_adopt_storage(nd_graph *g, nd_storage *s);
/* Runs the prologue if a source changed (graph_fold.c). */
nd_status nd_graph_run_prologue(nd_graph *g);

/* How many references the graph's records hold on each storage, and the
 * first and last record using it (SIZE_MAX / 0 when none): arrays of
 * g->nstor entries, filled here. */
void nd_graph_uses(const nd_graph *g, int64_t *refs, size_t *first, size_t *last);

#endif
