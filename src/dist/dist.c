#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
/* dist.c - nd.distributed's C half (needle.h, "distributed"): the world's
 * state, the argument and agreement checks, staging of tensors MPI cannot
 * read in place, bounded waits, and the world of one process (no launcher),
 * where every collective is local. The messages go through transport.h.
 *
 * Waiting is bounded by a watchdog thread rather than by polling: a blocking
 * call goes to MPI's blocking collective (its tuned algorithms, no polling
 * latency) with the watchdog armed; past the timeout the watchdog reports
 * which collective on which rank waited, and ends the process, and mpirun
 * then ends the job (MPI cannot cancel a collective, so the ranks could not
 * go on anyway; NCCL's watchdog in PyTorch does the same). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tensor.h"
#include "transport.h"

static struct {
    bool initialized, finalized, broken;
    int rank, size, local_rank, local_size;
} world = {.size = 1, .local_size = 1};
static _Atomic double timeout_s = 1800; /* the watchdog thread reads it */

static const char *const KIND_NAME[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                        "barrier"};
static const char *const OP_NAME[] = {"sum", "mean", "max", "min"};

struct nd_dist_work {
    nd_tx_kind kind;
    nd_dist_op op;
    nd_tx_req *req;      /* NULL: finished at start (a world of one) */
    bool done;
    nd_tensor *target;   /* all_reduce/broadcast: the user's tensor (written at the end) */
    nd_tensor *host;     /* the buffer MPI writes (target itself when it is usable as is) */
    nd_tensor *send;     /* all_gather/reduce_scatter: the host copy sent */
    nd_device device;    /* where results go */
};

bool nd_dist_available(void) { return nd_tx_available(); }

bool nd_dist_launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                       "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

bool nd_dist_initialized(void) { return world.initialized && !world.finalized; }
bool nd_dist_finalized(void) { return world.finalized; }
int nd_dist_rank(void) { return world.rank; }
int nd_dist_world_size(void) { return world.size; }
int nd_dist_local_rank(void) { return world.local_rank; }
int nd_dist_local_size(void) { return world.local_size; }
double nd_dist_timeout(void) { return atomic_load(&timeout_s); }
void nd_dist_set_timeout(double s) { atomic_store(&timeout_s, s > 0 && s == s ? s : 0); }

nd_status nd_dist_init(double seconds) {
    if (world.finalized)
        return nd_fail(ND_ERR_ARG, "distributed.init: called after finalize (MPI cannot start twice)");
    nd_dist_set_timeout(seconds);
    if (world.initialized) return ND_OK;
    if (nd_dist_launched()) {
        ND_TRY(nd_tx_init(&world.rank, &world.size, &world.local_rank, &world.local_size));
    }
    world.initialized = true;
    return ND_OK;
}

static nd_status need_init(const char *what) {
    if (world.finalized) return nd_fail(ND_ERR_ARG, "distributed.%s: called after finalize", what);
    if (!world.initialized)
        return nd_fail(ND_ERR_ARG, "distributed.%s: call nd.distributed.init() first", what);
    if (world.broken)
        return nd_fail(ND_ERR_ARG, "distributed.%s: an earlier collective failed or timed out, "
                       "so the ranks are out of step; end the job", what);
    return ND_OK;
}

/* ---- the watchdog ----
 * Arming is two atomic stores (a collective of a few microseconds must not
 * pay for a lock or a wake-up); the thread looks every tenth of the timeout
 * (10 ms .. 1 s) and fires when one armed call has lasted longer than it. */
