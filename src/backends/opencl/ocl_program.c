/* ocl_program.c - building kernels once per device, with an on-disk cache.
 *
 * A program is kernels/common.cl + kernels/<file>.cl compiled with a
 * defines string. In memory, programs and kernels are cached per device by
 * (file, defines) and (program, name). On disk, the program binary is kept
 * under ocl_cache_dir() in a file named by a 64-bit FNV-1a hash of the
 * device name, vendor, driver version, platform, defines and source, so a
 * new driver or an edited kernel never loads a stale binary; a binary the
 * driver rejects is rebuilt from source. Files are written atomically. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ocl_runtime.h"
#include "ocl_sources.h"

struct ocl_cached_program {
    char *file, *defines;
    cl_program prog;
    ocl_cached_program *next;
};

struct ocl_cached_kernel {
    cl_program prog;
    char *name;
    cl_kernel kernel;
    ocl_cached_kernel *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static char *dup_str(const char *s) { /* strdup is POSIX, not C11 */
    size_t n = strlen(s) + 1;
    char *r = malloc(n);
    if (r) memcpy(r, s, n);
    return r;
}

const char *ocl_source(const char *file) {
    for (unsigned long i = 0; i < nd_ocl_source_count; i++)
        if (strcmp(nd_ocl_sources[i].name, file) == 0) return nd_ocl_sources[i].src;
    return NULL;
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) { h ^= (unsigned char)*s; h *= UINT64_C(0x100000001b3); }
    h ^= 0xff; /* field separator */
    h *= UINT64_C(0x100000001b3);
    return h;
}

static char cache_dir[1024];
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void find_cache_dir(void) {
    if (!nd_cache_dir("opencl", cache_dir, sizeof cache_dir)) cache_dir[0] = 0;
}

const char *ocl_cache_dir(void) {
    pthread_once(&cache_once, find_cache_dir);
    return cache_dir[0] ? cache_dir : NULL;
}

static void cache_path(const ocl_device *d, const char *file, const char *defines,
                       const char *src, char *out, size_t n) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv(h, d->info.name);
    h = fnv(h, d->info.vendor);
    h = fnv(h, d->info.driver);
    h = fnv(h, d->info.version);
    h = fnv(h, d->info.platform);
    h = fnv(h, file);
    h = fnv(h, defines);
    h = fnv(h, src);
    const char *dir = ocl_cache_dir();
    if (!dir) { out[0] = 0; return; }
    snprintf(out, n, "%s/%s-%016llx.bin", dir, file, (unsigned long long)h);
}

static cl_program load_binary(ocl_device *d, const char *path, const char *opts) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n <= 0 || n > (256L << 20)) { fclose(f); return NULL; }
    unsigned char *bin = malloc((size_t)n);
    if (!bin || fread(bin, 1, (size_t)n, f) != (size_t)n) { free(bin); fclose(f); return NULL; }
    fclose(f);
    size_t len = (size_t)n;
    const unsigned char *bins[1] = {bin};
    cl_int status = 0, err;
    cl_program p = clCreateProgramWithBinary(d->ctx, 1, &d->id, &len, bins, &status, &err);
    free(bin);
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
        if (p) clReleaseProgram(p);
        return NULL;
    }
    if (clBuildProgram(p, 1, &d->id, opts, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(p);
        return NULL;
    }
    return p;
}

static void save_binary(ocl_device *d, cl_program p, const char *path) {
    if (!path[0]) return;
    size_t len = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) != CL_SUCCESS || !len)
        return;
    unsigned char *bin = malloc(len);
    if (!bin) return;
    unsigned char *bins[1] = {bin};
    if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(bin, 1, len, f) == len;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, path) != 0) remove(tmp);
        }
    }
    free(bin);
    (void)d;
}

/* Files compiled with another file in front (after common.cl and the
 * registry): the elementwise kernels and generated fused kernels share the
 * per-op functions of ew_ops.cl. */
static const char *prelude_of(const char *file) {
    return strcmp(file, "elementwise") == 0 ? "ew_ops" : NULL;
}

/* Builds common.cl + the registry + prelude (may be NULL) + body; label
 * names the program in the disk cache's file names and in errors. */
