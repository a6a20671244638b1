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
 * Choices persist in <cache>/compile/tune.txt (nd_cache_dir), one line per
 * kernel: a 64-bit key over the device (backend, OpenCL device name, vendor
 * and driver; CPU thread count), the program's steps and its tensors'
 * geometry, then the size and the serial flag. The file is untrusted input:
 * every line is checked and a bad one ignored. Written atomically (a
 * temporary file, then rename). */
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

typedef struct { uint64_t key; int32_t size; bool serial; } tune_entry;

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
    h = FNV(h, p->nt);
    h = FNV(h, p->nsteps);
    int dt = (int)p->dtype;
    h = FNV(h, dt);
    for (int j = 0; j < p->nsteps; j++) { /* field by field: no padding bytes */
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

/* The entries of the file (none when it is missing or unreadable); lines
 * that are not exactly "<16 hex digits> <size> <0|1>" are skipped. */
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
        unsigned long long key;
        int size, serial, used = 0;
        if (strlen(line) < 20 || line[16] != ' ') continue;
        if (sscanf(line, "%16llx %d %d%n", &key, &size, &serial, &used) != 3) continue;
        if (line[used] != '\n' && line[used] != 0) continue;
        if (size < 0 || size > MAX_SIZE || (size > 0 && size < MIN_SIZE) || (serial != 0 && serial != 1))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            tune_entry *ne = realloc(es, nc * sizeof *ne);
            if (!ne) break;
            es = ne;
            cap = nc;
        }
        es[n].key = key;
        es[n].size = size;
        es[n].serial = serial != 0;
        n++;
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
            if (!replaced)
                ok = fprintf(f, "%016llx %d %d\n", (unsigned long long)old[i].key, old[i].size,
                             old[i].serial ? 1 : 0) > 0;
        }
        for (size_t j = 0; j < nadd && ok; j++)
            ok = fprintf(f, "%016llx %d %d\n", (unsigned long long)add[j].key, add[j].size,
                         add[j].serial ? 1 : 0) > 0;
        ok = fclose(f) == 0 && ok;
    }
    if (!ok || rename(tmp, path) != 0) remove(tmp);
    free(old);
    pthread_mutex_unlock(&file_lock);
}

/* ---------------------------------------------------------------- timing */

typedef struct { int32_t size; bool serial; } knob;

static const knob cpu_knobs[] = {{0, false}, {0, true}, {256, false}, {256, true}, {4096, false},
                                 {4096, true}, {16384, false}};
static const knob ocl_knobs[] = {{0, false}, {32, false}, {64, false}, {128, false}, {512, false},
                                 {1024, false}};

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
    r->prog->tune_size = c.size;
    r->prog->tune_serial = c.serial;
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
    bool cpu = r->t[0]->storage->device == ND_DEVICE_CPU;
    const knob *ks = cpu ? cpu_knobs : ocl_knobs;
    int nk = cpu ? (int)(sizeof cpu_knobs / sizeof *cpu_knobs) : (int)(sizeof ocl_knobs / sizeof *ocl_knobs);
    nd_tensor *saved[ND_REC_MAX_TENSORS] = {0}, *ref[ND_REC_MAX_TENSORS] = {0};
    nd_status st = save_writes(r, saved);
    double base = 0, best_t = INFINITY;
    *best = ks[0];
    for (int c = 0; c < nk && st == ND_OK; c++) {
        double t;
        st = time_knob(r, ks[c], saved, budget / nk, &t);
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
        }
    }
    nd_status rst = restore_writes(r, saved);
    if (st == ND_OK) st = rst;
    free_all(saved, ND_REC_MAX_TENSORS);
    free_all(ref, ND_REC_MAX_TENSORS);
    r->prog->tune_size = best->size;
    r->prog->tune_serial = best->serial;
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
    size_t nfused = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (g->recs[i].entry != ND_CALL_fused_elementwise) continue;
        nfused++;
        nd_graph_rec_unprepare(&g->recs[i]); /* its launch geometry may change */
    }
    tune_entry *add = calloc(nfused + 1, sizeof *add);
    uint64_t *keys = malloc((g->n + 1) * sizeof *keys); /* per record (fused ones only) */
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
        if (r->entry != ND_CALL_fused_elementwise) continue;
        out->kernels++;
        keys[i] = record_key(r);
        const tune_entry *e = find_entry(known, nknown, keys[i]);
        if (e) {
            r->prog->tune_size = e->size;
            r->prog->tune_serial = e->serial;
            out->cached++;
        } else {
            left++;
        }
    }
    for (size_t i = 0; i < g->n && st == ND_OK && seconds > 0 && left; i++) {
        nd_graph_rec *r = &g->recs[i];
        if (r->entry != ND_CALL_fused_elementwise) continue;
        uint64_t key = keys[i];
        if (find_entry(known, nknown, key)) continue;
        const tune_entry *done = find_entry(add, nadd, key); /* the same kernel earlier in this graph */
        if (done) {
            r->prog->tune_size = done->size;
            r->prog->tune_serial = done->serial;
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
        add[nadd].size = best.size;
        add[nadd].serial = best.serial;
        nadd++;
    }
    if (have_file) save_entries(path, add, nadd);
    free(keys);
    free(add);
    free(known);
    out->seconds = now_s() - t0;
    return st;
}
