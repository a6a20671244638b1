/* ocl_fused.c - a fused elementwise program (backend.h, nd_ew_program; made
 * by nd.compile's fuse pass) as one generated OpenCL kernel.
 *
 * The kernel is written for the program's tensors as they are (a compiled
 * graph never changes them): their merged dims and strides are constants in
 * the source (their offsets are arguments), so one work item finds its elements with
 * constant divisions, loads the inputs, runs the steps through ew_ops.cl's
 * un_op / bin_op / cmp_op (the unfused kernels' own code, FP_CONTRACT off)
 * and stores the outputs. Built once through the program cache (memory and
 * disk); the kernel is kept in the program for the next replays.
 *
 * The steps' scalar operands are kernel arguments, as in the unfused
 * kernels, not literals: a compiler that sees x / 3.0f or pow(x, 2.0f) with
 * a constant may rewrite it (a reciprocal multiply, x * x), which OpenCL's
 * 2.5-ulp division allows, and the fused result would no longer be the
 * eager one bit for bit (NVIDIA's compiler did: a Transformer trained with
 * Adam drifted from its eager twin). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ocl_kernels.h"

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} strbuf;

static void put(strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) { b->oom = true; return; }
        if (b->s && b->n + (size_t)w < b->cap) { b->n += (size_t)w; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)w + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) { b->oom = true; return; }
        b->s = s;
        b->cap = cap;
    }
}

/* An element of dtype dt (float32 or float64) as an exact OpenCL literal. */
static void put_value(strbuf *b, nd_dtype dt, double v) {
    if (dt == ND_FLOAT32) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        put(b, "as_float(0x%08xu)", (unsigned)u);
    } else {
        uint64_t u;
        memcpy(&u, &v, 8);
        put(b, "as_double(0x%016llxUL)", (unsigned long long)u);
    }
}

/* Whether step s has a scalar operand (kernel argument "s<step>"). */
static bool has_scalar(const nd_ew_step *s) {
    if (s->kind != ND_EW_BINARY) return false;
    return s->in[0] == ND_EW_SCALAR || s->in[1] == ND_EW_SCALAR;
}

static void put_operand(strbuf *b, const nd_ew_step *s, int step, int q) {
    if (s->in[q] == ND_EW_SCALAR) put(b, "s%d", step);
    else put(b, "v%d", s->in[q]);
}

static const char *elem_type(nd_dtype dt) { return dt == ND_BOOL ? "uchar" : "T"; }

/* The kernel "nd_fused"(long n, tensors...) of program p over ts. */
static char *generate(const nd_ew_program *p, nd_tensor *const *ts) {
    strbuf b = {0};
    const int nt = p->nt;
    bool reads[ND_EW_MAX_TENSORS] = {0}, writes[ND_EW_MAX_TENSORS] = {0};
    for (int j = 0; j < p->nsteps; j++) {
        const nd_ew_step *s = &p->steps[j];
        for (int q = 0; q < nd_ew_inputs(s); q++)
            if (s->in[q] >= 0 && s->in[q] < nt) reads[s->in[q]] = true;
        if (s->store >= 0) writes[s->store] = true;
    }
    int64_t shape[ND_MAX_DIMS], strides[ND_EW_MAX_TENSORS][ND_MAX_DIMS];
    int nd = ocl_merge_dims(nt, (const nd_tensor *const *)ts, shape, strides);
    put(&b, "/* %s */\n__kernel void nd_fused(long n", p->desc);
    for (int k = 0; k < nt; k++)
        put(&b, ", __global %s%s *t%d", writes[k] ? "" : "const ", elem_type(ts[k]->dtype), k);
    for (int j = 0; j < p->nsteps; j++)
        if (has_scalar(&p->steps[j])) put(&b, ", T s%d", j);
    for (int k = 0; k < nt; k++) put(&b, ", long off%d", k);
    put(&b, ") {\n    long i = get_global_id(0);\n    if (i >= n) return;\n");
    if (nd == 1) put(&b, "    long c0 = i;\n");
    else {
        put(&b, "    long r = i;\n");
        for (int d = nd - 1; d > 0; d--)
            put(&b, "    long c%d = r %% %lld; r /= %lld;\n", d, (long long)shape[d], (long long)shape[d]);
        put(&b, "    long c0 = r;\n");
    }
    for (int k = 0; k < nt; k++) {
        put(&b, "    long o%d = off%d", k, k);
        for (int d = 0; d < nd; d++)
            if (strides[k][d]) put(&b, " + c%d * %lld", d, (long long)strides[k][d]);
        put(&b, ";\n");
        if (reads[k]) put(&b, "    %s v%d = t%d[o%d];\n", elem_type(ts[k]->dtype), k, k, k);
    }
    for (int j = 0; j < p->nsteps; j++) {
        const nd_ew_step *s = &p->steps[j];
        int v = nt + j;
        put(&b, "    %s v%d = ", elem_type((nd_dtype)s->dtype), v);
        switch ((nd_ew_kind)s->kind) {
        case ND_EW_UNARY: put(&b, "un_op(%d, v%d)", s->op, s->in[0]); break;
        case ND_EW_BINARY:
            put(&b, "%s(%d, ", s->dtype == ND_BOOL ? "cmp_op" : "bin_op", s->op);
            put_operand(&b, s, j, 0);
            put(&b, ", ");
            put_operand(&b, s, j, 1);
            put(&b, ")");
            break;
        case ND_EW_WHERE: put(&b, "v%d ? v%d : v%d", s->in[0], s->in[1], s->in[2]); break;
        case ND_EW_CLAMP: { /* NaN bounds: none (as ocl_clamp resolves them) */
            put(&b, "v%d < ", s->in[0]);
            put_value(&b, p->dtype, isnan(s->lo) ? -INFINITY : s->lo);
            put(&b, " ? ");
            put_value(&b, p->dtype, isnan(s->lo) ? -INFINITY : s->lo);
            put(&b, " : v%d > ", s->in[0]);
            put_value(&b, p->dtype, isnan(s->hi) ? INFINITY : s->hi);
            put(&b, " ? ");
            put_value(&b, p->dtype, isnan(s->hi) ? INFINITY : s->hi);
            put(&b, " : v%d", s->in[0]);
            break;
        }
        case ND_EW_RELU_BACKWARD: put(&b, "v%d > (T)0 ? v%d : (T)0", s->in[1], s->in[0]); break;
        case ND_EW_COPY: put(&b, "v%d", s->in[0]); break;
        }
        put(&b, ";\n");
        if (s->store >= 0) put(&b, "    t%d[o%d] = v%d;\n", s->store, s->store, v);
    }
    put(&b, "}\n");
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}

