/* graph_fuse.c - the fuse pass of a captured graph (nd_graph_pass "fuse").
 *
 * A run of consecutive elementwise records (unary, binary, binary_scalar,
 * where, clamp, relu_backward, copy without a cast) over one shape, one device and one float
 * dtype becomes one fused_elementwise record: a small program (backend.h,
 * nd_ew_program) that the backend runs in one pass over the elements -
 * OpenCL as one generated kernel, the CPU tile by tile with its own
 * elementwise inner loops. A value written inside the run and read only
 * inside it, in a storage nothing but the graph holds, is never stored
 * (the memory plan then drops the storage). Each step computes what its
 * unfused kernel computes, so results stay bit for bit the same.
 *
 * The run must not change what any step sees: element i of a step reads
 * element i of the values before it. So the views of a storage the run
 * writes are either the same view (same offset, shape and strides) or share
 * no element (the slices of a narrow, gradients added into them), and
 * written views have no 0 strides (no overlapping writes); a record that
 * would break this ends the run. Storages only read may be seen through any
 * views (broadcasts, transposes).
 *
 * A run whose result is the input of the softmax or layer norm right after
 * it, read by nothing else, becomes that row op's prologue instead (one
 * fused_rows record, where the backend has the kernel): the input is made
 * row by row in cache and never stored (row_input, absorb_row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

#define STEP_REF 1000 /* while building, value STEP_REF + j is step j's result (< that: a tensor) */

typedef struct {
    const nd_tensor *t; /* the view (a record's header, borrowed) */
    int sid;
    bool loaded;        /* read before the run wrote it: an input */
    bool written;
    bool full;          /* every write of it covers its whole storage */
    int value;          /* the value it holds now; -1: its element in memory */
    int last_step;      /* the step that wrote it last */
} fuse_slot;

/* A run has a slot per view it uses; those that become registers need no
 * tensor, so a run may use more views than a program holds tensors. */
#define MAX_SLOTS (ND_EW_MAX_TENSORS + ND_EW_MAX_STEPS)

typedef struct {
    const nd_graph *g;
    const int64_t *refs;
    const size_t *first, *last; /* as nd_graph_uses */
    size_t start;               /* the run's first record */
} fuse_ctx;

typedef struct {
    const nd_backend *be;
    nd_dtype dt;
    const nd_tensor *shape_of; /* a tensor with the run's shape */
    fuse_slot slot[MAX_SLOTS];
    int nslot;
    nd_ew_step step[ND_EW_MAX_STEPS];
    int nstep;
} fuse_run;

static bool overlapping_write(const nd_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->strides[d] == 0) return true;
    return false;
}

/* The step a record would add (operands as record tensor slots, >= 100 for
 * none / the scalar), or false when the record cannot join a run of dtype
 * dt (ND_NUM_DTYPES: any float dtype). */
static bool record_step(const nd_graph_rec *r, nd_ew_step *s, int in_slot[3], nd_dtype *dt) {
    memset(s, 0, sizeof *s);
    in_slot[0] = in_slot[1] = in_slot[2] = -1;
    for (int k = 0; k < r->nt; k++)
        if (!r->t[k]) return false;
    if (!r->be || !r->be->fused_elementwise) return false;
    const nd_tensor *out = r->t[0];
    nd_dtype T;
    switch (r->entry) {
    case ND_CALL_unary:
        s->kind = ND_EW_UNARY; s->op = (uint8_t)r->i[0]; T = r->t[1]->dtype;
        in_slot[0] = 1;
        if (out->dtype != T) return false;
        break;
    case ND_CALL_binary:
        s->kind = ND_EW_BINARY; s->op = (uint8_t)r->i[0]; T = r->t[1]->dtype;
        in_slot[0] = 1; in_slot[1] = 2;
        if (r->t[2]->dtype != T || (out->dtype != T && out->dtype != ND_BOOL)) return false;
        break;
    case ND_CALL_binary_scalar:
        s->kind = ND_EW_BINARY; s->op = (uint8_t)r->i[0]; T = r->t[1]->dtype;
        in_slot[r->i[1] ? 1 : 0] = 1;
        s->in[r->i[1] ? 0 : 1] = ND_EW_SCALAR;
        memcpy(s->scalar, r->u.value, sizeof s->scalar);
        if (out->dtype != T && out->dtype != ND_BOOL) return false;
        break;
    case ND_CALL_where:
        s->kind = ND_EW_WHERE; T = out->dtype;
        in_slot[0] = 1; in_slot[1] = 2; in_slot[2] = 3;
        if (r->t[1]->dtype != ND_BOOL || r->t[2]->dtype != T || r->t[3]->dtype != T) return false;
        break;
    case ND_CALL_clamp:
        s->kind = ND_EW_CLAMP; T = out->dtype; s->lo = r->f[0]; s->hi = r->f[1];
        in_slot[0] = 1;
        if (r->t[1]->dtype != T) return false;
        break;
    case ND_CALL_copy: /* the same dtype only: a cast is a kernel of its own */
        s->kind = ND_EW_COPY; T = out->dtype;
        in_slot[0] = 1;
        if (r->t[1]->dtype != T) return false;
        break;
    case ND_CALL_relu_backward:
        s->kind = ND_EW_RELU_BACKWARD; T = out->dtype;
        in_slot[0] = 1; in_slot[1] = 2;
        if (r->t[1]->dtype != T || r->t[2]->dtype != T) return false;
        break;
    default:
        return false;
    }
    if (T != ND_FLOAT32 && T != ND_FLOAT64) return false;
    if (*dt != ND_NUM_DTYPES && *dt != T) return false;
    for (int k = 1; k < r->nt; k++)
        if (!nd_graph_same_shape(r->t[k], out)) return false;
    s->dtype = (uint8_t)out->dtype;
    *dt = T;
    return true;
}