static atomic_bool wd_armed;
static atomic_uint wd_generation;
static _Atomic double wd_since;
static const char *_Atomic wd_what;
static bool wd_started;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *watchdog(void *arg) {
    (void)arg;
    unsigned seen = 0;
    double seen_since = 0;
    for (;;) {
        double timeout = atomic_load(&timeout_s);
        double poll = timeout > 0 ? fmin(fmax(timeout / 10, 0.01), 1.0) : 1.0;
        struct timespec ts = {(time_t)poll, (long)((poll - floor(poll)) * 1e9)};
        nanosleep(&ts, NULL);
        if (timeout <= 0 || !atomic_load(&wd_armed)) continue;
        unsigned gen = atomic_load(&wd_generation);
        double since = atomic_load(&wd_since);
        if (gen != seen) { /* another call since the last look */
            seen = gen;
            seen_since = since;
        }
        if (atomic_load(&wd_armed) && atomic_load(&wd_generation) == seen &&
            now() - seen_since > timeout) {
            fprintf(stderr, "needle: distributed.%s: timed out after %g s on rank %d of %d waiting for "
                    "the other ranks (one may have died, hung, or be in a different collective); "
                    "ending this process so that mpirun ends the job (the timeout is "
                    "nd.distributed.init{timeout = seconds})\n", atomic_load(&wd_what), timeout,
                    world.rank, world.size);
            fflush(stderr);
            _Exit(EXIT_FAILURE);
        }
    }
    return NULL;
}

static void arm(const char *what) {
    if (atomic_load(&timeout_s) <= 0) return;
    if (!wd_started) {
        pthread_t th;
        pthread_attr_t ta;
        pthread_attr_init(&ta);
        pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
        wd_started = pthread_create(&th, &ta, watchdog, NULL) == 0;
        pthread_attr_destroy(&ta);
    }
    atomic_store(&wd_what, what);
    atomic_store(&wd_since, now());
    atomic_fetch_add(&wd_generation, 1);
    atomic_store(&wd_armed, true);
}

static void disarm(void) { atomic_store(&wd_armed, false); }

/* the call, blocking, under the watchdog */
static nd_status run_call(const nd_tx_call *c, const char *what) {
    arm(what);
    nd_status st = nd_tx_run(c);
    disarm();
    if (st != ND_OK) world.broken = true;
    return st;
}

static nd_status wait_req(nd_tx_req *r, const char *what) {
    arm(what);
    int rc = nd_tx_wait(r);
    disarm();
    if (rc < 0) {
        world.broken = true;
        return ND_ERR_IO;
    }
    return ND_OK;
}

/* ---- agreement: every rank says what it is about to do ---- */
enum { META_KIND, META_OP, META_ROOT, META_DTYPE, META_DEVICE, META_NDIM, META_SHAPE, META_LEN = META_SHAPE + ND_MAX_DIMS };

/* Another rank's words are checked before use: a rank that made a call
 * without the agreement check may have sent anything here. */
static bool meta_sane(const int64_t *m) {
    if (m[META_KIND] < 0 || m[META_KIND] > ND_TX_BARRIER || m[META_OP] < 0 || m[META_OP] > ND_DIST_MIN ||
        m[META_DTYPE] < 0 || m[META_DTYPE] >= ND_NUM_DTYPES || m[META_NDIM] < 0 ||
        m[META_NDIM] > ND_MAX_DIMS)
        return false;
    for (int d = 0; d < m[META_NDIM]; d++)
        if (m[META_SHAPE + d] < 0) return false;
    return true;
}

static void describe(const int64_t *m, char *buf, size_t n) {
    char sb[ND_SHAPE_BUF];
    if (!meta_sane(m)) {
        snprintf(buf, n, "something else (a collective without the agreement check?)");
        return;
    }
    int len = snprintf(buf, n, "%s", KIND_NAME[m[META_KIND]]);
    if (m[META_KIND] == ND_TX_BARRIER) return;
    len += snprintf(buf + len, n - (size_t)len, " of %s %s", nd_dtype_name((nd_dtype)m[META_DTYPE]),
                    nd_shape_str(m + META_SHAPE, (int)m[META_NDIM], sb));
    if (m[META_KIND] == ND_TX_ALL_REDUCE || m[META_KIND] == ND_TX_REDUCE_SCATTER)
        snprintf(buf + len, n - (size_t)len, " (%s)", OP_NAME[m[META_OP]]);
    else if (m[META_KIND] == ND_TX_BROADCAST)
        snprintf(buf + len, n - (size_t)len, " from rank %lld", (long long)m[META_ROOT]);
}

