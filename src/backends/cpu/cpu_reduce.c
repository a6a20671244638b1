/* cpu_reduce.c - reductions over any set of dims.
 *
 * For each output element the reduced sub-block of x is walked as runs
 * (pointer, byte stride, length): reduced dims that are contiguous with each
 * other are merged first, so reducing a contiguous tensor's trailing dims is
 * one dense run. Floating accumulators are double, integer ones int64 (sums
 * of ints give int64 as in PyTorch). Outputs are computed in parallel; a
 * full reduction of one dense run is split across threads instead. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "cpu_kernels.h"

typedef struct {
    int nk, nr;                  /* kept and reduced dims (after merging) */
    int64_t kshape[ND_MAX_DIMS], kstride[ND_MAX_DIMS];
    int64_t rshape[ND_MAX_DIMS], rstride[ND_MAX_DIMS];
    int64_t rcount;              /* elements per output */
    int64_t ocount;              /* outputs */
    const char *base;
    nd_dtype dt;
} geom;

typedef struct {
    double acc;      /* sum, prod, best value, or sum of exp */
    double ref;      /* mean (var pass 2) or max (logsumexp pass 2) */
    int64_t iacc;    /* integer sum/prod/best */
    int64_t best_i;  /* argmax/argmin index */
    bool started;
} rstate;

static void geom_init(geom *g, const nd_tensor *x, const bool *reduced) {
    size_t es = nd_dtype_size(x->dtype);
    g->nk = g->nr = 0;
    g->rcount = g->ocount = 1;
    for (int i = 0; i < x->ndim; i++) {
        int64_t st = x->strides[i] * (int64_t)es;
        if (reduced[i]) {
            g->rcount *= x->shape[i];
            if (x->shape[i] == 1) continue;
            /* merge into the previous reduced dim when contiguous with it */
            if (g->nr && g->rstride[g->nr - 1] == st * x->shape[i]) {
                g->rshape[g->nr - 1] *= x->shape[i];
                g->rstride[g->nr - 1] = st;
            } else {
                g->rshape[g->nr] = x->shape[i];
                g->rstride[g->nr++] = st;
            }
        } else {
            g->ocount *= x->shape[i];
            g->kshape[g->nk] = x->shape[i];
            g->kstride[g->nk++] = st;
        }
    }
    if (g->nr == 0) { g->rshape[0] = 1; g->rstride[0] = 0; g->nr = 1; }
    g->base = nd_ptr(x);
    g->dt = x->dtype;
}

static const char *out_base(const geom *g, int64_t o) {
    const char *p = g->base;
    for (int d = g->nk - 1; d >= 0; d--) {
        p += (o % g->kshape[d]) * g->kstride[d];
        o /= g->kshape[d];
    }
    return p;
}

static int64_t load_i64(const char *p, nd_dtype dt) {
    switch (dt) {
    case ND_INT64: return *(const int64_t *)p;
    case ND_INT32: return *(const int32_t *)p;
    default: return *(const uint8_t *)p; /* uint8, bool */
    }
}

/* The sum of a run of n elements in double, in LANES interleaved partial
 * sums (element i goes to lane i % LANES; one running sum would wait on
 * the latency of each double add, 0.65 ns an element here, where these
 * vectorise), the lanes then combined pairwise. Every path that sums one
 * reduced dim (dense or strided runs, try_rows) follows this one order, so
 * the bits of a sum over one dim do not depend on the layout of its input
 * (over several dims they do: dims that merge into one dense run are summed
 * as one run, others run by run; a whole dense tensor is split between the
 * threads, try_parallel_full, as it was before these lanes). */
#define LANES 8
static double combine_lanes(double *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}
static double run_sum(const char *p, int64_t st, int64_t n, nd_dtype dt) {
    double acc[LANES] = {0};
    int64_t i = 0;
    if (dt == ND_FLOAT32 && st == 4) {
        const float *f = (const float *)p;
        for (; i + LANES <= n; i += LANES)
#pragma omp simd
            for (int j = 0; j < LANES; j++) acc[j] += f[i + j];
        for (int j = 0; i < n; i++, j++) acc[j] += f[i];
    } else if (dt == ND_FLOAT64 && st == 8) {
        const double *f = (const double *)p;
        for (; i + LANES <= n; i += LANES)
#pragma omp simd
            for (int j = 0; j < LANES; j++) acc[j] += f[i + j];
        for (int j = 0; i < n; i++, j++) acc[j] += f[i];
    } else if (dt == ND_FLOAT32) {
        for (; i < n; i++) acc[i % LANES] += *(const float *)(p + i * st);
    } else {
        for (; i < n; i++) acc[i % LANES] += *(const double *)(p + i * st);
    }
    return combine_lanes(acc);
}