nd_status ocl_fused_elementwise(nd_ew_program *p, nd_tensor *const *ts) {
    if (p->nt < 1 || p->nt > ND_EW_MAX_TENSORS || p->nsteps < 1 || p->nsteps > ND_EW_MAX_STEPS)
        return nd_fail(ND_ERR_INTERNAL, "fused elementwise: a program of %d tensors and %d steps",
                       p->nt, p->nsteps);
    ocl_device *d = ocl_dev(ts[0]);
    int64_t n = nd_numel(ts[0]);
    if (n == 0) return ND_OK;
    uint64_t gen = ocl_programs_generation();
    cl_kernel k = p->backend_cache;
    if (!k || p->backend_tag != gen) {
        ND_TRY(ocl_check_dtype(d, p->dtype, p->desc));
        char *src = generate(p, ts);
        if (!src) return nd_fail(ND_ERR_MEMORY, "fused elementwise (%s): out of memory generating "
                                 "its kernel", p->desc);
        char defs[128];
        ocl_dtype_defines(p->dtype, defs, sizeof defs);
        nd_status st = ocl_kernel_generated(d, "fused", defs, src, "nd_fused", &k);
        free(src);
        ND_TRY(st);
        p->backend_cache = k;
        p->backend_tag = gen;
    }
    cl_long nn = n;
    cl_int e = OCL_ARG(k, 0, nn);
    for (int j = 0; j < p->nt; j++) {
        cl_mem m = ocl_mem(ts[j]);
        e |= ocl_set_arg(k, (cl_uint)(1 + j), sizeof m, &m);
    }
    /* the scalars in the program's dtype, as the steps hold them, then the
     * tensors' offsets (arguments too: the same kernel serves every place of
     * the memory plan's arena) */
    cl_uint arg = (cl_uint)(1 + p->nt);
    for (int j = 0; j < p->nsteps; j++)
        if (has_scalar(&p->steps[j]))
            e |= ocl_set_arg(k, arg++, nd_dtype_size(p->dtype), p->steps[j].scalar);
    for (int j = 0; j < p->nt; j++) {
        cl_long off = ts[j]->offset;
        e |= OCL_ARG(k, arg, off);
        arg++;
    }
    if (e != CL_SUCCESS) return ocl_fail(e, p->desc, "setting kernel arguments", d);
    if (p->tune_size <= 0) return ocl_launch_1d(d, k, p->desc, n);
    size_t local = ocl_max_group(d, k, (size_t)p->tune_size), global = (size_t)n;
    return ocl_launch(d, k, p->desc, 1, &global, &local);
}