static nd_status agree(nd_tx_kind kind, nd_dist_op op, int root, const nd_tensor *t) {
    int64_t mine[META_LEN] = {0};
    mine[META_KIND] = kind;
    mine[META_OP] = op;
    mine[META_ROOT] = root;
    if (t) {
        mine[META_DTYPE] = t->dtype;
        mine[META_NDIM] = t->ndim;
        for (int d = 0; d < t->ndim; d++) mine[META_SHAPE + d] = t->shape[d];
    }
    int64_t *all = malloc(sizeof(int64_t) * META_LEN * (size_t)world.size);
    if (!all) return nd_fail(ND_ERR_MEMORY, "distributed.%s: out of memory", KIND_NAME[kind]);
    nd_tx_call c = {.kind = ND_TX_ALL_GATHER, .send = mine, .recv = all, .count = META_LEN,
                    .dtype = ND_INT64};
    nd_status st = run_call(&c, KIND_NAME[kind]);
    if (st != ND_OK) {
        free(all);
        return st;
    }
    for (int k = 1; k < world.size; k++) {
        const int64_t *m = all + (size_t)k * META_LEN;
        bool same = memcmp(m, all, sizeof(int64_t) * META_LEN) == 0;
        /* broadcast: the same shape and dtype, and one root */
        if (same) continue;
        char a[300], b[300];
        describe(all, a, sizeof a);
        describe(m, b, sizeof b);
        free(all);
        return nd_fail(ND_ERR_SHAPE, "distributed.%s: the ranks disagree: rank 0 called %s, rank "
                       "%d called %s (every rank must make the same collective calls, on tensors of "
                       "one shape and dtype)", KIND_NAME[kind], a, k, b);
    }
    free(all);
    return ND_OK;
}

/* ---- checks on the arguments ---- */
static nd_status check_op(const char *what, nd_dist_op op, nd_dtype dt) {
    if ((int)op < 0 || op > ND_DIST_MIN)
        return nd_fail(ND_ERR_ARG, "distributed.%s: unknown reduction %d", what, (int)op);
    if (op == ND_DIST_MEAN && !nd_dtype_is_float(dt) && dt != ND_FLOAT16 && dt != ND_BFLOAT16)
        return nd_fail(ND_ERR_DTYPE, "distributed.%s: op 'mean' needs a floating-point tensor, got "
                       "%s (use 'sum' and divide)", what, nd_dtype_name(dt));
    return ND_OK;
}

static nd_status check_tensor(const char *what, const nd_tensor *t) {
    if (!t) return nd_fail(ND_ERR_ARG, "distributed.%s: expected a tensor", what);
    if (t->dtype >= ND_NUM_DTYPES)
        return nd_fail(ND_ERR_DTYPE, "distributed.%s: unsupported dtype", what);
    return ND_OK;
}

/* A contiguous host tensor holding t's values: t itself (a new reference)
 * when MPI can use it as is and fresh is false, else a copy. */
static nd_status host_copy(const nd_tensor *t, bool fresh, nd_tensor **out) {
    nd_device cpu = nd_cpu_device();
    if (nd_get_device(t).type == ND_DEVICE_CPU && nd_is_contiguous(t) && !fresh) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    nd_tensor *c;
    ND_TRY(nd_empty(t->shape, t->ndim, t->dtype, &c));
    nd_tensor *src = NULL;
    nd_status st = nd_get_device(t).type == ND_DEVICE_CPU ? ND_OK : nd_to_device(t, cpu, &src);
    if (st == ND_OK) st = nd_copy_(c, src ? src : t);
    nd_release(src);
    if (st != ND_OK) { nd_release(c); return st; }
    *out = c;
    return ND_OK;
}

