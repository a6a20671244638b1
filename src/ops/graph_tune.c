/* graph_tune.c - autotuning of a compiled graph's fused kernels
 * (nd.compile's opts.tune; nd_graph_tune).
 *
 * Each fused_elementwise record has two knobs (nd_ew_program): a size (CPU:
 * elements per tile; OpenCL: work-group size) and, on the CPU, whether it
 * runs on one thread. The tuner times the candidates of each kernel within
 * a share of the time budget and keeps the fastest (when at least 5%
 * faster than the default) whose results are exactly the default's (the arithmetic does not depend on the knobs, so a
 * difference is a bug: that candidate is refused). Writes the record makes
 * are undone after every run (a fused optimizer update must not step the
 * parameters while being timed).
 *
 * Products (matmul, matmul_acc, linear_fused) on a backend that takes
 * GEMM hints (the CPU's; backend.h gemm_hint) are tuned the same way over
 * their work split: at most one thread, rows per block of A, which panel
 * stays in cache, and whether threads cut row blocks into column ranges.
 * None of these changes a sum's order, so here too a candidate whose
 * results differ by a bit is refused. The fastest candidates' fields are
 * also tried together.
 *
 * Choices persist in <cache>/compile/tune.txt (nd_cache_dir), one line per
 * kernel: a 64-bit key over the device (backend, OpenCL device name, vendor
 * and driver; CPU thread count), the program's steps (a product: its entry,
 * activation and the float32 matmul precision) and its tensors' geometry,
 * then the size and the serial flag, or for a product "gemm" and the
 * hint's four fields. The file is untrusted input: every line is checked
 * and a bad one ignored. Written atomically (a temporary file, then
 * rename). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "graph_internal.h"

#define FILE_HEADER "needle-compile-tune 1"
#define MAX_ENTRIES 65536
#define MIN_SIZE 16
#define MAX_SIZE 65536

#define MAX_HINT_THREADS 4096
#define MAX_HINT_MC 8192

/* A choice: a fused kernel's size and thread flag, or a product's hint */
typedef struct {
    int32_t size;
    bool serial;
    bool gemm;
    nd_gemm_hint hint;
} knob;

typedef struct { uint64_t key; knob k; } tune_entry;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= UINT64_C(0x100000001b3); }
    return h;
}
#define FNV(h, v) fnv_bytes((h), &(v), sizeof(v))

static uint64_t record_key(const nd_graph_rec *r) {
    const nd_ew_program *p = r->prog;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv_bytes(h, r->be->name, strlen(r->be->name));
    const nd_tensor *t0 = r->t[0];
    if (t0->storage->device == ND_DEVICE_OPENCL) {
        nd_opencl_info info;
        if (nd_opencl_device_info(t0->storage->device_index, &info) == ND_OK) {
            h = fnv_bytes(h, info.name, strlen(info.name));
            h = fnv_bytes(h, info.vendor, strlen(info.vendor));
            h = fnv_bytes(h, info.driver, strlen(info.driver));
        }
    } else {
        int threads = nd_get_num_threads();
        h = FNV(h, threads);
    }
    if (!p) { /* a product: its entry, activation and precision say which kernel runs */
        int e = (int)r->entry, prec = (int)nd_get_float32_matmul_precision();
        int64_t act = r->entry == ND_CALL_linear_fused ? r->i[0] : 0;
        h = FNV(h, e);
        h = FNV(h, act);
        h = FNV(h, prec);
    }
    if (p) {
        h = FNV(h, p->nt);
        h = FNV(h, p->nsteps);
        int dt = (int)p->dtype;
        h = FNV(h, dt);
    }
    for (int j = 0; p && j < p->nsteps; j++) { /* field by field: no padding bytes */
        const nd_ew_step *s = &p->steps[j];
        h = FNV(h, s->kind);
        h = FNV(h, s->op);
        h = FNV(h, s->dtype);
        h = FNV(h, s->store);
        h = fnv_bytes(h, s->in, sizeof s->in);
        h = FNV(h, s->lo);
        h = FNV(h, s->hi);
        h = fnv_bytes(h, s->scalar, sizeof s->scalar);
    }
    for (int k = 0; k < r->nt; k++) {
        const nd_tensor *t = r->t[k];
        if (!t) { /* a product's missing bias or residual */
            int none = -1;
            h = FNV(h, none);
            continue;
        }
        int tdt = (int)t->dtype, nd = t->ndim;
        h = FNV(h, tdt);
        h = FNV(h, nd);
        h = fnv_bytes(h, t->shape, sizeof(int64_t) * (size_t)nd);
        h = fnv_bytes(h, t->strides, sizeof(int64_t) * (size_t)nd);
        /* not the offset: the same kernel at another place of the memory plan's arena */
    }
    return h;
}

