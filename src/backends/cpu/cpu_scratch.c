/* cpu_scratch.c - scratch blocks for the CPU kernels (cpu_scratch.h).
 *
 * Each block starts with a 64-byte header holding its size, so that callers
 * free it without knowing the size, as with free(). A freed block first goes
 * to a few slots of the freeing thread, where that thread's next call finds
 * it: in the shared caching allocator it could be taken by a tensor of the
 * same size bin before the kernel asks again. It was: BERT's 128 x 768 GEMM
 * output is exactly one A panel's size, so each call's output took the
 * panel freed by the last call, every panel came fresh from the system and
 * page-faulted, and the call took 4.4 ms instead of 2.1. Blocks that do not
 * fit the slots go to the shared allocator; a thread's slots go back to it
 * when the thread ends. */
#include "cpu_scratch.h"

#include <pthread.h>
#include <stdlib.h>
#include "tensor.h"

#define HEADER 64 /* bytes: keeps the block after it 64-byte aligned */
#define SLOTS 4

typedef struct {
    void *p[SLOTS];
    size_t n[SLOTS];
} slots;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool key_ok;

static void release_slots(void *v) {
    slots *s = v;
    for (int i = 0; i < SLOTS; i++)
        if (s->p[i]) nd_cache_free(s->p[i], s->n[i]);
    free(s);
}

static void make_key(void) { key_ok = pthread_key_create(&key, release_slots) == 0; }

/* this thread's slots, made on first use (NULL: none to be had) */
static slots *my_slots(void) {
    pthread_once(&once, make_key);
    if (!key_ok) return NULL;
    slots *s = pthread_getspecific(key);
    if (!s && (s = calloc(1, sizeof *s)) && pthread_setspecific(key, s) != 0) {
        free(s);
        s = NULL;
    }
    return s;
}

void *nd_cpu_scratch_alloc(size_t nbytes) {
    size_t total = nbytes + HEADER;
    slots *s = my_slots();
    for (int i = 0; s && i < SLOTS; i++) /* a kept block not more than twice the size */
        if (s->p[i] && s->n[i] >= total && s->n[i] / 2 <= total) {
            unsigned char *p = s->p[i];
            s->p[i] = NULL;
            return p + HEADER; /* (its header still holds its own size) */
        }
    unsigned char *p = nd_cache_alloc(total);
    if (!p) return NULL;
    *(size_t *)p = total;
    return p + HEADER;
}

void nd_cpu_scratch_free(void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - HEADER;
    size_t n = *(size_t *)p;
    slots *s = my_slots();
    if (!s) { nd_cache_free(p, n); return; }
    for (int i = 0; i < SLOTS; i++)
        if (!s->p[i]) { s->p[i] = p; s->n[i] = n; return; }
    nd_cache_free(s->p[0], s->n[0]); /* full: the oldest slot goes to the shared allocator */
    for (int i = 0; i + 1 < SLOTS; i++) { s->p[i] = s->p[i + 1]; s->n[i] = s->n[i + 1]; }
    s->p[SLOTS - 1] = p;
    s->n[SLOTS - 1] = n;
}
