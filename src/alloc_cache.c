#define _POSIX_C_SOURCE 200809L /* posix_memalign */
/* alloc_cache.c - a size-binned caching allocator for CPU tensor memory.
 *
 * Training loops allocate the same sizes every step; returning blocks to a
 * free list instead of free() keeps malloc (and its page faults for large
 * blocks) out of the hot loop. Sizes are rounded up to a bin: multiples of
 * 64 bytes below 4 KiB, then four bins per power of two. The cache holds at
 * most cache_limit bytes; beyond that blocks go back to the system.
 *
 * Small blocks (the 64 bins up to 4 KiB) first go through a per-thread
 * front that needs no lock: an op on small tensors allocates and frees three
 * of them (tensor header, storage header, data), and a lock/unlock pair for
 * each was a tenth of such an op's time. The front holds at most
 * FRONT_BYTES per thread; beyond that blocks go to the shared bins. A
 * thread's front goes back to the shared bins when the thread ends, and
 * nd_empty_cache() frees the calling thread's front too. */
#include <pthread.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h> /* malloc_trim */
#endif
#include <string.h>
#include "tensor.h"

#define NUM_BINS 256
#define ALIGN 64
/* Lua frees tensors in batches when its collector runs, so a loop of small
 * ops can have thousands in flight: small bins keep many blocks, large ones
 * at least 64, or as many as fill LARGE_BIN_BYTES - a collection's worth
 * of garbage (lt_tensor.c collects when live bytes grew by 32 MiB): a loop
 * making 393 KB results (BERT's 128 x 768 GEMM output) frees about 80 at a
 * time, and with 64 per bin the rest went back to the system, to be page
 * faulted again (4,500 more faults in 33 calls, 2.1 -> 3.7 ms a call). The
 * byte limit applies to all. */
#define MAX_PER_SMALL_BIN 16384
#define MAX_PER_LARGE_BIN 64
#define LARGE_BIN_BYTES ((int64_t)64 << 20)

typedef struct block { struct block *next; } block;

static struct {
    pthread_mutex_t lock;
    block *bins[NUM_BINS];
    int count[NUM_BINS];
    int64_t cached_bytes;
    int64_t limit;
} cache = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, (int64_t)1 << 30};

/* ---- the per-thread front for the small bins ---- */
#define FRONT_BINS 64
#define FRONT_BYTES ((int64_t)4 << 20)

typedef struct {
    block *bins[FRONT_BINS];
    int64_t bytes;
    bool keyed; /* registered for the thread-exit flush */
} front;

static _Thread_local front tl_front;
static pthread_key_t front_key;
static pthread_once_t front_once = PTHREAD_ONCE_INIT;
static bool front_key_ok;

static void shared_free(void *p, int bin, size_t rounded);

/* A thread's front back to the shared bins (or the system): at its exit,
 * and from nd_empty_cache for the calling thread. */
static void front_exit(void *arg) {
    front *f = arg;
    for (int bin = 0; bin < FRONT_BINS; bin++) {
        block *b = f->bins[bin];
        while (b) {
            block *next = b->next;
            shared_free(b, bin, (size_t)(bin + 1) * ALIGN);
            b = next;
        }
        f->bins[bin] = NULL;
    }
    f->bytes = 0;
}

static void make_front_key(void) { front_key_ok = pthread_key_create(&front_key, front_exit) == 0; }

/* true when the block went to this thread's front */
static bool front_push(void *p, int bin, size_t rounded) {
    front *f = &tl_front;
    if (bin >= FRONT_BINS || f->bytes + (int64_t)rounded > FRONT_BYTES) return false;
    if (!f->keyed) {
        /* without the exit hook a thread's front would leak when it ends */
        pthread_once(&front_once, make_front_key);
        if (!front_key_ok || pthread_setspecific(front_key, f) != 0) return false;
        f->keyed = true;
    }
    block *b = p;
    b->next = f->bins[bin];
    f->bins[bin] = b;
    f->bytes += (int64_t)rounded;
    return true;
}

static void *front_pop(int bin, size_t rounded) {
    front *f = &tl_front;
    if (bin >= FRONT_BINS) return NULL;
    block *b = f->bins[bin];
    if (b) {
        f->bins[bin] = b->next;
        f->bytes -= (int64_t)rounded;
    }
    return b;
}

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
        void *hit = front_pop(bin, rounded);
        if (hit) return hit;
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

/* p (rounded bytes of bin) into the shared bins, or back to the system */
static void shared_free(void *p, int bin, size_t rounded) {
    pthread_mutex_lock(&cache.lock);
    bool room = bin < 64 ? cache.count[bin] < MAX_PER_SMALL_BIN
                         : cache.count[bin] < MAX_PER_LARGE_BIN ||
                           (int64_t)(cache.count[bin] + 1) * (int64_t)rounded <= LARGE_BIN_BYTES;
    if (room && cache.cached_bytes + (int64_t)rounded <= cache.limit) {
        block *b = p;
        b->next = cache.bins[bin];
        cache.bins[bin] = b;
        cache.count[bin]++;
        cache.cached_bytes += (int64_t)rounded;
        p = NULL;
    }
    pthread_mutex_unlock(&cache.lock);
    free(p);
}

void nd_cache_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t rounded;
    int bin = bin_of(nbytes, &rounded);
    if (bin < 0) { free(p); return; }
    if (front_push(p, bin, rounded)) return;
    shared_free(p, bin, rounded);
}

int64_t nd_cached_bytes(void) {
    pthread_mutex_lock(&cache.lock);
    int64_t n = cache.cached_bytes;
    pthread_mutex_unlock(&cache.lock);
    return n + tl_front.bytes;
}

void nd_empty_cache(void) {
    front_exit(&tl_front); /* this thread's front into the shared bins, freed below */
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
#if defined(__GLIBC__)
    /* free() keeps what it gets back in glibc's heaps: blocks between the
     * mmap threshold's start (128 KiB) and its dynamic ceiling (32 MiB) come
     * from the heap once a larger block has been freed, and a live block
     * above them pins the pages below. Without a trim, RSS after emptying
     * the cache stayed at 650 MiB with 92 MiB of tensors live. */
    malloc_trim(0);
#endif
}