/* ---------------------------------------------------------------- the file */

static bool tune_path(char *out, size_t n) {
    char dir[1024];
    if (!nd_cache_dir("compile", dir, sizeof dir)) return false;
    return snprintf(out, n, "%s/tune.txt", dir) < (int)n;
}

/* One line's choice, or false when the line is not exactly "<16 hex
 * digits> <size> <0|1>" or "<16 hex digits> gemm <threads> <mc> <order>
 * <split>" with every field in its range. */
static bool parse_line(const char *line, tune_entry *e) {
    unsigned long long key;
    int a, b, c, d, used = 0;
    if (strlen(line) < 20 || line[16] != ' ') return false;
    memset(e, 0, sizeof *e);
    if (sscanf(line, "%16llx gemm %d %d %d %d%n", &key, &a, &b, &c, &d, &used) == 5 && used > 0) {
        if (line[used] != '\n' && line[used] != 0) return false;
        if (a < 0 || a > MAX_HINT_THREADS || b < 0 || b > MAX_HINT_MC || c < 0 || c > 2 || d < 0 || d > 2)
            return false;
        e->k.gemm = true;
        e->k.hint = (nd_gemm_hint){a, b, c, d};
    } else {
        used = 0;
        if (sscanf(line, "%16llx %d %d%n", &key, &a, &b, &used) != 3) return false;
        if (line[used] != '\n' && line[used] != 0) return false;
        if (a < 0 || a > MAX_SIZE || (a > 0 && a < MIN_SIZE) || (b != 0 && b != 1)) return false;
        e->k.size = a;
        e->k.serial = b != 0;
    }
    e->key = key;
    return true;
}

static int print_entry(FILE *f, const tune_entry *e) {
    const nd_gemm_hint *h = &e->k.hint;
    if (e->k.gemm)
        return fprintf(f, "%016llx gemm %d %d %d %d\n", (unsigned long long)e->key, h->threads, h->mc, h->order,
                       h->split);
    return fprintf(f, "%016llx %d %d\n", (unsigned long long)e->key, e->k.size, e->k.serial ? 1 : 0);
}

/* The entries of the file (none when it is missing or unreadable); lines
 * parse_line refuses are skipped. */
static size_t load_entries(const char *path, tune_entry **out) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t n = 0, cap = 0;
    tune_entry *es = NULL;
    bool header = fgets(line, sizeof line, f) && strncmp(line, FILE_HEADER, strlen(FILE_HEADER)) == 0 &&
                  (line[strlen(FILE_HEADER)] == '\n' || line[strlen(FILE_HEADER)] == 0);
    while (header && n < MAX_ENTRIES && fgets(line, sizeof line, f)) {
        tune_entry e;
        if (!parse_line(line, &e)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            tune_entry *ne = realloc(es, nc * sizeof *ne);
            if (!ne) break;
            es = ne;
            cap = nc;
        }
        es[n++] = e;
    }
    fclose(f);
    *out = es;
    return n;
}

static const tune_entry *find_entry(const tune_entry *es, size_t n, uint64_t key) {
    for (size_t i = n; i-- > 0;) /* the last line of a key wins */
        if (es[i].key == key) return &es[i];
    return NULL;
}

static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;

/* Adds the new choices to the file (read again now: another process may
 * have written it since) and replaces it atomically. */
