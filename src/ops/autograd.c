/* autograd.c - grad mode, recording nodes, saved tensors and the backward
 * engine. See autograd_node.h for the design. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "autograd.h"
#include "backend_call.h" /* nd_graph_note_leaf_grad */
#include "grad_fns.h"      /* nd_view_grad_into */

/* ------------------------------------------------------------- grad mode */

static _Thread_local bool grad_disabled; /* zero-initialised: grad is on */

bool nd_grad_enabled(void) { return !grad_disabled; }

bool nd_set_grad_enabled(bool on) {
    bool prev = !grad_disabled;
    grad_disabled = !on;
    return prev;
}

/* One zeroed allocation: the node, then its per-input arrays (largest
 * alignment first, so none needs padding). */
_Static_assert(_Alignof(nd_node) >= _Alignof(int64_t) && _Alignof(nd_dtype) <= _Alignof(int),
               "node_alloc's layout");
static nd_node *node_alloc(int ninputs) {
    size_t k = (size_t)ninputs;
    size_t per = 2 * sizeof(void *) + sizeof(int64_t[ND_MAX_DIMS]) + sizeof(int) +
                 sizeof(nd_dtype) + sizeof(bool);
    if (ninputs < 0 || k > (SIZE_MAX - sizeof(nd_node)) / per) return NULL;
    char *p = calloc(1, sizeof(nd_node) + k * per);
    if (!p) return NULL;
    nd_node *n = (nd_node *)p;
    p += sizeof(nd_node);
    n->next = (nd_node **)p;                       p += k * sizeof(nd_node *);
    n->leaf = (nd_tensor **)p;                     p += k * sizeof(nd_tensor *);
    n->in_shape = (int64_t(*)[ND_MAX_DIMS])p;      p += k * sizeof(int64_t[ND_MAX_DIMS]);
    n->in_ndim = (int *)p;                         p += k * sizeof(int);
    n->in_dtype = (nd_dtype *)p;                   p += k * sizeof(nd_dtype);
    n->needs_grad = (bool *)p;
    return n;
}

static nd_status record_named(const char *name, nd_backward_fn fn, nd_tensor *out, int ninputs,
                              const nd_tensor *const *inputs, nd_node **node);

nd_status nd_record(nd_op op, nd_backward_fn fn, nd_tensor *out, int ninputs,
                    const nd_tensor *const *inputs, nd_node **node) {
    return record_named(nd_op_name(op), fn, out, ninputs, inputs, node);
}

