/* ocl_gemm_tune.c - which GEMM configuration each OpenCL device runs: the
 * defaults, the autotuner (nd.opencl_tune) and its choices on disk.
 *
 * A choice is kept per device, size class (small / large products) and
 * layout group (nn: b row-major; nt: b = w:t(); see ocl_gemm.h) in
 * ocl_cache_dir()/gemm-<hash>.txt, the hash taken over the
 * device's name, vendor, version, driver and platform, so another driver
 * starts from the defaults again. The file also records a hash of gemm.cl:
 * a choice made for other kernel code is ignored (the kernels it measured
 * are gone). Files are written atomically (temporary file + rename).
 *
 * The tuner times each candidate (a configuration for a layout group) that
 * the device can run (work-group size, local memory) on a few sizes in
 * float32, after checking its result against the naive kernel; a wrong or failing candidate is rejected. Its
 * budget is wall-clock time including kernel builds (slow on CPU drivers):
 * the candidates are ordered so that the likely ones come first, and the
 * configurations in use are always measured, as the baseline. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ocl_kernels.h"
#include "ocl_gemm.h"

#define FORMAT_VERSION 1
#define NC OCL_GEMM_NCLASS
#define NG OCL_GEMM_NGROUP
const char *const ocl_gemm_class_names[NC] = {"small", "large"};
const char *const ocl_gemm_group_names[NG] = {"nn", "nt"};
#define class_names ocl_gemm_class_names
#define group_names ocl_gemm_group_names

typedef struct {
    ocl_gemm_cfg cfg[NC][NG]; /* float32's choice (also float64's when it fits) */
    bool tuned[NC][NG];
    bool disabled[NC][NG][2]; /* [.][.][float64]: a launch failed; naive from then on */
    char source[1400];        /* where cfg came from, for nd.opencl_tune{query=true} */
    char file[1100];
} gemm_state;

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------- defaults */

/* In order of preference; the first that the device can run wins. GPUs get
 * local-memory tiles (64x64 per group, 4x4 per work-item); CPU drivers
 * (POCL) emulate local memory in ordinary memory, so there the kernels
 * without it are faster: direct (vectors along N) for nn, dot (vectors
 * along K) for nt, as measured on POCL 3.1 (docs/opencl-gemm.md). */
static const char *const gpu_defaults[NC][NG][5] = {
    {{"tiled 32x32x16 2x2 v4", "tiled 16x16x16 1x1 v1", "direct 16x16 1x1 v1", "naive", NULL},
     {"tiled 32x32x16 2x2 v4", "tiled 16x16x16 1x1 v1", "direct 16x16 1x1 v1", "naive", NULL}},
    {{"tiled 64x64x16 4x4 v4", "tiled 32x32x16 2x2 v4", "tiled 16x16x16 1x1 v1",
      "direct 16x16 1x1 v1", "naive"},
     {"tiled 64x64x16 4x4 v4", "tiled 32x32x16 2x2 v4", "tiled 16x16x16 1x1 v1",
      "direct 16x16 1x1 v1", "naive"}},
};
static const char *const cpu_defaults[NC][NG][5] = {
    {{"direct 8x64 8x16 v16", "direct 8x64 8x8 v8", "direct 16x64 2x4 v1", "direct 8x16 1x1 v1",
      "naive"},
     {"dot 16x16 4x4 v8", "dot 8x8 2x2 v8", "direct 16x64 2x4 v1", "direct 8x16 1x1 v1", "naive"}},
    {{"direct 64x64 4x64 v16", "direct 8x64 8x16 v16", "direct 16x64 2x4 v1", "direct 8x16 1x1 v1",
      "naive"},
     {"dot 32x32 4x4 v8", "dot 8x8 2x2 v8", "direct 16x64 2x4 v1", "direct 8x16 1x1 v1", "naive"}},
};

/* The tuner's candidates beyond the defaults, per group, most promising
 * first (by device type). Those the device cannot run are skipped. */
