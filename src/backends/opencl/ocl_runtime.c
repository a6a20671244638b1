/* ocl_runtime.c - OpenCL devices, errors, dtypes, launches and geometry. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include "ocl_runtime.h"

#define OCL_MAX_DEVICES 16

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static ocl_device devices[OCL_MAX_DEVICES];
static int ndevices;
static char unavailable[512];

#define INSTALL_HINT "install an OpenCL driver (ICD): on Debian `apt install pocl-opencl-icd` " \
    "runs on the CPU; GPUs need their vendor's ICD (nvidia-opencl-icd, mesa-opencl-icd, " \
    "intel-opencl-icd); `clinfo -l` lists what the loader sees"

const char *ocl_error_name(cl_int err) {
    switch (err) {
#define E(x) case x: return #x;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_BUILD_PROGRAM_FAILURE) E(CL_INVALID_VALUE) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT)
    E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_BINARY)
    E(CL_INVALID_BUILD_OPTIONS) E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE)
    E(CL_INVALID_KERNEL_NAME) E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX)
    E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE) E(CL_INVALID_KERNEL_ARGS)
    E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE) E(CL_INVALID_WORK_ITEM_SIZE)
    E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST) E(CL_INVALID_OPERATION)
    E(CL_INVALID_BUFFER_SIZE) E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) E(CL_INVALID_PLATFORM)
#undef E
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "unknown OpenCL error";
    }
}

nd_status ocl_fail(cl_int err, const char *op, const char *what, const ocl_device *d) {
    bool oom = err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
               err == CL_OUT_OF_HOST_MEMORY;
    return nd_fail(oom ? ND_ERR_MEMORY : ND_ERR_DEVICE, "%s: OpenCL %s failed on opencl:%d (%s): "
                   "%s (%d)%s", op, what, d ? d->index : -1, d ? d->info.name : "?",
                   ocl_error_name(err), (int)err,
                   oom ? "; the device is out of memory (free tensors or use smaller batches)" : "");
}

/* ---------------------------------------------------------------- devices */

static void info_string(cl_device_id id, cl_device_info what, char *buf, size_t n) {
    buf[0] = 0;
    if (clGetDeviceInfo(id, what, n, buf, NULL) != CL_SUCCESS) buf[0] = 0;
    buf[n - 1] = 0;
}

static void init_device(ocl_device *d, cl_platform_id p, cl_device_id id, int index) {
    memset(d, 0, sizeof *d);
    d->index = index;
    d->platform = p;
    d->id = id;
    nd_opencl_info *in = &d->info;
    info_string(id, CL_DEVICE_NAME, in->name, sizeof in->name);
    info_string(id, CL_DEVICE_VENDOR, in->vendor, sizeof in->vendor);
    info_string(id, CL_DEVICE_VERSION, in->version, sizeof in->version);
    info_string(id, CL_DRIVER_VERSION, in->driver, sizeof in->driver);
    if (clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof in->platform, in->platform, NULL) != CL_SUCCESS)
        in->platform[0] = 0;
    in->platform[sizeof in->platform - 1] = 0;
    cl_ulong u = 0;
    clGetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof u, &u, NULL);
    in->global_mem_bytes = (int64_t)u;
    u = 0;
    clGetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof u, &u, NULL);
    in->max_alloc_bytes = (int64_t)u;
    u = 0;
    clGetDeviceInfo(id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof u, &u, NULL);
    in->local_mem_bytes = (int64_t)u;
    d->local_mem = (size_t)u;
    cl_uint v = 0;
    clGetDeviceInfo(id, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof v, &v, NULL);
    in->compute_units = (int)v;
    v = 0;
    clGetDeviceInfo(id, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof v, &v, NULL);
    in->max_clock_mhz = (int)v;
    size_t wg = 0;
    clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    d->max_wg = wg ? wg : 1;
    in->max_work_group_size = (int)d->max_wg;
    cl_device_type type = 0;
    clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    in->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
    cl_device_fp_config fp = 0;
    clGetDeviceInfo(id, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    d->fp32_rounded_div_sqrt = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    fp = 0;
    clGetDeviceInfo(id, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp, &fp, NULL);
    in->fp64 = fp != 0;
    size_t ext_len = 0;
    in->fp16 = false;
    if (clGetDeviceInfo(id, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len) == CL_SUCCESS && ext_len > 0) {
        char *ext = malloc(ext_len + 1);
        if (ext && clGetDeviceInfo(id, CL_DEVICE_EXTENSIONS, ext_len, ext, NULL) == CL_SUCCESS) {
            ext[ext_len] = '\0';
            in->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
        }
        free(ext);
    }
}

