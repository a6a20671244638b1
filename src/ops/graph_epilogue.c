/* graph_epilogue.c - the epilogue pass of a captured graph (nd_graph_pass
 * "epilogue"): elementwise work a GEMM can do as it stores its result.
 *
 * Built: accumulation. A weight used at every step of a recurrence gets one
 * gradient GEMM per step, and autograd sums them: acc' = acc + a @ b, an
 * add kernel (and a GEMM result written and read back) per step - in the
 * LSTM's backward, one per time step and layer, and as many for its bias
 * (a sum over the batch, then an add). Where the add's other operand is an
 * accumulator nothing reads afterwards, the GEMM or the sum adds into it
 * instead (matmul_acc: out += a @ b; reduce_sum_acc: out += sum(x); one add
 * per element after the product or sum, so the same bits as the two
 * kernels), and later kernels read the accumulator where they read the
 * add's result. The add may read the product transposed (a weight's
 * gradient): the GEMM then writes into the accumulator through the
 * transposed view (a sum writes row-major only: its add must read it so).
 *
 * Safe when: the add, the GEMM result and the accumulator are whole
 * storages of one float dtype and size, the result and the accumulator seen
 * through one view covering their storage once, the product through a
 * permutation of its dims; the GEMM (or sum) result is made
 * inside and read by the add alone; the accumulator is made by a record of
 * the graph, seen nowhere after the call, and nothing reads or writes it -
 * nor the result of an earlier add that now lives in it - between the GEMM
 * and the add (it now changes at the GEMM) or after the add; the GEMM's
 * operands are not the accumulator; the add's result is made inside,
 * written by the add alone and seen nowhere after the call; and the
 * backend has matmul_acc (OpenCL and the CPU) or reduce_sum_acc (OpenCL).
 * "The same bits" here and below: one exception, the payload of a NaN
 * where both operands of the add are NaN (x86 keeps the first operand's;
 * the fused kernels add in one order whatever order the add had).
 * An empty product (K = 0) stays: eager's add of its zeros turns -0 into +0.
 * (A driver that refuses the accumulating GEMM variant gets the plain GEMM
 * into a temporary and an add: ocl_matmul.c.)
 *
 * Activation: a ReLU or GELU after a fused convolution or linear kernel
 * becomes its epilogue (activation_at, below).
 *
 * Residual: an add of a fused convolution's or linear kernel's result to a
 * tensor of its shape becomes that kernel's residual (residual_at).
 *
 * Still to come here: bias epilogues where the backend's GEMM is a plain
 * matmul (OpenCL), and residuals of the OpenCL kernels. */
#include <stdlib.h>
#include "graph_internal.h"

typedef struct {
    int64_t *refs, *reads, *writes;
    size_t *first, *last;
} uses;

static bool is_float(nd_dtype dt) { return dt == ND_FLOAT32 || dt == ND_FLOAT64; }

/* Whether any record in (from, to) touches storage sid, or a storage whose
 * readers will read sid (alias: the results of adds removed so far, which
 * records not yet visited still name). */
static bool touched_between(const nd_graph *g, size_t from, size_t to, int sid, const int *alias) {
    for (size_t j = from + 1; j < to; j++)
        for (int k = 0; k < g->recs[j].nt; k++)
            if (g->recs[j].t[k] && (g->recs[j].sid[k] == sid || (alias && alias[g->recs[j].sid[k]] == sid)))
                return true;
    return false;
}

/* Whether any record after `at` touches storage sid (or reads it through alias). */
static bool touched_after(const nd_graph *g, size_t at, int sid, const int *alias) {
    return touched_between(g, at, g->n, sid, alias);
}

/* The record before `at` that last touched storage sid (SIZE_MAX: none). */
static size_t last_toucher(const nd_graph *g, size_t at, int sid) {
    for (size_t j = at; j-- > 0;)
        for (int k = 0; k < g->recs[j].nt; k++)
            if (g->recs[j].t[k] && g->recs[j].sid[k] == sid) return j;
    return SIZE_MAX;
}