bool nd_graph_fusable(const nd_graph_rec *r, nd_dtype *dt) {
    nd_ew_step s;
    int in_slot[3];
    *dt = ND_NUM_DTYPES;
    return record_step(r, &s, in_slot, dt) && !overlapping_write(r->t[0]);
}

/* Whether offset difference delta (elements) is sum_d c_d * st[d] for some
 * |c_d| < sh[d], over dims d >= k sorted by decreasing stride, each stride
 * larger than the reach of the dims after it (checked by the caller): then
 * at most two c_k can work at each level. */
static bool reachable(int64_t delta, const int64_t *sh, const int64_t *st, int k, int nd) {
    if (k == nd) return delta == 0;
    int64_t reach = 0; /* how far the dims after k can go */
    for (int d = k + 1; d < nd; d++) reach += (sh[d] - 1) * st[d];
    int64_t c0 = delta >= 0 ? delta / st[k] : -((-delta) / st[k]);
    for (int64_t c = c0 - 1; c <= c0 + 1; c++) {
        if (c <= -sh[k] || c >= sh[k]) continue;
        int64_t rest = delta - c * st[k];
        if (rest < -reach || rest > reach) continue;
        if (reachable(rest, sh, st, k + 1, nd)) return true;
    }
    return false;
}

/* t's dims of size > 1 by decreasing stride into sh/st; their count, or -1
 * when a stride is not positive or not nested (each larger than what the
 * dims inside it reach: then t's elements are distinct); *reach how far
 * from its first element t reaches. */
static int nested_dims(const nd_tensor *t, int64_t *sh, int64_t *st, int64_t *reach) {
    int nd = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1) continue;
        if (t->strides[d] <= 0) return -1;
        int at = nd++; /* insertion by decreasing stride */
        while (at > 0 && st[at - 1] < t->strides[d]) {
            sh[at] = sh[at - 1];
            st[at] = st[at - 1];
            at--;
        }
        sh[at] = t->shape[d];
        st[at] = t->strides[d];
    }
    *reach = 0;
    for (int d = nd - 1; d >= 0; d--) {
        if (st[d] <= *reach) return -1;
        *reach += (sh[d] - 1) * st[d];
    }
    return nd;
}

/* Views a and b (of one storage) share no element: same dtype, shape and
 * strides (the slices of a narrow, the steps of a select), the strides
 * positive and nested (each larger than what the dims inside it reach), and
 * their offsets apart by no element distance of the view. Anything else
 * counts as overlapping. */
bool nd_graph_views_disjoint(const nd_tensor *a, const nd_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d]) return false;
    if (nd_numel(a) == 0) return true; /* no elements */
    int64_t sh[ND_MAX_DIMS], st[ND_MAX_DIMS], reach;
    int nd = nested_dims(a, sh, st, &reach);
    if (nd < 0) return false; /* not nested: give up */
    int64_t delta = b->offset - a->offset;
    if (delta == 0) return false;
    return !reachable(delta, sh, st, 0, nd);
}

bool nd_graph_view_injective(const nd_tensor *t, int64_t total, int64_t *n) {
    *n = nd_numel(t);
    if (*n == 0) return true;
    int64_t sh[ND_MAX_DIMS], st[ND_MAX_DIMS], reach;
    if (nested_dims(t, sh, st, &reach) < 0) return false;
    return t->offset >= 0 && t->offset + reach < total;
}

