/* ocl_conv.c - im2col/col2im and 2-D pooling (kernels/conv.cl, kernels/pooling.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_im2col(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g) {
    (void)cols;
    (void)x;
    (void)g;
    return nd_fail(ND_ERR_UNSUPPORTED, "im2col: no kernel on device 'opencl' yet");
}

nd_status ocl_col2im(nd_tensor *x, const nd_tensor *cols, const nd_conv_geom *g) {
    (void)x;
    (void)cols;
    (void)g;
    return nd_fail(ND_ERR_UNSUPPORTED, "col2im: no kernel on device 'opencl' yet");
}

nd_status ocl_max_pool2d(nd_tensor *out, nd_tensor *indices, const nd_tensor *x, const nd_pool_geom *p) {
    (void)out;
    (void)indices;
    (void)x;
    (void)p;
    return nd_fail(ND_ERR_UNSUPPORTED, "max_pool2d: no kernel on device 'opencl' yet");
}

nd_status ocl_max_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices) {
    (void)gx;
    (void)g;
    (void)indices;
    return nd_fail(ND_ERR_UNSUPPORTED, "max_pool2d_backward: no kernel on device 'opencl' yet");
}

nd_status ocl_avg_pool2d(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p) {
    (void)out;
    (void)x;
    (void)p;
    return nd_fail(ND_ERR_UNSUPPORTED, "avg_pool2d: no kernel on device 'opencl' yet");
}

nd_status ocl_avg_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p) {
    (void)gx;
    (void)g;
    (void)p;
    return nd_fail(ND_ERR_UNSUPPORTED, "avg_pool2d_backward: no kernel on device 'opencl' yet");
}

