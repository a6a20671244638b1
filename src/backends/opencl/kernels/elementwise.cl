/* elementwise.cl - unary, binary (arithmetic and comparisons), scalar forms,
 * where, clamp and fill for one element type T (build define). The per-op
 * functions come from kernels/ew_ops.cl, compiled in front of this file.
 *
 * Op codes and the per-op cases are generated from needle_ops.h
 * (ocl_registry_source.c). Every kernel has a flat form (operands contiguous
 * from their offsets) and a strided one driven by an nd_geom. Semantics
 * follow the CPU kernels: signed integers wrap, max/min propagate NaN,
 * round is half-to-even, bool + is or and * is and. */

__kernel void unary_flat(int op, long n, __global T *o, long oo, __global const T *x, long xo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = un_op(op, x[xo + i]);
}

__kernel void unary_strided(int op, long n, nd_geom g, __global T *o, __global const T *x) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    o[off[0]] = un_op(op, x[off[1]]);
}

__kernel void binary_flat(int op, long n, __global T *o, long oo, __global const T *a, long ao,
                          __global const T *b, long bo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = bin_op(op, a[ao + i], b[bo + i]);
}

__kernel void binary_strided(int op, long n, nd_geom g, __global T *o, __global const T *a,
                             __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    o[off[0]] = bin_op(op, a[off[1]], b[off[2]]);
}

__kernel void compare_strided(int op, long n, nd_geom g, __global uchar *o, __global const T *a,
                              __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[3];
    GEOM_OFFSETS(g, i, 3, off);
    o[off[0]] = cmp_op(op, a[off[1]], b[off[2]]);
}

/* a op s, or s op a when scalar_first */
__kernel void scalar_strided(int op, int scalar_first, T s, long n, nd_geom g, __global T *o,
                             __global const T *a) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T x = a[off[1]];
    o[off[0]] = scalar_first ? bin_op(op, s, x) : bin_op(op, x, s);
}

__kernel void scalar_flat(int op, int scalar_first, T s, long n, __global T *o, long oo,
                          __global const T *a, long ao) {
    long i = get_global_id(0);
    if (i >= n) return;
    T x = a[ao + i];
    o[oo + i] = scalar_first ? bin_op(op, s, x) : bin_op(op, x, s);
}

__kernel void compare_scalar_strided(int op, int scalar_first, T s, long n, nd_geom g,
                                     __global uchar *o, __global const T *a) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T x = a[off[1]];
    o[off[0]] = scalar_first ? cmp_op(op, s, x) : cmp_op(op, x, s);
}

__kernel void where_strided(long n, nd_geom g, __global T *o, __global const uchar *c,
                            __global const T *a, __global const T *b) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[4];
    GEOM_OFFSETS(g, i, 4, off);
    o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
}

/* lo/hi already resolved by the host (integers: exact bounds; floats:
 * +-inf for no bound); has_lo/has_hi kept for NaN bounds. */
__kernel void clamp_strided(T lo, T hi, long n, nd_geom g, __global T *o, __global const T *x) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[2];
    GEOM_OFFSETS(g, i, 2, off);
    T v = x[off[1]];
    o[off[0]] = v < lo ? lo : v > hi ? hi : v;
}

__kernel void fill_strided(T v, long n, nd_geom g, __global T *o) {
    long i = get_global_id(0);
    if (i >= n) return;
    long off[1];
    GEOM_OFFSETS(g, i, 1, off);
    o[off[0]] = v;
}

__kernel void fill_flat(T v, long n, __global T *o, long oo) {
    long i = get_global_id(0);
    if (i < n) o[oo + i] = v;
}