/* The run's slot for view t of storage sid, or -1 when using it would let a
 * step see another element than eager would (see the top of the file). */
static int find_slot(fuse_run *R, const nd_tensor *t, int sid, bool writes) {
    int same = -1;
    for (int k = 0; k < R->nslot; k++) {
        if (R->slot[k].sid != sid) continue;
        if (nd_graph_same_view(R->slot[k].t, t)) { same = k; continue; }
        if ((R->slot[k].written || writes) && !nd_graph_views_disjoint(R->slot[k].t, t)) return -1;
    }
    if (same >= 0) return same;
    if (R->nslot == MAX_SLOTS) return -1;
    fuse_slot *s = &R->slot[R->nslot];
    memset(s, 0, sizeof *s);
    s->t = t;
    s->sid = sid;
    s->full = true;
    s->value = -1;
    s->last_step = -1;
    return R->nslot++;
}

/* Slot sl needs no tensor if the run ends before record `end`: written
 * (first as a whole) and read only inside the run, in a storage made by the
 * run that nothing outside the graph holds. */
static bool is_register(const fuse_ctx *c, const fuse_slot *sl, size_t end) {
    const stor_info *in = &c->g->stor[sl->sid];
    return sl->written && !sl->loaded && sl->full && in->internal &&
           !nd_graph_live_out(c->g, (size_t)sl->sid, c->refs) && c->first[sl->sid] >= c->start &&
           c->last[sl->sid] < end;
}

/* Adds record r (number c->start + R->nstep) to the run; false (the run
 * unchanged) when it cannot join. */
static bool try_add(const fuse_ctx *c, fuse_run *R, const nd_graph_rec *r) {
    nd_ew_step s;
    int in_slot[3];
    nd_dtype dt = R->nstep ? R->dt : ND_NUM_DTYPES;
    if (R->nstep == ND_EW_MAX_STEPS || !record_step(r, &s, in_slot, &dt)) return false;
    /* one backend object serves every OpenCL device: the device index too */
    if (R->nstep && (r->be != R->be || !nd_graph_same_shape(r->t[0], R->shape_of) ||
                     r->t[0]->storage->device_index != R->shape_of->storage->device_index))
        return false;
    if (overlapping_write(r->t[0])) return false;
    fuse_slot saved[MAX_SLOTS];
    int nsaved = R->nslot;
    memcpy(saved, R->slot, (size_t)nsaved * sizeof *saved);
    bool ok = true;
    for (int j = 0; j < 3 && ok; j++) { /* reads first: an in-place op reads the old value */
        if (in_slot[j] < 0) continue;
        int k = find_slot(R, r->t[in_slot[j]], r->sid[in_slot[j]], false);
        if (k < 0) { ok = false; break; }
        fuse_slot *sl = &R->slot[k];
        if (sl->value < 0) { sl->loaded = true; s.in[j] = (int16_t)k; }
        else s.in[j] = (int16_t)sl->value;
    }
    int w = ok ? find_slot(R, r->t[0], r->sid[0], true) : -1;
    if (w >= 0) {
        fuse_slot *ws = &R->slot[w];
        ws->written = true;
        ws->full = ws->full && r->full[0];
        ws->value = STEP_REF + R->nstep;
        ws->last_step = R->nstep;
        int tensors = 0; /* were the run to end here */
        for (int k = 0; k < R->nslot; k++)
            tensors += !is_register(c, &R->slot[k], c->start + (size_t)R->nstep + 1);
        if (tensors > ND_EW_MAX_TENSORS) w = -1;
    }
    if (w < 0) {
        R->nslot = nsaved;
        memcpy(R->slot, saved, (size_t)nsaved * sizeof *saved);
        return false;
    }
    int id = R->nstep;
    R->step[R->nstep++] = s;
    if (id == 0) {
        R->be = r->be;
        R->dt = dt;
        R->shape_of = r->t[0];
    }
    return true;
}

static const char *step_name(const nd_ew_step *s) {
    switch ((nd_ew_kind)s->kind) {
    case ND_EW_UNARY: return nd_unary_name((nd_unary_op)s->op);
    case ND_EW_BINARY: return nd_binary_name((nd_binary_op)s->op);
    case ND_EW_WHERE: return "where";
    case ND_EW_CLAMP: return "clamp";
    case ND_EW_RELU_BACKWARD: return "relu_backward";
    case ND_EW_COPY: return "copy";
    }
    return "?";
}

/* The fused record of run R (records first .. first + R->nstep - 1 of the
 * original numbering); refs/first/last as nd_graph_uses. */