/* One run of n elements; idx0 is the flat index of its first element within
 * the reduced block (for arg ops). pass 0 or 1 (var, logsumexp need two). */
static void visit(nd_reduce_op op, rstate *s, const char *p, int64_t st, int64_t n, int64_t idx0,
                  nd_dtype dt, int pass) {
    bool fl = dt == ND_FLOAT32 || dt == ND_FLOAT64;
#define LOAD(i) (dt == ND_FLOAT32 ? (double)*(const float *)(p + (i) * st) \
                                  : *(const double *)(p + (i) * st))
    switch (op) {
    case ND_REDUCE_sum:
    case ND_REDUCE_mean:
        if (fl) {
            s->acc += run_sum(p, st, n, dt);
        } else {
            uint64_t a = (uint64_t)s->iacc;
            for (int64_t i = 0; i < n; i++) a += (uint64_t)load_i64(p + i * st, dt);
            s->iacc = (int64_t)a;
        }
        break;
    case ND_REDUCE_prod:
        if (fl) for (int64_t i = 0; i < n; i++) s->acc *= LOAD(i);
        else {
            uint64_t a = (uint64_t)s->iacc;
            for (int64_t i = 0; i < n; i++) a *= (uint64_t)load_i64(p + i * st, dt);
            s->iacc = (int64_t)a;
        }
        break;
    case ND_REDUCE_max: case ND_REDUCE_min: case ND_REDUCE_argmax: case ND_REDUCE_argmin: {
        bool want_max = op == ND_REDUCE_max || op == ND_REDUCE_argmax;
        if (fl) {
            for (int64_t i = 0; i < n; i++) {
                double v = LOAD(i);
                /* NaN wins and stays (first NaN), as in PyTorch */
                if (!s->started || (!isnan(s->acc) && (isnan(v) || (want_max ? v > s->acc : v < s->acc)))) {
                    s->acc = v;
                    s->best_i = idx0 + i;
                    s->started = true;
                }
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                int64_t v = load_i64(p + i * st, dt);
                if (!s->started || (want_max ? v > s->iacc : v < s->iacc)) {
                    s->iacc = v;
                    s->best_i = idx0 + i;
                    s->started = true;
                }
            }
        }
        break;
    }
    case ND_REDUCE_var: case ND_REDUCE_std:
        if (pass == 0) for (int64_t i = 0; i < n; i++) s->acc += LOAD(i);
        else for (int64_t i = 0; i < n; i++) { double d = LOAD(i) - s->ref; s->acc += d * d; }
        break;
    case ND_REDUCE_logsumexp:
        if (pass == 0) {
            for (int64_t i = 0; i < n; i++) {
                double v = LOAD(i);
                if (!s->started || v > s->acc || isnan(v)) { s->acc = v; s->started = true; }
            }
        } else {
            for (int64_t i = 0; i < n; i++) s->acc += exp(LOAD(i) - s->ref);
        }
        break;
    default: break;
    }
#undef LOAD
}

/* Walks the reduced block starting at p. */
static void walk(const geom *g, nd_reduce_op op, rstate *s, const char *p, int pass) {
    int in = g->nr - 1;
    int64_t n = g->rshape[in], st = g->rstride[in];
    int64_t outer = g->rcount / (n ? n : 1);
    if (g->rcount == 0) return;
    int64_t idx[ND_MAX_DIMS] = {0};
    for (int64_t o = 0; o < outer; o++) {
        const char *q = p;
        for (int d = 0; d < in; d++) q += idx[d] * g->rstride[d];
        visit(op, s, q, st, n, o * n, g->dt, pass);
        for (int d = in - 1; d >= 0; d--) {
            if (++idx[d] < g->rshape[d]) break;
            idx[d] = 0;
        }
    }
}

static void state_init(nd_reduce_op op, rstate *s) {
    memset(s, 0, sizeof *s);
    if (op == ND_REDUCE_prod) { s->acc = 1; s->iacc = 1; }
}