/* View v reaches every element of its storage exactly once. */
static bool covers_once(const nd_tensor *v) {
    size_t es = nd_dtype_size(v->dtype);
    int64_t total = (int64_t)(v->storage->nbytes / es), n;
    return v->offset == 0 && nd_graph_view_injective(v, total, &n) && n == total &&
           (size_t)total * es == v->storage->nbytes && n > 0;
}

/* The add reads the GEMM's result m_out through vt, a permutation of m_out's
 * dims (a transpose of a weight gradient); the accumulator through vx. The
 * view of the accumulator's storage in m_out's shape that puts each product
 * element where the add would have added it: false when vt is no permutation. */
static bool accumulator_view(const nd_tensor *m_out, const nd_tensor *vt, const nd_tensor *vx,
                             int64_t *strides) {
    if (vt->offset != 0 || vt->ndim != vx->ndim) return false;
    int matched = 0, big = 0;
    for (int e = 0; e < vt->ndim; e++) big += vt->shape[e] > 1;
    for (int d = 0; d < m_out->ndim; d++) {
        strides[d] = 0;
        if (m_out->shape[d] == 1) continue;
        int found = -1;
        for (int e = 0; e < vt->ndim && found < 0; e++)
            if (vt->shape[e] == m_out->shape[d] && vt->strides[e] == m_out->strides[d]) found = e;
        if (found < 0) return false;
        strides[d] = vx->strides[found];
        matched++;
    }
    return matched == big;
}