static nd_status make_fused(const fuse_ctx *c, const fuse_run *R, nd_graph_rec *out,
                            int64_t *registers, int64_t *register_bytes) {
    size_t end = c->start + (size_t)R->nstep; /* one past the run */
    int newidx[MAX_SLOTS];
    nd_ew_program *p = calloc(1, sizeof *p);
    if (!p) return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fuse pass");
    memset(out, 0, sizeof *out);
    out->entry = ND_CALL_fused_elementwise;
    out->be = R->be;
    out->op = "fused";
    int nt = 0;
    for (int k = 0; k < R->nslot; k++) {
        const fuse_slot *sl = &R->slot[k];
        if (is_register(c, sl, end)) {
            newidx[k] = -1;
            (*registers)++;
            *register_bytes += (int64_t)c->g->stor[sl->sid].nbytes;
            continue;
        }
        newidx[k] = nt;
        nd_tensor *t = (nd_tensor *)sl->t;
        nd_retain(t);
        out->t[nt] = t;
        out->role[nt] = (unsigned char)((sl->loaded ? ND_ROLE_READ : 0) | (sl->written ? ND_ROLE_WRITE : 0));
        out->full[nt] = sl->written && sl->full;
        out->sid[nt] = sl->sid;
        nt++;
    }
    out->nt = nt;
    p->nt = nt;
    p->nsteps = R->nstep;
    p->dtype = R->dt;
    size_t len = 0;
    for (int j = 0; j < R->nstep; j++) {
        nd_ew_step s = R->step[j];
        for (int q = 0; q < nd_ew_inputs(&s); q++) {
            if (s.in[q] == ND_EW_SCALAR) continue;
            s.in[q] = (int16_t)(s.in[q] >= STEP_REF ? nt + (s.in[q] - STEP_REF) : newidx[s.in[q]]);
        }
        s.store = -1;
        p->steps[j] = s;
        const char *name = step_name(&s);
        size_t nl = strlen(name);
        if (len + nl + 5 < sizeof p->desc) {
            if (j) p->desc[len++] = '+';
            memcpy(p->desc + len, name, nl);
            len += nl;
            p->desc[len] = 0;
        } else if (len + 4 < sizeof p->desc && !strstr(p->desc, "...")) {
            memcpy(p->desc + len, "+...", 5);
            len += 4;
        }
    }
    for (int k = 0; k < R->nslot; k++)
        if (R->slot[k].written && newidx[k] >= 0) p->steps[R->slot[k].last_step].store = (int8_t)newidx[k];
    out->prog = p;
    return ND_OK;
}

/* The slot of row record r (record number `at`, right after run R) that
 * is its input x, when run R can become x's prologue (a fused_rows record;
 * backend.h, nd_rows_op); -1 when not. x must be written by the run (whole,
 * contiguous, never read before) and read by r alone after it, in a storage
 * made inside that nothing outside the graph holds: then x needs no memory.
 * r is a softmax along the last dim or a layer norm over the last dim, and
 * shares no storage with what the run writes (its rows are written as the
 * program makes them, row by row). */
static int row_input(const fuse_ctx *c, const fuse_run *R, const nd_graph_rec *r, size_t at) {
    if (!R->nstep || !r->be || r->be != R->be || !r->be->fused_rows) return -1;
    const int xs = nd_graph_row_input_slot(r);
    if (xs < 0) return -1;
    const nd_tensor *x = r->t[xs], *y = r->t[0];
    if (!x || !y || x->ndim < 1 || x->dtype != R->dt || !nd_graph_whole(x) || !nd_is_contiguous(y) ||
        !nd_graph_same_shape(x, R->shape_of) || !nd_graph_same_shape(y, x) ||
        x->storage->device_index != R->shape_of->storage->device_index)
        return -1;
    const int64_t cols = x->shape[x->ndim - 1];
    if (r->entry == ND_CALL_softmax && r->i[0] != x->ndim - 1) return -1;
    if (r->entry == ND_CALL_layer_norm &&
        (!r->t[1] || !r->t[2] || !nd_is_contiguous(r->t[1]) || !nd_is_contiguous(r->t[2]) ||
         nd_numel(r->t[1]) * cols != nd_numel(x)))
        return -1; /* (normalised over more than the last dim) */
    const int sid = r->sid[xs];
    for (int k = 0; k < r->nt; k++) {
        if (k == xs || !r->t[k]) continue;
        if (r->sid[k] == sid) return -1;
        for (int q = 0; q < R->nslot; q++)
            if (R->slot[q].sid == r->sid[k] && (R->slot[q].written || (r->role[k] & ND_ROLE_WRITE)))
                return -1;
    }
    const stor_info *in = &c->g->stor[sid];
    if (!in->internal || nd_graph_live_out(c->g, (size_t)sid, c->refs) || c->first[sid] < c->start ||
        c->last[sid] != at)
        return -1;
    int found = -1, tensors = 0;
    for (int q = 0; q < R->nslot; q++) {
        const fuse_slot *sl = &R->slot[q];
        tensors += !is_register(c, sl, at);
        if (sl->sid != sid) continue;
        if (found >= 0 || !sl->written || sl->loaded || !sl->full || !nd_graph_same_view(sl->t, x)) return -1;
        found = q;
    }
    if (found < 0 || r->nt + tensors > ND_REC_MAX_TENSORS) return -1;
    return xs;
}