static void init_all(void) {
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err != CL_SUCCESS || np == 0) {
        snprintf(unavailable, sizeof unavailable, "no OpenCL platform found (%s); %s",
                 err == CL_SUCCESS ? "the ICD loader lists none" : ocl_error_name(err), INSTALL_HINT);
        return;
    }
    cl_platform_id plats[8];
    if (np > 8) np = 8;
    if (clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) {
        snprintf(unavailable, sizeof unavailable, "the OpenCL platforms could not be listed; %s",
                 INSTALL_HINT);
        return;
    }
    for (cl_uint p = 0; p < np && ndevices < OCL_MAX_DEVICES; p++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0)
            continue;
        cl_device_id ids[OCL_MAX_DEVICES];
        if (nd > OCL_MAX_DEVICES) nd = OCL_MAX_DEVICES;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, NULL) != CL_SUCCESS) continue;
        for (cl_uint i = 0; i < nd && ndevices < OCL_MAX_DEVICES; i++) {
            ocl_device *d = &devices[ndevices];
            init_device(d, plats[p], ids[i], ndevices);
            cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[p], 0};
            d->ctx = clCreateContext(props, 1, &ids[i], NULL, NULL, &err);
            if (err != CL_SUCCESS) continue;
            d->queue = clCreateCommandQueue(d->ctx, ids[i], 0, &err);
            if (err != CL_SUCCESS) { clReleaseContext(d->ctx); continue; }
            ndevices++;
        }
    }
    if (ndevices == 0)
        snprintf(unavailable, sizeof unavailable, "the OpenCL platforms have no usable device; %s",
                 INSTALL_HINT);
}

static void ensure_init(void) { pthread_once(&init_once, init_all); }

int nd_ocl_device_count(void) {
    ensure_init();
    return ndevices;
}

const char *nd_ocl_unavailable_reason(void) {
    ensure_init();
    return ndevices ? NULL : unavailable;
}

ocl_device *ocl_device_at(int index) {
    ensure_init();
    return index >= 0 && index < ndevices ? &devices[index] : NULL;
}

nd_status nd_ocl_device_info(int index, nd_opencl_info *out) {
    ocl_device *d = ocl_device_at(index);
    if (!d) {
        if (!ndevices) return nd_fail(ND_ERR_DEVICE, "opencl: %s", unavailable);
        return nd_fail(ND_ERR_DEVICE, "opencl: no device %d (%d available)", index, ndevices);
    }
    *out = d->info;
    return ND_OK;
}

nd_status nd_ocl_default_device(int *index) {
    ensure_init();
    if (!ndevices) return nd_fail(ND_ERR_DEVICE, "opencl: %s", unavailable);
    const char *env = getenv("NEEDLE_OPENCL_DEVICE");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == 0) {
            if (v < 0 || v >= ndevices)
                return nd_fail(ND_ERR_DEVICE, "NEEDLE_OPENCL_DEVICE=%s: no such OpenCL device "
                               "(%d available, 0..%d)", env, ndevices, ndevices - 1);
            *index = (int)v;
            return ND_OK;
        }
        for (int i = 0; i < ndevices; i++)
            if (strstr(devices[i].info.name, env) || strstr(devices[i].info.vendor, env)) {
                *index = i;
                return ND_OK;
            }
        return nd_fail(ND_ERR_DEVICE, "NEEDLE_OPENCL_DEVICE=%s matches no OpenCL device name "
                       "(nd.devices() lists them)", env);
    }
    for (int i = 0; i < ndevices; i++)
        if (devices[i].info.is_gpu) { *index = i; return ND_OK; }
    *index = 0;
    return ND_OK;
}

/* ---------------------------------------------------------------- dtypes */

const char *ocl_type_name(nd_dtype dt) {
    switch (dt) {
    case ND_FLOAT32: return "float";
    case ND_FLOAT64: return "double";
    case ND_INT64: return "long";
    case ND_INT32: return "int";
    case ND_UINT8: case ND_BOOL: return "uchar";
    case ND_FLOAT16: case ND_BFLOAT16: return "ushort";
    default: return "?";
    }
}

void ocl_dtype_defines(nd_dtype dt, char *buf, size_t n) {
    snprintf(buf, n, "-DT=%s -DT_FLOAT=%d -DT_ID=%d", ocl_type_name(dt),
             dt == ND_FLOAT32 || dt == ND_FLOAT64, (int)dt);
}

nd_status ocl_check_dtype(const ocl_device *d, nd_dtype dt, const char *op) {
    if (dt == ND_FLOAT64 && !d->info.fp64)
        return nd_fail(ND_ERR_DTYPE, "%s: float64 is not supported on opencl:%d (%s has no "
                       "cl_khr_fp64); use float32", op, d->index, d->info.name);
    return ND_OK;
}