static void save_entries(const char *path, const tune_entry *add, size_t nadd) {
    if (!nadd) return;
    pthread_mutex_lock(&file_lock);
    tune_entry *old;
    size_t nold = load_entries(path, &old);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL;
    if (ok) {
        ok = fprintf(f, "%s\n", FILE_HEADER) > 0;
        /* the oldest lines go when the file would outgrow what load_entries reads */
        size_t keep_from = nold + nadd > MAX_ENTRIES ? nold + nadd - MAX_ENTRIES : 0;
        for (size_t i = keep_from; i < nold && ok; i++) {
            bool replaced = false;
            for (size_t j = 0; j < nadd && !replaced; j++) replaced = add[j].key == old[i].key;
            if (!replaced) ok = print_entry(f, &old[i]) > 0;
        }
        for (size_t j = 0; j < nadd && ok; j++) ok = print_entry(f, &add[j]) > 0;
        ok = fclose(f) == 0 && ok;
    }
    if (!ok || rename(tmp, path) != 0) remove(tmp);
    free(old);
    pthread_mutex_unlock(&file_lock);
}

/* ---------------------------------------------------------------- timing */

static const knob cpu_knobs[] = {{0, false}, {0, true}, {256, false}, {256, true}, {4096, false},
                                 {4096, true}, {16384, false}};
static const knob ocl_knobs[] = {{0, false}, {32, false}, {64, false}, {128, false}, {512, false},
                                 {1024, false}};
/* a product's: the default, then one field at a time (the fastest of them
 * together are tried after) */
static const knob gemm_knobs[] = {
    {.gemm = true}, {.gemm = true, .hint = {.threads = 1}}, {.gemm = true, .hint = {.mc = 96}},
    {.gemm = true, .hint = {.mc = 384}}, {.gemm = true, .hint = {.order = 1}}, {.gemm = true, .hint = {.order = 2}},
    {.gemm = true, .hint = {.split = 1}}, {.gemm = true, .hint = {.split = 2}}};

static bool tunable(const nd_graph_rec *r) {
    return r->entry == ND_CALL_fused_elementwise || nd_graph_rec_gemm(r);
}

static void apply_knob(nd_graph_rec *r, const knob *c) {
    if (r->entry == ND_CALL_fused_elementwise) {
        r->prog->tune_size = c->gemm ? 0 : c->size;
        r->prog->tune_serial = !c->gemm && c->serial;
    } else {
        memset(&r->hint, 0, sizeof r->hint);
        if (c->gemm) r->hint = c->hint;
    }
}

static bool same_knob(const knob *a, const knob *b) {
    return a->size == b->size && a->serial == b->serial && a->gemm == b->gemm && a->hint.threads == b->hint.threads &&
           a->hint.mc == b->hint.mc && a->hint.order == b->hint.order && a->hint.split == b->hint.split;
}

/* The fields candidates set, together (a later one's over an earlier's) */
static void merge_hint(nd_gemm_hint *into, const nd_gemm_hint *h) {
    if (h->threads) into->threads = h->threads;
    if (h->mc) into->mc = h->mc;
    if (h->order) into->order = h->order;
    if (h->split) into->split = h->split;
}

static nd_status sync_of(const nd_graph_rec *r) { return nd_synchronize(nd_get_device(r->t[0])); }

/* The record's written tensors as they are now (saved[k] for each written
 * slot k, else NULL); restore puts them back. */
static nd_status save_writes(const nd_graph_rec *r, nd_tensor **saved) {
    for (int k = 0; k < r->nt; k++) {
        saved[k] = NULL;
        if (r->role[k] & ND_ROLE_WRITE) ND_TRY(nd_clone(r->t[k], &saved[k]));
    }
    return ND_OK;
}

static nd_status restore_writes(const nd_graph_rec *r, nd_tensor *const *saved) {
    for (int k = 0; k < r->nt; k++)
        if (saved[k]) ND_TRY(nd_copy_(r->t[k], saved[k]));
    return ND_OK;
}

