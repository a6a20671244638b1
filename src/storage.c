/* storage.c - refcounted device memory behind tensors. */
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "tensor.h"

static atomic_llong live_bytes;
static _Atomic uint64_t last_serial;

atomic_int nd_captures_running;

uint64_t nd_storage_serial(void) { return atomic_load(&last_serial); }

static _Atomic uint64_t last_id;

uint64_t nd_storage_id(nd_storage *s) {
    uint64_t id = atomic_load_explicit(&s->id, memory_order_acquire);
    if (id) return id;
    const uint64_t mine = atomic_fetch_add(&last_id, 1) + 1;
    /* two threads asking at once: the first to store wins, both return it */
    if (atomic_compare_exchange_strong(&s->id, &id, mine)) return mine;
    return id;
}
/* Storages made while no capture runs on any thread all get 0 (no atomic
 * increment on the hot path): a capture only asks whether a storage is
 * newer than its own start, and nothing made before it is. */
uint64_t nd_storage_next_serial(void) {
    if (!atomic_load_explicit(&nd_captures_running, memory_order_relaxed)) return 0;
    return atomic_fetch_add(&last_serial, 1) + 1;
}

static atomic_llong allocated_bytes; /* cumulative: the profiler's "bytes allocated" */

static atomic_llong peak_bytes; /* the most live_bytes has been since the last reset */

int64_t nd_live_bytes(void) { return atomic_load(&live_bytes); }
int64_t nd_peak_live_bytes(void) { return atomic_load(&peak_bytes); }
void nd_reset_peak_live_bytes(void) { atomic_store(&peak_bytes, atomic_load(&live_bytes)); }

static void add_live(size_t nbytes) {
    long long now = atomic_fetch_add(&live_bytes, (long long)nbytes) + (long long)nbytes;
    long long peak = atomic_load(&peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now)) {}
}
int64_t nd_allocated_bytes(void) { return atomic_load_explicit(&allocated_bytes, memory_order_relaxed); }

nd_status nd_storage_new(size_t nbytes, nd_storage **out) {
    char want[ND_BYTES_BUF];
    /* Checked before malloc: where the kernel overcommits, malloc of more
     * than the machine has succeeds and filling it gets the process killed. */
    int64_t limit = nd_memory_limit();
    if ((uint64_t)nbytes > (uint64_t)limit) {
        char have[ND_BYTES_BUF];
        return nd_fail(ND_ERR_MEMORY, "%s is more than the %s of memory this process can have (%s)",
                       nd_bytes_str(nbytes, want), nd_bytes_str((uint64_t)limit, have),
                       nd_memory_limit_source());
    }
    nd_storage *s = nd_cache_alloc(sizeof *s); /* headers are pooled too */
    if (!s) return nd_fail(ND_ERR_MEMORY, "out of memory allocating a storage header");
    void *data = nd_cache_alloc(nbytes ? nbytes : 1);
    if (!data) {
        nd_cache_free(s, sizeof *s);
        return nd_fail(ND_ERR_MEMORY, "out of memory allocating %s", nd_bytes_str(nbytes, want));
    }
    atomic_init(&s->refcount, 1);
    s->device = ND_DEVICE_CPU;
    s->device_index = 0;
    s->nbytes = nbytes;
    s->data = data;
    s->version = 0;
    s->serial = nd_storage_next_serial();
    atomic_init(&s->id, 0);
    atomic_init(&s->graph_refs, 0);
    s->release = NULL;
    s->release_ctx = NULL;
    add_live(nbytes);
    atomic_fetch_add_explicit(&allocated_bytes, (long long)nbytes, memory_order_relaxed);
    *out = s;
    return ND_OK;
}

static _Thread_local bool cpu_only; /* nd_set_thread_cpu_only */

void nd_set_thread_cpu_only(bool on) { cpu_only = on; }

nd_status nd_storage_new_on(nd_device dev, size_t nbytes, nd_storage **out) {
    if (dev.type == ND_DEVICE_CPU) return nd_storage_new(nbytes, out);
    char db[32];
    if (cpu_only)
        return nd_fail(ND_ERR_DEVICE, "device '%s' cannot be used on this thread (a DataLoader "
                       "worker thread makes its tensors on the CPU; move the batches to the "
                       "device in the training loop)", nd_device_str(dev, db));
    const nd_backend *be = nd_backend_for(dev.type);
    if (!be || !be->alloc)
        return nd_fail(ND_ERR_DEVICE, "device '%s' is not available in this build", nd_device_str(dev, db));
    nd_storage *s = nd_cache_alloc(sizeof *s);
    if (!s) return nd_fail(ND_ERR_MEMORY, "out of memory allocating a storage header");
    void *handle = NULL;
    nd_status st = be->alloc(dev.index, nbytes, &handle);
    if (st != ND_OK) { nd_cache_free(s, sizeof *s); return st; }
    atomic_init(&s->refcount, 1);
    s->device = dev.type;
    s->device_index = dev.index;
    s->nbytes = nbytes;
    s->data = handle;
    s->version = 0;
    s->serial = nd_storage_next_serial();
    atomic_init(&s->id, 0);
    atomic_init(&s->graph_refs, 0);
    s->release = NULL;
    s->release_ctx = NULL;
    add_live(nbytes);
    atomic_fetch_add_explicit(&allocated_bytes, (long long)nbytes, memory_order_relaxed);
    *out = s;
    return ND_OK;
}

void nd_storage_retain(nd_storage *s) { atomic_fetch_add(&s->refcount, 1); }

void (*nd_storage_idle_hook)(nd_storage *s);

/* The memory itself goes (to the cache or the device); the header stays. */
static void free_data(nd_storage *s) {
    if (!s->data) return;
    if (s->device != ND_DEVICE_CPU) {
        const nd_backend *be = nd_backend_for(s->device);
        if (be && be->free) be->free(s->device_index, s->data, s->nbytes);
    } else {
        nd_cache_free(s->data, s->nbytes ? s->nbytes : 1);
    }
    atomic_fetch_sub(&live_bytes, (long long)s->nbytes);
    s->data = NULL;
}

void nd_storage_drop_data(nd_storage *s) {
    if (s && !s->release) free_data(s);
}

nd_status nd_storage_refill_data(nd_storage *s) {
    if (s->data || s->release) return ND_OK;
    nd_storage *t = NULL;
    nd_device dev = {s->device, s->device_index};
    ND_TRY(nd_storage_new_on(dev, s->nbytes, &t));
    s->data = t->data; /* (counted live by t's allocation, now s's) */
    nd_cache_free(t, sizeof *t);
    return ND_OK;
}

void nd_storage_release(nd_storage *s) {
    if (!s) return;
    int left = atomic_fetch_sub(&s->refcount, 1) - 1;
    if (left > 0) {
        /* only a capturing graph holds it now: eager would have freed it */
        if (left == atomic_load_explicit(&s->graph_refs, memory_order_relaxed) && nd_storage_idle_hook)
            nd_storage_idle_hook(s);
        return;
    }
    if (s->release) s->release(s->release_ctx);
    else free_data(s);
    nd_cache_free(s, sizeof *s);
}
