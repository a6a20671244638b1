/* cpu_bf16_weights.c - linear layers' weights packed to bfloat16 once per
 * nd.autocast scope, as PyTorch's autocast caches its casts of the weights.
 *
 * Inside nd.autocast (nd_autocast_enter .. the outermost nd_autocast_exit,
 * on the calling thread: a scope and its cache are the thread's own, so a
 * DataLoader worker neither sees the main thread's nor has its entries
 * freed under it) a linear layer's weight is packed for the bfloat16 GEMM on
 * first use and kept (a weight that is its own whole storage, as parameters
 * are): later calls in the scope skip the packing, and a layer
 * with few rows (a generated token's) runs the bfloat16 kernel on the
 * packed weight, half the bytes of the float32 weight it would otherwise
 * stream. An entry is keyed by the weight's storage identity (nd_storage_id:
 * unique for the process's life, so no reference is held and a freed
 * weight's address cannot be mistaken for a new one; not the storage's
 * serial, which is 0 outside a capture), offset, shape and dtype, and checked against
 * the storage's version: a weight written since (an optimizer step, copy_,
 * a replay's update) is packed again. The cache holds at most MAX_ENTRIES
 * entries and MAX_BYTES of packed weights, the least recently used going
 * first (a weight made afresh on every call - a non-contiguous weight's
 * copy - only cycles through it); the outermost exit frees it all. */
#include <stdlib.h>
#include "cpu_gemm.h"
#include "cpu_kernels.h"

#define MAX_ENTRIES 512
#define MAX_BYTES ((size_t)2 << 30)

typedef struct {
    uint64_t serial, version, used; /* serial: the storage's identity (nd_storage_id) */
    int64_t offset, rows, cols;
    nd_dtype dtype;
    nd_bf16_packed_b *packed;
} entry;

static _Thread_local entry entries[MAX_ENTRIES];
static _Thread_local int count;
static _Thread_local size_t bytes;
static _Thread_local uint64_t clock_;
static _Thread_local int depth;

static void drop(int i) {
    bytes -= nd_cpu_bf16_packed_bytes(entries[i].packed);
    nd_cpu_bf16_packed_free(entries[i].packed);
    entries[i] = entries[--count];
}

void nd_autocast_enter(void) { depth++; }

void nd_autocast_exit(void) {
    if (depth <= 0) return; /* (an exit without its enter changes nothing) */
    if (--depth > 0) return;
    while (count > 0) drop(count - 1);
    bytes = 0;
}

bool nd_autocast_active(void) { return depth > 0; }

/* w (O x K, contiguous float32, a linear layer's weight) packed as the
 * bfloat16 GEMM's B = w^T, from the cache or packed now; NULL outside
 * nd.autocast, when products do not run on bfloat16, or when it cannot be
 * packed. Valid until this thread's next call here or outermost exit. */
const nd_bf16_packed_b *nd_cpu_bf16_weight(const nd_tensor *w) {
    if (depth <= 0 || !nd_cpu_gemm_bf16_active() || (w->dtype != ND_FLOAT32 && w->dtype != ND_BFLOAT16) ||
        w->ndim != 2)
        return NULL;
    const int64_t O = w->shape[0], K = w->shape[1];
    const size_t esize = nd_dtype_size(w->dtype);
    /* a weight that is its whole storage (a parameter) only: a view into a
     * larger one - nd.compile's arena, where slots are reused without the
     * storage's version changing - packs per call as outside the scope */
    if (w->offset != 0 || w->storage->nbytes != (size_t)O * (size_t)K * esize) return NULL;
    const uint64_t serial = nd_storage_id(w->storage), version = w->storage->version;
    for (int i = 0; i < count; i++) {
        entry *e = &entries[i];
        if (e->serial != serial || e->offset != w->offset || e->rows != O || e->cols != K || e->dtype != w->dtype)
            continue;
        if (e->version == version) {
            e->used = ++clock_;
            return e->packed;
        }
        drop(i); /* written since: packed again below */
        break;
    }
    const size_t need = (size_t)O * (size_t)K * 2;
    if (need > MAX_BYTES) return NULL;
    while (count > 0 && (count == MAX_ENTRIES || bytes + need > MAX_BYTES)) {
        int lru = 0;
        for (int i = 1; i < count; i++)
            if (entries[i].used < entries[lru].used) lru = i;
        drop(lru);
    }
    /* a bfloat16 weight (a model kept in half precision) goes in as it is */
    nd_bf16_packed_b *pb = w->dtype == ND_BFLOAT16 ? nd_cpu_bf16_pack_weight_bf16(K, O, (const uint16_t *)nd_ptr(w), K)
                                                   : nd_cpu_bf16_pack_b(K, O, (const float *)nd_ptr(w), 1, K);
    if (!pb) return NULL;
    entries[count++] = (entry){serial, version, ++clock_, w->offset, O, K, w->dtype, pb};
    bytes += nd_cpu_bf16_packed_bytes(pb);
    return pb;
}
