/* autograd_node.c - the lifetime of autograd nodes (core): a tensor
 * releasing its grad_fn must not need the engine (ops/autograd.c). */
#include <stdlib.h>
#include "autograd_node.h"

/* ----------------------------------------------------------------- nodes */

void nd_node_retain(nd_node *n) { if (n) atomic_fetch_add(&n->refcount, 1); }

/* Releasing the last reference to a long chain (an RNN unrolled over
 * thousands of steps) would recurse once per node; instead nodes whose count
 * drops to zero go on a worklist that the outermost release drains. */
static _Thread_local struct { nd_node **items; size_t len, cap; bool draining; } dying;

static void free_node(nd_node *n) {
    for (int i = 0; i < n->ninputs; i++) {
        nd_node_release(n->next[i]);
        nd_release(n->leaf[i]);
    }
    for (int i = 0; i < n->nsaved; i++) nd_release(n->saved[i]);
    nd_release(n->pending);
    if (n->ctx_free) n->ctx_free(n->ctx);
    if (n->hooked && nd_hook_key_freed) nd_hook_key_freed(n);
    free(n);
}

void nd_node_release(nd_node *n) {
    if (!n || atomic_fetch_sub(&n->refcount, 1) != 1) return;
    if (dying.len == dying.cap) {
        size_t cap = dying.cap ? dying.cap * 2 : 64;
        nd_node **items = realloc(dying.items, cap * sizeof *items);
        if (!items) { free_node(n); return; } /* no memory: recurse instead */
        dying.items = items;
        dying.cap = cap;
    }
    dying.items[dying.len++] = n;
    if (dying.draining) return;
    dying.draining = true;
    while (dying.len) free_node(dying.items[--dying.len]);
    dying.draining = false;
}
