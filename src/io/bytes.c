/* bytes.c - tensors from raw little-endian element bytes. */
#include <string.h>
#include "io/io.h"
#include "tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "needle's raw byte formats (safetensors, frombytes) assume a little-endian host"
#endif

nd_status nd_from_bytes(const char *op, const void *data, size_t n, const int64_t *shape,
                        int ndim, nd_dtype dt, nd_tensor **out) {
    *out = NULL;
    if ((unsigned)dt >= ND_NUM_DTYPES) return nd_fail(ND_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
    int64_t numel;
    ND_TRY(nd_check_shape(op, shape, ndim, &numel));
    size_t es = nd_dtype_size(dt);
    char sb[ND_SHAPE_BUF];
    if ((uint64_t)numel > UINT64_MAX / es || (uint64_t)numel * es != (uint64_t)n)
        return nd_fail(ND_ERR_SHAPE, "%s: expected %llu bytes (shape %s %s, %zu bytes per element), "
                       "got %zu", op, (unsigned long long)((uint64_t)numel * es),
                       nd_shape_str(shape, ndim, sb), nd_dtype_name(dt), es, n);
    if (dt == ND_BOOL) {
        const unsigned char *p = data;
        for (size_t i = 0; i < n; i++)
            if (p[i] > 1)
                return nd_fail(ND_ERR_ARG, "%s: bool element %zu has byte value %u (expected 0 or 1)",
                               op, i + 1, p[i]);
    }
    nd_tensor *t;
    ND_TRY(nd_empty(shape, ndim, dt, &t));
    if (n) memcpy(nd_ptr(t), data, n);
    *out = t;
    return ND_OK;
}
