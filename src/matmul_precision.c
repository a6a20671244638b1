/* matmul_precision.c - the float32 matmul precision setting (needle.h):
 * core state that the CPU backend's GEMM reads at each product and the
 * autograd engine records per node, so that a backward pass runs each
 * product's gradient at the precision its forward ran at (nd.autocast). */
#include <stdatomic.h>
#include "needle.h"
#include "tensor.h"

static _Atomic int precision = ND_MATMUL_HIGHEST;

void nd_set_float32_matmul_precision(nd_matmul_precision p) { precision = (int)p; }

nd_matmul_precision nd_get_float32_matmul_precision(void) { return (nd_matmul_precision)precision; }

/* ND_FLOAT32: OpenCL products as they are; ND_FLOAT16 / ND_BFLOAT16: on
 * operands rounded to it (nd.autocast{device_type = "opencl"}) */
static _Atomic int opencl_operands = ND_FLOAT32;

nd_status nd_set_opencl_matmul_dtype(nd_dtype dt) {
    if (dt != ND_FLOAT32 && dt != ND_FLOAT16 && dt != ND_BFLOAT16)
        return nd_fail(ND_ERR_DTYPE, "set_opencl_matmul_dtype: expected float32, float16 or bfloat16, got %s",
                       nd_dtype_name(dt));
    opencl_operands = (int)dt;
    return ND_OK;
}

nd_dtype nd_get_opencl_matmul_dtype(void) { return (nd_dtype)opencl_operands; }