static void divide(nd_tensor *t, double n) {
    int64_t k = nd_numel(t);
    void *p = nd_data(t);
    switch (t->dtype) {
    case ND_FLOAT32: for (int64_t i = 0; i < k; i++) ((float *)p)[i] /= (float)n; break;
    case ND_FLOAT64: for (int64_t i = 0; i < k; i++) ((double *)p)[i] /= n; break;
    case ND_FLOAT16:
        for (int64_t i = 0; i < k; i++) {
            uint16_t *h = (uint16_t *)p + i;
            *h = nd_float_to_half(nd_half_to_float(*h) / (float)n);
        }
        break;
    case ND_BFLOAT16:
        for (int64_t i = 0; i < k; i++) {
            uint16_t *h = (uint16_t *)p + i;
            *h = nd_float_to_bf16(nd_bf16_to_float(*h) / (float)n);
        }
        break;
    default: break;
    }
}

/* what happens once the messages are through: the mean's division, the copy
 * back into a staged tensor, results moved to the tensor's device */
static nd_status finish(nd_dist_work *w) {
    if (w->done) return ND_OK;
    w->done = true;
    if (w->op == ND_DIST_MEAN && world.size > 1) divide(w->host, world.size);
    if (w->target && w->host == w->target) {
        nd_bump_version(w->target); /* MPI wrote it in place: autograd must know */
    } else if (w->target && w->host) {
        /* the collectives are not recorded: their in-place writes are data */
        bool grad = nd_set_grad_enabled(false);
        nd_status st = nd_copy_(w->target, w->host);
        nd_set_grad_enabled(grad);
        ND_TRY(st);
    }
    if (!w->target && w->host && w->device.type != ND_DEVICE_CPU) {
        nd_tensor *moved;
        ND_TRY(nd_to_device(w->host, w->device, &moved));
        nd_release(w->host);
        w->host = moved;
    }
    return ND_OK;
}

/* blocking: the call now; async: a request in flight */
static nd_status start(nd_dist_work *w, const nd_tx_call *c, bool async) {
    if (world.size == 1) return ND_OK;
    if (!async) return run_call(c, KIND_NAME[w->kind]);
    nd_status st = nd_tx_start(c, &w->req);
    if (st != ND_OK) world.broken = true;
    return st;
}

/* hands the work to the caller, or waits for it and frees it */
static nd_status deliver(nd_dist_work *w, nd_status st, nd_tensor **out, nd_dist_work **work) {
    if (st == ND_OK && !work) st = nd_dist_wait(w);
    if (st != ND_OK) {
        nd_dist_free(w);
        return st;
    }
    if (work) {
        *work = w;
        return ND_OK;
    }
    if (out) *out = nd_dist_result(w);
    nd_dist_free(w);
    return ND_OK;
}

static nd_dist_work *new_work(nd_tx_kind kind, nd_dist_op op, const nd_tensor *t) {
    nd_dist_work *w = calloc(1, sizeof *w);
    if (!w) {
        nd_fail(ND_ERR_MEMORY, "distributed.%s: out of memory", KIND_NAME[kind]);
        return NULL;
    }
    w->kind = kind;
    w->op = op;
    w->device = t ? nd_get_device(t) : nd_cpu_device();
    return w;
}

nd_status nd_dist_all_reduce(nd_tensor *t, nd_dist_op op, bool check, nd_dist_work **work) {
    return nd_dist_all_reduce_on(t, op, check, 0, work);
}

