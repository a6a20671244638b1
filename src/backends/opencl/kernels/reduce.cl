/* reduce.cl - reductions over any set of dims of an input of type T (build
 * define; float, double, long, int or uchar: the op layer has already
 * turned half types into float and integers into float for mean/var/std/
 * logsumexp).
 *
 * Semantics follow src/backends/cpu/cpu_reduce.c: floats accumulate in
 * acc_t (double when the device has it), integer sums and products wrap in
 * ulong; max/min/argmax/argmin take the first extreme (ties keep the lowest
 * flat index in the reduced block) and the first NaN wins; var/std divide
 * by (count - correction) and give NaN when that is <= 0; logsumexp is -inf
 * over nothing and +-inf or NaN when the maximum is.
 *
 * Every partial result is a mergeable state (rstate): work-items fold their
 * elements in, a work-group folds its items' states in local memory, and
 * when one output is split across several work-groups, reduce_finish folds
 * their states. var/std use Welford's update and Chan's merge; logsumexp
 * keeps (max, sum of exp(v - max)). */

#ifndef WG_MAX
#define WG_MAX 256
#endif

/* the op codes are nd_reduce_op, generated from needle_ops.h (ocl_registry_source.c) */
#define R_SUM ND_REDUCE_sum
#define R_MEAN ND_REDUCE_mean
#define R_PROD ND_REDUCE_prod
#define R_MAX ND_REDUCE_max
#define R_MIN ND_REDUCE_min
#define R_ARGMAX ND_REDUCE_argmax
#define R_ARGMIN ND_REDUCE_argmin
#define R_VAR ND_REDUCE_var
#define R_STD ND_REDUCE_std
#define R_LSE ND_REDUCE_logsumexp

/* ocl_reduce.c's rgeom, same layout. */
typedef struct {
    long kshape[8], kstride[8]; /* kept dims of x (outputs, row-major) */
    long rshape[8], rstride[8]; /* reduced dims of x (merged where contiguous) */
    long ocount, rcount;        /* outputs; reduced elements per output */
    long xoff, voff, ioff;      /* element offsets of x, the value and the index outputs */
    long chunk;                 /* reduced elements per work-group */
    int nk, nr;
    int groups;                 /* work-groups per output */
    int pad_;
} rgeom;

typedef struct {
    acc_t a;     /* sum, product, best value, Welford mean, or logsumexp max */
    acc_t b;     /* Welford M2, or logsumexp sum of exp(v - a) */
    long n;      /* Welford count */
    long idx;    /* flat index of the best value in the reduced block */
    ulong u;     /* integer sum, product or best value (bits of a long) */
    int started; /* best value seen */
    int pad_;
} rstate;

inline rstate st_init(int op) {
    rstate s;
    s.a = op == R_PROD ? (acc_t)1 : op == R_LSE ? (acc_t)(-INFINITY) : (acc_t)0;
    s.b = 0;
    s.n = 0;
    s.idx = 0;
    s.u = op == R_PROD ? 1 : 0;
    s.started = 0;
    s.pad_ = 0;
    return s;
}

inline long kept_offset(const rgeom *g, long o) {
    long off = 0;
    for (int d = g->nk - 1; d >= 0; d--) {
        long q = o / g->kshape[d];
        off += (o - q * g->kshape[d]) * g->kstride[d];
        o = q;
    }
    return off;
}

inline long red_offset(const rgeom *g, long j) {
    if (g->nr == 1) return j * g->rstride[0];
    long off = 0;
    for (int d = g->nr - 1; d >= 0; d--) {
        long q = j / g->rshape[d];
        off += (j - q * g->rshape[d]) * g->rstride[d];
        j = q;
    }
    return off;
}

/* Folds elements j0, j0 + step, ... < j1 of the reduced block at x + base
 * into s. One loop per op, so the op test stays out of the inner loop. */
#define RLOOP(BODY)                                                    \
    for (long j = j0; j < j1; j += step) {                             \
        T v_ = x[base + red_offset(g, j)];                             \
        BODY                                                           \
    }

