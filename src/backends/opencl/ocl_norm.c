/* ocl_norm.c - fused softmax, layer_norm, cross_entropy, batch_norm (kernels/norm.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool log) {
    (void)out;
    (void)x;
    (void)dim;
    (void)log;
    return nd_fail(ND_ERR_UNSUPPORTED, "softmax: no kernel on device 'opencl' yet");
}

nd_status ocl_layer_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b, double eps) {
    (void)y;
    (void)mean;
    (void)rstd;
    (void)x;
    (void)w;
    (void)b;
    (void)eps;
    return nd_fail(ND_ERR_UNSUPPORTED, "layer_norm: no kernel on device 'opencl' yet");
}

nd_status ocl_cross_entropy(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels, int64_t ignore, double smoothing) {
    (void)loss;
    (void)logits;
    (void)labels;
    (void)ignore;
    (void)smoothing;
    return nd_fail(ND_ERR_UNSUPPORTED, "cross_entropy: no kernel on device 'opencl' yet");
}

nd_status ocl_batch_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b, double eps, bool training) {
    (void)y;
    (void)mean;
    (void)rstd;
    (void)x;
    (void)w;
    (void)b;
    (void)eps;
    (void)training;
    return nd_fail(ND_ERR_UNSUPPORTED, "batch_norm: no kernel on device 'opencl' yet");
}

nd_status ocl_layer_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db, const nd_tensor *g, const nd_tensor *x, const nd_tensor *w, const nd_tensor *mean, const nd_tensor *rstd) {
    (void)dx;
    (void)dw;
    (void)db;
    (void)g;
    (void)x;
    (void)w;
    (void)mean;
    (void)rstd;
    return nd_fail(ND_ERR_UNSUPPORTED, "layer_norm_backward: no kernel on device 'opencl' yet");
}

nd_status ocl_cross_entropy_backward(nd_tensor *dlogits, const nd_tensor *logits, const nd_tensor *labels, const nd_tensor *wrow, int64_t ignore, double smoothing) {
    (void)dlogits;
    (void)logits;
    (void)labels;
    (void)wrow;
    (void)ignore;
    (void)smoothing;
    return nd_fail(ND_ERR_UNSUPPORTED, "cross_entropy_backward: no kernel on device 'opencl' yet");
}

