/* graph_backward.c - backward through a compiled forward (nd.compile of a
 * model or a forward function, trained with an eager backward).
 *
 * When the function's outputs need gradients, nd.compile captures, next to
 * the forward graph fw, one backward graph bw: the gradients of the outputs
 * with respect to the parameters, from gradients placed in tensors of the
 * outputs' shapes (grad_in, one per output, zeros between backwards). Each
 * output of a replay gets a node (op compiled_forward) whose inputs are
 * those parameters; its backward copies the gradient it receives into the
 * output's grad_in, replays bw, zeroes grad_in again and hands copies of
 * bw's results to the engine, which accumulates them into the parameters'
 * .grad as for any node (several outputs: one replay each, summed per
 * parameter). bw reads activations that fw wrote, so the node refuses once
 * fw has replayed again, or anything bw reads from outside was written
 * since (storage versions). */
#include <stdlib.h>
#include "autograd.h"
#include "graph_internal.h"

typedef struct {
    nd_graph *fw, *bw;
    bool pending;        /* counted in fw->pending: alive, its backward not run yet */
    uint64_t fw_replays; /* fw's replay count when the output was made */
    nd_tensor *grad_in;
    /* what bw reads from outside (activations, parameters, the graph's inputs)
     * and its version when the output was made: any write since (a later
     * call, a refused replay, an in-place update) makes the backward refuse,
     * as eager refuses a saved tensor modified in place */
    size_t nread;
    nd_storage **read;    /* (bw holds them) */
    uint64_t *version;
    int n;
    nd_tensor *grads[]; /* bw's results, one per leaf (NULL: no gradient) */
} compiled_backward;

static void settle(compiled_backward *c) {
    if (c->pending) atomic_fetch_sub(&c->fw->pending, 1);
    c->pending = false;
}

static void free_ctx(void *p) {
    compiled_backward *c = p;
    settle(c);
    free(c->read);
    free(c->version);
    for (int i = 0; i < c->n; i++) nd_release(c->grads[i]);
    nd_release(c->grad_in);
    nd_graph_free(c->fw);
    nd_graph_free(c->bw);
    free(c);
}

static nd_status bw_compiled(nd_node *node, nd_tensor *g, nd_tensor **grads) {
    compiled_backward *c = node->ctx;
    if (nd_grad_enabled())
        return nd_fail(ND_ERR_UNSUPPORTED, "compiled_forward: backward with create_graph through "
                       "the output of a compiled function is not supported (its backward is a "
                       "replayed graph, not differentiable ops): run that function eagerly");
    if (c->fw->replays != c->fw_replays)
        return nd_fail(ND_ERR_UNSUPPORTED, "compiled_forward: the compiled function ran again after "
                       "it made this output, and overwrote the activations its backward reads: call "
                       "backward before the next call (or compile the whole training step)");
    for (size_t k = 0; k < c->nread; k++)
        if (c->read[k]->version != c->version[k])
            return nd_fail(ND_ERR_UNSUPPORTED, "compiled_forward: a tensor this output's backward "
                           "reads (an activation, a parameter or an argument of the compiled call) "
                           "was modified in place after the call, or a later call was refused "
                           "half way: call backward before changing them");
    nd_status st = nd_copy_(c->grad_in, g);
    if (st == ND_OK) st = nd_graph_replay(c->bw);
    /* copies first: a gradient may be grad_in itself (x + w), or a view of it */
    for (int i = 0; i < c->n && st == ND_OK; i++)
        if (c->grads[i] && node->needs_grad[i]) st = nd_clone(c->grads[i], &grads[i]);
    /* the other outputs' backwards replay bw too: their grad_in must read zeros */
    nd_status zst = nd_fill_(c->grad_in, 0.0);
    if (st == ND_OK) settle(c);
    return st != ND_OK ? st : zst;
}

static bool same_geometry(const nd_tensor *a, const nd_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* s is where one of the outputs' gradients goes (written by the nodes themselves) */
static bool is_grad_in(const nd_storage *s, nd_tensor *const *grad_ins, int ngrad_in) {
    for (int k = 0; k < ngrad_in; k++)
        if (grad_ins[k]->storage == s) return true;
    return false;
}

nd_status nd_graph_attach_backward(nd_tensor *out, nd_graph *fw, nd_graph *bw,
                                   nd_tensor *const *grad_ins, int ngrad_in, int k,
                                   int n, nd_tensor *const *leaves, nd_tensor *const *grads) {
    if (k < 0 || k >= ngrad_in)
        return nd_fail(ND_ERR_ARG, "compiled_forward: output %d of %d", k + 1, ngrad_in);
    nd_tensor *grad_in = grad_ins[k];
    if (!fw || !bw || !fw->ended || !bw->ended)
        return nd_fail(ND_ERR_ARG, "compiled_forward: the graphs were not captured");
    if (!same_geometry(out, grad_in))
        return nd_fail(ND_ERR_SHAPE, "compiled_forward: the output and its gradient's place differ "
                       "in shape or dtype");
    for (int i = 0; i < n; i++)
        if (grads[i] && !same_geometry(grads[i], leaves[i]))
            return nd_fail(ND_ERR_SHAPE, "compiled_forward: gradient %d differs from its parameter "
                           "in shape or dtype", i + 1);
    compiled_backward *c = calloc(1, sizeof *c + (size_t)n * sizeof *c->grads);
    size_t nread = 0;
    for (size_t q = 0; q < bw->nstor; q++)
        nread += !bw->stor[q].internal && !is_grad_in(bw->stor[q].s, grad_ins, ngrad_in);
    if (c) {
        c->read = malloc((nread + 1) * sizeof *c->read);
        c->version = malloc((nread + 1) * sizeof *c->version);
    }
    if (!c || !c->read || !c->version) {
        if (c) { free(c->read); free(c->version); free(c); }
        return nd_fail(ND_ERR_MEMORY, "compiled_forward: out of memory");
    }
    for (size_t q = 0; q < bw->nstor; q++) {
        nd_storage *s = bw->stor[q].s;
        if (bw->stor[q].internal || is_grad_in(s, grad_ins, ngrad_in)) continue;
        c->read[c->nread] = s;
        c->version[c->nread++] = s->version;
    }
    nd_node *node;
    nd_status st = nd_record(ND_OP_compiled_forward, bw_compiled, out, n,
                             (const nd_tensor *const *)leaves, &node);
    if (st != ND_OK || !node) {
        free(c->read);
        free(c->version);
        free(c);
        return st;
    }
    c->fw = fw;
    c->bw = bw;
    c->pending = false;
    nd_graph_retain(fw);
    nd_graph_retain(bw);
    c->fw_replays = fw->replays;
    c->grad_in = grad_in;
    nd_retain(grad_in);
    c->n = n;
    for (int i = 0; i < n; i++) {
        c->grads[i] = grads[i];
        if (grads[i]) nd_retain(grads[i]);
    }
    c->pending = true;
    atomic_fetch_add(&fw->pending, 1);
    node->ctx = c;
    node->ctx_free = free_ctx;
    return ND_OK;
}

int64_t nd_graph_pending_backwards(const nd_graph *g) {
    return g ? (int64_t)atomic_load(&((nd_graph *)g)->pending) : 0;
}
