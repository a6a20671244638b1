/* cpu_bf16_weights.c - linear layers' weights packed to bfloat16 once per
 * nd.autocast scope, as PyTorch's autocast caches its casts of the weights.
 *
 * Inside nd.autocast (nd_autocast_enter .. the outermost nd_autocast_exit)
 * a linear layer's weight is packed for the bfloat16 GEMM on first use and
 * kept: later calls in the scope skip the packing, and a layer with few rows
 * (a generated token's) runs the bfloat16 kernel on the packed weight,
 * half the bytes of the float32 weight it would otherwise stream. An entry
 * holds a reference to the weight's storage (so the address cannot be
 * reused by another tensor while it is cached) and the storage's version: a
 * weight written since (an optimizer step, copy_, a replay's update) is
 * packed again. The outermost exit frees every entry. The cache is bounded
 * (CACHE_BYTES): past it, products pack their weight per call as outside the
 * scope. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "cpu_gemm.h"
#include "cpu_kernels.h"

#define CACHE_BYTES ((size_t)4 << 30)

typedef struct {
    nd_storage *storage; /* retained */
    uint64_t version;
    int64_t offset, rows, cols;
    nd_bf16_packed_b *packed;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static int count, capacity;
static size_t bytes;
static atomic_int depth;

static void drop(entry *e) {
    bytes -= nd_cpu_bf16_packed_bytes(e->packed);
    nd_cpu_bf16_packed_free(e->packed);
    nd_storage_release(e->storage);
}

void nd_autocast_enter(void) { atomic_fetch_add(&depth, 1); }

void nd_autocast_exit(void) {
    if (atomic_fetch_sub(&depth, 1) != 1) return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < count; i++) drop(&entries[i]);
    free(entries);
    entries = NULL;
    count = capacity = 0;
    pthread_mutex_unlock(&lock);
}

bool nd_autocast_active(void) { return atomic_load(&depth) > 0; }

/* w (O x K, contiguous float32, a linear layer's weight) packed as the
 * bfloat16 GEMM's B = w^T, from the cache or packed now; NULL outside
 * nd.autocast, when products do not run on bfloat16, or past the cache's
 * bound. Valid until the outermost nd_autocast_exit. */
const nd_bf16_packed_b *nd_cpu_bf16_weight(const nd_tensor *w) {
    if (!nd_autocast_active() || !nd_cpu_gemm_bf16_active() || w->dtype != ND_FLOAT32 || w->ndim != 2)
        return NULL;
    const int64_t O = w->shape[0], K = w->shape[1];
    const nd_bf16_packed_b *found = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < count && !found; i++) {
        entry *e = &entries[i];
        if (e->storage != w->storage || e->offset != w->offset || e->rows != O || e->cols != K) continue;
        if (e->version == w->storage->version) {
            found = e->packed;
            break;
        }
        drop(e); /* written since: packed again below */
        entries[i] = entries[--count];
        break;
    }
    if (!found) {
        nd_bf16_packed_b *pb = NULL;
        const size_t need = (size_t)O * (size_t)K * 2;
        if (count == capacity) {
            const int grown = capacity ? 2 * capacity : 16;
            entry *more = realloc(entries, sizeof *entries * (size_t)grown);
            if (more) entries = more, capacity = grown;
        }
        if (count < capacity && bytes + need <= CACHE_BYTES)
            pb = nd_cpu_bf16_pack_b(K, O, (const float *)nd_ptr(w), 1, K);
        if (pb) {
            nd_storage_retain(w->storage);
            entries[count++] = (entry){w->storage, w->storage->version, w->offset, O, K, pb};
            bytes += nd_cpu_bf16_packed_bytes(pb);
            found = pb;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}