/* Whether the written tensors equal ref (byte for byte, on the host). */
static nd_status same_writes(const nd_graph_rec *r, nd_tensor *const *ref, bool *same) {
    *same = true;
    for (int k = 0; k < r->nt && *same; k++) {
        if (!ref[k]) continue;
        size_t bytes = (size_t)nd_numel(ref[k]) * nd_dtype_size(ref[k]->dtype);
        unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
        nd_status st = a && b ? ND_OK : nd_fail(ND_ERR_MEMORY, "compile: out of memory tuning");
        if (st == ND_OK) st = nd_copy_to_buffer(ref[k], a, bytes);
        if (st == ND_OK) st = nd_copy_to_buffer(r->t[k], b, bytes);
        if (st == ND_OK) *same = memcmp(a, b, bytes) == 0;
        free(a);
        free(b);
        ND_TRY(st);
    }
    return ND_OK;
}

static void free_all(nd_tensor **ts, int n) {
    for (int k = 0; k < n; k++) { nd_release(ts[k]); ts[k] = NULL; }
}

/* Times knob c on r (the median of up to 15 runs within budget seconds, at
 * least 3); each run starts from the saved state. */
static nd_status time_knob(nd_graph_rec *r, knob c, nd_tensor *const *saved, double budget,
                           double *secs) {
    apply_knob(r, &c);
    double ts[15];
    int n = 0;
    double start = now_s();
    while (n < 15 && (n < 3 || now_s() - start < budget)) {
        ND_TRY(restore_writes(r, saved));
        ND_TRY(sync_of(r));
        double t0 = now_s();
        ND_TRY(nd_graph_rec_replay(r));
        ND_TRY(sync_of(r));
        ts[n++] = now_s() - t0;
    }
    for (int i = 1; i < n; i++) /* insertion sort: n <= 15 */
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
            double t = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = t;
        }
    *secs = ts[n / 2];
    return ND_OK;
}

/* Tunes one record: its best knob within budget seconds; *speedup the
 * default's time over the best's. The record's tensors end as they were. */
static nd_status tune_record(nd_graph_rec *r, double budget, knob *best, double *speedup) {
    bool cpu = r->t[0]->storage->device == ND_DEVICE_CPU, gemm = nd_graph_rec_gemm(r);
    const knob *table = gemm ? gemm_knobs : cpu ? cpu_knobs : ocl_knobs;
    int nk = gemm  ? (int)(sizeof gemm_knobs / sizeof *gemm_knobs)
             : cpu ? (int)(sizeof cpu_knobs / sizeof *cpu_knobs)
                   : (int)(sizeof ocl_knobs / sizeof *ocl_knobs);
    knob ks[16]; /* the table, and for a product the winners' fields together */
    /* on one thread, "at most one thread" and the thread splits are the default itself */
    bool one_thread = nd_get_num_threads() <= 1;
    int kept = 0;
    for (int c = 0; c < nk; c++)
        if (!(c > 0 && gemm && one_thread && (table[c].hint.threads || table[c].hint.split))) ks[kept++] = table[c];
    nk = kept;
    const int ntable = nk;
    knob together = {.gemm = true};
    int winners = 0;
    nd_tensor *saved[ND_REC_MAX_TENSORS] = {0}, *ref[ND_REC_MAX_TENSORS] = {0};
    nd_status st = save_writes(r, saved);
    double base = 0, best_t = INFINITY;
    *best = ks[0];
    for (int c = 0; c < nk && st == ND_OK; c++) {
        double t;
        st = time_knob(r, ks[c], saved, budget / (ntable + 1), &t);
        if (st != ND_OK) { /* a knob the device refuses (work-group size): not a candidate */
            if (c == 0) break;
            st = ND_OK;
            continue;
        }
        if (c == 0) {
            base = t;
            for (int k = 0; k < r->nt && st == ND_OK; k++)
                if (saved[k]) st = nd_clone(r->t[k], &ref[k]);
        } else {
            bool same;
            st = same_writes(r, ref, &same);
            if (st != ND_OK || !same) continue; /* a different result: refused */
        }
        /* another choice only when clearly faster: timings of microsecond kernels are noisy */
        if (c == 0 || t < 0.95 * base) {
            if (t < best_t) {
                best_t = t;
                *best = ks[c];
            }
            if (gemm && c > 0 && c < ntable) {
                merge_hint(&together.hint, &ks[c].hint);
                winners++;
            }
        }
        if (c == ntable - 1 && winners > 1) ks[nk++] = together;
    }
    /* a winner must win again, timed right after the default: one lucky
     * median among many candidates is noise, not speed */
    if (st == ND_OK && isfinite(best_t) && !same_knob(best, &ks[0])) {
        double again_base, again_best;
        st = time_knob(r, ks[0], saved, budget / (ntable + 1), &again_base);
        if (st == ND_OK) st = time_knob(r, *best, saved, budget / (ntable + 1), &again_best);
        if (st == ND_OK && !(again_best < 0.95 * again_base)) {
            *best = ks[0];
            best_t = base;
        } else if (st == ND_OK) { /* the speed-up reported: the smaller of the two */
            if (again_best / again_base > best_t / base) best_t = base * again_best / again_base;
        }
    }
    nd_status rst = restore_writes(r, saved);
    if (st == ND_OK) st = rst;
    free_all(saved, ND_REC_MAX_TENSORS);
    free_all(ref, ND_REC_MAX_TENSORS);
    apply_knob(r, best);
    *speedup = best_t > 0 && isfinite(best_t) ? base / best_t : 1.0;
    return st;
}