/* Reduces one output; writes it through store. */
static void reduce_one(const geom *g, nd_reduce_op op, int correction, const char *p, char *out,
                       nd_dtype odt) {
    rstate s;
    state_init(op, &s);
    bool fl = g->dt == ND_FLOAT32 || g->dt == ND_FLOAT64;
    double n = (double)g->rcount;
    double r = 0;
    walk(g, op, &s, p, 0);
    switch (op) {
    case ND_REDUCE_sum: case ND_REDUCE_prod:
        if (fl) r = s.acc;
        else { *(int64_t *)out = s.iacc; return; }
        break;
    case ND_REDUCE_mean: r = s.acc / n; break;
    case ND_REDUCE_max: case ND_REDUCE_min:
        if (!fl) {
            /* integer max/min keep the input dtype exactly */
            switch (odt) {
            case ND_INT64: *(int64_t *)out = s.iacc; break;
            case ND_INT32: *(int32_t *)out = (int32_t)s.iacc; break;
            default: *(uint8_t *)out = (uint8_t)s.iacc; break;
            }
            return;
        }
        r = s.acc;
        break;
    case ND_REDUCE_argmax: case ND_REDUCE_argmin: *(int64_t *)out = s.best_i; return;
    case ND_REDUCE_var: case ND_REDUCE_std: {
        double mean = s.acc / n;
        state_init(op, &s);
        s.ref = mean;
        walk(g, op, &s, p, 1);
        double denom = n - correction;
        r = denom > 0 ? s.acc / denom : NAN;
        if (op == ND_REDUCE_std) r = sqrt(r);
        break;
    }
    case ND_REDUCE_logsumexp: {
        double m = s.acc;
        if (g->rcount == 0) { r = -INFINITY; break; }
        if (isinf(m) || isnan(m)) { r = m; break; }
        state_init(op, &s);
        s.ref = m;
        walk(g, op, &s, p, 1);
        r = m + log(s.acc);
        break;
    }
    default: break;
    }
    nd_store_f64(out, odt, r);
}

/* Dense full reduction split across threads (sum, mean, max, min, prod). */
static bool try_parallel_full(const geom *g, nd_reduce_op op, char *out, nd_dtype odt) {
    if (g->ocount != 1 || g->nr != 1 || g->rcount < 4 * ND_PARALLEL_THRESHOLD) return false;
    if (g->dt != ND_FLOAT32 && g->dt != ND_FLOAT64) return false;
    if (op != ND_REDUCE_sum && op != ND_REDUCE_mean && op != ND_REDUCE_max && op != ND_REDUCE_min)
        return false;
    int nt = nd_cpu_threads();
    if (nt < 2) return false;
    if (nt > 64) nt = 64;
    rstate part[64];
    int64_t n = g->rcount, st = g->rstride[0];
    int team = 1; /* the team actually granted may be smaller than asked */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
#pragma omp single
        team = T;
        int64_t chunk = (n + T - 1) / T, s0 = t * chunk, e = s0 + chunk < n ? s0 + chunk : n;
        state_init(op, &part[t]);
        if (s0 < e) visit(op, &part[t], g->base + s0 * st, st, e - s0, s0, g->dt, 0);
        else part[t].started = false;
    }
    rstate s;
    state_init(op, &s);
    for (int t = 0; t < team; t++) {
        if (op == ND_REDUCE_sum || op == ND_REDUCE_mean) s.acc += part[t].acc;
        else if (part[t].started) {
            double v = part[t].acc;
            bool better = !s.started || isnan(v) ||
                          (!isnan(s.acc) && (op == ND_REDUCE_max ? v > s.acc : v < s.acc));
            if (better && !(s.started && isnan(s.acc))) { s.acc = v; s.started = true; }
        }
    }
    nd_store_f64(out, odt, op == ND_REDUCE_mean ? s.acc / (double)n : s.acc);
    return true;
}

/* Sum or mean over one dim whose rows are contiguous in the kept dims (a
 * bias gradient: a (T*B, H) block summed over its rows; (A, R, K) summed
 * over R). Walking each output's column reads one element per cache line;
 * here the rows are added, in order, into double accumulators for a block
 * of K's columns at a time, row r into lane r % LANES as run_sum does, the
 * lanes combined as it combines them: the same additions in the same order
 * as the column walk, so the same bits, reading memory row by row. */