nd_status nd_dist_all_reduce_on(nd_tensor *t, nd_dist_op op, bool check, int channel,
                                nd_dist_work **work) {
    const char *what = "all_reduce";
    if (channel != 0 && channel != 1)
        return nd_fail(ND_ERR_ARG, "distributed.all_reduce: channel %d does not exist (0: default, "
                       "1: gradients)", channel);
    ND_TRY(need_init(what));
    ND_TRY(check_tensor(what, t));
    ND_TRY(check_op(what, op, t->dtype));
    if (check && world.size > 1) ND_TRY(agree(ND_TX_ALL_REDUCE, op, 0, t));
    nd_dist_work *w = new_work(ND_TX_ALL_REDUCE, op, t);
    if (!w) return ND_ERR_MEMORY;
    nd_retain(t);
    w->target = t;
    nd_status st = world.size > 1 ? host_copy(t, false, &w->host) : ND_OK;
    if (st == ND_OK && world.size > 1) {
        nd_tx_call c = {.kind = ND_TX_ALL_REDUCE, .recv = nd_data(w->host), .count = nd_numel(t),
                        .dtype = t->dtype, .op = op == ND_DIST_MEAN ? ND_DIST_SUM : op,
                        .channel = channel};
        st = start(w, &c, work != NULL);
    }
    return deliver(w, st, NULL, work);
}

nd_status nd_dist_broadcast(nd_tensor *t, int root, bool check, nd_dist_work **work) {
    const char *what = "broadcast";
    ND_TRY(need_init(what));
    ND_TRY(check_tensor(what, t));
    if (root < 0 || root >= world.size)
        return nd_fail(ND_ERR_INDEX, "distributed.broadcast: root rank %d out of range (ranks are "
                       "0..%d)", root, world.size - 1);
    if (check && world.size > 1) ND_TRY(agree(ND_TX_BROADCAST, ND_DIST_SUM, root, t));
    nd_dist_work *w = new_work(ND_TX_BROADCAST, ND_DIST_SUM, t);
    if (!w) return ND_ERR_MEMORY;
    nd_retain(t);
    w->target = t;
    nd_status st = world.size > 1 ? host_copy(t, false, &w->host) : ND_OK;
    if (st == ND_OK && world.size > 1) {
        nd_tx_call c = {.kind = ND_TX_BROADCAST, .recv = nd_data(w->host), .count = nd_numel(t),
                        .dtype = t->dtype, .root = root};
        st = start(w, &c, work != NULL);
    }
    return deliver(w, st, NULL, work);
}

nd_status nd_dist_all_gather(const nd_tensor *t, bool check, nd_tensor **out, nd_dist_work **work) {
    const char *what = "all_gather";
    ND_TRY(need_init(what));
    ND_TRY(check_tensor(what, t));
    if (t->ndim >= ND_MAX_DIMS)
        return nd_fail(ND_ERR_SHAPE, "distributed.all_gather: a tensor of %d dims gathers into %d, "
                       "more than the %d a tensor has", t->ndim, t->ndim + 1, ND_MAX_DIMS);
    if (check && world.size > 1) ND_TRY(agree(ND_TX_ALL_GATHER, ND_DIST_SUM, 0, t));
    nd_dist_work *w = new_work(ND_TX_ALL_GATHER, ND_DIST_SUM, t);
    if (!w) return ND_ERR_MEMORY;
    int64_t shape[ND_MAX_DIMS];
    shape[0] = world.size;
    memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    nd_status st = host_copy(t, false, &w->send);
    if (st == ND_OK) st = nd_empty(shape, t->ndim + 1, t->dtype, &w->host);
    if (st == ND_OK && world.size == 1) st = nd_copy_to_buffer(w->send, nd_data(w->host),
                                                              nd_numel(t) * nd_dtype_size(t->dtype));
    if (st == ND_OK) {
        nd_tx_call c = {.kind = ND_TX_ALL_GATHER, .send = nd_data(w->send), .recv = nd_data(w->host),
                        .count = nd_numel(t), .dtype = t->dtype};
        st = start(w, &c, work != NULL);
    }
    return deliver(w, st, out, work);
}