static const char *const gpu_candidates[NG][32] = {
    {"tiled 64x64x16 4x4 v4", "tiled 128x128x16 8x8 v4", "tiled 64x64x16 8x4 v4",
     "tiled 128x64x16 8x4 v4", "tiled 64x128x16 4x8 v4", "tiled 32x32x16 2x2 v4",
     "tiled 64x64x32 4x4 v4", "tiled 128x128x8 8x8 v4", "tiled 64x64x8 4x4 v2",
     "tiled 32x64x16 2x4 v4", "tiled 128x128x32 8x8 v8", "tiled 32x32x8 4x4 v4",
     "tiled 64x64x16 2x2 v4", "tiled 16x16x16 1x1 v1", "direct 64x64 4x4 v4",
     "direct 32x32 2x2 v1", "direct 32x64 4x4 v4", "naive", NULL},
    {"tiled 64x64x16 4x4 v4", "tiled 128x128x16 8x8 v4", "tiled 64x64x16 8x4 v4",
     "tiled 128x64x16 8x4 v4", "tiled 64x128x16 4x8 v4", "tiled 32x32x16 2x2 v4",
     "tiled 64x64x32 4x4 v4", "tiled 128x128x8 8x8 v4", "tiled 64x64x8 4x4 v2",
     "tiled 32x64x16 2x4 v4", "tiled 128x128x32 8x8 v8", "tiled 32x32x8 4x4 v4",
     "tiled 16x16x16 1x1 v1", "dot 16x16 1x1 v4", "dot 32x32 2x2 v4", "direct 32x32 2x2 v1",
     "naive", NULL},
};
static const char *const cpu_candidates[NG][32] = {
    {"direct 64x64 4x64 v16", "direct 128x64 4x64 v16", "direct 256x64 4x64 v16",
     "direct 128x128 4x64 v16", "direct 64x64 8x32 v16", "direct 128x64 8x32 v16",
     "direct 8x128 8x16 v16", "direct 8x128 8x16 v8", "direct 8x64 8x8 v8", "direct 16x128 8x16 v8",
     "direct 4x64 4x32 v8", "direct 8x64 4x16 v8", "direct 16x128 4x64 v16", "direct 8x64 8x32 v16",
     "direct 64x64 4x64 v16", "direct 8x64 8x16 v16", "direct 8x256 8x16 v16",
     "direct 16x128 8x16 v16", "direct 4x128 4x16 v16", "direct 32x64 8x32 v16",
     "direct 32x64 4x32 v8", "direct 8x128 8x32 v8", "direct 16x64 2x4 v1",
     "tiled 64x64x16 4x4 v4", "tiled 32x64x32 4x4 v8", "naive", NULL},
    {"dot 16x16 4x4 v8", "dot 16x16 4x4 v16", "dot 8x8 4x4 v8", "dot 32x32 4x4 v8",
     "dot 16x16 4x2 v8", "dot 16x16 2x4 v8", "dot 16x16 4x4 v4", "dot 16x32 4x8 v8",
     "dot 64x64 4x4 v8", "dot 8x8 4x4 v16", "dot 32x32 4x4 v16", "dot 8x16 2x4 v16",
     "dot 16x16 2x2 v16", "dot 16x16 4x4 v2", "direct 16x64 2x4 v1", "tiled 64x64x16 4x4 v4",
     "tiled 32x64x32 4x4 v8", "naive", NULL},
};

static size_t elem_of(nd_dtype dt) { return nd_dtype_size(dt); }

ocl_gemm_cfg ocl_gemm_default(ocl_device *d, int cls, int group, nd_dtype dt) {
    const char *const *list = d->info.is_gpu ? gpu_defaults[cls][group] : cpu_defaults[cls][group];
    ocl_gemm_cfg c = {OCL_GEMM_NAIVE, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 5 && list[i]; i++) {
        ocl_gemm_cfg t;
        if (ocl_gemm_cfg_parse(list[i], &t) && ocl_gemm_cfg_valid(d, &t, elem_of(dt), NULL, 0))
            return t;
    }
    return c;
}

/* ---------------------------------------------------------------- the file */

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) { h ^= (unsigned char)*s; h *= UINT64_C(0x100000001b3); }
    h ^= 0xff;
    h *= UINT64_C(0x100000001b3);
    return h;
}

static uint64_t kernel_hash(void) {
    const char *src = ocl_source("gemm");
    return fnv(UINT64_C(0xcbf29ce484222325), src ? src : "");
}

/* ocl_cache_dir()/gemm-<hash of the device and driver>.txt ("" without a cache dir) */
static void tune_path(const ocl_device *d, char *out, size_t n) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv(h, d->info.name);
    h = fnv(h, d->info.vendor);
    h = fnv(h, d->info.version);
    h = fnv(h, d->info.driver);
    h = fnv(h, d->info.platform);
    const char *dir = ocl_cache_dir();
    if (!dir) { out[0] = 0; return; }
    snprintf(out, n, "%s/gemm-%016llx.txt", dir, (unsigned long long)h);
}

/* Reads the tuned choice into s; false (s untouched but for source) when
 * there is none usable. */
static bool load_file(ocl_device *d, gemm_state *s) {
    if (!s->file[0]) return false;
    FILE *f = fopen(s->file, "r");
    if (!f) return false;
    char line[512];
    int version = 0;
    unsigned long long kh = 0;
    ocl_gemm_cfg cfg[NC][NG];
    bool have[NC][NG] = {{false}}, any = false, bad = false;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        if (sscanf(line, "format %d", &version) == 1) continue;
        if (sscanf(line, "kernel %llx", &kh) == 1) continue;
        /* "<class> <group> <config>" */
        for (int c = 0; c < NC; c++)
            for (int g = 0; g < NG; g++) {
                char key[16];
                snprintf(key, sizeof key, "%s %s ", class_names[c], group_names[g]);
                size_t l = strlen(key);
                if (strncmp(line, key, l) != 0) continue;
                if (ocl_gemm_cfg_parse(line + l, &cfg[c][g]) &&
                    ocl_gemm_cfg_valid(d, &cfg[c][g], 4, NULL, 0) &&
                    ocl_gemm_cfg_fits_group(&cfg[c][g], g))
                    have[c][g] = any = true;
                else
                    bad = true;
            }
    }
    fclose(f);
    if (version != FORMAT_VERSION || bad || !any) {
        snprintf(s->source, sizeof s->source, "default (ignored %s: not a format-%d GEMM tuning "
                 "file; rerun nd.opencl_tune)", s->file, FORMAT_VERSION);
        return false;
    }
    if (kh != kernel_hash()) {
        snprintf(s->source, sizeof s->source, "default (ignored %s: tuned for another version of "
                 "gemm.cl; rerun nd.opencl_tune)", s->file);
        return false;
    }
    for (int c = 0; c < NC; c++)
        for (int g = 0; g < NG; g++)
            if (have[c][g]) { s->cfg[c][g] = cfg[c][g]; s->tuned[c][g] = true; }
    snprintf(s->source, sizeof s->source, "tuned (%s)", s->file);
    return true;
}

