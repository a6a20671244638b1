/* ocl_index.c - index ops (kernels/index.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_gather(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    (void)out;
    (void)x;
    (void)dim;
    (void)index;
    return nd_fail(ND_ERR_UNSUPPORTED, "gather: no kernel on device 'opencl' yet");
}

nd_status ocl_scatter(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src, int accumulate) {
    (void)out;
    (void)dim;
    (void)index;
    (void)src;
    (void)accumulate;
    return nd_fail(ND_ERR_UNSUPPORTED, "scatter: no kernel on device 'opencl' yet");
}

nd_status ocl_index_select(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    (void)out;
    (void)x;
    (void)dim;
    (void)index;
    return nd_fail(ND_ERR_UNSUPPORTED, "index_select: no kernel on device 'opencl' yet");
}

nd_status ocl_index_add(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src, double alpha) {
    (void)out;
    (void)dim;
    (void)index;
    (void)src;
    (void)alpha;
    return nd_fail(ND_ERR_UNSUPPORTED, "index_add: no kernel on device 'opencl' yet");
}

nd_status ocl_masked_fill(nd_tensor *out, const nd_tensor *mask, double value) {
    (void)out;
    (void)mask;
    (void)value;
    return nd_fail(ND_ERR_UNSUPPORTED, "masked_fill: no kernel on device 'opencl' yet");
}

