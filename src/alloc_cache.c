#define _POSIX_C_SOURCE 200809L /* posix_memalign */
/* alloc_cache.c - a size-binned caching allocator for CPU tensor memory.
 *
 * Training loops allocate the same sizes every step; returning blocks to a
 * free list instead of free() keeps malloc (and its page faults for large
 * blocks) out of the hot loop. Sizes are rounded up to a bin: multiples of
 * 64 bytes below 4 KiB, then four bins per power of two. The cache holds at
 * most cache_limit bytes; beyond that blocks go back to the system. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"

#define NUM_BINS 256
#define ALIGN 64
/* Lua frees tensors in batches when its collector runs, so a loop of small
 * ops can have thousands in flight: small bins keep many blocks, large ones
 * few (the byte limit applies to all). */
#define MAX_PER_SMALL_BIN 16384
#define MAX_PER_LARGE_BIN 64

typedef struct block { struct block *next; } block;

static struct {
    pthread_mutex_t lock;
    block *bins[NUM_BINS];
    int count[NUM_BINS];
    int64_t cached_bytes;
    int64_t limit;
} cache = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, (int64_t)1 << 30};

/* Bin index and rounded size for a request. */
static int bin_of(size_t n, size_t *rounded) {
    if (n <= 4096) {
        size_t r = (n + ALIGN - 1) / ALIGN * ALIGN;
        if (r == 0) r = ALIGN;
        *rounded = r;
        return (int)(r / ALIGN) - 1; /* 0..63 */
    }
    int p = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^p < n <= 2^(p+1) */
    size_t base = (size_t)1 << p, quarter = base / 4;
    size_t k = (n - base + quarter - 1) / quarter; /* 1..4 */
    *rounded = base + k * quarter;
    int bin = 64 + (p - 12) * 4 + (int)(k - 1);
    return bin < NUM_BINS ? bin : -1;
}

void *nd_cache_alloc(size_t nbytes) {
    size_t rounded;
    int bin = bin_of(nbytes, &rounded);
    if (bin >= 0) {
        pthread_mutex_lock(&cache.lock);
        block *b = cache.bins[bin];
        if (b) {
            cache.bins[bin] = b->next;
            cache.count[bin]--;
            cache.cached_bytes -= (int64_t)rounded;
        }
        pthread_mutex_unlock(&cache.lock);
        if (b) return b;
    } else rounded = nbytes;
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, rounded) != 0) {
        /* Memory may be held by the cache: give it back and try once more. */
        nd_empty_cache();
        if (posix_memalign(&p, ALIGN, rounded) != 0) return NULL;
    }
    return p;
}

void nd_cache_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t rounded;
    int bin = bin_of(nbytes, &rounded);
    if (bin >= 0) {
        pthread_mutex_lock(&cache.lock);
        if (cache.count[bin] < (bin < 64 ? MAX_PER_SMALL_BIN : MAX_PER_LARGE_BIN) && cache.cached_bytes + (int64_t)rounded <= cache.limit) {
            block *b = p;
            b->next = cache.bins[bin];
            cache.bins[bin] = b;
            cache.count[bin]++;
            cache.cached_bytes += (int64_t)rounded;
            p = NULL;
        }
        pthread_mutex_unlock(&cache.lock);
    }
    free(p);
}

int64_t nd_cached_bytes(void) {
    pthread_mutex_lock(&cache.lock);
    int64_t n = cache.cached_bytes;
    pthread_mutex_unlock(&cache.lock);
    return n;
}

void nd_empty_cache(void) {
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < NUM_BINS; i++) {
        block *b = cache.bins[i];
        while (b) {
            block *next = b->next;
            free(b);
            b = next;
        }
        cache.bins[i] = NULL;
        cache.count[i] = 0;
    }
    cache.cached_bytes = 0;
    pthread_mutex_unlock(&cache.lock);
}