static nd_status save_file(ocl_device *d, const gemm_state *s) {
    if (!s->file[0])
        return nd_fail(ND_ERR_IO, "opencl_tune: no cache directory (set NEEDLE_CACHE_DIR or HOME)");
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", s->file, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return nd_fail(ND_ERR_IO, "opencl_tune: cannot write %s", tmp);
    fprintf(f, "# needle OpenCL GEMM configuration chosen by nd.opencl_tune; delete this file\n"
               "# (or call nd.opencl_tune{forget=true}) to return to the defaults.\n");
    fprintf(f, "format %d\n", FORMAT_VERSION);
    fprintf(f, "device %s\nvendor %s\ndriver %s\n", d->info.name, d->info.vendor, d->info.driver);
    fprintf(f, "kernel %016llx\n", (unsigned long long)kernel_hash());
    fprintf(f, "# <size class> <layout group> <configuration>; untuned ones are the defaults\n");
    for (int c = 0; c < NC; c++)
        for (int g = 0; g < NG; g++) {
            char cs[48];
            ocl_gemm_cfg_str(&s->cfg[c][g], cs, sizeof cs);
            fprintf(f, "%s %s %s\n", class_names[c], group_names[g], cs);
        }
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, s->file) != 0) {
        remove(tmp);
        return nd_fail(ND_ERR_IO, "opencl_tune: cannot write %s", s->file);
    }
    return ND_OK;
}

/* The device's state, loaded on first use. Called with state_lock held. */
static gemm_state *state_locked(ocl_device *d) {
    if (d->gemm_config) return d->gemm_config;
    gemm_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    for (int c = 0; c < NC; c++)
        for (int g = 0; g < NG; g++) s->cfg[c][g] = ocl_gemm_default(d, c, g, ND_FLOAT32);
    snprintf(s->source, sizeof s->source, "default (not tuned)");
    tune_path(d, s->file, sizeof s->file);
    load_file(d, s);
    d->gemm_config = s;
    return s;
}

ocl_gemm_cfg ocl_gemm_config(ocl_device *d, int cls, int group, nd_dtype dt) {
    pthread_mutex_lock(&state_lock);
    gemm_state *s = state_locked(d);
    ocl_gemm_cfg c = {OCL_GEMM_NAIVE, 0, 0, 0, 0, 0, 0, 0};
    bool f64 = dt == ND_FLOAT64;
    if (s && !s->disabled[cls][group][f64]) {
        c = s->cfg[cls][group];
        /* (every stored choice is valid for float32.) A float32 tile can
         * need too much local memory for doubles. */
        if (f64 && !ocl_gemm_cfg_valid(d, &c, elem_of(dt), NULL, 0))
            c = ocl_gemm_default(d, cls, group, dt);
    }
    pthread_mutex_unlock(&state_lock);
    return c;
}

void ocl_gemm_disable(ocl_device *d, int cls, int group, nd_dtype dt, const char *msg) {
    pthread_mutex_lock(&state_lock);
    gemm_state *s = state_locked(d);
    if (s && !s->disabled[cls][group][dt == ND_FLOAT64]) {
        s->disabled[cls][group][dt == ND_FLOAT64] = true;
        fprintf(stderr, "needle: warning: the %s GEMM configuration for %s %s products failed on "
                "opencl:%d (%s); using the naive kernel for them (nd.opencl_tune finds a "
                "working one): %s\n", nd_dtype_name(dt), class_names[cls], group_names[group],
                d->index, d->info.name, msg ? msg : "?");
    }
    pthread_mutex_unlock(&state_lock);
}

static nd_status device_of(int index, const char *op, ocl_device **out) {
    ocl_device *d = ocl_device_at(index);
    if (!d) {
        const char *why = nd_ocl_unavailable_reason();
        if (why) return nd_fail(ND_ERR_DEVICE, "%s: %s", op, why);
        return nd_fail(ND_ERR_DEVICE, "%s: no OpenCL device %d (%d available)", op, index,
                       nd_ocl_device_count());
    }
    *out = d;
    return ND_OK;
}

nd_status nd_ocl_gemm_current(int device, char cfg[NC][NG][48], char *source, size_t nsource,
                              char *file, size_t nfile) {
    ocl_device *d = NULL;
    ND_TRY(device_of(device, "opencl_tune", &d));
    pthread_mutex_lock(&state_lock);
    gemm_state *s = state_locked(d);
    if (s) {
        for (int c = 0; c < NC; c++)
            for (int g = 0; g < NG; g++) ocl_gemm_cfg_str(&s->cfg[c][g], cfg[c][g], 48);
        snprintf(source, nsource, "%s", s->source);
        snprintf(file, nfile, "%s", s->file);
    }
    pthread_mutex_unlock(&state_lock);
    return s ? ND_OK : nd_fail(ND_ERR_MEMORY, "opencl_tune: out of memory");
}

