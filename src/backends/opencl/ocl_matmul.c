/* ocl_matmul.c - matmul: the tuned GEMM (kernels/gemm.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_matmul(nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    (void)out;
    (void)a;
    (void)b;
    return nd_fail(ND_ERR_UNSUPPORTED, "matmul: no kernel on device 'opencl' yet");
}