static nd_status record_named(const char *name, nd_backward_fn fn, nd_tensor *out, int ninputs,
                              const nd_tensor *const *inputs, nd_node **node) {
    *node = NULL;
    if (grad_disabled) return ND_OK;
    bool any = false;
    for (int i = 0; i < ninputs; i++) any = any || (inputs[i] && inputs[i]->requires_grad);
    if (!any) return ND_OK;
    nd_node *n = node_alloc(ninputs);
    if (!n) return nd_fail(ND_ERR_MEMORY, "%s: out of memory recording the autograd graph", name);
    atomic_init(&n->refcount, 1);
    n->name = name;
    n->backward = fn;
    n->precision = (int8_t)nd_get_float32_matmul_precision();
    n->opencl_operands = (int8_t)nd_get_opencl_matmul_dtype();
    n->ninputs = ninputs;
    for (int i = 0; i < ninputs; i++) {
        const nd_tensor *t = inputs[i];
        if (!t) continue;
        n->in_ndim[i] = t->ndim;
        memcpy(n->in_shape[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
        n->in_dtype[i] = t->dtype;
        if (!t->requires_grad) continue;
        n->needs_grad[i] = true;
        if (t->grad_fn) {
            n->next[i] = t->grad_fn;
            nd_node_retain(t->grad_fn);
        } else {
            n->leaf[i] = (nd_tensor *)t;
            nd_retain(n->leaf[i]);
        }
    }
    n->out_ndim = out->ndim;
    memcpy(n->out_shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    n->out_dtype = out->dtype;
    nd_node_release(out->grad_fn); /* an op result is fresh; defensive */
    out->grad_fn = n;
    out->requires_grad = true;
    *node = n;
    return ND_OK;
}

/* ---- custom ops: a backward written outside the registry (needle.h) ---- */
typedef struct {
    nd_custom_backward_fn fn;
    void *ctx;
    void (*ctx_free)(void *ctx);
} custom_ctx;

/* A custom node's name outlives the caller's string (a Lua string built at
 * run time, "linalg." .. name, may be collected before the node is freed),
 * and it must be one pointer per distinct name: the profiler caches backward
 * event names by pointer. So names are interned for the life of the process
 * (custom ops are few: a program names tens of them, not thousands; past
 * NAMES_MAX they share "custom"). */
#define NAMES_MAX 1024
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static char *names[NAMES_MAX];
static int names_n;

static const char *intern_name(const char *name) {
    if (!name) return "custom";
    const char *found = "custom";
    pthread_mutex_lock(&names_lock);
    for (int i = 0; i < names_n; i++)
        if (strcmp(names[i], name) == 0) { found = names[i]; goto done; }
    if (names_n < NAMES_MAX) {
        size_t len = strlen(name) + 1;
        char *copy = malloc(len);
        if (copy) { memcpy(copy, name, len); names[names_n++] = copy; found = copy; }
    }
done:
    pthread_mutex_unlock(&names_lock);
    return found;
}

static void custom_free(void *p) {
    custom_ctx *c = p;
    if (c->ctx_free) c->ctx_free(c->ctx);
    free(c);
}

static nd_status custom_backward(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    custom_ctx *c = n->ctx;
    return c->fn(c->ctx, g, grads, n->ninputs);
}

nd_status nd_custom_record(const char *name, const nd_tensor *const *inputs, int ninputs,
                           const nd_tensor *value, nd_custom_backward_fn fn, void *ctx,
                           void (*ctx_free)(void *ctx), nd_tensor **out) {
    *out = NULL;
    custom_ctx *c = malloc(sizeof *c);
    if (!c) {
        if (ctx_free) ctx_free(ctx);
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory", name);
    }
    *c = (custom_ctx){fn, ctx, ctx_free};
    name = intern_name(name);
    nd_tensor *o;
    nd_status st = nd_tensor_view_of(value, value->shape, value->strides, value->ndim,
                                     value->offset, &o);
    nd_node *node = NULL;
    if (st == ND_OK) st = record_named(name, custom_backward, o, ninputs, inputs, &node);
    if (st != ND_OK || !node) {
        custom_free(c);
        if (st != ND_OK) { nd_release(o); return st; }
        *out = o; /* nothing to differentiate */
        return ND_OK;
    }
    node->ctx = c;
    node->ctx_free = custom_free;
    *out = o;
    return ND_OK;
}

nd_status nd_save(nd_node *n, const nd_tensor *t, bool is_output) {
    if (n->nsaved == ND_NODE_MAX_SAVED)
        return nd_fail(ND_ERR_INTERNAL, "%s: too many saved tensors", n->name);
    nd_tensor *s;
    if (is_output) {
        /* an alias without grad_fn: the node must not own its own output */
        ND_TRY(nd_tensor_view_of(t, t->shape, t->strides, t->ndim, t->offset, &s));
    } else {
        nd_retain((nd_tensor *)t);
        s = (nd_tensor *)t;
    }
    int i = n->nsaved++;
    n->saved[i] = s;
    n->saved_version[i] = t->storage->version;
    n->saved_is_output[i] = is_output;
    return ND_OK;
}

nd_status nd_saved(nd_node *n, int i, nd_tensor **out) {
    char b[ND_SHAPE_BUF];
    if (n->released || !n->saved[i])
        return nd_fail(ND_ERR_ARG, "backward: trying to backward through %s a second time, but "
                       "its saved tensors were freed by the first backward (pass "
                       "retain_graph=true to the first call)", n->name);
    nd_tensor *s = n->saved[i];
    if (s->storage->version != n->saved_version[i])
        return nd_fail(ND_ERR_ARG, "backward: a tensor of shape %s that %s saved for its "
                       "gradient was modified in place afterwards (version %llu, now %llu); "
                       "use an out-of-place op instead", nd_shape_str(s->shape, s->ndim, b),
                       n->name, (unsigned long long)n->saved_version[i],
                       (unsigned long long)s->storage->version);
    if (!n->saved_is_output[i]) {
        nd_retain(s);
        *out = s;
        return ND_OK;
    }
    /* re-attach the saved output to this node, so formulas that use it are
     * themselves differentiable (create_graph) */
    ND_TRY(nd_tensor_view_of(s, s->shape, s->strides, s->ndim, s->offset, out));
    (*out)->grad_fn = n;
    nd_node_retain(n);
    (*out)->requires_grad = true;
    return ND_OK;
}

/* ------------------------------------------------------------- helpers */

nd_status nd_sum_to_shape(const nd_tensor *g, const int64_t *shape, int ndim, nd_tensor **out) {
    int dims[ND_MAX_DIMS], nd = 0, lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    if (nd == 0 && lead == 0) {
        nd_retain((nd_tensor *)g);
        *out = (nd_tensor *)g;
        return ND_OK;
    }
    nd_tensor *s;
    ND_TRY(nd_reduce(ND_REDUCE_sum, g, dims, nd, 1, 0, &s));
    nd_status st = nd_reshape(s, shape, ndim, out);
    nd_release(s);
    return st;
}

/* slot += g (out of place: someone may hold the old tensor) */
static nd_status accumulate(nd_tensor **slot, nd_tensor *g) {
    if (!*slot) {
        nd_retain(g);
        *slot = g;
        return ND_OK;
    }
    nd_tensor *sum;
    ND_TRY(nd_binary(ND_BINARY_add, *slot, g, &sum));
    nd_release(*slot);
    *slot = sum;
    return ND_OK;
}

/* --------------------------------------------------------------- engine */

typedef struct { nd_node **items; size_t len, cap; } node_list;

static nd_status list_push(node_list *l, nd_node *n) {
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        nd_node **items = realloc(l->items, cap * sizeof *items);
        if (!items) return nd_fail(ND_ERR_MEMORY, "backward: out of memory walking the graph");
        l->items = items;
        l->cap = cap;
    }
    l->items[l->len++] = n;
    return ND_OK;
}

/* marks nodes visited by the current walk; one counter for every thread (a
 * DataLoader worker may run a backward too), so no two walks share a value */
static atomic_int epoch;

/* What nd_grad wants back: gradients reaching these nodes or leaves. */
typedef struct {
    int n;
    nd_node *const *nodes;   /* per input: its grad_fn, or NULL for a leaf */
    nd_tensor *const *leaves;
    nd_tensor **result;
} capture;

static nd_status capture_grad(const capture *c, nd_node *node, nd_tensor *leaf, nd_tensor *g) {
    if (!c) return ND_OK;
    for (int i = 0; i < c->n; i++)
        if ((node && c->nodes[i] == node) || (leaf && !c->nodes[i] && c->leaves[i] == leaf))
            ND_TRY(accumulate(&c->result[i], g));
    return ND_OK;
}

static nd_status check_grad_shape(nd_node *n, int i, const nd_tensor *g) {
    bool ok = g->ndim == n->in_ndim[i];
    for (int d = 0; ok && d < g->ndim; d++) ok = g->shape[d] == n->in_shape[i][d];
    if (ok) return ND_OK;
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    return nd_fail(ND_ERR_INTERNAL, "backward: %s returned a gradient of shape %s for an input "
                   "of shape %s", n->name, nd_shape_str(g->shape, g->ndim, b1),
                   nd_shape_str(n->in_shape[i], n->in_ndim[i], b2));
}

/* ---- gradient-ready hooks: a leaf's contributions are counted while the
 * graph is collected and counted down as they arrive; the last one fires
 * the callback (nd_set_grad_hook). */
static nd_grad_hook_fn grad_hook_fn;

void nd_set_grad_hook_callback(nd_grad_hook_fn fn) { grad_hook_fn = fn; }

nd_status nd_set_grad_hook(nd_tensor *t, bool on) {
    if (on && t->grad_fn)
        return nd_fail(ND_ERR_ARG, "grad hook: only leaf tensors (parameters) can have one");
    t->grad_hook = on;
    return ND_OK;
}

/* run: this walk's epoch (a backward inside a custom backward is a walk of
 * its own; a leaf both walks reach is counted by the inner one, so the
 * outer one does not report it: see nd_set_grad_hook) */
static void count_leaf_use(nd_node *n, int i, bool accumulate_leaves, int run) {
    nd_tensor *leaf = n->needs_grad[i] ? n->leaf[i] : NULL;
    if (!leaf || !leaf->grad_hook || !accumulate_leaves || !grad_hook_fn) return;
    if (leaf->grad_mark != run) {
        leaf->grad_mark = run;
        leaf->grad_pending = 0;
    }
    leaf->grad_pending++;
}

/* uses: contributions that arrived (a hooked leaf's all at once, see below) */
static nd_status leaf_done(nd_tensor *leaf, int run, int uses) {
    if (!leaf || leaf->grad_mark != run || leaf->grad_pending <= 0) return ND_OK;
    leaf->grad_pending -= uses;
    if (leaf->grad_pending > 0 || !leaf->grad) return ND_OK;
    return grad_hook_fn ? grad_hook_fn(leaf) : ND_OK;
}

static nd_status leaf_used(nd_tensor *leaf, int run) { return leaf_done(leaf, run, 1); }

/* ---- tensor hooks (x:register_hook, nd_hook_tensor): a hooked node's
 * output gradient passes the callback when the node comes off the ready
 * list, before nd_grad captures it and before its backward; a hooked leaf's
 * contributions of one walk are summed aside (the same counting as above,
 * per walk) and the sum passes the callback once, before it is captured or
 * added to the leaf's grad. */
static nd_tensor_hook_fn tensor_hook_fn;

void nd_set_tensor_hook_callback(nd_tensor_hook_fn fn, void (*freed)(const void *key)) {
    tensor_hook_fn = fn;
    nd_hook_key_freed = freed;
}

nd_status nd_hook_tensor(nd_tensor *t, const void **key, bool *fresh) {
    if (!t->requires_grad)
        return nd_fail(ND_ERR_ARG, "register_hook: cannot register a hook on a tensor that does not "
                       "require grad");
    if (t->grad_fn) {
        *fresh = !t->grad_fn->hooked;
        t->grad_fn->hooked = true;
        *key = t->grad_fn;
    } else {
        *fresh = !t->tensor_hooks;
        if (!t->tensor_hooks) nd_bump_meta_generation(); /* (compiled graphs that use t: nd_graph_stale) */
        t->tensor_hooks = true;
        *key = t;
    }
    return ND_OK;
}

/* *g through key's hooks (*g replaced by the result) */
static nd_status apply_hooks(const void *key, nd_tensor **g, bool in_backward) {
    if (!tensor_hook_fn) return ND_OK;
    nd_tensor *r = NULL;
    ND_TRY(tensor_hook_fn(key, *g, in_backward, &r));
    if (!r) return ND_OK;
    bool same = r->ndim == (*g)->ndim && r->dtype == (*g)->dtype;
    for (int d = 0; same && d < r->ndim; d++) same = r->shape[d] == (*g)->shape[d];
    if (!same) {
        char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
        nd_status st = nd_fail(ND_ERR_SHAPE, "register_hook: a hook returned a %s gradient of shape "
                               "%s for a %s gradient of shape %s", nd_dtype_name(r->dtype),
                               nd_shape_str(r->shape, r->ndim, b1), nd_dtype_name((*g)->dtype),
                               nd_shape_str((*g)->shape, (*g)->ndim, b2));
        nd_release(r);
        return st;
    }
    nd_release(*g);
    *g = r;
    return ND_OK;
}

typedef struct { nd_tensor *leaf, *sum; int left, uses; } hooked_leaf;
typedef struct { hooked_leaf *items; int len, cap; } hooked_leaves;

static hooked_leaf *find_hooked(const hooked_leaves *h, const nd_tensor *leaf) {
    for (int k = 0; k < h->len; k++)
        if (h->items[k].leaf == leaf) return &h->items[k];
    return NULL;
}

static nd_status count_hooked(hooked_leaves *h, nd_tensor *leaf) {
    hooked_leaf *e = find_hooked(h, leaf);
    if (!e) {
        if (h->len == h->cap) {
            int cap = h->cap ? h->cap * 2 : 8;
            hooked_leaf *items = realloc(h->items, (size_t)cap * sizeof *items);
            if (!items) return nd_fail(ND_ERR_MEMORY, "backward: out of memory walking the graph");
            h->items = items;
            h->cap = cap;
        }
        e = &h->items[h->len++];
        *e = (hooked_leaf){leaf, NULL, 0, 0};
    }
    e->left++;
    e->uses++;
    return ND_OK;
}

static void drop_hooked(hooked_leaves *h) {
    for (int k = 0; k < h->len; k++) nd_release(h->items[k].sum);
    free(h->items);
}

/* g reached the leaf: nd_grad's result, and the leaf's grad in backward */
static nd_status give_leaf(nd_tensor *leaf, nd_tensor *g, const capture *cap, bool accumulate_leaves) {
    ND_TRY(capture_grad(cap, NULL, leaf, g));
    if (!accumulate_leaves) return ND_OK;
    ND_TRY(nd_graph_note_leaf_grad(leaf, true));
    ND_TRY(accumulate(&leaf->grad, g));
    /* a half leaf's gradient keeps its dtype (as PyTorch's): a sum of two
     * half gradients computes, and comes out, in float32 */
    if ((leaf->dtype == ND_FLOAT16 || leaf->dtype == ND_BFLOAT16) && leaf->grad->dtype != leaf->dtype) {
        nd_tensor *c;
        ND_TRY(nd_to_dtype(leaf->grad, leaf->dtype, &c));
        nd_release(leaf->grad);
        leaf->grad = c;
    }
    return ND_OK;
}

/* the last contribution of this walk reached a hooked leaf */
static nd_status deliver_hooked(hooked_leaf *e, const capture *cap, bool accumulate_leaves, int run) {
    nd_tensor *g = e->sum;
    e->sum = NULL;
    nd_status st = ND_OK;
    if (g) {
        st = apply_hooks(e->leaf, &g, accumulate_leaves);
        if (st == ND_OK) st = give_leaf(e->leaf, g, cap, accumulate_leaves);
        nd_release(g);
    }
    if (st == ND_OK) st = leaf_done(e->leaf, run, e->uses);
    return st;
}

static nd_status run(nd_node *const *roots, nd_tensor *const *root_grads, int nroots,
                     bool retain_graph, bool create_graph, bool accumulate_leaves,
                     const capture *cap) {
    node_list all = {0}, ready = {0};
    hooked_leaves hooked = {0};
    nd_status st = ND_OK;
    int run_epoch = atomic_fetch_add(&epoch, 1) + 1; /* this walk's: a nested walk takes the next one */
    /* 1. collect the reachable nodes and count each one's consumers */
    for (int r = 0; r < nroots && st == ND_OK; r++) {
        if (roots[r]->mark != run_epoch) {
            roots[r]->mark = run_epoch;
            roots[r]->deps = 0;
            st = list_push(&all, roots[r]);
        }
    }
    for (size_t k = 0; k < all.len && st == ND_OK; k++) {
        nd_node *n = all.items[k];
        for (int i = 0; i < n->ninputs && st == ND_OK; i++) {
            nd_node *m = n->next[i];
            if (!m) {
                count_leaf_use(n, i, accumulate_leaves, run_epoch);
                nd_tensor *leaf = n->needs_grad[i] ? n->leaf[i] : NULL;
                if (leaf && leaf->tensor_hooks) st = count_hooked(&hooked, leaf);
                continue;
            }
            if (m->mark != run_epoch) {
                m->mark = run_epoch;
                m->deps = 0;
                st = list_push(&all, m);
            }
            m->deps++;
        }
    }
    /* 2. seed the roots */
    for (int r = 0; r < nroots && st == ND_OK; r++) st = accumulate(&roots[r]->pending, root_grads[r]);
    for (size_t k = 0; k < all.len && st == ND_OK; k++)
        if (all.items[k]->deps == 0) st = list_push(&ready, all.items[k]);
    /* 3. Kahn's order: a node runs once every consumer has passed its gradient */
    bool prev_mode = nd_set_grad_enabled(create_graph);
    while (ready.len && st == ND_OK) {
        nd_node *n = ready.items[--ready.len];
        nd_tensor *g = n->pending;
        n->pending = NULL;
        nd_tensor *inline_grads[ND_NODE_INLINE_INPUTS] = {0}, **grads = inline_grads;
        if (n->ninputs > ND_NODE_INLINE_INPUTS) {
            grads = calloc((size_t)n->ninputs, sizeof *grads);
            if (!grads) {
                st = nd_fail(ND_ERR_MEMORY, "backward: out of memory running %s", n->name);
                nd_release(g);
                break;
            }
        }
        if (g) {
            if (n->hooked) st = apply_hooks(n, &g, accumulate_leaves);
            if (st == ND_OK) st = capture_grad(cap, n, NULL, g);
            if (st == ND_OK) {
                /* the profiler's "<op>_backward" events (one flag test when off) */
                int pdepth = nd_profiler_on_ ? nd_profiler_push_backward(n->name) : -1;
                bool done = false;
                if (!create_graph && n->ninputs == 1 && n->needs_grad[0] && n->next[0])
                    st = nd_view_grad_into(n, g, &n->next[0]->pending, &done);
                if (st == ND_OK && !done) {
                    /* products in the backward at the forward's precision (inside
                     * nd.autocast, bfloat16 where the CPU has it) */
                    const nd_matmul_precision prev = nd_get_float32_matmul_precision();
                    const nd_dtype prev_ocl = nd_get_opencl_matmul_dtype();
                    if (n->precision != (int8_t)prev)
                        nd_set_float32_matmul_precision((nd_matmul_precision)n->precision);
                    if (n->opencl_operands != (int8_t)prev_ocl)
                        (void)nd_set_opencl_matmul_dtype((nd_dtype)n->opencl_operands); /* recorded: valid */
                    st = n->backward(n, g, grads);
                    if (n->precision != (int8_t)prev) nd_set_float32_matmul_precision(prev);
                    if (n->opencl_operands != (int8_t)prev_ocl) (void)nd_set_opencl_matmul_dtype(prev_ocl);
                }
                if (pdepth >= 0) nd_profiler_pop(pdepth);
            }
        }
        for (int i = 0; i < n->ninputs && st == ND_OK; i++) {
            if (!n->needs_grad[i]) continue;
            if (grads[i]) st = check_grad_shape(n, i, grads[i]);
            if (st == ND_OK && grads[i] && grads[i]->dtype != n->in_dtype[i]) {
                nd_tensor *cast; /* a float64 * float32 product: each input gets its own dtype */
                st = nd_to_dtype(grads[i], n->in_dtype[i], &cast);
                if (st == ND_OK) { nd_release(grads[i]); grads[i] = cast; }
            }
            if (st != ND_OK) break;
            if (n->next[i]) {
                nd_node *m = n->next[i];
                if (grads[i]) st = accumulate(&m->pending, grads[i]);
                if (st == ND_OK && --m->deps == 0) st = list_push(&ready, m);
            } else {
                nd_tensor *leaf = n->leaf[i];
                hooked_leaf *e = leaf->tensor_hooks ? find_hooked(&hooked, leaf) : NULL;
                if (e) {
                    if (grads[i]) st = accumulate(&e->sum, grads[i]);
                    if (st == ND_OK && --e->left == 0)
                        st = deliver_hooked(e, cap, accumulate_leaves, run_epoch);
                } else {
                    if (grads[i]) st = give_leaf(leaf, grads[i], cap, accumulate_leaves);
                    if (st == ND_OK) st = leaf_used(leaf, run_epoch);
                }
            }
        }
        for (int i = 0; i < n->ninputs; i++) nd_release(grads[i]);
        if (grads != inline_grads) free(grads);
        nd_release(g);
        if (!retain_graph && st == ND_OK) {
            for (int i = 0; i < n->nsaved; i++) {
                nd_release(n->saved[i]);
                n->saved[i] = NULL;
            }
            n->released = true;
        }
    }
    nd_set_grad_enabled(prev_mode);
    /* on error, drop gradients that never got used */
    for (size_t k = 0; k < all.len; k++) {
        nd_release(all.items[k]->pending);
        all.items[k]->pending = NULL;
    }
    free(all.items);
    free(ready.items);
    drop_hooked(&hooked);
    return st;
}

static nd_status default_grad(const char *op, const nd_tensor *out, const nd_tensor *grad,
                              nd_tensor **g) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (!grad) {
        if (nd_numel(out) != 1)
            return nd_fail(ND_ERR_SHAPE, "%s: a gradient can be created implicitly only for a "
                           "one-element tensor, but this one has shape %s (pass a gradient "
                           "tensor of that shape)", op, nd_shape_str(out->shape, out->ndim, b1));
        return nd_full_on(nd_get_device(out), out->shape, out->ndim, out->dtype, 1, g);
    }
    bool same = grad->ndim == out->ndim;
    for (int i = 0; same && i < out->ndim; i++) same = grad->shape[i] == out->shape[i];
    if (!same)
        return nd_fail(ND_ERR_SHAPE, "%s: gradient of shape %s does not match the tensor's "
                       "shape %s", op, nd_shape_str(grad->shape, grad->ndim, b1),
                       nd_shape_str(out->shape, out->ndim, b2));
    return nd_to_dtype(grad, out->dtype, g);
}

nd_status nd_backward(nd_tensor *root, const nd_tensor *grad, bool retain_graph,
                      bool create_graph) {
    if (!root->requires_grad)
        return nd_fail(ND_ERR_ARG, "backward: the tensor does not require grad (no input of the "
                       "computation that produced it has requires_grad = true)");
    nd_tensor *g;
    ND_TRY(default_grad("backward", root, grad, &g));
    nd_status st;
    if (!root->grad_fn) { /* a leaf: its gradient is g itself */
        st = root->tensor_hooks ? apply_hooks(root, &g, true) : ND_OK;
        if (st == ND_OK) st = accumulate(&root->grad, g);
    } else {
        nd_node *r = root->grad_fn;
        st = run(&r, &g, 1, retain_graph, create_graph, true, NULL);
    }
    nd_release(g);
    return st;
}

nd_status nd_grad(nd_tensor *const *outputs, nd_tensor *const *grad_outputs, int noutputs,
                  nd_tensor *const *inputs, int ninputs, bool retain_graph, bool create_graph,
                  bool allow_unused, nd_tensor **result) {
    if (noutputs < 1 || ninputs < 1)
        return nd_fail(ND_ERR_ARG, "grad: expected at least one output and one input, got %d and %d",
                       noutputs, ninputs);
    for (int i = 0; i < ninputs; i++) {
        result[i] = NULL;
        if (!inputs[i]->requires_grad)
            return nd_fail(ND_ERR_ARG, "grad: input " ND_IXF " does not require grad", ND_IX(i));
    }
    /* one allocation: roots and their gradients per output, nodes per input */
    void **mem = calloc((size_t)(2 * noutputs + ninputs), sizeof *mem);
    if (!mem) return nd_fail(ND_ERR_MEMORY, "grad: out of memory");
    nd_node **roots = (nd_node **)mem, **in_nodes = (nd_node **)mem + 2 * noutputs;
    nd_tensor **gs = (nd_tensor **)mem + noutputs;
    for (int i = 0; i < ninputs; i++) in_nodes[i] = inputs[i]->grad_fn;
    nd_status st = ND_OK;
    int nroots = 0;
    for (int o = 0; o < noutputs && st == ND_OK; o++) {
        if (!outputs[o]->requires_grad) {
            st = nd_fail(ND_ERR_ARG, "grad: output " ND_IXF " does not require grad", ND_IX(o));
            break;
        }
        nd_tensor *g;
        st = default_grad("grad", outputs[o], grad_outputs ? grad_outputs[o] : NULL, &g);
        if (st != ND_OK) break;
        if (outputs[o]->grad_fn) {
            roots[nroots] = outputs[o]->grad_fn;
            gs[nroots++] = g;
        } else { /* an output that is itself one of the leaves */
            for (int i = 0; i < ninputs && st == ND_OK; i++)
                if (inputs[i] == outputs[o]) st = accumulate(&result[i], g);
            nd_release(g);
        }
    }
    if (st == ND_OK && nroots) {
        capture c = {ninputs, in_nodes, inputs, result};
        st = run(roots, gs, nroots, retain_graph, create_graph, false, &c);
    }
    for (int r = 0; r < nroots; r++) nd_release(gs[r]);
    for (int i = 0; i < ninputs && st == ND_OK; i++)
        if (!result[i] && !allow_unused)
            st = nd_fail(ND_ERR_ARG, "grad: input " ND_IXF " is not used in the graph of the "
                         "outputs (pass allow_unused=true to get nil)", ND_IX(i));
    if (st != ND_OK)
        for (int i = 0; i < ninputs; i++) { nd_release(result[i]); result[i] = NULL; }
    free(mem);
    return st;
}

/* ------------------------------------------------------ public helpers */

nd_status nd_requires_grad_(nd_tensor *t, bool on) {
    if (on && !nd_dtype_is_float(t->dtype))
        return nd_fail(ND_ERR_DTYPE, "requires_grad: only floating point tensors can require "
                       "gradients, got %s", nd_dtype_name(t->dtype));
    if (!on && t->grad_fn)
        return nd_fail(ND_ERR_ARG, "requires_grad: only leaf tensors can stop requiring grad "
                       "(use detach() for a non-leaf)");
    if (t->requires_grad != on) nd_bump_meta_generation();
    t->requires_grad = on;
    return ND_OK;
}

nd_tensor *nd_get_grad(const nd_tensor *t) { return t->grad; }

nd_status nd_set_grad(nd_tensor *t, nd_tensor *grad) {
    ND_TRY(nd_graph_note_leaf_grad(t, false));
    if (grad) {
        char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
        bool same = grad->ndim == t->ndim;
        for (int i = 0; same && i < t->ndim; i++) same = grad->shape[i] == t->shape[i];
        if (!same)
            return nd_fail(ND_ERR_SHAPE, "grad: assigned gradient has shape %s, expected %s",
                           nd_shape_str(grad->shape, grad->ndim, b1),
                           nd_shape_str(t->shape, t->ndim, b2));
        nd_retain(grad);
    }
    nd_release(t->grad);
    t->grad = grad;
    return ND_OK;
}

nd_status nd_detach(const nd_tensor *t, nd_tensor **out) {
    return nd_tensor_view_of(t, t->shape, t->strides, t->ndim, t->offset, out);
}

const char *nd_grad_fn_name(const nd_tensor *t) { return t->grad_fn ? t->grad_fn->name : NULL; }
