/* ocl_pool.c - device buffers: a per-device pool of freed buffers, and
 * transfers between host and device.
 *
 * Sizes are rounded up (to 256 bytes, then to an eighth of their power of
 * two) so that a training loop's buffers are reused exactly; the pool keeps
 * at most a quarter of the device memory (and 2 GiB). OpenCL drivers often
 * allocate lazily, so an allocation that would take live buffers past the
 * device's memory is refused here with a clear error instead of failing at
 * some later kernel launch. The queue is in order, so a buffer freed while
 * kernels that use it are still queued can be handed out again at once:
 * every later use is enqueued after them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "ocl_runtime.h"

struct ocl_pool_block {
    size_t size;
    cl_mem mem;
    ocl_pool_block *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static size_t round_size(size_t n) {
    if (n < 256) return 256;
    size_t p = 256;
    while (p < n / 8 && p < ((size_t)1 << 60)) p <<= 1;
    return (n + p - 1) / p * p; /* granularity: >= 1/8 of n's power of two */
}

static size_t pool_cap(const ocl_device *d) {
    size_t cap = (size_t)d->info.global_mem_bytes / 4;
    return cap > ((size_t)2 << 30) ? ((size_t)2 << 30) : cap;
}

void ocl_pool_drain(ocl_device *d) {
    pthread_mutex_lock(&lock);
    for (ocl_pool_block *b = d->pool, *n; b; b = n) {
        n = b->next;
        clReleaseMemObject(b->mem);
        free(b);
    }
    d->pool = NULL;
    d->pool_bytes = 0;
    pthread_mutex_unlock(&lock);
}

nd_status ocl_alloc(int index, size_t nbytes, void **handle) {
    ocl_prepare_impure(); /* not repeatable by a prepared replay (ocl_prepared.c) */
    ocl_device *d = ocl_device_at(index);
    if (!d) return nd_fail(ND_ERR_DEVICE, "opencl: no device %d", index);
    size_t size = round_size(nbytes);
    if ((int64_t)nbytes > d->info.max_alloc_bytes || size + d->live_bytes > (size_t)d->info.global_mem_bytes) {
        ocl_pool_drain(d);
        return nd_fail(ND_ERR_MEMORY, "opencl: out of memory on opencl:%d (%s): a buffer of %zu "
                       "bytes with %zu bytes already in use (device memory %lld bytes, largest "
                       "buffer %lld bytes)", index, d->info.name, nbytes, d->live_bytes,
                       (long long)d->info.global_mem_bytes, (long long)d->info.max_alloc_bytes);
    }
    pthread_mutex_lock(&lock);
    ocl_pool_block **pp = &d->pool;
    while (*pp && (*pp)->size != size) pp = &(*pp)->next;
    if (*pp) {
        ocl_pool_block *b = *pp;
        *pp = b->next;
        d->pool_bytes -= size;
        d->live_bytes += size;
        pthread_mutex_unlock(&lock);
        *handle = b->mem;
        free(b);
        return ND_OK;
    }
    pthread_mutex_unlock(&lock);
    cl_int err;
    cl_mem m = clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    if (err != CL_SUCCESS) { /* give the pool back and try once more */
        ocl_pool_drain(d);
        m = clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    }
    if (err != CL_SUCCESS) return ocl_fail(err, "opencl", "buffer allocation", d);
    pthread_mutex_lock(&lock);
    d->live_bytes += size;
    pthread_mutex_unlock(&lock);
    *handle = m;
    return ND_OK;
}

void ocl_free(int index, void *handle, size_t nbytes) {
    ocl_device *d = ocl_device_at(index);
    if (!d || !handle) return;
    size_t size = round_size(nbytes);
    ocl_pool_block *b = NULL;
    pthread_mutex_lock(&lock);
    d->live_bytes -= size;
    if (d->pool_bytes + size <= pool_cap(d)) b = malloc(sizeof *b);
    if (b) {
        b->size = size;
        b->mem = (cl_mem)handle;
        b->next = d->pool;
        d->pool = b;
        d->pool_bytes += size;
    }
    pthread_mutex_unlock(&lock);
    if (!b) clReleaseMemObject((cl_mem)handle);
}

nd_status ocl_read(const nd_storage *s, size_t off, void *dst, size_t n) {
    ocl_prepare_impure(); /* not repeatable by a prepared replay (ocl_prepared.c) */
    ocl_device *d = ocl_device_at(s->device_index);
    if (!n) return ND_OK;
    cl_int err = clEnqueueReadBuffer(d->queue, (cl_mem)s->data, CL_TRUE, off, n, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "to", "read from the device", d);
    return ND_OK;
}

nd_status ocl_write(nd_storage *s, size_t off, const void *src, size_t n) {
    ocl_prepare_impure(); /* not repeatable by a prepared replay (ocl_prepared.c) */
    ocl_device *d = ocl_device_at(s->device_index);
    if (!n) return ND_OK;
    /* Blocking: the host buffer may be freed as soon as this returns. */
    cl_int err = clEnqueueWriteBuffer(d->queue, (cl_mem)s->data, CL_TRUE, off, n, src, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "to", "write to the device", d);
    return ND_OK;
}

nd_status ocl_upload(ocl_device *d, const void *src, size_t n, const char *op, cl_mem *out) {
    ocl_prepare_impure(); /* not repeatable by a prepared replay (ocl_prepared.c) */
    static const unsigned char none[8];
    if (!n) { src = none; n = 1; }
    cl_int err;
    *out = clCreateBuffer(d->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n, (void *)src, &err);
    if (err != CL_SUCCESS) return ocl_fail(err, op, "buffer upload", d);
    return ND_OK;
}
