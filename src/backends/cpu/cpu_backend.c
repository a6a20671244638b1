/* cpu_backend.c - the CPU backend's function table. */
#include "cpu_kernels.h"

const nd_backend nd_cpu_backend = {
    .name = "cpu",
    .copy = nd_cpu_copy,
    .fill = nd_cpu_fill,
    .unary = nd_cpu_unary,
    .binary = nd_cpu_binary,
    .binary_scalar = nd_cpu_binary_scalar,
    .where = nd_cpu_where,
    .clamp = nd_cpu_clamp,
    .reduce = nd_cpu_reduce,
    .max_dim = nd_cpu_max_dim,
    .matmul = nd_cpu_matmul,
    .gather = nd_cpu_gather,
    .scatter = nd_cpu_scatter,
    .index_select = nd_cpu_index_select,
    .index_add = nd_cpu_index_add,
    .masked_fill = nd_cpu_masked_fill,
    .cumsum = nd_cpu_cumsum,
    .sort = nd_cpu_sort,
    .softmax = nd_cpu_softmax,
    .random = nd_cpu_random,
};