/* Tries p = add(o; x, t) with t from a matmul m: m becomes x += a @ b. */
static nd_status try_accumulate(nd_graph *g, size_t p, uses *u, int *alias, bool *drop, bool *done) {
    nd_graph_rec *add = &g->recs[p];
    *done = false;
    if (add->entry != ND_CALL_binary || add->i[0] != ND_BINARY_add || add->nt != 3) return ND_OK;
    for (int k = 0; k < 3; k++)
        if (!add->t[k] || !is_float(add->t[k]->dtype) || add->t[k]->dtype != add->t[0]->dtype ||
            add->t[k]->storage->nbytes != add->t[0]->storage->nbytes)
            return ND_OK;
    int o = add->sid[0];
    const stor_info *so = &g->stor[o];
    if (add->role[0] != ND_ROLE_WRITE || !add->full[0] || !covers_once(add->t[0]) || !so->internal ||
        u->writes[o] != 1 || nd_graph_live_out(g, (size_t)o, u->refs))
        return ND_OK;
    for (int q = 1; q <= 2; q++) {
        const nd_tensor *vt = add->t[q], *vx = add->t[3 - q];
        int ts = add->sid[q], xs = add->sid[3 - q];
        if (ts == xs || ts == o || xs == o || add->role[q] != ND_ROLE_READ || add->role[3 - q] != ND_ROLE_READ)
            continue;
        /* the add's result lives where the accumulator's elements are: its readers read those */
        if (!nd_graph_same_view(vx, add->t[0])) continue;
        size_t m = last_toucher(g, p, ts);
        if (m == SIZE_MAX) continue;
        nd_graph_rec *mm = &g->recs[m];
        bool gemm = mm->entry == ND_CALL_matmul && mm->be && mm->be->matmul_acc && mm->nt == 3;
        bool sum = mm->entry == ND_CALL_reduce && mm->i[0] == ND_REDUCE_sum && mm->be &&
                   mm->be->reduce_sum_acc && mm->nt == 2 && mm->t[1] && mm->t[1]->dtype == add->t[0]->dtype;
        if ((!gemm && !sum) || mm->sid[0] != ts || mm->role[0] != ND_ROLE_WRITE || !mm->full[0] ||
            !nd_graph_whole(mm->t[0]) || mm->t[0]->dtype != add->t[0]->dtype)
            continue;
        int64_t strides[ND_MAX_DIMS];
        if (!accumulator_view(mm->t[0], vt, vx, strides)) continue;
        if (sum) { /* reduce_sum_acc writes its output in row-major order: no transposes */
            bool same = true;
            for (int d = 0; d < mm->t[0]->ndim; d++)
                same = same && (mm->t[0]->shape[d] == 1 || strides[d] == mm->t[0]->strides[d]);
            if (!same) continue;
        }
        if (gemm && mm->t[1]->ndim > 0 && mm->t[1]->shape[mm->t[1]->ndim - 1] == 0)
            continue; /* K = 0: no product to add (eager's add of zeros still turns -0 into +0) */
        /* the product: made inside, read by the add alone */
        if (!g->stor[ts].internal || u->reads[ts] != 1 || nd_graph_live_out(g, (size_t)ts, u->refs)) continue;
        /* the accumulator: made inside, not seen after, untouched from the GEMM on */
        const stor_info *sx = &g->stor[xs];
        bool reads_acc = false; /* the GEMM's operands, the sum's input */
        for (int k = 1; k < mm->nt; k++) reads_acc |= mm->t[k] && mm->sid[k] == xs;
        /* made by a record of the graph (so each replay makes it anew before the GEMM adds into it) */
        if (!sx->internal || !sx->seen_write || !initial_unseen(sx) || nd_graph_live_out(g, (size_t)xs, u->refs) ||
            reads_acc || touched_between(g, m, p, xs, alias) || touched_after(g, p, xs, alias))
            continue;
        nd_tensor *acc;
        ND_TRY(nd_tensor_view_of(vx, mm->t[0]->shape, strides, mm->t[0]->ndim, vx->offset, &acc));
        nd_release(mm->t[0]);
        mm->t[0] = acc;
        u->refs[ts]--; /* the storage references records hold (nd_graph_live_out counts them) */
        u->refs[xs]++;
        mm->entry = gemm ? ND_CALL_matmul_acc : ND_CALL_reduce_sum_acc;
        mm->role[0] = ND_ROLE_UPDATE;
        mm->sid[0] = xs;
        mm->full[0] = false;
        alias[o] = xs;
        drop[p] = true;
        *done = true;
        return ND_OK;
    }
    return ND_OK;
}

/* A rewrite of the fused layer record at i (its neighbours by the uses
 * given, as nd_graph_uses counted them before this pass of rewrites):
 * true when it changed the graph (records to go marked in drop). */
typedef bool (*layer_rewrite)(nd_graph *g, size_t i, int64_t *refs, const size_t *first,
                              const size_t *last, bool *drop);

/* Runs fn at each record, then drops what it marked. */
static nd_status each_layer(nd_graph *g, int64_t *changed, layer_rewrite fn) {
    size_t ns = g->nstor, n = g->n;
    int64_t *refs = malloc((ns + 1) * sizeof *refs);
    size_t *first = malloc((ns + 1) * sizeof *first), *last = malloc((ns + 1) * sizeof *last);
    bool *drop = calloc(n + 1, 1);
    if (!refs || !first || !last || !drop) {
        free(refs); free(first); free(last); free(drop);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory in the epilogue pass");
    }
    nd_graph_uses(g, refs, first, last);
    for (size_t i = 0; i < n; i++)
        if (fn(g, i, refs, first, last, drop)) (*changed)++;
    nd_graph_compact(g, drop);
    free(refs); free(first); free(last); free(drop);
    return ND_OK;
}

/* Activation epilogues: a ReLU or GELU whose input is the result of a
 * fused convolution or linear kernel without activation, read by it alone
 * and seen nowhere else, becomes that kernel's activation (its epilogue
 * applies it as it stores - the GELU with nd.gelu's own inner loop: one
 * pass over the result fewer; the same bits, NaN included). */
