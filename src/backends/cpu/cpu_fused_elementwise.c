/* cpu_fused_elementwise.c - runs a fused elementwise program (backend.h,
 * nd_ew_program; made by nd.compile's fuse pass) without a compiler at run
 * time: the loop engine (cpu_loop.h) walks the tensors' common shape in
 * runs, and each run goes through the program tile by tile. A tile of every
 * step's result that is not stored lives in a scratch block on the stack
 * (small enough to stay in cache); results that are stored go straight
 * into their tensor. Each step is the unfused kernel's own inner loop
 * (cpu_elementwise.c), so the arithmetic is exactly the unfused one. */
#include <string.h>
#include "cpu_ew_exec.h"

#define DEFAULT_TILE 1024 /* elements; the tuner may pick another (prog->tune_size) */

/* copy's inner loop: operands out, x of one element size (ctx: size_t) */
static void copy_inner(char **p, const int64_t *s, int64_t n, void *ctx) {
    size_t es = *(const size_t *)ctx;
    if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
        memmove(p[0], p[1], (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], p[1] + i * s[1], es);
}

void nd_cpu_ew_run(char **p, const int64_t *s, int64_t n, void *vctx) {
    const nd_cpu_ew_exec *x = vctx;
    const nd_ew_program *prog = x->p;
    const int nt = prog->nt;
    _Alignas(64) unsigned char scratch[ND_CPU_EW_SCRATCH];
    char *vp[ND_EW_MAX_TENSORS + ND_EW_MAX_STEPS];
    int64_t vs[ND_EW_MAX_TENSORS + ND_EW_MAX_STEPS];
    for (int64_t c = 0; c < n; c += x->tile) {
        int64_t m = n - c < x->tile ? n - c : x->tile;
        for (int k = 0; k < nt; k++) {
            vp[k] = p[k] + c * s[k];
            vs[k] = s[k];
        }
        for (int j = 0; j < prog->nsteps; j++) {
            const nd_ew_step *st = &prog->steps[j];
            const int v = nt + j;
            if (st->store >= 0) {
                vp[v] = vp[st->store];
                vs[v] = vs[st->store];
            } else {
                int64_t es = (int64_t)nd_dtype_size((nd_dtype)st->dtype);
                vp[v] = (char *)scratch + (size_t)x->scratch_of[j] * (size_t)x->tile * 8;
                vs[v] = es;
            }
            char *ptr[4];
            int64_t str[4];
            ptr[0] = vp[v];
            str[0] = vs[v];
            for (int q = 0; q < nd_ew_inputs(st); q++) {
                if (st->in[q] == ND_EW_SCALAR) {
                    ptr[q + 1] = (char *)st->scalar;
                    str[q + 1] = 0;
                } else {
                    ptr[q + 1] = vp[st->in[q]];
                    str[q + 1] = vs[st->in[q]];
                }
            }
            x->fn[j](ptr, str, m, x->ctx[j]);
        }
    }
}

nd_status nd_cpu_ew_prepare(const nd_ew_program *p, nd_cpu_ew_exec *x) {
    if (p->nt < 1 || p->nt > ND_EW_MAX_TENSORS || p->nsteps < 1 || p->nsteps > ND_EW_MAX_STEPS)
        return nd_fail(ND_ERR_INTERNAL, "fused elementwise: a program of %d tensors and %d steps",
                       p->nt, p->nsteps);
    *x = (nd_cpu_ew_exec){.p = p, .es = nd_dtype_size(p->dtype)};
    /* Scratch blocks by liveness: a result's block is free again after the
     * last step that reads it. */
    int last_use[ND_EW_MAX_STEPS], owner[ND_EW_MAX_STEPS], nblocks = 0;
    for (int j = 0; j < p->nsteps; j++) last_use[j] = j;
    for (int j = 0; j < p->nsteps; j++)
        for (int q = 0; q < nd_ew_inputs(&p->steps[j]); q++) {
            int v = p->steps[j].in[q];
            if (v >= p->nt) last_use[v - p->nt] = j;
        }
    for (int j = 0; j < p->nsteps; j++) {
        const nd_ew_step *st = &p->steps[j];
        switch ((nd_ew_kind)st->kind) {
        case ND_EW_UNARY: x->fn[j] = nd_cpu_unary_inner((nd_unary_op)st->op, p->dtype); break;
        case ND_EW_BINARY: x->fn[j] = nd_cpu_binary_inner((nd_binary_op)st->op, p->dtype); break;
        case ND_EW_WHERE: x->fn[j] = nd_cpu_where_inner; x->ctx[j] = &x->es; break;
        case ND_EW_CLAMP:
            x->clamp[j] = (nd_cpu_clamp_ctx){st->lo, st->hi, p->dtype};
            x->fn[j] = nd_cpu_clamp_inner;
            x->ctx[j] = &x->clamp[j];
            break;
        case ND_EW_RELU_BACKWARD: x->fn[j] = nd_cpu_relu_backward_inner(p->dtype); break;
        case ND_EW_COPY: x->fn[j] = copy_inner; x->ctx[j] = &x->es; break;
        default: x->fn[j] = NULL;
        }
        if (!x->fn[j])
            return nd_fail(ND_ERR_INTERNAL, "fused elementwise: no cpu kernel for step %d (%s) in %s",
                           j + 1, p->desc, nd_dtype_name(p->dtype));
        x->scratch_of[j] = -1;
        if (st->store >= 0) continue;
        /* a block whose result was read for the last time before this step,
         * or by this step with the same element size (element i is read
         * before element i is written: a bool condition under a float result
         * would be overwritten ahead of its reads) */
        for (int q = 0; q < nblocks; q++)
            if (last_use[owner[q]] < j ||
                (last_use[owner[q]] == j && p->steps[owner[q]].dtype == st->dtype)) {
                x->scratch_of[j] = q;
                owner[q] = j;
                break;
            }
        if (x->scratch_of[j] < 0) {
            x->scratch_of[j] = nblocks;
            owner[nblocks++] = j;
        }
    }
    x->tile = p->tune_size > 0 ? p->tune_size : DEFAULT_TILE;
    if (nblocks && x->tile * 8 * nblocks > ND_CPU_EW_SCRATCH) x->tile = ND_CPU_EW_SCRATCH / (8 * nblocks) / 16 * 16;
    if (x->tile < 16) x->tile = 16; /* 48 blocks at most: 48 * 16 * 8 bytes fits */
    return ND_OK;
}

nd_status nd_cpu_fused_elementwise(nd_ew_program *p, nd_tensor *const *ts) {
    nd_cpu_ew_exec x;
    ND_TRY(nd_cpu_ew_prepare(p, &x));
    nd_loop L;
    nd_loop_init(&L, p->nt, (const nd_tensor *const *)ts);
    nd_loop_run(&L, nd_cpu_ew_run, &x, !p->tune_serial);
    return ND_OK;
}