/* f (a run's fused_elementwise record) becomes row record r's prologue:
 * f turns into the fused_rows record (graph_record.h), taking r's tensors
 * (r is left empty) with slot xs, x, dropped from both. */
static void absorb_row(nd_graph_rec *f, nd_graph_rec *r, int xs) {
    int px = -1;
    for (int k = 0; k < f->nt; k++)
        if (f->t[k] && f->sid[k] == r->sid[xs]) px = k;
    nd_graph_rec m = *r;
    nd_release(m.t[xs]);
    m.t[xs] = NULL;
    m.full[xs] = false;
    const int base = m.nt;
    for (int k = 0; k < f->nt; k++) {
        m.t[base + k] = f->t[k];
        m.role[base + k] = f->role[k];
        m.full[base + k] = f->full[k];
        m.sid[base + k] = f->sid[k];
    }
    nd_release(m.t[base + px]);
    m.t[base + px] = NULL;
    m.full[base + px] = false;
    m.nt = base + f->nt;
    m.i[ND_ROWS_REC_X] = px;
    m.i[ND_ROWS_REC_BASE] = base;
    m.i[ND_ROWS_REC_ENTRY] = r->entry;
    m.entry = ND_CALL_fused_rows;
    m.prog = f->prog;
    m.prep_state = ND_PREP_NONE;
    m.prepared = NULL;
    m.profile_id = 0;
    const char *what = r->entry == ND_CALL_layer_norm ? "layer_norm" : r->i[1] ? "log_softmax" : "softmax";
    size_t len = strlen(m.prog->desc);
    snprintf(m.prog->desc + len, sizeof m.prog->desc - len, ">%s", what);
    *f = m;
    r->nt = 0; /* (its tensors and program moved) */
    r->prog = NULL;
}

nd_status nd_graph_pass_fuse(nd_graph *g, int64_t *changed) {
    size_t ns = g->nstor, n = g->n;
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    nd_graph_rec *recs = malloc((n + 1) * sizeof *recs);
    fuse_run *R = malloc(sizeof *R);
    nd_status st = ND_OK;
    if (!refs || !first || !last || !recs || !R) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the fuse pass");
        goto done;
    }
    nd_graph_uses(g, refs, first, last);
    fuse_ctx c = {g, refs, first, last, 0};
    size_t out = 0, i = 0;
    while (i < n) {
        R->nslot = R->nstep = 0;
        c.start = i;
        size_t j = i;
        while (j < n && try_add(&c, R, &g->recs[j])) j++;
        const int xs = j < n ? row_input(&c, R, &g->recs[j], j) : -1;
        if (R->nstep < 2 && xs < 0) { /* nothing to gain from a run of one */
            recs[out++] = g->recs[i++];
            continue;
        }
        st = make_fused(&c, R, &recs[out], &g->fused_registers, &g->fused_register_bytes);
        if (st != ND_OK) { /* keep the rest as it was */
            while (i < n) recs[out++] = g->recs[i++];
            break;
        }
        if (xs >= 0) { /* the run is the prologue of the row op after it */
            const int xsid = g->recs[j].sid[xs];
            absorb_row(&recs[out], &g->recs[j], xs);
            g->fused_registers++;
            g->fused_register_bytes += (int64_t)g->stor[xsid].nbytes;
            g->fused_rows++;
            j++;
        } else {
            g->fused_runs++;
        }
        out++;
        for (size_t k = i; k < j; k++) nd_graph_rec_release(&g->recs[k]);
        *changed += (int64_t)(j - i) - 1;
        i = j;
    }
    if (out) memcpy(g->recs, recs, out * sizeof *recs);
    g->n = out;
done:
    free(refs); free(first); free(last); free(recs); free(R);
    return st;
}
