/* ocl_backend.c - the OpenCL backend's function table. Entries left NULL
 * make the op fail with "no kernel on device 'opencl'". */
#include "ocl_kernels.h"

const nd_backend nd_opencl_backend = {
    .name = "opencl",
    .alloc = ocl_alloc,
    .free = ocl_free,
    .read = ocl_read,
    .write = ocl_write,
    .synchronize = ocl_synchronize,
    .copy = ocl_copy,
    .fill = ocl_fill,
    .unary = ocl_unary,
    .binary = ocl_binary,
    .binary_scalar = ocl_binary_scalar,
    .where = ocl_where,
    .clamp = ocl_clamp,
};
