/* ocl_scan_sort.c - cumsum and sort (kernels/scan_sort.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_cumsum(nd_tensor *out, const nd_tensor *x, int dim) {
    (void)out;
    (void)x;
    (void)dim;
    return nd_fail(ND_ERR_UNSUPPORTED, "cumsum: no kernel on device 'opencl' yet");
}

nd_status ocl_sort(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim, int descending) {
    (void)values;
    (void)indices;
    (void)x;
    (void)dim;
    (void)descending;
    return nd_fail(ND_ERR_UNSUPPORTED, "sort: no kernel on device 'opencl' yet");
}

