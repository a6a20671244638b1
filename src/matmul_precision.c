/* matmul_precision.c - the float32 matmul precision setting (needle.h):
 * core state that the CPU backend's GEMM reads at each product and the
 * autograd engine records per node, so that a backward pass runs each
 * product's gradient at the precision its forward ran at (nd.autocast). */
#include <stdatomic.h>
#include "needle.h"

static _Atomic int precision = ND_MATMUL_HIGHEST;

void nd_set_float32_matmul_precision(nd_matmul_precision p) { precision = (int)p; }

nd_matmul_precision nd_get_float32_matmul_precision(void) { return (nd_matmul_precision)precision; }
