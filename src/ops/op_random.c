/* op_random.c - the global random stream and the ops that draw from it.
 *
 * The stream is Philox4x32-10 keyed by a 64-bit seed (backend.h, cpu_philox.h).
 * A call that makes n values takes the next n counters, with the offset
 * rounded up to a multiple of 4 afterwards, so no two calls share a counter
 * and a result depends only on (seed, offset) and the call, never on the
 * thread count or the device. */
#include <math.h>
#include <stdatomic.h>
#include "backend_call.h"
#include "tensor.h"

#define ND_DEFAULT_SEED UINT64_C(0x5eed5eed5eed5eed)

static _Atomic uint64_t rng_seed = ND_DEFAULT_SEED;
static _Atomic uint64_t rng_offset = 0;

/* A thread's own stream (nd_rng_thread_local): a DataLoader worker seeds it
 * per batch; the process's stream above is never touched from there. */
static _Thread_local struct { bool on; uint64_t seed, offset; } own;

void nd_rng_thread_local(bool on) {
    if (on && !own.on) {
        own.seed = atomic_load(&rng_seed);
        own.offset = atomic_load(&rng_offset);
    }
    own.on = on;
}

void nd_manual_seed(uint64_t seed) {
    if (own.on) { own.seed = seed; own.offset = 0; return; }
    atomic_store(&rng_seed, seed);
    atomic_store(&rng_offset, 0);
}

void nd_rng_get_state(uint64_t *seed, uint64_t *offset) {
    if (seed) *seed = own.on ? own.seed : atomic_load(&rng_seed);
    if (offset) *offset = own.on ? own.offset : atomic_load(&rng_offset);
}

void nd_rng_set_state(uint64_t seed, uint64_t offset) {
    if (own.on) { own.seed = seed; own.offset = offset; return; }
    atomic_store(&rng_seed, seed);
    atomic_store(&rng_offset, offset);
}

/* Takes `count` counters from the stream. */
void nd_rng_reserve(int64_t count, uint64_t *seed, uint64_t *offset) {
    uint64_t n = ((uint64_t)count + 3) / 4 * 4;
    if (own.on) {
        *seed = own.seed;
        *offset = own.offset;
        own.offset += n;
        return;
    }
    *seed = atomic_load(&rng_seed);
    *offset = atomic_fetch_add(&rng_offset, n);
}

/* A new tensor of `shape` filled by the backend's random kernel. */
static nd_status random_new(const char *op, nd_device dev, const int64_t *shape, int ndim, nd_dtype dt,
                            nd_random_kind kind, double a, double b, const nd_tensor *p,
                            nd_tensor **out) {
    int64_t numel;
    *out = NULL;
    ND_TRY(nd_check_shape(op, shape, ndim, &numel));
    nd_tensor *t;
    ND_TRY(nd_empty_on(dev, shape, ndim, dt, &t));
    uint64_t seed, offset;
    nd_rng_reserve(numel, &seed, &offset);
    const nd_backend *be = nd_backend_of(t);
    nd_status st = ND_BACKEND_CALL(be, random, op, t, kind, a, b, p, seed, offset);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

static nd_status check_float(const char *op, nd_dtype dt) {
    if ((unsigned)dt >= ND_NUM_DTYPES || !nd_dtype_is_float(dt))
        return nd_fail(ND_ERR_DTYPE, "%s: dtype %s is not a floating point type (expected "
                       "float32, float64, float16 or bfloat16)", op, nd_dtype_name(dt));
    return ND_OK;
}

nd_status nd_rand_on(nd_device dev, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_float("rand", dt));
    return random_new("rand", dev, shape, ndim, dt, ND_RANDOM_UNIFORM, 0.0, 1.0, NULL, out);
}

nd_status nd_randn_on(nd_device dev, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_float("randn", dt));
    return random_new("randn", dev, shape, ndim, dt, ND_RANDOM_NORMAL, 0.0, 1.0, NULL, out);
}

nd_status nd_rand(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    return nd_rand_on(nd_cpu_device(), shape, ndim, dt, out);
}

nd_status nd_randn(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    return nd_randn_on(nd_cpu_device(), shape, ndim, dt, out);
}

/* Bounds travel to the kernel as doubles: keep them exact. */
#define RANDINT_LIMIT ((int64_t)1 << 53)