/* ---------------------------------------------------------------- launches */

static _Atomic uint64_t launches;

uint64_t nd_ocl_launch_count(void) { return atomic_load(&launches); }

nd_status ocl_launch(ocl_device *d, cl_kernel k, const char *op, int dims, const size_t *global,
                     const size_t *local) {
    size_t g[3];
    for (int i = 0; i < dims; i++) {
        g[i] = global[i];
        if (g[i] == 0) return ND_OK; /* nothing to do */
        if (local && local[i]) g[i] = (g[i] + local[i] - 1) / local[i] * local[i];
    }
    cl_event ev = NULL;
    cl_int err = clEnqueueNDRangeKernel(d->queue, k, (cl_uint)dims, NULL, g, local, 0, NULL,
                                        OCL_TIMING_EVENT(ev));
    if (err != CL_SUCCESS) return ocl_fail(err, op, "kernel launch", d);
    ocl_timing_note_kernel(ev, k, op, (cl_uint)dims, g);
    atomic_fetch_add(&launches, 1);
    ocl_prepare_note_launch(d, k, op, (cl_uint)dims, g, local);
    return ND_OK;
}

void ocl_count_launch(void) { atomic_fetch_add(&launches, 1); }

nd_status ocl_launch_1d(ocl_device *d, cl_kernel k, const char *op, int64_t n) {
    if (n <= 0) return ND_OK;
    size_t local = d->max_wg < 256 ? d->max_wg : 256;
    size_t global = (size_t)n;
    return ocl_launch(d, k, op, 1, &global, &local);
}

size_t ocl_max_group(ocl_device *d, cl_kernel k, size_t limit) {
    size_t lim = limit < d->max_wg ? limit : d->max_wg;
    size_t kw = 0;
    if (clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kw, &kw, NULL) ==
            CL_SUCCESS && kw && kw < lim)
        lim = kw;
    size_t p = 1;
    while (p * 2 <= lim) p *= 2;
    return p;
}

nd_status ocl_synchronize(int index) {
    ocl_device *d = ocl_device_at(index);
    if (!d) return ND_OK;
    ocl_prepare_impure();
    cl_int err = clFinish(d->queue);
    if (err != CL_SUCCESS) return ocl_fail(err, "synchronize", "clFinish", d);
    return ND_OK;
}

/* ---------------------------------------------------------------- geometry */

int ocl_merge_dims(int nops, const nd_tensor *const *ops, int64_t *shape,
                   int64_t (*strides)[ND_MAX_DIMS]) {
    const nd_tensor *o = ops[0];
    int nd = 0;
    /* keep dims of size != 1, outermost first */
    for (int i = 0; i < o->ndim; i++) {
        if (o->shape[i] == 1) continue;
        shape[nd] = o->shape[i];
        for (int k = 0; k < nops; k++) strides[k][nd] = ops[k]->strides[i];
        nd++;
    }
    /* merge dim i into i+1 when every operand steps contiguously across them */
    int m = 0;
    for (int i = 0; i < nd; i++) {
        if (m > 0) {
            bool mergeable = true;
            for (int k = 0; k < nops && mergeable; k++)
                mergeable = strides[k][m - 1] == strides[k][i] * shape[i];
            if (mergeable) {
                shape[m - 1] *= shape[i];
                for (int k = 0; k < nops; k++) strides[k][m - 1] = strides[k][i];
                continue;
            }
        }
        shape[m] = shape[i];
        for (int k = 0; k < nops; k++) strides[k][m] = strides[k][i];
        m++;
    }
    if (m == 0) { /* a single element */
        shape[0] = 1;
        for (int k = 0; k < nops; k++) strides[k][0] = 1;
        m = 1;
    }
    return m;
}

void ocl_geom_make(ocl_geom *g, int nops, const nd_tensor *const *ops) {
    memset(g, 0, sizeof *g);
    int64_t shape[ND_MAX_DIMS], strides[4][ND_MAX_DIMS];
    g->ndim = ocl_merge_dims(nops, ops, shape, strides);
    for (int d = 0; d < g->ndim; d++) {
        g->shape[d] = shape[d];
        for (int k = 0; k < nops; k++) g->strides[k][d] = strides[k][d];
    }
    for (int k = 0; k < nops; k++) g->offset[k] = ops[k]->offset;
}

bool ocl_geom_is_flat(const ocl_geom *g, int nops) {
    if (g->ndim != 1) return false;
    for (int k = 0; k < nops; k++)
        if (g->strides[k][0] != 1) return false;
    return true;
}