nd_status nd_ocl_gemm_forget(int device) {
    ocl_device *d = NULL;
    ND_TRY(device_of(device, "opencl_tune", &d));
    pthread_mutex_lock(&state_lock);
    gemm_state *s = state_locked(d);
    if (s) {
        if (s->file[0]) remove(s->file);
        for (int c = 0; c < NC; c++)
            for (int g = 0; g < NG; g++) {
                s->cfg[c][g] = ocl_gemm_default(d, c, g, ND_FLOAT32);
                s->tuned[c][g] = false;
            }
        snprintf(s->source, sizeof s->source, "default (tuning forgotten)");
    }
    pthread_mutex_unlock(&state_lock);
    return s ? ND_OK : nd_fail(ND_ERR_MEMORY, "opencl_tune: out of memory");
}

/* ---------------------------------------------------------------- peak */

nd_status nd_ocl_gemm_peak(int device, double *gflops, char *formula, size_t n) {
    ocl_device *d = NULL;
    ND_TRY(device_of(device, "opencl_tune", &d));
    const nd_opencl_info *in = &d->info;
    cl_uint w = 0;
    clGetDeviceInfo(d->id, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof w, &w, NULL);
    if (!w) w = 1;
    int per; /* float32 FLOP per cycle per compute unit: an assumption by device kind */
    char why[320];
    if (in->is_gpu && (strstr(in->vendor, "NVIDIA") || strstr(in->vendor, "nvidia"))) {
        per = 256;
        snprintf(why, sizeof why, "NVIDIA SM assumed to have 128 FP32 lanes x 2 FLOP per FMA "
                 "(Volta/A100 SMs: 64 lanes, half this)");
    } else if (in->is_gpu && (strstr(in->vendor, "AMD") || strstr(in->vendor, "Advanced Micro"))) {
        per = 128;
        snprintf(why, sizeof why, "AMD CU assumed to have 64 FP32 lanes x 2 FLOP per FMA "
                 "(RDNA3 dual issue: twice this)");
    } else if (in->is_gpu && strstr(in->vendor, "Intel")) {
        per = 16;
        snprintf(why, sizeof why, "Intel EU assumed to have 8 FP32 lanes x 2 FLOP per FMA");
    } else if (in->is_gpu) {
        per = 128;
        snprintf(why, sizeof why, "unknown GPU: 64 FP32 lanes x 2 FLOP per FMA per compute unit "
                 "assumed");
    } else {
        per = 4 * (int)w;
        snprintf(why, sizeof why, "CPU: 2 FMA pipes x %u-wide float vectors "
                 "(CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT) x 2 FLOP per FMA assumed; cores with one "
                 "pipe, or that split AVX-512 in two 256-bit halves (AMD Zen 4), reach half", w);
    }
    *gflops = (double)in->compute_units * (double)in->max_clock_mhz * per / 1000.0;
    snprintf(formula, n, "%d compute units x %d MHz x %d FLOP/cycle = %.0f GFLOPS (float32; %s)",
             in->compute_units, in->max_clock_mhz, per, *gflops, why);
    return ND_OK;
}

