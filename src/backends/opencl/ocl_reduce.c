/* ocl_reduce.c - reductions (kernels/reduce.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_reduce(nd_reduce_op op, nd_tensor *out, const nd_tensor *x, const bool *reduced, int correction) {
    (void)op;
    (void)out;
    (void)x;
    (void)reduced;
    (void)correction;
    return nd_fail(ND_ERR_UNSUPPORTED, "reduce: no kernel on device 'opencl' yet");
}

nd_status ocl_max_dim(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim, int is_min) {
    (void)values;
    (void)indices;
    (void)x;
    (void)dim;
    (void)is_min;
    return nd_fail(ND_ERR_UNSUPPORTED, "max_dim: no kernel on device 'opencl' yet");
}