static nd_status build_source(ocl_device *d, const char *label, const char *prelude,
                              const char *body, const char *defines, cl_program *out) {
    const char *common = ocl_source("common");
    if (!common) return nd_fail(ND_ERR_INTERNAL, "opencl: no embedded kernel source 'common.cl'");
    if (!prelude) prelude = "";
    size_t lc = strlen(common), lr = strlen(ocl_registry_source), lp = strlen(prelude),
           lb = strlen(body);
    char *src = malloc(lc + lr + lp + lb + 3);
    if (!src) return nd_fail(ND_ERR_MEMORY, "opencl: out of memory building '%s'", label);
    char *w = src;
    memcpy(w, common, lc); w += lc; *w++ = '\n';
    memcpy(w, ocl_registry_source, lr); w += lr;
    memcpy(w, prelude, lp); w += lp; *w++ = '\n';
    memcpy(w, body, lb + 1);
    /* IEEE float32 division and square root in every program where the
     * device offers them (OpenCL allows 2.5 and 3 ulp otherwise): then a
     * quotient is one value whatever kernel computes it. Without this,
     * NVIDIA's driver divided by a scalar differently in a fused kernel than
     * in the unfused one (1 ulp), and compiled training drifted from eager;
     * the CPU backend's results are IEEE too. */
    const char *rounded = " -cl-fp32-correctly-rounded-divide-sqrt";
    bool want_rounded = d->fp32_rounded_div_sqrt && !strstr(defines, rounded + 1);
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%s%s -cl-std=CL1.2", defines, d->info.fp64 ? " -DND_FP64=1" : "",
             want_rounded ? rounded : "");
    char path[1100];
    cache_path(d, label, opts, src, path, sizeof path);
    cl_program p = path[0] ? load_binary(d, path, opts) : NULL;
    if (p) {
        free(src);
        *out = p;
        return ND_OK;
    }
    cl_int err;
    const char *srcs[1] = {src};
    p = clCreateProgramWithSource(d->ctx, 1, srcs, NULL, &err);
    free(src);
    if (err != CL_SUCCESS) return ocl_fail(err, label, "clCreateProgramWithSource", d);
    err = clBuildProgram(p, 1, &d->id, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[4096] = "";
        size_t n = 0;
        clGetProgramBuildInfo(p, d->id, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &n);
        log[sizeof log - 1] = 0;
        clReleaseProgram(p);
        return nd_fail(ND_ERR_DEVICE, "opencl: building kernels/%s.cl (%s) failed on opencl:%d "
                       "(%s): %s\nbuild log:\n%s", label, defines, d->index, d->info.name,
                       ocl_error_name(err), log);
    }
    save_binary(d, p, path);
    *out = p;
    return ND_OK;
}

static nd_status build_program(ocl_device *d, const char *file, const char *defines,
                               cl_program *out) {
    const char *body = ocl_source(file);
    const char *pre = prelude_of(file);
    const char *prelude = pre ? ocl_source(pre) : NULL;
    if (!body || (pre && !prelude))
        return nd_fail(ND_ERR_INTERNAL, "opencl: no embedded kernel source '%s.cl'", body ? pre : file);
    return build_source(d, file, prelude, body, defines, out);
}

/* file: a kernels/ file, or (label given) the generated source itself. */
static nd_status find_kernel(ocl_device *d, const char *file, const char *label,
                             const char *defines, const char *name, cl_kernel *out) {
    pthread_mutex_lock(&lock);
    ocl_cached_program *cp = d->programs;
    while (cp && (strcmp(cp->file, file) != 0 || strcmp(cp->defines, defines) != 0)) cp = cp->next;
    nd_status st = ND_OK;
    if (!cp) {
        cl_program p;
        st = label ? build_source(d, label, ocl_source("ew_ops"), file, defines, &p)
                   : build_program(d, file, defines, &p);
        if (st == ND_OK) {
            cp = calloc(1, sizeof *cp);
            if (cp) {
                cp->file = dup_str(file);
                cp->defines = dup_str(defines);
            }
            if (!cp || !cp->file || !cp->defines) {
                if (cp) { free(cp->file); free(cp->defines); free(cp); }
                clReleaseProgram(p);
                st = nd_fail(ND_ERR_MEMORY, "opencl: out of memory");
            } else {
                cp->prog = p;
                cp->next = d->programs;
                d->programs = cp;
            }
        }
    }
    if (st == ND_OK) {
        ocl_cached_kernel *ck = d->kernels;
        while (ck && (ck->prog != cp->prog || strcmp(ck->name, name) != 0)) ck = ck->next;
        if (!ck) {
            cl_int err;
            cl_kernel k = clCreateKernel(cp->prog, name, &err);
            if (err != CL_SUCCESS) {
                st = nd_fail(ND_ERR_INTERNAL, "opencl: kernel '%s' not found in kernels/%s.cl (%s): %s",
                             name, label ? label : file, defines, ocl_error_name(err));
            } else {
                ck = calloc(1, sizeof *ck);
                if (ck) ck->name = dup_str(name);
                if (!ck || !ck->name) {
                    if (ck) free(ck);
                    clReleaseKernel(k);
                    st = nd_fail(ND_ERR_MEMORY, "opencl: out of memory");
                } else {
                    ck->prog = cp->prog;
                    ck->kernel = k;
                    ck->next = d->kernels;
                    d->kernels = ck;
                }
            }
        }
        if (st == ND_OK) *out = ck->kernel;
    }
    pthread_mutex_unlock(&lock);
    return st;
}

nd_status ocl_kernel(ocl_device *d, const char *file, const char *defines, const char *name,
                     cl_kernel *out) {
    return find_kernel(d, file, NULL, defines, name, out);
}

nd_status ocl_kernel_generated(ocl_device *d, const char *label, const char *defines,
                               const char *body, const char *name, cl_kernel *out) {
    return find_kernel(d, body, label, defines, name, out);
}

static atomic_uint_fast64_t generation = 1;

uint64_t ocl_programs_generation(void) { return atomic_load(&generation); }

void ocl_forget_programs(ocl_device *d) {
    pthread_mutex_lock(&lock);
    atomic_fetch_add(&generation, 1);
    for (ocl_cached_kernel *k = d->kernels, *n; k; k = n) {
        n = k->next;
        clReleaseKernel(k->kernel);
        free(k->name);
        free(k);
    }
    d->kernels = NULL;
    for (ocl_cached_program *p = d->programs, *n; p; p = n) {
        n = p->next;
        clReleaseProgram(p->prog);
        free(p->file);
        free(p->defines);
        free(p);
    }
    d->programs = NULL;
    pthread_mutex_unlock(&lock);
}
