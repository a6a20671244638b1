/* ocl_registry_source.c - the elementwise ops of needle_ops.h as OpenCL C.
 *
 * The op enums (reductions included: kernels/reduce.cl numbers its ops with
 * them) and one `case` per elementwise op are generated from the registry's
 * expressions (stringified, so the OpenCL compiler sees the same text the
 * CPU kernels are instantiated from) and put in front of every program,
 * after kernels/common.cl. kernels/elementwise.cl expands the cases in its
 * switches: an op cannot lack its OpenCL case, and its numbering cannot
 * drift from needle.h's. */
#include "ocl_runtime.h"

#define IF_KEEP(...) __VA_ARGS__
#define IF_FLOAT(...)
#define IF_INT64(...)
#define IF_REFUSE(...)
#define IF_ARITH_ARITH(...) __VA_ARGS__
#define IF_ARITH_CMP(...)
#define IF_CMP_ARITH(...)
#define IF_CMP_CMP(...) __VA_ARGS__

/* Each case stringifies the registry's expression right in ND_X (#fexpr),
 * never through a helper macro: an argument passed on would be
 * macro-expanded first, and isnan() is a macro of <math.h>. */
const char ocl_registry_source[] =
    "enum nd_unary_op {"
#define ND_X(name, ...) " ND_UNARY_" #name ","
    ND_UNARY_OPS(ND_X)
#undef ND_X
    " ND_NUM_UNARY };\n"
    "enum nd_binary_op {"
#define ND_X(name, ...) " ND_BINARY_" #name ","
    ND_BINARY_OPS(ND_X)
#undef ND_X
    " ND_NUM_BINARY };\n"
    "enum nd_reduce_op {"
#define ND_X(name, ...) " ND_REDUCE_" #name ","
    ND_REDUCE_OPS(ND_X)
#undef ND_X
    " ND_NUM_REDUCE };\n"
    /* unary: T x -> T */
    "#define ND_UNARY_FLOAT_CASES"
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw) \
    " case ND_UNARY_" #name ": return (T)(" #fexpr ");"
    ND_UNARY_OPS(ND_X)
#undef ND_X
    "\n#define ND_UNARY_INT_CASES"
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw) \
    IF_##ints(" case ND_UNARY_" #name ": return (T)(" #iexpr ");")
    ND_UNARY_OPS(ND_X)
#undef ND_X
    /* binary arithmetic: T a, T b -> T */
    "\n#define ND_BINARY_FLOAT_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_ARITH_##kind(" case ND_BINARY_" #name ": return (T)(" #fexpr ");")
    ND_BINARY_OPS(ND_X)
#undef ND_X
    "\n#define ND_BINARY_INT_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_ARITH_##kind(IF_##ints(" case ND_BINARY_" #name ": return (T)(" #iexpr ");"))
    ND_BINARY_OPS(ND_X)
#undef ND_X
    "\n#define ND_BINARY_BOOL_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_ARITH_##kind(IF_##bools(" case ND_BINARY_" #name ": return (T)(" #bexpr ");"))
    ND_BINARY_OPS(ND_X)
#undef ND_X
    /* comparisons: T a, T b -> uchar */
    "\n#define ND_COMPARE_FLOAT_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_CMP_##kind(" case ND_BINARY_" #name ": return (uchar)(" #fexpr ");")
    ND_BINARY_OPS(ND_X)
#undef ND_X
    "\n#define ND_COMPARE_INT_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_CMP_##kind(IF_##ints(" case ND_BINARY_" #name ": return (uchar)(" #iexpr ");"))
    ND_BINARY_OPS(ND_X)
#undef ND_X
    "\n#define ND_COMPARE_BOOL_CASES"
#define ND_X(name, kind, ints, bools, fexpr, iexpr, bexpr) \
    IF_CMP_##kind(IF_##bools(" case ND_BINARY_" #name ": return (uchar)(" #bexpr ");"))
    ND_BINARY_OPS(ND_X)
#undef ND_X
    "\n";

/* Whether a kernel exists for (op, dtype class), as the cases above. */
bool ocl_unary_has_kernel(nd_unary_op op, nd_dtype dt) {
    static const bool keeps_int[ND_NUM_UNARY] = {
#define ND_X(name, ints, ...) [ND_UNARY_##name] = IF_##ints(true) + 0,
        ND_UNARY_OPS(ND_X)
#undef ND_X
    };
    return nd_dtype_is_float(dt) || ((unsigned)op < ND_NUM_UNARY && keeps_int[op]);
}

bool ocl_binary_has_kernel(nd_binary_op op, nd_dtype dt) {
    static const bool keeps_int[ND_NUM_BINARY] = {
#define ND_X(name, kind, ints, ...) [ND_BINARY_##name] = IF_##ints(true) + 0,
        ND_BINARY_OPS(ND_X)
#undef ND_X
    };
    static const bool keeps_bool[ND_NUM_BINARY] = {
#define ND_X(name, kind, ints, bools, ...) [ND_BINARY_##name] = IF_##bools(true) + 0,
        ND_BINARY_OPS(ND_X)
#undef ND_X
    };
    if ((unsigned)op >= ND_NUM_BINARY) return false;
    if (nd_dtype_is_float(dt)) return true;
    return dt == ND_BOOL ? keeps_bool[op] : keeps_int[op];
}

bool ocl_binary_is_comparison(nd_binary_op op) {
    static const bool cmp[ND_NUM_BINARY] = {
#define ND_X(name, kind, ...) [ND_BINARY_##name] = IF_CMP_##kind(true) + 0,
        ND_BINARY_OPS(ND_X)
#undef ND_X
    };
    return (unsigned)op < ND_NUM_BINARY && cmp[op];
}