nd_status nd_graph_tune(nd_graph *g, double seconds, nd_graph_tune_stat *out) {
    memset(out, 0, sizeof *out);
    if (!g || !g->ended || g->error != ND_OK || !g->plan_done)
        return nd_fail(ND_ERR_ARG, "compile: tuning needs a captured and planned graph");
    double t0 = now_s();
    char path[1100];
    bool have_file = tune_path(path, sizeof path);
    tune_entry *known = NULL;
    size_t nknown = have_file ? load_entries(path, &known) : 0;
    size_t ntunable = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!tunable(&g->recs[i])) continue;
        ntunable++;
        nd_graph_rec_unprepare(&g->recs[i]); /* its launch geometry may change */
    }
    tune_entry *add = calloc(ntunable + 1, sizeof *add);
    uint64_t *keys = malloc((g->n + 1) * sizeof *keys); /* per record (tunable ones only) */
    if (!add || !keys) {
        free(add);
        free(keys);
        free(known);
        return nd_fail(ND_ERR_MEMORY, "compile: out of memory tuning");
    }
    size_t nadd = 0, left = 0;
    nd_status st = ND_OK;
    /* first the choices on file, then the budget over the rest */
    for (size_t i = 0; i < g->n; i++) {
        nd_graph_rec *r = &g->recs[i];
        if (!tunable(r)) continue;
        if (nd_graph_rec_gemm(r)) out->gemms++;
        else out->kernels++;
        keys[i] = record_key(r);
        const tune_entry *e = find_entry(known, nknown, keys[i]);
        if (e && e->k.gemm == nd_graph_rec_gemm(r)) {
            apply_knob(r, &e->k);
            out->cached++;
        } else {
            left++;
        }
    }
    for (size_t i = 0; i < g->n && st == ND_OK && seconds > 0 && left; i++) {
        nd_graph_rec *r = &g->recs[i];
        if (!tunable(r)) continue;
        uint64_t key = keys[i];
        const tune_entry *e = find_entry(known, nknown, key);
        if (e && e->k.gemm == nd_graph_rec_gemm(r)) continue;
        const tune_entry *done = find_entry(add, nadd, key); /* the same kernel earlier in this graph */
        if (done) {
            apply_knob(r, &done->k);
            out->cached++;
            left--;
            continue;
        }
        double remaining = seconds - (now_s() - t0);
        if (remaining <= 0) break;
        knob best;
        double speedup;
        st = tune_record(r, remaining / (double)left, &best, &speedup);
        left--;
        if (st != ND_OK) break;
        out->tuned++;
        if (speedup > out->best_speedup) out->best_speedup = speedup;
        add[nadd].key = key;
        add[nadd].k = best;
        add[nadd].k.gemm = nd_graph_rec_gemm(r);
        nadd++;
    }
    out->untimed = (int64_t)left;
    if (have_file) save_entries(path, add, nadd);
    free(keys);
    free(add);
    free(known);
    out->seconds = now_s() - t0;
    return st;
}
