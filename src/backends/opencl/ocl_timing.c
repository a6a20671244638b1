/* ocl_timing.c - device time per kernel (nd.opencl.timing, nd.profile's
 * device_time option, docs/profiler.md).
 *
 * The profiler times calls on the host. On a GPU the host only enqueues: a
 * launch returns in microseconds and the kernel runs later, so host time
 * says how long enqueueing took, not where the device spends its time. With
 * timing on, every device's queue is recreated with
 * CL_QUEUE_PROFILING_ENABLE and every command enqueued (kernel launches,
 * buffer fills and copies, prepared or not) takes an event; the events are
 * read when the times are asked for (or when too many are pending) and
 * summed per label: the kernel's function name, the op that launched it and
 * its global size, so one GEMM shape or one fused kernel is one row.
 *
 * Events cost host time of their own, so timing stays off unless asked
 * for; with it off the enqueue paths take no event (one branch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ocl_kernels.h"

#define MAX_PENDING 8192

typedef struct {
    cl_event ev;
    char label[sizeof ((nd_opencl_kernel_time *)0)->label];
} pending_event;

static struct {
    bool on;
    pending_event *pending;
    int npending;
    nd_opencl_kernel_time *rows;
    int nrows, cap_rows;
} tm;

bool ocl_timing_on(void) { return tm.on; }

static nd_opencl_kernel_time *row_for(const char *label) {
    for (int i = 0; i < tm.nrows; i++)
        if (strcmp(tm.rows[i].label, label) == 0) return &tm.rows[i];
    if (tm.nrows == tm.cap_rows) {
        int cap = tm.cap_rows ? tm.cap_rows * 2 : 64;
        nd_opencl_kernel_time *r = realloc(tm.rows, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        tm.rows = r;
        tm.cap_rows = cap;
    }
    nd_opencl_kernel_time *r = &tm.rows[tm.nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->label, sizeof r->label, "%s", label);
    return r;
}

/* Waits for the pending events and adds their times to the rows. */
static nd_status collect(void) {
    nd_status st = ND_OK;
    if (tm.npending) {
        cl_event evs[64];
        for (int i = 0; i < tm.npending; i += 64) {
            int n = tm.npending - i < 64 ? tm.npending - i : 64;
            for (int j = 0; j < n; j++) evs[j] = tm.pending[i + j].ev;
            cl_int e = clWaitForEvents((cl_uint)n, evs);
            if (e != CL_SUCCESS && st == ND_OK)
                st = nd_fail(ND_ERR_DEVICE, "opencl.kernel_times: waiting for the timed commands "
                             "failed: %s", ocl_error_name(e));
        }
    }
    for (int i = 0; i < tm.npending; i++) {
        cl_ulong t0 = 0, t1 = 0;
        cl_int e = clGetEventProfilingInfo(tm.pending[i].ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        e |= clGetEventProfilingInfo(tm.pending[i].ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(tm.pending[i].ev);
        if (e != CL_SUCCESS) continue; /* a command the driver did not time */
        nd_opencl_kernel_time *r = row_for(tm.pending[i].label);
        if (!r) {
            if (st == ND_OK) st = nd_fail(ND_ERR_MEMORY, "opencl.kernel_times: out of memory");
            continue;
        }
        r->calls++;
        r->ns += t1 > t0 ? t1 - t0 : 0;
    }
    tm.npending = 0;
    return st;
}

void ocl_timing_note(cl_event ev, const char *function, const char *op, cl_uint dims,
                     const size_t *global) {
    if (!ev) return;
    if (!tm.pending) {
        tm.pending = malloc(MAX_PENDING * sizeof *tm.pending);
        if (!tm.pending) { clReleaseEvent(ev); return; }
    }
    if (tm.npending == MAX_PENDING) (void)collect(); /* a failure shows as missing calls */
    pending_event *p = &tm.pending[tm.npending++];
    p->ev = ev;
    char size[64] = "";
    size_t at = 0;
    for (cl_uint i = 0; i < dims && at < sizeof size; i++)
        at += (size_t)snprintf(size + at, sizeof size - at, "%s%zu", i ? "x" : "", global[i]);
    if (op && function && strcmp(op, function) != 0)
        snprintf(p->label, sizeof p->label, "%s %s [%s]", op, function, size);
    else
        snprintf(p->label, sizeof p->label, "%s [%s]", function ? function : op, size);
}

void ocl_timing_note_kernel(cl_event ev, cl_kernel k, const char *op, cl_uint dims,
                            const size_t *global) {
    char name[64] = "?";
    if (ev) clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
    ocl_timing_note(ev, name, op, dims, global);
}

nd_status nd_ocl_timing(bool on) {
    int n = nd_ocl_device_count();
    nd_status st = collect();
    tm.nrows = 0;
    if (on == tm.on) return st;
    for (int i = 0; i < n; i++) {
        ocl_device *d = ocl_device_at(i);
        cl_int e = clFinish(d->queue);
        if (e != CL_SUCCESS) return ocl_fail(e, "opencl.timing", "clFinish", d);
        cl_command_queue q = clCreateCommandQueue(d->ctx, d->id, on ? CL_QUEUE_PROFILING_ENABLE : 0, &e);
        if (e != CL_SUCCESS) return ocl_fail(e, "opencl.timing", "creating a profiling queue", d);
        clReleaseCommandQueue(d->queue);
        d->queue = q;
    }
    tm.on = on;
    return st;
}

nd_status nd_ocl_kernel_times(const nd_opencl_kernel_time **rows, int *n) {
    nd_status st = collect();
    *rows = tm.rows;
    *n = tm.nrows;
    return st;
}