nd_status nd_dist_reduce_scatter(const nd_tensor *t, nd_dist_op op, bool check, nd_tensor **out,
                                 nd_dist_work **work) {
    const char *what = "reduce_scatter";
    ND_TRY(need_init(what));
    ND_TRY(check_tensor(what, t));
    ND_TRY(check_op(what, op, t->dtype));
    if (t->ndim < 1 || t->shape[0] % world.size != 0) {
        char sb[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "distributed.reduce_scatter: the first dim must be a multiple "
                       "of the world size %d, got shape %s", world.size, nd_shape_str(t->shape, t->ndim, sb));
    }
    if (check && world.size > 1) ND_TRY(agree(ND_TX_REDUCE_SCATTER, op, 0, t));
    nd_dist_work *w = new_work(ND_TX_REDUCE_SCATTER, op, t);
    if (!w) return ND_ERR_MEMORY;
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[0] /= world.size;
    nd_status st = ND_OK;
    if (world.size == 1) {
        st = host_copy(t, true, &w->host); /* the result is this rank's block: all of it */
    } else {
        st = host_copy(t, false, &w->send);
        if (st == ND_OK) st = nd_empty(shape, t->ndim, t->dtype, &w->host);
        if (st == ND_OK) {
            nd_tx_call c = {.kind = ND_TX_REDUCE_SCATTER, .send = nd_data(w->send),
                            .recv = nd_data(w->host), .count = nd_numel(w->host), .dtype = t->dtype,
                            .op = op == ND_DIST_MEAN ? ND_DIST_SUM : op};
            st = start(w, &c, work != NULL);
        }
    }
    return deliver(w, st, out, work);
}

nd_status nd_dist_barrier(void) {
    ND_TRY(need_init("barrier"));
    if (world.size == 1) return ND_OK;
    ND_TRY(agree(ND_TX_BARRIER, ND_DIST_SUM, 0, NULL));
    nd_dist_work *w = new_work(ND_TX_BARRIER, ND_DIST_SUM, NULL);
    if (!w) return ND_ERR_MEMORY;
    nd_tx_call c = {.kind = ND_TX_BARRIER};
    return deliver(w, start(w, &c, false), NULL, NULL);
}

bool nd_dist_test(nd_dist_work *w, nd_status *st) {
    *st = ND_OK;
    if (w->done) return true;
    if (w->req) {
        int d = nd_tx_test(w->req);
        if (d < 0) {
            world.broken = true;
            *st = ND_ERR_IO;
            return true;
        }
        if (d == 0) return false;
        nd_tx_free(w->req);
        w->req = NULL;
    }
    *st = finish(w);
    return true;
}

nd_status nd_dist_wait(nd_dist_work *w) {
    if (w->done) return ND_OK;
    if (w->req) {
        ND_TRY(wait_req(w->req, KIND_NAME[w->kind]));
        nd_tx_free(w->req);
        w->req = NULL;
    }
    return finish(w);
}

nd_tensor *nd_dist_result(nd_dist_work *w) {
    nd_tensor *r = w->target ? w->target : w->host;
    if (!r || !w->done) return NULL;
    nd_retain(r);
    return r;
}

void nd_dist_free(nd_dist_work *w) {
    if (!w) return;
    if (w->req) {
        /* a handle dropped before its wait: MPI may still be writing the
         * buffers, so wait for it first (bounded by the watchdog); if that
         * fails, the buffers must stay and the ranks are out of step */
        if (world.broken || wait_req(w->req, KIND_NAME[w->kind]) != ND_OK) {
            world.broken = true;
            return;
        }
        nd_tx_free(w->req);
        w->req = NULL;
    }
    nd_release(w->target);
    nd_release(w->host);
    nd_release(w->send);
    free(w);
}

nd_status nd_dist_finalize(void) {
    if (!world.initialized || world.finalized) {
        world.finalized = world.finalized || world.initialized;
        return ND_OK;
    }
    world.finalized = true;
    if (world.size == 1 && !nd_dist_launched()) return ND_OK;
    arm("finalize"); /* MPI_Finalize waits for every rank */
    nd_status st = nd_tx_finalize();
    disarm();
    return st;
}

void nd_dist_abort(int code) {
    if (world.initialized && nd_dist_launched() && nd_tx_available()) nd_tx_abort(code);
}