#define ROW_BLOCK 256 /* columns per block: 16 KiB of accumulators */
static bool try_rows(const geom *g, nd_reduce_op op, char *out, nd_dtype odt) {
    if ((op != ND_REDUCE_sum && op != ND_REDUCE_mean) || g->nk < 1 || g->nr != 1) return false;
    const int64_t es = (int64_t)nd_dtype_size(g->dt);
    if ((g->dt != ND_FLOAT32 && g->dt != ND_FLOAT64) || g->kstride[g->nk - 1] != es || g->rshape[0] < 2)
        return false;
    const int64_t K = g->kshape[g->nk - 1], R = g->rshape[0], rs = g->rstride[0];
    const int64_t outer = K ? g->ocount / K : 0;
    const int64_t osz = (int64_t)nd_dtype_size(odt), nblocks = (K + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t tasks = outer * nblocks;
    const double n = (double)g->rcount;
    bool par = tasks > 1 && g->ocount * R >= ND_PARALLEL_THRESHOLD;
#pragma omp parallel for num_threads(nd_cpu_threads()) if (par) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        double acc[LANES][ROW_BLOCK];
        const int64_t o = t / nblocks, b = t % nblocks;
        const int64_t k0 = b * ROW_BLOCK, kn = K - k0 < ROW_BLOCK ? K - k0 : ROW_BLOCK;
        const char *base = out_base(g, o * K) + k0 * es;
        /* lanes past the row count stay +0 and adding +0 changes no sum (a
         * lane's sum, begun at +0, is never -0): those are left out */
        const int nl = R < LANES ? (int)R : LANES;
        for (int j = 0; j < nl; j++)
            for (int64_t k = 0; k < kn; k++) acc[j][k] = 0;
        for (int64_t r = 0; r < R; r++) {
            double *a = acc[r % LANES];
            if (g->dt == ND_FLOAT32) {
                const float *v = (const float *)(base + r * rs);
#pragma omp simd
                for (int64_t k = 0; k < kn; k++) a[k] += v[k];
            } else {
                const double *v = (const double *)(base + r * rs);
#pragma omp simd
                for (int64_t k = 0; k < kn; k++) a[k] += v[k];
            }
        }
        for (int w = LANES / 2; w >= 1; w /= 2) /* combine_lanes, for every column */
            for (int j = 0; j < w && j + w < nl; j++)
#pragma omp simd
                for (int64_t k = 0; k < kn; k++) acc[j][k] += acc[j + w][k];
        char *dst = out + (o * K + k0) * osz;
        for (int64_t k = 0; k < kn; k++)
            nd_store_f64(dst + k * osz, odt, op == ND_REDUCE_mean ? acc[0][k] / n : acc[0][k]);
    }
    return true;
}

nd_status nd_cpu_reduce(nd_reduce_op op, nd_tensor *out, const nd_tensor *x, const bool *reduced,
                        int correction) {
    geom g;
    geom_init(&g, x, reduced);
    char *o = nd_ptr(out);
    size_t osz = nd_dtype_size(out->dtype);
    nd_dtype odt = out->dtype;
    if (try_parallel_full(&g, op, o, odt) || try_rows(&g, op, o, odt)) return ND_OK;
    int64_t work = g.ocount * (g.rcount ? g.rcount : 1);
    bool par = g.ocount > 1 && work >= ND_PARALLEL_THRESHOLD;
#pragma omp parallel for num_threads(nd_cpu_threads()) if (par) schedule(static)
    for (int64_t i = 0; i < g.ocount; i++)
        reduce_one(&g, op, correction, out_base(&g, i), o + i * (int64_t)osz, odt);
    return ND_OK;
}

nd_status nd_cpu_max_dim(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                         int is_min) {
    bool reduced[ND_MAX_DIMS] = {0};
    reduced[dim] = true;
    geom g;
    geom_init(&g, x, reduced);
    nd_reduce_op op = is_min ? ND_REDUCE_argmin : ND_REDUCE_argmax;
    char *vo = nd_ptr(values);
    int64_t *io = (int64_t *)nd_ptr(indices);
    size_t vsz = nd_dtype_size(values->dtype);
    bool fl = x->dtype == ND_FLOAT32 || x->dtype == ND_FLOAT64;
    bool par = g.ocount > 1 && g.ocount * g.rcount >= ND_PARALLEL_THRESHOLD;
#pragma omp parallel for num_threads(nd_cpu_threads()) if (par) schedule(static)
    for (int64_t i = 0; i < g.ocount; i++) {
        rstate s;
        state_init(op, &s);
        walk(&g, op, &s, out_base(&g, i), 0);
        io[i] = s.best_i;
        char *v = vo + i * (int64_t)vsz;
        if (fl) nd_store_f64(v, values->dtype, s.acc);
        else if (values->dtype == ND_INT64) *(int64_t *)v = s.iacc;
        else if (values->dtype == ND_INT32) *(int32_t *)v = (int32_t)s.iacc;
        else *(uint8_t *)v = (uint8_t)s.iacc;
    }
    return ND_OK;
}
