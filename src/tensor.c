/* tensor.c - tensor headers: creation, lifetime, metadata, host buffers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "autograd_node.h"
#include "backend.h"
#include "tensor.h"

void nd_retain(nd_tensor *t) { if (t) atomic_fetch_add(&t->refcount, 1); }

void (*nd_hook_key_freed)(const void *key);

void nd_release(nd_tensor *t) {
    if (!t || atomic_fetch_sub(&t->refcount, 1) != 1) return;
    if (t->tensor_hooks && nd_hook_key_freed) nd_hook_key_freed(t);
    nd_node_release(t->grad_fn);
    nd_release(t->grad);
    nd_storage_release(t->storage);
    nd_cache_free(t, sizeof *t);
}

int nd_ndim(const nd_tensor *t) { return t->ndim; }
const int64_t *nd_shape(const nd_tensor *t) { return t->shape; }
const int64_t *nd_strides(const nd_tensor *t) { return t->strides; }
nd_dtype nd_get_dtype(const nd_tensor *t) { return t->dtype; }
void *nd_data(const nd_tensor *t) { return nd_on_cpu(t) ? nd_ptr(t) : NULL; }

int64_t nd_shape_numel(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int64_t nd_numel(const nd_tensor *t) { return nd_shape_numel(t->shape, t->ndim); }

void nd_contiguous_strides(const int64_t *shape, int ndim, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int nd_is_contiguous(const nd_tensor *t) {
    if (nd_numel(t) == 0) return 1; /* no element is out of place */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

nd_status nd_norm_dim(const char *op, int dim, int ndim, int *out) {
    int n = ndim > 0 ? ndim : 1; /* a 0-dim tensor accepts dim 0 / -1 */
    if (dim < -n || dim >= n)
        return nd_fail(ND_ERR_INDEX, "%s: dim " ND_IXF " out of range for a tensor with %d dims "
                       "(expected " ND_IXF ".." ND_IXF " or %d..-1)", op, ND_IX(dim), ndim, ND_IX(0),
                       ND_IX(n - 1), -n);
    *out = dim < 0 ? dim + n : dim;
    return ND_OK;
}

/* The one size rule (tensor.h): every size >= 0, and the product of the
 * sizes with each 0 counted as 1 (the "span") at most ND_MAX_NUMEL. The span
 * bounds every contiguous stride and every product of some of the sizes,
 * so an empty tensor whose other dims are huge ({0, 2^62, 2^62}) is refused
 * like a full one: its strides would overflow int64. */
nd_status nd_check_shape(const char *op, const int64_t *shape, int ndim, int64_t *numel) {
    if (ndim < 0 || ndim > ND_MAX_DIMS)
        return nd_fail(ND_ERR_ARG, "%s: %d dims requested, at most %d supported", op, ndim,
                       ND_MAX_DIMS);
    int64_t n = 1, span = 1;
    for (int i = 0; i < ndim; i++) {
        char buf[ND_SHAPE_BUF];
        if (shape[i] < 0)
            return nd_fail(ND_ERR_ARG, "%s: negative size %lld in shape %s", op,
                           (long long)shape[i], nd_shape_str(shape, ndim, buf));
        int64_t m = shape[i] > 0 ? shape[i] : 1;
        if (span > ND_MAX_NUMEL / m)
            return nd_fail(ND_ERR_MEMORY, "%s: shape %s is too large (the product of its sizes, "
                           "counting 0 as 1, is more than 2^48)", op, nd_shape_str(shape, ndim, buf));
        span *= m;
        n *= shape[i];
    }
    if (numel) *numel = n;
    return ND_OK;
}

nd_status nd_check_strides(const char *op, const int64_t *shape, const int64_t *strides,
                           int ndim) {
    for (int i = 0; i < ndim; i++) {
        int64_t reach = shape[i] > 1 ? shape[i] - 1 : 1;
        if (strides[i] < 0 || strides[i] > ND_MAX_NUMEL / reach) {
            char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
            return nd_fail(ND_ERR_ARG, "%s: strides %s are invalid for shape %s (each stride "
                           "must be >= 0 and reach at most 2^48 elements)", op,
                           nd_shape_str(strides, ndim, b1), nd_shape_str(shape, ndim, b2));
        }
    }
    return ND_OK;
}

nd_status nd_tensor_wrap(nd_storage *storage, nd_dtype dt, const int64_t *shape,
                         const int64_t *strides, int ndim, int64_t offset, nd_tensor **out) {
    nd_tensor *t = nd_cache_alloc(sizeof *t); /* pooled: no malloc per op */
    if (!t) return nd_fail(ND_ERR_MEMORY, "out of memory allocating a tensor header");
    atomic_init(&t->refcount, 1);
    t->ndim = ndim;
    t->dtype = dt;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    t->offset = offset;
    t->storage = storage;
    nd_storage_retain(storage);
    t->requires_grad = false;
    t->grad_hook = false;
    t->tensor_hooks = false;
    t->grad_mark = t->grad_pending = 0;
    t->grad = NULL;
    t->grad_fn = NULL;
    *out = t;
    return ND_OK;
}

nd_status nd_tensor_view_of(const nd_tensor *t, const int64_t *shape, const int64_t *strides,
                            int ndim, int64_t offset, nd_tensor **out) {
    return nd_tensor_wrap(t->storage, t->dtype, shape, strides, ndim, offset, out);
}