nd_status nd_randint(int64_t low, int64_t high, const int64_t *shape, int ndim, nd_dtype dt,
                     nd_tensor **out) {
    *out = NULL;
    if ((unsigned)dt >= ND_NUM_DTYPES)
        return nd_fail(ND_ERR_DTYPE, "randint: invalid dtype %d", (int)dt);
    if (low >= high)
        return nd_fail(ND_ERR_ARG, "randint: low (%lld) must be less than high (%lld)",
                       (long long)low, (long long)high);
    if (low < -RANDINT_LIMIT || high > RANDINT_LIMIT)
        return nd_fail(ND_ERR_ARG, "randint: bounds [%lld, %lld) must lie within [-2^53, 2^53]",
                       (long long)low, (long long)high);
    int64_t lo_min = -RANDINT_LIMIT, hi_max = RANDINT_LIMIT;
    switch (dt) {
    case ND_BOOL: lo_min = 0; hi_max = 2; break;
    case ND_UINT8: lo_min = 0; hi_max = 256; break;
    case ND_INT32: lo_min = INT32_MIN; hi_max = (int64_t)INT32_MAX + 1; break;
    case ND_FLOAT16: lo_min = -2048; hi_max = 2049; break;   /* exact integers only */
    case ND_BFLOAT16: lo_min = -256; hi_max = 257; break;
    case ND_FLOAT32: lo_min = -(1 << 24); hi_max = (1 << 24) + 1; break;
    default: break;
    }
    if (low < lo_min || high > hi_max)
        return nd_fail(ND_ERR_ARG, "randint: range [%lld, %lld) does not fit dtype %s (which "
                       "holds [%lld, %lld) exactly)", (long long)low, (long long)high,
                       nd_dtype_name(dt), (long long)lo_min, (long long)hi_max);
    return random_new("randint", nd_cpu_device(), shape, ndim, dt, ND_RANDOM_INT, (double)low, (double)high,
                      NULL, out);
}

/* Reads one reduction of p (min or max over everything) as a double. */
static nd_status reduce_item(nd_reduce_op op, const nd_tensor *p, double *v) {
    nd_tensor *r;
    ND_TRY(nd_reduce(op, p, NULL, 0, 0, 0, &r));
    int64_t zero[ND_MAX_DIMS] = {0};
    nd_status st = nd_get_item(r, zero, v);
    nd_release(r);
    return st;
}

/* The probabilities in [0, 1]: a host check (backend_call.h), so a compiled
 * call checks each replay's p as the eager call would. */
static nd_status check_probabilities(const char *op, nd_tensor *const *t, int64_t *iv) {
    (void)iv;
    double lo, hi;
    ND_TRY(reduce_item(ND_REDUCE_min, t[0], &lo));
    ND_TRY(reduce_item(ND_REDUCE_max, t[0], &hi));
    if (!(lo >= 0 && lo <= 1))
        return nd_fail(ND_ERR_ARG, "%s: probabilities must be in [0, 1], got %g", op, lo);
    if (!(hi >= 0 && hi <= 1))
        return nd_fail(ND_ERR_ARG, "%s: probabilities must be in [0, 1], got %g", op, hi);
    return ND_OK;
}

nd_status nd_bernoulli(const nd_tensor *p, nd_tensor **out) {
    *out = NULL;
    ND_TRY(check_float("bernoulli", p->dtype));
    if (nd_numel(p) > 0) { /* checked with reductions so any backend can run it */
        nd_tensor *t[1] = {(nd_tensor *)p};
        ND_TRY(nd_host_check("bernoulli", check_probabilities, t, 1, NULL, 0));
    }
    return random_new("bernoulli", nd_get_device(p), p->shape, p->ndim, p->dtype, ND_RANDOM_BERNOULLI, 0.0, 0.0,
                      p, out);
}

/* randperm draws n keys, uniform in [0, 2^53), and argsorts them (stable,
 * so equal keys keep their order: with n keys a tie has probability about
 * n^2 / 2^54, and then only those two positions keep their order). Works on
 * any device that can sort. */
nd_status nd_randperm(int64_t n, nd_tensor **out) {
    *out = NULL;
    if (n < 0) return nd_fail(ND_ERR_ARG, "randperm: n must be non-negative, got %lld",
                              (long long)n);
    nd_tensor *keys;
    ND_TRY(random_new("randperm", nd_cpu_device(), &n, 1, ND_INT64, ND_RANDOM_INT, 0.0, (double)RANDINT_LIMIT,
                      NULL, &keys));
    nd_status st = nd_sort(keys, 0, 0, NULL, out);
    nd_release(keys);
    return st;
}
