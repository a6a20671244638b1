/* test_opencl_runtime.c - the OpenCL runtime from C: device parsing, the
 * on-disk program cache (written, reused, a corrupt binary rebuilt), a kernel
 * build failure that shows the compiler's log, out-of-memory as an error the
 * process survives, mixed-device errors, and transfers.
 * Exits 77 (skipped, with the reason) when the build or the machine has no
 * OpenCL device. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#ifdef NEEDLE_TEST_HAVE_OPENCL
#include "backends/opencl/ocl_runtime.h"
#endif

static char cache_dir[256];

/* Number of files in the cache directory whose name ends with ".bin". */
static int count_bins(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/opencl", cache_dir);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && strcmp(e->d_name + l - 4, ".bin") == 0) n++;
    }
    closedir(d);
    return n;
}

/* Overwrites every cached binary with garbage. */
static void corrupt_bins(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/opencl", cache_dir);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 4 || strcmp(e->d_name + l - 4, ".bin") != 0) continue;
        char f[600];
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        FILE *fp = fopen(f, "wb");
        if (fp) { fputs("not a program binary", fp); fclose(fp); }
    }
    closedir(d);
}

/* (x + 1) on the device, read back. */
static void add_one_roundtrip(nd_device dev) {
    float v[4] = {1, 2, 3, 4};
    nd_tensor *c = NULL, *g = NULL, *r = NULL, *h = NULL;
    OK(nd_from_buffer(v, (int64_t[]){4}, 1, ND_FLOAT32, &c));
    OK(nd_to_device(c, dev, &g));
    OK(nd_binary_scalar(ND_BINARY_add, g, 1, 0, &r));
    CHECK(nd_get_device(r).type == ND_DEVICE_OPENCL);
    OK(nd_to_device(r, nd_cpu_device(), &h));
    const float *p = nd_data(h);
    CHECK(p && p[0] == 2 && p[3] == 5);
    CHECK(nd_data(r) == NULL); /* no host pointer for device memory */
    nd_release(c); nd_release(g); nd_release(r); nd_release(h);
}

static void test_parse(void) {
    nd_device d;
    OK(nd_device_parse("cpu", &d));
    CHECK(d.type == ND_DEVICE_CPU);
    OK(nd_device_parse("opencl", &d));
    CHECK(d.type == ND_DEVICE_OPENCL);
    OK(nd_device_parse("opencl:0", &d));
    CHECK(d.type == ND_DEVICE_OPENCL && d.index == 0);
    EXPECT_ERR("opencl:99", nd_device_parse("opencl:99", &d), ND_ERR_DEVICE, "no such OpenCL device", NULL);
    EXPECT_ERR("tpu", nd_device_parse("tpu", &d), ND_ERR_ARG, "not a device name", NULL);
    EXPECT_ERR("opencl:x", nd_device_parse("opencl:x", &d), ND_ERR_ARG, "not a device name", NULL);
}

static void test_mixed_devices(nd_device dev) {
    nd_tensor *a = NULL, *b = NULL, *r = NULL;
    OK(nd_zeros((int64_t[]){3}, 1, ND_FLOAT32, &a));
    OK(nd_zeros_on(dev, (int64_t[]){3}, 1, ND_FLOAT32, &b));
    EXPECT_ERR("add cpu+opencl", nd_binary(ND_BINARY_add, a, b, &r), ND_ERR_DEVICE, "cpu", "opencl:0");
    EXPECT_ERR("matmul cpu@opencl", nd_matmul(a, b, &r), ND_ERR_DEVICE, "matmul", "opencl:0");
    nd_release(a); nd_release(b);
}

static void test_out_of_memory(nd_device dev) {
    nd_opencl_info in;
    OK(nd_opencl_device_info(dev.index, &in));
    int64_t n = in.global_mem_bytes / 4 * 2; /* twice the device's memory in float32 */
    nd_tensor *t = NULL;
    EXPECT_ERR("huge", nd_empty_on(dev, &n, 1, ND_FLOAT32, &t), ND_ERR_MEMORY, "out of memory", "opencl:0");
    CHECK(t == NULL);
    add_one_roundtrip(dev); /* and the device still works */
}

#ifdef NEEDLE_TEST_HAVE_OPENCL
static void test_build_failure(nd_device dev) {
    ocl_device *d = ocl_device_at(dev.index);
    cl_kernel k;
    EXPECT_ERR("bad build", ocl_kernel(d, "elementwise", "-DT=no_such_type -DT_FLOAT=0 -DT_ID=99",
                                       "unary_flat", &k),
               ND_ERR_DEVICE, "build log", "elementwise.cl");
    EXPECT_ERR("no kernel", ocl_kernel(d, "elementwise", "-DT=float -DT_FLOAT=1 -DT_ID=0",
                                       "no_such_kernel", &k),
               ND_ERR_INTERNAL, "no_such_kernel", NULL);
}

static void test_disk_cache(nd_device dev) {
    add_one_roundtrip(dev);
    int n = count_bins();
    CHECKM(n >= 1, "expected program binaries in %s/opencl, found %d", cache_dir, n);
    /* A fresh build in memory now loads from disk; a corrupt file is rebuilt. */
    ocl_forget_programs(ocl_device_at(dev.index));
    add_one_roundtrip(dev);
    corrupt_bins();
    ocl_forget_programs(ocl_device_at(dev.index));
    add_one_roundtrip(dev);
    CHECK(count_bins() == n);
}
#endif

int main(void) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/needle-ocl-test-%ld", (long)getpid());
    setenv("NEEDLE_CACHE_DIR", cache_dir, 1);
    unsetenv("NEEDLE_OPENCL_DEVICE");
    if (nd_opencl_device_count() == 0) {
        printf("SKIP: no OpenCL device: %s\n", nd_opencl_unavailable_reason());
        return 77;
    }
    nd_device dev = {ND_DEVICE_OPENCL, 0};
    test_parse();
    test_mixed_devices(dev);
    test_out_of_memory(dev);
#ifdef NEEDLE_TEST_HAVE_OPENCL
    test_build_failure(dev);
    test_disk_cache(dev);
#endif
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", cache_dir);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