nd_status nd_empty_on(nd_device dev, const int64_t *shape, int ndim, nd_dtype dt,
                      nd_tensor **out) {
    int64_t numel;
    if ((unsigned)dt >= ND_NUM_DTYPES) return nd_fail(ND_ERR_DTYPE, "empty: invalid dtype %d", dt);
    ND_TRY(nd_check_shape("empty", shape, ndim, &numel));
    size_t nbytes = (size_t)numel * nd_dtype_size(dt);
    nd_storage *s;
    if (dev.type == ND_DEVICE_CPU) {
        if (nd_storage_new(nbytes, &s) != ND_OK) {
            char buf[ND_SHAPE_BUF], why[512];
            snprintf(why, sizeof why, "%s", nd_last_error());
            return nd_fail(ND_ERR_MEMORY, "empty: cannot allocate a %s tensor of shape %s: %s",
                           nd_dtype_name(dt), nd_shape_str(shape, ndim, buf), why);
        }
    } else {
        ND_TRY(nd_storage_new_on(dev, nbytes, &s));
    }
    int64_t strides[ND_MAX_DIMS];
    nd_contiguous_strides(shape, ndim, strides);
    nd_status st = nd_tensor_wrap(s, dt, shape, strides, ndim, 0, out);
    nd_storage_release(s);
    return st;
}

nd_status nd_empty(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    return nd_empty_on(nd_cpu_device(), shape, ndim, dt, out);
}

nd_status nd_from_buffer(const void *data, const int64_t *shape, int ndim, nd_dtype dt,
                         nd_tensor **out) {
    ND_TRY(nd_empty(shape, ndim, dt, out));
    if ((*out)->storage->nbytes) memcpy(nd_ptr(*out), data, (*out)->storage->nbytes);
    return ND_OK;
}

static void nd_noop_release(void *ctx) { (void)ctx; }

nd_status nd_from_borrowed(void *data, const int64_t *shape, int ndim, nd_dtype dt,
                           void (*release)(void *ctx), void *ctx, nd_tensor **out) {
    int64_t numel;
    if ((unsigned)dt >= ND_NUM_DTYPES)
        return nd_fail(ND_ERR_DTYPE, "from_borrowed: invalid dtype %d", dt);
    ND_TRY(nd_check_shape("from_borrowed", shape, ndim, &numel));
    if (!data && numel) return nd_fail(ND_ERR_ARG, "from_borrowed: data is NULL");
    nd_storage *s = nd_cache_alloc(sizeof *s); /* headers are pooled too */
    if (!s) return nd_fail(ND_ERR_MEMORY, "out of memory allocating a storage header");
    atomic_init(&s->refcount, 1);
    s->device = ND_DEVICE_CPU;
    s->device_index = 0;
    s->nbytes = (size_t)numel * nd_dtype_size(dt);
    s->data = data;
    s->version = 0;
    s->serial = nd_storage_next_serial();
    atomic_init(&s->id, 0);
    atomic_init(&s->graph_refs, 0);
    /* A no-op release marks the memory as not ours even without a callback. */
    s->release = release;
    s->release_ctx = ctx;
    if (!release) s->release = nd_noop_release;
    int64_t strides[ND_MAX_DIMS];
    nd_contiguous_strides(shape, ndim, strides);
    nd_status st = nd_tensor_wrap(s, dt, shape, strides, ndim, 0, out);
    nd_storage_release(s);
    return st;
}

nd_status nd_get_item(const nd_tensor *t, const int64_t *index, double *out) {
    int64_t off = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (index[i] < 0 || index[i] >= t->shape[i])
            return nd_fail(ND_ERR_INDEX, "item: index " ND_IXF " out of range for dim " ND_IXF " of size %lld",
                           ND_IX(index[i]), ND_IX(i), (long long)t->shape[i]);
        off += index[i] * t->strides[i];
    }
    size_t es = nd_dtype_size(t->dtype);
    if (!nd_on_cpu(t)) { /* one element over from the device */
        _Alignas(8) unsigned char v[8];
        ND_TRY(nd_backend_of(t)->read(t->storage, (size_t)off * es, v, es));
        *out = nd_load_f64(v, t->dtype);
        return ND_OK;
    }
    *out = nd_load_f64((char *)t->storage->data + off * (int64_t)es, t->dtype);
    return ND_OK;
}

static _Atomic uint64_t meta_generation;
uint64_t nd_meta_generation(void) { return atomic_load(&meta_generation); }
void nd_bump_meta_generation(void) { atomic_fetch_add(&meta_generation, 1); }

nd_status nd_set_data_(nd_tensor *t, const nd_tensor *src) {
    if (t == src) return ND_OK;
    if (t->grad_fn)
        return nd_fail(ND_ERR_ARG, "set_data_: the tensor is the result of an op (it has a "
                       "gradient history); only leaves can take new data");
    nd_bump_meta_generation();
    nd_storage_retain(src->storage);
    nd_storage_release(t->storage);
    t->storage = src->storage;
    t->dtype = src->dtype;
    t->ndim = src->ndim;
    memcpy(t->shape, src->shape, sizeof t->shape);
    memcpy(t->strides, src->strides, sizeof t->strides);
    t->offset = src->offset;
    if (t->grad && !nd_same_device(t->grad, t)) {
        nd_release(t->grad);
        t->grad = NULL;
    }
    return ND_OK;
}