static bool activation_at(nd_graph *g, size_t i, int64_t *refs, const size_t *first, const size_t *last,
                          bool *drop) {
    nd_graph_rec *a = &g->recs[i];
    int64_t *act = nd_graph_layer_act(a);
    if (!act || *act != ND_ACT_NONE || !a->t[0] || a->role[0] != ND_ROLE_WRITE || !a->full[0] ||
        a->nt > ND_LAYER_RES) /* a residual is added after the activation: a ReLU after it stays */
        return false;
    int o = a->sid[0];
    /* the result: made inside, used by this kernel and one more (the ReLU) */
    if (refs[o] != 2 || first[o] != i || !g->stor[o].internal || nd_graph_live_out(g, (size_t)o, refs))
        return false;
    nd_graph_rec *r = &g->recs[last[o]];
    if (r->entry != ND_CALL_unary || (r->i[0] != ND_UNARY_relu && r->i[0] != ND_UNARY_gelu) || r->nt != 2 || !r->t[0] ||
        !r->t[1] || r->sid[1] != o || r->sid[0] == o || r->role[0] != ND_ROLE_WRITE || !r->full[0] ||
        !nd_graph_same_view(r->t[1], a->t[0]) || !nd_graph_same_view(r->t[0], a->t[0]))
        return false;
    nd_release(a->t[0]);
    a->t[0] = r->t[0];
    a->sid[0] = r->sid[0];
    r->t[0] = NULL;
    *act = r->i[0] == ND_UNARY_gelu ? ND_ACT_GELU : ND_ACT_RELU;
    drop[last[o]] = true;
    return true;
}

/* Whether a record in (from, to) writes storage sid. */
static bool written_between(const nd_graph *g, size_t from, size_t to, int sid) {
    for (size_t j = from + 1; j < to; j++)
        for (int k = 0; k < g->recs[j].nt; k++)
            if (g->recs[j].t[k] && g->recs[j].sid[k] == sid && (g->recs[j].role[k] & ND_ROLE_WRITE))
                return true;
    return false;
}

/* Residual epilogues: an add of a fused convolution's or linear kernel's
 * result o to a tensor r of its shape (a residual connection: x + f(x))
 * becomes that kernel's residual: it stores act(. + b) + r, one pass over
 * the result fewer, the same bits (the add rounds once either way). Safe
 * when: the backend's kernel takes a residual (the CPU's do; a record with
 * one already, or another shape or dtype, stays); o is made by the kernel
 * and read by the add alone, seen nowhere after the call; r is a whole
 * contiguous view in o's shape and dtype that nothing writes between the
 * kernel and the add (the kernel now reads it earlier) and not the add's
 * result; the add's result, in o's layout, is not touched between the
 * two (the kernel now writes it earlier). Runs after the activation
 * epilogues: the residual comes after the activation, as in ResNet9's
 * x + relu(conv(x)); in relu(conv(x) + x) the add joins the kernel and
 * the ReLU stays a kernel of its own. */