inline void st_fold(int op, rstate *s, const rgeom *g, __global const T *x, long base, long j0,
                    long j1, long step) {
#if T_FLOAT
    switch (op) {
    case R_SUM:
    case R_MEAN: {
        acc_t a = s->a;
        RLOOP(a += (acc_t)v_;)
        s->a = a;
        break;
    }
    case R_PROD: {
        acc_t a = s->a;
        RLOOP(a *= (acc_t)v_;)
        s->a = a;
        break;
    }
    case R_MAX:
    case R_ARGMAX:
        RLOOP(acc_t v = (acc_t)v_;
              if (!s->started || (!isnan(s->a) && (isnan(v) || v > s->a))) {
                  s->a = v; s->idx = j; s->started = 1;
              })
        break;
    case R_MIN:
    case R_ARGMIN:
        RLOOP(acc_t v = (acc_t)v_;
              if (!s->started || (!isnan(s->a) && (isnan(v) || v < s->a))) {
                  s->a = v; s->idx = j; s->started = 1;
              })
        break;
    case R_VAR:
    case R_STD:
        RLOOP(acc_t v = (acc_t)v_;
              s->n++;
              acc_t d = v - s->a;
              s->a += d / (acc_t)s->n;
              s->b += d * (v - s->a);)
        break;
    case R_LSE:
        RLOOP(acc_t v = (acc_t)v_;
              if (isnan(s->a)) continue;
              if (isnan(v)) { s->a = v; continue; }
              if (v == (acc_t)(-INFINITY)) continue; /* adds exp(-inf) = 0 */
              if (v > s->a) { s->b = s->b * exp(s->a - v) + (acc_t)1; s->a = v; }
              else s->b += exp(v - s->a);)
        break;
    default: break;
    }
#else
    switch (op) {
    case R_SUM: {
        ulong u = s->u;
        RLOOP(u += (ulong)(long)v_;)
        s->u = u;
        break;
    }
    case R_PROD: {
        ulong u = s->u;
        RLOOP(u *= (ulong)(long)v_;)
        s->u = u;
        break;
    }
    case R_MAX:
    case R_ARGMAX:
        RLOOP(long v = (long)v_;
              if (!s->started || v > (long)s->u) { s->u = (ulong)v; s->idx = j; s->started = 1; })
        break;
    case R_MIN:
    case R_ARGMIN:
        RLOOP(long v = (long)v_;
              if (!s->started || v < (long)s->u) { s->u = (ulong)v; s->idx = j; s->started = 1; })
        break;
    default: break;
    }
#endif
}
#undef RLOOP

/* s = merge(s, t): the two cover disjoint parts of one reduced block, in
 * any order, so ties are broken by index. */
inline void st_merge(int op, rstate *s, const rstate *t) {
    switch (op) {
    case R_SUM:
    case R_MEAN:
        s->a += t->a;
        s->u += t->u;
        break;
    case R_PROD:
        s->a *= t->a;
        s->u *= t->u;
        break;
    case R_MAX: case R_MIN: case R_ARGMAX: case R_ARGMIN: {
        if (!t->started) break;
        if (!s->started) { *s = *t; break; }
        bool want_max = op == R_MAX || op == R_ARGMAX;
        bool take;
#if T_FLOAT
        bool sn = isnan(s->a), tn = isnan(t->a);
        if (sn || tn) take = tn && (!sn || t->idx < s->idx);
        else take = (want_max ? t->a > s->a : t->a < s->a) || (t->a == s->a && t->idx < s->idx);
#else
        long sv = (long)s->u, tv = (long)t->u;
        take = (want_max ? tv > sv : tv < sv) || (tv == sv && t->idx < s->idx);
#endif
        if (take) *s = *t;
        break;
    }
    case R_VAR:
    case R_STD: {
        if (t->n == 0) break;
        if (s->n == 0) { *s = *t; break; }
        acc_t n1 = (acc_t)s->n, n2 = (acc_t)t->n, n = n1 + n2;
        acc_t d = t->a - s->a;
        s->a += d * (n2 / n);
        s->b += t->b + d * d * (n1 * n2 / n);
        s->n += t->n;
        break;
    }
    case R_LSE: {
        if (isnan(s->a)) break;
        if (isnan(t->a)) { s->a = t->a; break; }
        if (t->a == (acc_t)(-INFINITY)) break;
        if (s->a == (acc_t)(-INFINITY)) { *s = *t; break; }
        if (t->a > s->a) { s->b = s->b * exp(s->a - t->a) + t->b; s->a = t->a; }
        else s->b += t->b * exp(t->a - s->a);
        break;
    }
    default: break;
    }
}

