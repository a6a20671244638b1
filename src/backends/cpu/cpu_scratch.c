/* cpu_scratch.c - scratch blocks from the caching allocator (cpu_scratch.h).
 * Each block starts with a 64-byte header holding its size, so that callers
 * free it without knowing the size, as with free(). */
#include "cpu_scratch.h"
#include "tensor.h"

#define HEADER 64 /* bytes: keeps the block after it 64-byte aligned */

void *nd_cpu_scratch_alloc(size_t nbytes) {
    size_t total = nbytes + HEADER;
    unsigned char *p = nd_cache_alloc(total);
    if (!p) return NULL;
    *(size_t *)p = total;
    return p + HEADER;
}

void nd_cpu_scratch_free(void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - HEADER;
    nd_cache_free(p, *(size_t *)p);
}