static bool residual_at(nd_graph *g, size_t i, int64_t *refs, const size_t *first, const size_t *last,
                        bool *drop) {
    nd_graph_rec *a = &g->recs[i];
    if (!nd_graph_layer_act(a) || a->nt != ND_LAYER_RES || !a->t[0] || a->role[0] != ND_ROLE_WRITE ||
        !is_float(a->t[0]->dtype) || !nd_is_contiguous(a->t[0]))
        return false;
    int o = a->sid[0];
    if (refs[o] != 2 || first[o] != i || !g->stor[o].internal || nd_graph_live_out(g, (size_t)o, refs))
        return false;
    size_t p = last[o];
    nd_graph_rec *add = &g->recs[p];
    if (add->entry != ND_CALL_binary || add->i[0] != ND_BINARY_add || add->nt != 3 || !add->t[0] ||
        !add->t[1] || !add->t[2] || add->role[0] != ND_ROLE_WRITE || add->role[1] != ND_ROLE_READ ||
        add->role[2] != ND_ROLE_READ || !nd_graph_same_view(add->t[0], a->t[0]))
        return false;
    int q = add->sid[1] == o ? 1 : add->sid[2] == o ? 2 : 0;
    if (!q || !nd_graph_same_view(add->t[q], a->t[0])) return false;
    const nd_tensor *res = add->t[3 - q];
    int rs = add->sid[3 - q], os = add->sid[0];
    if (rs == o || os == o || rs == os || res->dtype != a->t[0]->dtype || res->ndim != a->t[0]->ndim ||
        !nd_is_contiguous(res))
        return false;
    for (int d = 0; d < res->ndim; d++)
        if (res->shape[d] != a->t[0]->shape[d]) return false;
    if (written_between(g, i, p, rs) || touched_between(g, i, p, os, NULL)) return false;
    /* the kernel writes the add's result and reads the residual */
    nd_release(a->t[0]);
    a->t[0] = add->t[0];
    a->sid[0] = os;
    a->full[0] = add->full[0];
    add->t[0] = NULL;
    a->t[ND_LAYER_RES] = add->t[3 - q];
    a->role[ND_LAYER_RES] = ND_ROLE_READ;
    a->full[ND_LAYER_RES] = false;
    a->sid[ND_LAYER_RES] = rs;
    add->t[3 - q] = NULL;
    a->nt = ND_LAYER_RES + 1;
    drop[p] = true;
    refs[o] = 0;
    return true;
}

nd_status nd_graph_pass_epilogue(nd_graph *g, int64_t *changed) {
    ND_TRY(each_layer(g, changed, activation_at));
    ND_TRY(each_layer(g, changed, residual_at)); /* (after: the residual comes after the activation) */
    size_t ns = g->nstor, n = g->n;
    uses u = {malloc((ns + 1) * sizeof *u.refs), calloc(ns + 1, sizeof *u.reads),
              calloc(ns + 1, sizeof *u.writes), malloc((ns + 1) * sizeof *u.first),
              malloc((ns + 1) * sizeof *u.last)};
    int *alias = malloc((ns + 1) * sizeof *alias);
    bool *drop = calloc(n + 1, 1);
    nd_status st = ND_OK;
    if (!u.refs || !u.reads || !u.writes || !u.first || !u.last || !alias || !drop) {
        st = nd_fail(ND_ERR_MEMORY, "compile: out of memory in the epilogue pass");
        goto done;
    }
    nd_graph_uses(g, u.refs, u.first, u.last);
    for (size_t i = 0; i < n; i++) {
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++) {
            if (!r->t[k]) continue;
            if (r->role[k] & ND_ROLE_READ) u.reads[r->sid[k]]++;
            if (r->role[k] & ND_ROLE_WRITE) u.writes[r->sid[k]]++;
        }
    }
    for (size_t k = 0; k < ns; k++) alias[k] = (int)k;
    for (size_t i = 0; i < n && st == ND_OK; i++) {
        /* reads of an add's result that went read its accumulator (before the
         * tests: a chain's next add finds the accumulator as its operand) */
        const nd_graph_rec *r = &g->recs[i];
        for (int k = 0; k < r->nt; k++)
            if (r->t[k] && alias[r->sid[k]] != r->sid[k]) {
                u.refs[r->sid[k]]--;
                u.refs[alias[r->sid[k]]]++;
            }
        nd_graph_redirect_reads(g, &g->recs[i], alias);
        bool done;
        st = try_accumulate(g, i, &u, alias, drop, &done);
        if (done) (*changed)++;
    }
    nd_graph_compact(g, drop);
done:
    free(u.refs); free(u.reads); free(u.writes); free(u.first); free(u.last); free(alias); free(drop);
    return st;
}