/* ---------------------------------------------------------------- the tuner */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void say(bool verbose, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(bool verbose, const char *fmt, ...) {
    if (!verbose) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

/* one problem of the tuning set, on the device */
typedef struct {
    int64_t m, n, k;
    int cls, group; /* nt: b is the transposed view of an (n, k) matrix */
    nd_tensor *a, *b, *c;
    /* The reference: the naive kernel on a sample of the rows and columns
     * of C (all of them for small sizes; rows start_m, start_m + step_m, ...
     * up to the last one, with an odd step so that every residue modulo the
     * power-of-two tiles is hit; the same for columns). The naive kernel on
     * all of a 1024^3 product would take seconds on a CPU driver. */
    int64_t start_m, step_m, rm, start_n, step_n, rn;
    float *ref;   /* rm x rn, on the host */
    float *got;   /* m x n, the candidate's result */
    double best_s; /* fastest time so far (for cutting slow candidates short) */
} problem;

static void problem_free(problem *p) {
    nd_release(p->a);
    nd_release(p->b);
    nd_release(p->c);
    free(p->ref);
    free(p->got);
}

static nd_status finish(ocl_device *d) {
    cl_int e = clFinish(d->queue);
    return e == CL_SUCCESS ? ND_OK : ocl_fail(e, "opencl_tune", "clFinish", d);
}

static nd_status problem_make(ocl_device *d, problem *p, uint64_t *seed) {
    nd_device dev = {ND_DEVICE_OPENCL, d->index};
    int64_t sa[2] = {p->m, p->k}, sc[2] = {p->m, p->n};
    int64_t sb[2] = {p->k, p->n}, sbt[2] = {p->n, p->k};
    ND_TRY(nd_empty_on(dev, sa, 2, ND_FLOAT32, &p->a));
    ND_TRY(nd_empty_on(dev, sc, 2, ND_FLOAT32, &p->c));
    if (p->group == OCL_GEMM_NT) {
        nd_tensor *bt = NULL;
        ND_TRY(nd_empty_on(dev, sbt, 2, ND_FLOAT32, &bt));
        int64_t shape[2] = {bt->shape[1], bt->shape[0]}, strides[2] = {bt->strides[1], bt->strides[0]};
        nd_status st = nd_tensor_view_of(bt, shape, strides, 2, bt->offset, &p->b);
        nd_release(bt);
        ND_TRY(st);
    } else {
        ND_TRY(nd_empty_on(dev, sb, 2, ND_FLOAT32, &p->b));
    }
    size_t na = (size_t)(p->m * p->k), nb = (size_t)(p->k * p->n), nc = (size_t)(p->m * p->n);
    size_t big = na > nb ? na : nb;
    p->step_m = p->m / 48 > 1 ? (p->m / 48) | 1 : 1;
    p->step_n = p->n / 48 > 1 ? (p->n / 48) | 1 : 1;
    p->start_m = (p->m - 1) % p->step_m;
    p->start_n = (p->n - 1) % p->step_n;
    p->rm = (p->m - 1 - p->start_m) / p->step_m + 1;
    p->rn = (p->n - 1 - p->start_n) / p->step_n + 1;
    float *h = malloc(big * sizeof *h);
    p->ref = malloc((size_t)(p->rm * p->rn) * sizeof *p->ref);
    p->got = malloc(nc * sizeof *p->got);
    if (!h || !p->ref || !p->got) {
        free(h);
        return nd_fail(ND_ERR_MEMORY, "opencl_tune: out of host memory");
    }
    nd_status st = ND_OK;
    for (int t = 0; t < 2 && st == ND_OK; t++) {
        size_t cnt = t ? nb : na;
        for (size_t i = 0; i < cnt; i++) { /* uniform in [-1, 1): an LCG is plenty here */
            *seed = *seed * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
            h[i] = (float)((double)(*seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        st = ocl_write((t ? p->b : p->a)->storage, 0, h, cnt * sizeof *h);
    }
    free(h);
    return st;
}

/* The view of t taking every step-th index from start (< stop) along dim
 * (what the slice op gives; a backend builds views itself). */
static nd_status every_step(const nd_tensor *t, int dim, int64_t start, int64_t stop,
                            int64_t step, nd_tensor **out) {
    int64_t shape[2] = {t->shape[0], t->shape[1]}, strides[2] = {t->strides[0], t->strides[1]};
    shape[dim] = stop > start ? (stop - start + step - 1) / step : 0;
    strides[dim] *= step;
    return nd_tensor_view_of(t, shape, strides, 2, t->offset + start * t->strides[dim], out);
}

/* The naive kernel's result on p's sample (p->ref) and its time. */
static nd_status reference(ocl_device *d, problem *p, double *secs) {
    nd_device dev = {ND_DEVICE_OPENCL, d->index};
    ocl_gemm_cfg naive = {OCL_GEMM_NAIVE, 0, 0, 0, 0, 0, 0, 0};
    nd_tensor *as = NULL, *bs = NULL, *cs = NULL;
    int64_t shape[2] = {p->rm, p->rn};
    nd_status st = every_step(p->a, 0, p->start_m, p->m, p->step_m, &as);
    if (st == ND_OK) st = every_step(p->b, 1, p->start_n, p->n, p->step_n, &bs);
    if (st == ND_OK) st = nd_empty_on(dev, shape, 2, ND_FLOAT32, &cs);
    double t0 = now_s();
    if (st == ND_OK) st = ocl_gemm_run(d, &naive, cs, as, bs);
    if (st == ND_OK) st = finish(d);
    *secs = now_s() - t0;
    if (st == ND_OK) st = ocl_read(cs->storage, 0, p->ref, (size_t)(p->rm * p->rn) * sizeof(float));
    nd_release(as);
    nd_release(bs);
    nd_release(cs);
    return st;
}

/* Largest |got - ref| over the sample relative to the largest |ref|. The
 * kernels sum in different orders (lanes, fused multiply-adds), so they
 * differ by rounding: ~1e-6 here, where a wrong index gives ~1. */
static double rel_err(const problem *p) {
    double e = 0, mx = 1e-30;
    for (int64_t i = 0; i < p->rm; i++)
        for (int64_t j = 0; j < p->rn; j++) {
            double r = p->ref[i * p->rn + j];
            double g = p->got[(p->start_m + i * p->step_m) * p->n + p->start_n + j * p->step_n];
            if (fabs(r) > mx) mx = fabs(r);
            double diff = fabs(g - r);
            if (!(diff <= e)) e = isnan(diff) ? INFINITY : diff;
        }
    return e / mx;
}

/* Runs c on p once, checking the result, then times it: the median of a
 * few samples of several launches each, or the checked run alone when it
 * was far slower than the best so far. The caller launched c once before
 * (the first launch can include compiling). Returns ND_ERR_INTERNAL with
 * `status` set for a wrong result. */
static nd_status measure(ocl_device *d, const ocl_gemm_cfg *c, problem *p, double *secs,
                         char *status, size_t nstatus) {
    size_t nc = (size_t)(p->m * p->n);
    const uint32_t nan_bits = 0x7fc00000u; /* NaN first: a kernel that skips outputs cannot pass */
    ND_TRY(ocl_fill(p->c, &nan_bits));
    ND_TRY(finish(d));
    double t0 = now_s();
    ND_TRY(ocl_gemm_run(d, c, p->c, p->a, p->b));
    ND_TRY(finish(d));
    double t1 = now_s() - t0;
    ND_TRY(ocl_read(p->c->storage, 0, p->got, nc * sizeof *p->got));
    double e = rel_err(p);
    if (!(e <= 1e-3)) {
        snprintf(status, nstatus, "wrong result on %lldx%lldx%lld %s (rel. error %.2g)",
                 (long long)p->m, (long long)p->n, (long long)p->k, group_names[p->group], e);
        return ND_ERR_INTERNAL;
    }
    if (p->best_s > 0 && t1 > 4 * p->best_s) { *secs = t1; return ND_OK; }
    int inner = t1 > 0 ? (int)(0.01 / t1) : 50;
    inner = inner < 1 ? 1 : inner > 50 ? 50 : inner;
    int samples = t1 * inner * 3 < 0.6 ? 5 : t1 > 0.3 ? 1 : 3;
    double ts[5];
    for (int s = 0; s < samples; s++) {
        t0 = now_s();
        for (int i = 0; i < inner; i++) ND_TRY(ocl_gemm_run(d, c, p->c, p->a, p->b));
        ND_TRY(finish(d));
        ts[s] = (now_s() - t0) / inner;
    }
    for (int i = 1; i < samples; i++) /* insertion sort: 5 at most */
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) { double x = ts[j]; ts[j] = ts[j - 1]; ts[j - 1] = x; }
    *secs = ts[samples / 2];
    return ND_OK;
}

static double gflops_of(const problem *p, double secs) {
    return secs > 0 ? 2.0 * (double)p->m * (double)p->n * (double)p->k / secs * 1e-9 : 0;
}

/* Does candidate c (for group g) run on problem p? The naive kernel only
 * competes where launch overhead dominates. */
static bool eligible(const ocl_gemm_cfg *c, int g, const problem *p) {
    return p->group == g && (c->kind != OCL_GEMM_NAIVE || p->cls == OCL_GEMM_SMALL);
}

typedef struct {
    ocl_gemm_cfg cfg[OCL_GEMM_MAX_CANDIDATES];
    int group[OCL_GEMM_MAX_CANDIDATES];
    int n;
} cand_list;

static void add_candidate(const ocl_device *d, cand_list *l, const char *s, int g,
                          ocl_gemm_tune_result *r) {
    ocl_gemm_cfg c;
    if (!ocl_gemm_cfg_parse(s, &c) || l->n >= OCL_GEMM_MAX_CANDIDATES ||
        !ocl_gemm_cfg_fits_group(&c, g))
        return;
    char cs[48];
    ocl_gemm_cfg_str(&c, cs, sizeof cs);
    for (int i = 0; i < l->n; i++)
        if (l->group[i] == g && strcmp(r->cand[i].cfg, cs) == 0) return;
    ocl_gemm_candidate_result *cr = &r->cand[l->n];
    memset(cr, 0, sizeof *cr);
    snprintf(cr->cfg, sizeof cr->cfg, "%s", cs);
    cr->group = g;
    char why[160];
    if (!ocl_gemm_cfg_valid(d, &c, 4, why, sizeof why))
        snprintf(cr->status, sizeof cr->status, "skipped: %.54s", why);
    else
        snprintf(cr->status, sizeof cr->status, "not tried (budget)");
    l->cfg[l->n] = c;
    l->group[l->n] = g;
    l->n++;
}

nd_status nd_ocl_gemm_tune(const ocl_gemm_tune_opts *o, ocl_gemm_tune_result *r) {
    double start = now_s();
    memset(r, 0, sizeof *r);
    ocl_device *d = NULL;
    ND_TRY(device_of(o->device, "opencl_tune", &d));
    r->device = d->index;
    snprintf(r->device_name, sizeof r->device_name, "%s", d->info.name);
    ND_TRY(nd_ocl_gemm_peak(d->index, &r->peak_gflops, r->peak_formula, sizeof r->peak_formula));

    static const int64_t default_sizes[][3] = {
        {256, 256, 256}, {1024, 1024, 1024}, {72, 73, 74}, {128, 3072, 768}};
    int nsizes = o->nsizes > 0 ? o->nsizes : 4;
    if (nsizes > OCL_GEMM_MAX_SIZES)
        return nd_fail(ND_ERR_ARG, "opencl_tune: at most %d sizes", OCL_GEMM_MAX_SIZES);
    bool groups[NG];
    bool any_group = false;
    for (int g = 0; g < NG; g++) any_group = any_group || o->groups[g];
    for (int g = 0; g < NG; g++) groups[g] = any_group ? o->groups[g] : true;
    problem ps[OCL_GEMM_MAX_PROBLEMS];
    memset(ps, 0, sizeof ps);
    int np = 0;
    bool has[NC][NG] = {{false}};
    for (int i = 0; i < nsizes; i++) {
        const int64_t *s = o->nsizes > 0 ? o->sizes[i] : default_sizes[i];
        if (s[0] < 1 || s[1] < 1 || s[2] < 1 || s[0] > 16384 || s[1] > 16384 || s[2] > 16384)
            return nd_fail(ND_ERR_ARG, "opencl_tune: size %lldx%lldx%lld: each of M, N, K must be "
                           "in 1..16384", (long long)s[0], (long long)s[1], (long long)s[2]);
        for (int g = 0; g < NG; g++) {
            if (!groups[g]) continue;
            problem *p = &ps[np++];
            p->m = s[0]; p->n = s[1]; p->k = s[2];
            p->cls = ocl_gemm_class(s[0], s[1], s[2]);
            p->group = g;
            has[p->cls][g] = true;
        }
    }

    /* candidates: the configurations in use and the defaults first, then
     * the two groups' lists, interleaved */
    cand_list cl;
    cl.n = 0;
    {
        char cur[NC][NG][48], src[8], file[8];
        ND_TRY(nd_ocl_gemm_current(d->index, cur, src, sizeof src, file, sizeof file));
        for (int c = NC - 1; c >= 0; c--)
            for (int g = 0; g < NG; g++)
                if (has[c][g]) add_candidate(d, &cl, cur[c][g], g, r);
        for (int c = NC - 1; c >= 0; c--)
            for (int g = 0; g < NG; g++) {
                if (!has[c][g]) continue;
                ocl_gemm_cfg dc = ocl_gemm_default(d, c, g, ND_FLOAT32);
                char cs[48];
                ocl_gemm_cfg_str(&dc, cs, sizeof cs);
                add_candidate(d, &cl, cs, g, r);
            }
    }
    int nbaseline = cl.n; /* always measured, whatever the budget */
    for (int i = 0; i < 32; i++)
        for (int g = 0; g < NG; g++) {
            const char *s = d->info.is_gpu ? gpu_candidates[g][i] : cpu_candidates[g][i];
            if (s && groups[g]) add_candidate(d, &cl, s, g, r);
        }
    r->ncandidates = cl.n;
    r->nsizes = np;

    nd_status st = ND_OK;
    uint64_t seed = UINT64_C(0x9e3779b97f4a7c15);
    say(o->verbose, "opencl_tune: opencl:%d (%s), %d problems, %d candidates, budget %.1f s\n",
        d->index, d->info.name, np, cl.n, o->budget_s);
    /* the reference results (naive kernel) and its speed */
    ocl_gemm_cfg naive = {OCL_GEMM_NAIVE, 0, 0, 0, 0, 0, 0, 0};
    cl_kernel nk;
    st = ocl_gemm_kernel(d, &naive, ND_FLOAT32, ND_FLOAT32, ND_FLOAT32, 2, 1, &nk); /* built before the clock runs */
    for (int i = 0; i < np && st == ND_OK; i++) {
        problem *p = &ps[i];
        st = problem_make(d, p, &seed);
        double t1 = 0;
        if (st == ND_OK) st = reference(d, p, &t1);
        if (st != ND_OK) break;
        ocl_gemm_size_result *sr = &r->sizes[i];
        sr->m = p->m; sr->n = p->n; sr->k = p->k;
        sr->cls = p->cls;
        sr->group = p->group;
        sr->naive_gflops = t1 > 0 ? 2.0 * (double)(p->rm * p->rn) * (double)p->k / t1 * 1e-9 : 0;
        say(o->verbose, "  reference %lldx%lldx%lld %s (%s): naive kernel on %lldx%lld outputs, %.3f s\n",
            (long long)p->m, (long long)p->n, (long long)p->k, group_names[p->group],
            class_names[p->cls], (long long)p->rm, (long long)p->rn, t1);
    }

    for (int ci = 0; ci < cl.n && st == ND_OK; ci++) {
        ocl_gemm_candidate_result *cr = &r->cand[ci];
        const ocl_gemm_cfg *cfg = &cl.cfg[ci];
        int g = cl.group[ci];
        if (strncmp(cr->status, "skipped", 7) == 0) continue;
        double elapsed = now_s() - start;
        if (ci >= nbaseline && elapsed >= o->budget_s) { r->budget_exhausted = true; break; }
        r->ntried++;
        double c0 = now_s();
        /* the smallest problem the candidate runs on, for its first launch */
        int small = -1;
        for (int i = 0; i < np; i++)
            if (eligible(cfg, g, &ps[i]) &&
                (small < 0 || ps[i].m * ps[i].n * ps[i].k < ps[small].m * ps[small].n * ps[small].k))
                small = i;
        if (small < 0) { snprintf(cr->status, sizeof cr->status, "no problem to run"); continue; }
        int la, lb;
        ocl_gemm_layouts(ps[small].a, ps[small].b, &la, &lb);
        cl_kernel k;
        nd_status bs = ocl_gemm_kernel(d, cfg, ND_FLOAT32, ND_FLOAT32, ND_FLOAT32, la, lb, &k);
        if (bs != ND_OK) {
            snprintf(cr->status, sizeof cr->status, "build failed");
            r->nrejected++;
            say(o->verbose, "  [%2d/%d] %s %-24s build failed: %.200s\n", ci + 1, cl.n,
                group_names[g], cr->cfg, nd_last_error());
            continue;
        }
        /* The first launch can include more compiling (POCL builds the
         * work-group function then): not timed. */
        bs = ocl_gemm_run(d, cfg, ps[small].c, ps[small].a, ps[small].b);
        if (bs == ND_OK) bs = finish(d);
        if (bs != ND_OK) {
            snprintf(cr->status, sizeof cr->status, "failed: %.52s", nd_last_error());
            r->nrejected++;
            say(o->verbose, "  [%2d/%d] %s %-24s failed: %.200s\n", ci + 1, cl.n, group_names[g],
                cr->cfg, nd_last_error());
            continue;
        }
        double build_s = now_s() - c0;
        snprintf(cr->status, sizeof cr->status, "ok");
        say(o->verbose, "  [%2d/%d] %s %-24s", ci + 1, cl.n, group_names[g], cr->cfg);
        for (int i = 0; i < np; i++) {
            problem *p = &ps[i];
            if (!eligible(cfg, g, p)) continue;
            double secs = 0;
            char why[64] = "";
            nd_status ms = measure(d, cfg, p, &secs, why, sizeof why);
            if (ms == ND_ERR_INTERNAL && why[0]) {
                snprintf(cr->status, sizeof cr->status, "%s", why);
                r->nrejected++;
                break;
            }
            if (ms != ND_OK) { /* a launch the device refused: reject, go on */
                snprintf(cr->status, sizeof cr->status, "failed: %.52s", nd_last_error());
                r->nrejected++;
                break;
            }
            cr->gflops[i] = gflops_of(p, secs);
            if (p->best_s == 0 || secs < p->best_s) p->best_s = secs;
            say(o->verbose, " %lldx%lldx%lld:%.1f", (long long)p->m, (long long)p->n,
                (long long)p->k, cr->gflops[i]);
        }
        if (strcmp(cr->status, "ok") == 0)
            say(o->verbose, " GFLOPS (build %.1f s)\n", build_s);
        else
            say(o->verbose, " %s\n", cr->status);
    }

    if (st == ND_OK) {
        /* per class and group: the best geometric mean over its problems */
        pthread_mutex_lock(&state_lock);
        gemm_state *s = state_locked(d);
        for (int c = 0; c < NC && s; c++)
            for (int g = 0; g < NG; g++) {
                ocl_gemm_cfg_str(&s->cfg[c][g], r->config[c][g], sizeof r->config[c][g]);
                if (!has[c][g]) continue;
                int best = -1;
                double best_score = 0;
                for (int ci = 0; ci < cl.n; ci++) {
                    if (cl.group[ci] != g || strcmp(r->cand[ci].status, "ok") != 0) continue;
                    double lg = 0;
                    int cnt = 0;
                    bool all = true;
                    for (int i = 0; i < np; i++)
                        if (ps[i].cls == c && ps[i].group == g) {
                            if (!eligible(&cl.cfg[ci], g, &ps[i]) || !(r->cand[ci].gflops[i] > 0))
                                all = false;
                            else {
                                lg += log(r->cand[ci].gflops[i]);
                                cnt++;
                            }
                        }
                    if (!all || !cnt) continue;
                    double score = exp(lg / cnt);
                    if (score > best_score) { best_score = score; best = ci; }
                }
                if (best < 0) continue;
                s->cfg[c][g] = cl.cfg[best];
                s->tuned[c][g] = true;
                s->disabled[c][g][0] = s->disabled[c][g][1] = false;
                r->tuned[c][g] = true;
                snprintf(r->config[c][g], sizeof r->config[c][g], "%s", r->cand[best].cfg);
                for (int i = 0; i < np; i++)
                    if (ps[i].cls == c && ps[i].group == g) {
                        ocl_gemm_size_result *sr = &r->sizes[i];
                        snprintf(sr->cfg, sizeof sr->cfg, "%s", r->cand[best].cfg);
                        sr->gflops = r->cand[best].gflops[i];
                        sr->ms = sr->gflops > 0 ? 2.0 * (double)sr->m * (double)sr->n *
                                                      (double)sr->k / (sr->gflops * 1e9) * 1e3
                                                : 0;
                    }
            }
        bool any = false;
        for (int c = 0; c < NC; c++)
            for (int g = 0; g < NG; g++) any = any || r->tuned[c][g];
        if (s && o->save && any) {
            st = save_file(d, s);
            if (st == ND_OK) {
                snprintf(r->file, sizeof r->file, "%s", s->file);
                snprintf(s->source, sizeof s->source, "tuned (%s)", s->file);
            }
        } else if (s && any) {
            snprintf(s->source, sizeof s->source, "tuned in this process (not saved)");
        }
        pthread_mutex_unlock(&state_lock);
        if (!s) st = nd_fail(ND_ERR_MEMORY, "opencl_tune: out of memory");
    }
    for (int i = 0; i < np; i++) problem_free(&ps[i]);
    r->elapsed_s = now_s() - start;
    say(o->verbose && st == ND_OK, "opencl_tune: chose small: nn %s, nt %s; large: nn %s, nt %s (%.1f s)\n",
        r->config[0][0], r->config[0][1], r->config[1][0], r->config[1][1], r->elapsed_s);
    return st;
}
