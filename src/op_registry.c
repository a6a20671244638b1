/* op_registry.c - the op registry (needle_ops.h) as data: names for error
 * messages, autograd nodes and the profiler, and descriptions for bindings
 * and tools (nd.ops() in Lua). */
#include <string.h>
#include "needle.h"

static const char *const unary_names[] = {
#define ND_X(name, ...) #name,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};
static const char *const binary_names[] = {
#define ND_X(name, ...) #name,
    ND_BINARY_OPS(ND_X)
#undef ND_X
};
static const char *const reduce_names[] = {
#define ND_X(name, ...) #name,
    ND_REDUCE_OPS(ND_X)
#undef ND_X
};
_Static_assert(sizeof unary_names / sizeof *unary_names == ND_NUM_UNARY, "unary names");
_Static_assert(sizeof binary_names / sizeof *binary_names == ND_NUM_BINARY, "binary names");
_Static_assert(sizeof reduce_names / sizeof *reduce_names == ND_NUM_REDUCE, "reduce names");

const char *nd_unary_name(nd_unary_op op) {
    return (unsigned)op < ND_NUM_UNARY ? unary_names[op] : "unary?";
}
const char *nd_binary_name(nd_binary_op op) {
    return (unsigned)op < ND_NUM_BINARY ? binary_names[op] : "binary?";
}
const char *nd_reduce_name(nd_reduce_op op) {
    return (unsigned)op < ND_NUM_REDUCE ? reduce_names[op] : "reduce?";
}

/* Column tokens of needle_ops.h as the strings nd_op_info reports. */
#define KIND_TERNARY "ternary"
#define KIND_UNARY "unary"
#define KIND_REDUCE "reduce"
#define KIND_VIEW "view"
#define KIND_COPY "copy"
#define KIND_CREATE "create"
#define KIND_INDEX "index"
#define KIND_NORM "norm"
#define KIND_LOSS "loss"
#define KIND_GEMM "gemm"
#define KIND_CONV "conv"
#define KIND_POOL "pool"
#define KIND_JOIN "join"
#define KIND_SCAN "scan"
#define KIND_SORT "sort"
#define KIND_RANDOM "random"
#define KIND_OPTIM "optim"
#define KIND_BACKWARD "backward"
#define KIND_GRAPH "graph"
#define KIND_CELL "cell"
#define GRAD_NODE true
#define GRAD_VIA true
#define GRAD_NONE false
#define NODE_NODE true
#define NODE_VIA false
#define NODE_NONE false
#define RULE_SAME "same"
#define RULE_FLOAT "float"
#define RULE_PROMOTE "promote"
#define RULE_INDEX "index"
#define RULE_OUTPUT "output"
#define BINARY_RULE_ARITH_KEEP "promote"
#define BINARY_RULE_ARITH_FLOAT "promote_float" /* integers and bools compute in float32 */
#define BINARY_RULE_CMP_KEEP "compare"
#define BINARY_DIFF_ARITH true
#define BINARY_DIFF_CMP false
/* A unary op differentiates unless its formula is ZEROS (sign, floor, ...:
 * zero almost everywhere; they still record, as PyTorch's do). */
#define UNARY_RULE_KEEP "same"
#define UNARY_RULE_FLOAT "float"

static const nd_op_info ops[] = {
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw) \
    {#name, "unary", 1, UNARY_RULE_##ints, true, true, #fexpr, #bw},
    ND_UNARY_OPS(ND_X)
#undef ND_X
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    {#name, "binary", 2, BINARY_RULE_##kind##_##ints, BINARY_DIFF_##kind, BINARY_DIFF_##kind, #fexpr, NULL},
    ND_BINARY_OPS(ND_X)
#undef ND_X
#define ND_X(name, grad) {#name, "reduce", 1, "same", GRAD_##grad, NODE_##grad, NULL, NULL},
    ND_REDUCE_OPS(ND_X)
#undef ND_X
#define ND_X(name, kind, arity, rule, grad) \
    {#name, KIND_##kind, arity, RULE_##rule, GRAD_##grad, NODE_##grad, NULL, NULL},
    ND_OTHER_OPS(ND_X)
#undef ND_X
};

_Static_assert(sizeof ops / sizeof *ops == ND_NUM_OPS, "one description per op");
/* nd_unary_op_id and friends map by offset: the lists keep their order in nd_op. */
#define ND_X(name, ...) _Static_assert((int)ND_OP_##name == (int)ND_UNARY_##name, #name);
ND_UNARY_OPS(ND_X)
#undef ND_X
#define ND_X(name, ...) \
    _Static_assert((int)ND_OP_##name == ND_NUM_UNARY + (int)ND_BINARY_##name, #name);
ND_BINARY_OPS(ND_X)
#undef ND_X
#define ND_X(name, ...) \
    _Static_assert((int)ND_OP_##name == ND_NUM_UNARY + ND_NUM_BINARY + (int)ND_REDUCE_##name, #name);
ND_REDUCE_OPS(ND_X)
#undef ND_X

int nd_op_count(void) { return (int)(sizeof ops / sizeof *ops); }

const char *nd_op_name(nd_op op) { return (unsigned)op < ND_NUM_OPS ? ops[op].name : "op?"; }

const nd_op_info *nd_op_at(int i) { return i >= 0 && i < nd_op_count() ? &ops[i] : NULL; }

const nd_op_info *nd_op_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < nd_op_count(); i++)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}