/* Writes output o. both: max_dim (values and indices). */
inline void st_store(int op, const rstate *s, const rgeom *g, int corr, int both, long o,
                     __global T *outv, __global long *outi) {
#if T_FLOAT
    acc_t r = s->a;
    switch (op) {
    case R_MEAN: r = s->a / (acc_t)g->rcount; break;
    case R_ARGMAX:
    case R_ARGMIN:
        if (both) outv[g->voff + o] = (T)s->a;
        outi[g->ioff + o] = s->idx;
        return;
    case R_VAR:
    case R_STD: {
        acc_t denom = (acc_t)g->rcount - (acc_t)corr;
        r = denom > 0 ? s->b / denom : (acc_t)NAN;
        if (op == R_STD) r = sqrt(r);
        break;
    }
    case R_LSE:
        if (!(isnan(s->a) || isinf(s->a))) r = s->a + log(s->b);
        break;
    default: break;
    }
#if defined(ACCUMULATE) && ACCUMULATE /* nd.compile's epilogue pass: out += the sum */
    outv[g->voff + o] = outv[g->voff + o] + (T)r;
#else
    outv[g->voff + o] = (T)r;
#endif
#else
    switch (op) {
    case R_SUM:
    case R_PROD: outi[g->ioff + o] = (long)s->u; break;
    case R_MAX:
    case R_MIN: outv[g->voff + o] = (T)(long)s->u; break;
    default: /* argmax, argmin */
        if (both) outv[g->voff + o] = (T)(long)s->u;
        outi[g->ioff + o] = s->idx;
        break;
    }
#endif
}

/* Folds the local states ls[0 .. L) into ls[0]; L a power of two. */
inline void tree_merge(int op, __local rstate *ls, int lid, int L) {
    for (int h = L >> 1; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < h) {
            rstate s = ls[lid], t = ls[lid + h];
            st_merge(op, &s, &t);
            ls[lid] = s;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* One work-item per output: small reduced blocks. */
__kernel void reduce_serial(int op, int corr, int both, rgeom g, __global const T *x,
                            __global T *outv, __global long *outi) {
    long o = get_global_id(0);
    if (o >= g.ocount) return;
    rstate s = st_init(op);
    st_fold(op, &s, &g, x, g.xoff + kept_offset(&g, o), 0, g.rcount, 1);
    st_store(op, &s, &g, corr, both, o, outv, outi);
}

/* g.groups work-groups per output, each over `chunk` reduced elements; with
 * one group per output the group writes the result, else its state goes
 * to part[group] for reduce_finish. Local size: a power of two <= WG_MAX. */
__kernel void reduce_groups(int op, int corr, int both, rgeom g, __global const T *x,
                            __global T *outv, __global long *outi, __global rstate *part) {
    __local rstate ls[WG_MAX];
    long grp = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    long o = grp / g.groups, c = grp - o * g.groups;
    long j0 = c * g.chunk, j1 = min(j0 + g.chunk, g.rcount);
    rstate s = st_init(op);
    if (o < g.ocount) st_fold(op, &s, &g, x, g.xoff + kept_offset(&g, o), j0 + lid, j1, L);
    ls[lid] = s;
    tree_merge(op, ls, lid, L);
    if (lid == 0 && o < g.ocount) {
        if (g.groups > 1) part[grp] = ls[0];
        else {
            s = ls[0];
            st_store(op, &s, &g, corr, both, o, outv, outi);
        }
    }
}

/* One work-group per output: folds the g.groups partial states. */
__kernel void reduce_finish(int op, int corr, int both, rgeom g, __global const rstate *part,
                            __global T *outv, __global long *outi) {
    __local rstate ls[WG_MAX];
    long o = get_group_id(0);
    int lid = get_local_id(0), L = get_local_size(0);
    rstate s = st_init(op);
    for (long c = lid; c < g.groups; c += L) {
        rstate t = part[o * g.groups + c];
        st_merge(op, &s, &t);
    }
    ls[lid] = s;
    tree_merge(op, ls, lid, L);
    if (lid == 0 && o < g.ocount) {
        s = ls[0];
        st_store(op, &s, &g, corr, both, o, outv, outi);
    }
}

/* Column reductions (the kept dims' innermost is contiguous in x, the
 * reduced ones are not): work-group tiles of LC consecutive outputs x LR
 * lanes over the reduced block, so neighbouring work-items read
 * neighbouring elements; the lanes' states are folded in local memory. */
__kernel void reduce_tiles(int op, int corr, int both, rgeom g, __global const T *x,
                           __global T *outv, __global long *outi) {
    __local rstate ls[WG_MAX];
    int lc = get_local_id(0), lr = get_local_id(1);
    int LC = get_local_size(0), LR = get_local_size(1);
    long o = get_group_id(0) * LC + lc;
    rstate s = st_init(op);
    if (o < g.ocount) st_fold(op, &s, &g, x, g.xoff + kept_offset(&g, o), lr, g.rcount, LR);
    int t = lr * LC + lc;
    ls[t] = s;
    for (int h = LR >> 1; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lr < h) {
            rstate a = ls[t], b = ls[t + h * LC];
            st_merge(op, &a, &b);
            ls[t] = a;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lr == 0 && o < g.ocount) {
        s = ls[t];
        st_store(op, &s, &g, corr, both, o, outv, outi);
    }
}
