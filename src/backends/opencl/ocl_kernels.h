/* ocl_kernels.h - the OpenCL backend's entry points (one file per family),
 * gathered into the function table by ocl_backend.c. Signatures are those
 * of nd_backend (src/backend.h). */
#ifndef ND_OCL_KERNELS_H
#define ND_OCL_KERNELS_H

#include "ocl_runtime.h"

/* Sets args first.. of a strided kernel to (n, geom, ts[0] .. ts[nops-1])
 * with the geometry of ts (ts[0] the output) and launches it over numel(ts[0]). */
nd_status ocl_run_strided(ocl_device *d, cl_kernel k, const char *op, int first, int nops,
                          const nd_tensor *const *ts);

/* ocl_elementwise.c */
nd_status ocl_copy(nd_tensor *dst, const nd_tensor *src);
nd_status ocl_fill(nd_tensor *dst, const void *value);
nd_status ocl_unary(nd_unary_op op, nd_tensor *out, const nd_tensor *x);
nd_status ocl_binary(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
nd_status ocl_binary_scalar(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                            int scalar_first);
nd_status ocl_where(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b);
nd_status ocl_clamp(nd_tensor *out, const nd_tensor *x, double lo, double hi);

#endif
