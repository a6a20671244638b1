/* ocl_prepared.c - prepared launches: the OpenCL commands one backend call
 * enqueues, recorded once and enqueued again without the call (nd.compile's
 * replays, backend.h prepare_begin .. prepared_run).
 *
 * A replayed record normally runs its backend call again: the call finds
 * its kernel, works out the geometry, sets every argument and enqueues. On
 * a GPU driver each of those steps costs host time (NVIDIA's OpenCL spends
 * microseconds per clSetKernelArg and per launch), and a compiled LSTM step
 * is nearly a thousand launches whose arguments never change: the graph's
 * tensors keep their buffers from replay to replay. So while a record runs
 * with recording on, every argument set (ocl_set_arg) and every command
 * enqueued (kernel launches, buffer fills and copies) is noted; each launch
 * gets a kernel object of its own (clCreateKernel of the same program and
 * function) holding that launch's arguments, and replaying the record
 * becomes one enqueue per command.
 *
 * A call cannot be prepared (prepare_end returns NULL) when it does
 * anything else: reads or writes host memory, allocates a buffer (a
 * temporary would be gone by the next replay), waits for the queue, or
 * launches a kernel some of whose arguments were set before recording
 * began. The caller records a call twice and keeps the launches only if
 * both recordings agree byte for byte: arguments that change from call to
 * call (a random stream's counter) show up there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ocl_kernels.h"

typedef struct {
    cl_kernel k;
    cl_uint index;
    size_t size;
    unsigned char *bytes; /* NULL: a __local argument of `size` bytes */
} rec_arg;

typedef enum { CMD_KERNEL, CMD_FILL, CMD_COPY } cmd_kind;

typedef struct {
    cmd_kind kind;
    /* CMD_KERNEL */
    cl_kernel k;          /* this command's own kernel object (released with it) */
    cl_program program;   /* for comparing two recordings */
    char name[64];
    char op[48];          /* the launching op's name, for timing labels */
    cl_uint dims;
    size_t global[3], local[3];
    bool has_local;
    int nargs;
    rec_arg *args;        /* the arguments as set (k is the original kernel) */
    /* CMD_FILL / CMD_COPY */
    cl_mem dst, src;
    unsigned char pattern[16];
    size_t pattern_size, dst_off, src_off, size;
} command;

typedef struct ocl_prepared {
    ocl_device *d;
    int n;
    command *cmd;
} ocl_prepared;

typedef struct {
    bool on, impure;
    ocl_device *d;
    rec_arg *args;
    int nargs, cap_args;
    command *cmd;
    int ncmd, cap_cmd;
} recorder;

static _Thread_local recorder rec;

static void free_commands(command *c, int n) {
    for (int i = 0; i < n; i++) {
        if (c[i].kind == CMD_KERNEL && c[i].k) clReleaseKernel(c[i].k);
        for (int j = 0; j < c[i].nargs; j++) free(c[i].args[j].bytes);
        free(c[i].args);
    }
    free(c);
}

static void reset(void) {
    for (int i = 0; i < rec.nargs; i++) free(rec.args[i].bytes);
    free(rec.args);
    free_commands(rec.cmd, rec.ncmd);
    memset(&rec, 0, sizeof rec);
}

void ocl_prepare_impure(void) { if (rec.on) rec.impure = true; }

/* items (*cap of them, n used) with room for one more: the same block or a
 * larger one; NULL (items kept, the recording impure) when memory runs out. */
static void *grow(void *items, int *cap, int n, size_t elem, int first) {
    if (n < *cap) return items;
    int c = *cap ? *cap * 2 : first;
    void *p = realloc(items, (size_t)c * elem);
    if (!p) {
        rec.impure = true;
        return NULL;
    }
    *cap = c;
    return p;
}

static command *new_command(cmd_kind kind, ocl_device *d) {
    if (rec.impure) return NULL;
    if (rec.d && rec.d != d) { rec.impure = true; return NULL; } /* one device per record */
    rec.d = d;
    command *cmds = grow(rec.cmd, &rec.cap_cmd, rec.ncmd, sizeof *rec.cmd, 4);
    if (!cmds) return NULL;
    rec.cmd = cmds;
    command *c = &rec.cmd[rec.ncmd++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    return c;
}

cl_int ocl_set_arg(cl_kernel k, cl_uint index, size_t size, const void *value) {
    cl_int e = clSetKernelArg(k, index, size, value);
    if (!rec.on || rec.impure || e != CL_SUCCESS) return e;
    rec_arg *args = grow(rec.args, &rec.cap_args, rec.nargs, sizeof *rec.args, 32);
    if (!args) return e;
    rec.args = args;
    rec_arg *a = &rec.args[rec.nargs];
    a->k = k;
    a->index = index;
    a->size = size;
    a->bytes = NULL;
    if (value) {
        a->bytes = malloc(size ? size : 1);
        if (!a->bytes) { rec.impure = true; return e; }
        memcpy(a->bytes, value, size);
    }
    rec.nargs++;
    return e;
}

/* The latest value set for argument `index` of k while recording. */
static const rec_arg *latest_arg(cl_kernel k, cl_uint index) {
    for (int i = rec.nargs - 1; i >= 0; i--)
        if (rec.args[i].k == k && rec.args[i].index == index) return &rec.args[i];
    return NULL;
}

static void note_launch(ocl_device *d, cl_kernel k, const char *op, cl_uint dims,
                        const size_t *global, const size_t *local) {
    command *c = new_command(CMD_KERNEL, d);
    if (!c) return;
    snprintf(c->op, sizeof c->op, "%s", op ? op : "?");
    cl_uint nargs = 0;
    cl_int e = clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL);
    e |= clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof c->program, &c->program, NULL);
    e |= clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof c->name, c->name, NULL);
    if (e != CL_SUCCESS || dims < 1 || dims > 3) { rec.impure = true; return; }
    c->dims = dims;
    for (cl_uint i = 0; i < dims; i++) {
        c->global[i] = global[i];
        c->local[i] = local ? local[i] : 0;
    }
    c->has_local = local != NULL;
    c->args = calloc(nargs ? nargs : 1, sizeof *c->args);
    if (!c->args) { rec.impure = true; return; }
    for (cl_uint i = 0; i < nargs; i++) {
        const rec_arg *a = latest_arg(k, i);
        if (!a) { rec.impure = true; return; } /* set before recording: unknown */
        c->args[i] = *a;
        c->args[i].bytes = NULL;
        if (a->bytes) {
            c->args[i].bytes = malloc(a->size ? a->size : 1);
            if (!c->args[i].bytes) { rec.impure = true; return; }
            memcpy(c->args[i].bytes, a->bytes, a->size);
        }
        c->nargs = (int)i + 1;
    }
    c->k = clCreateKernel(c->program, c->name, &e);
    if (e != CL_SUCCESS) { c->k = NULL; rec.impure = true; return; }
    for (int i = 0; i < c->nargs; i++)
        if (clSetKernelArg(c->k, c->args[i].index, c->args[i].size, c->args[i].bytes) != CL_SUCCESS) {
            rec.impure = true;
            return;
        }
}

void ocl_prepare_note_launch(ocl_device *d, cl_kernel k, const char *op, cl_uint dims,
                             const size_t *global, const size_t *local) {
    if (rec.on && !rec.impure) note_launch(d, k, op, dims, global, local);
}

void ocl_prepare_note_fill(ocl_device *d, cl_mem dst, const void *pattern, size_t pattern_size,
                           size_t off, size_t size) {
    if (!rec.on || rec.impure) return;
    if (pattern_size > sizeof ((command *)0)->pattern) { rec.impure = true; return; }
    command *c = new_command(CMD_FILL, d);
    if (!c) return;
    c->dst = dst;
    memcpy(c->pattern, pattern, pattern_size);
    c->pattern_size = pattern_size;
    c->dst_off = off;
    c->size = size;
}

void ocl_prepare_note_copy(ocl_device *d, cl_mem src, cl_mem dst, size_t src_off, size_t dst_off,
                           size_t size) {
    if (!rec.on || rec.impure) return;
    command *c = new_command(CMD_COPY, d);
    if (!c) return;
    c->src = src;
    c->dst = dst;
    c->src_off = src_off;
    c->dst_off = dst_off;
    c->size = size;
}

/* ---------------------------------------------------------------- the backend entries */

nd_status ocl_prepare_begin(void) {
    reset();
    rec.on = true;
    return ND_OK;
}

void *ocl_prepare_end(bool keep) {
    bool ok = keep && rec.on && !rec.impure && rec.ncmd > 0;
    ocl_prepared *p = NULL;
    if (ok && (p = malloc(sizeof *p)) != NULL) {
        p->d = rec.d;
        p->n = rec.ncmd;
        p->cmd = rec.cmd;
        rec.cmd = NULL;
        rec.ncmd = rec.cap_cmd = 0;
    }
    reset();
    return p;
}

static bool same_args(const command *a, const command *b) {
    if (a->nargs != b->nargs) return false;
    for (int i = 0; i < a->nargs; i++) {
        const rec_arg *x = &a->args[i], *y = &b->args[i];
        if (x->index != y->index || x->size != y->size || !x->bytes != !y->bytes) return false;
        if (x->bytes && memcmp(x->bytes, y->bytes, x->size) != 0) return false;
    }
    return true;
}

bool ocl_prepared_equal(const void *pa, const void *pb) {
    const ocl_prepared *a = pa, *b = pb;
    if (!a || !b || a->d != b->d || a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) {
        const command *x = &a->cmd[i], *y = &b->cmd[i];
        if (x->kind != y->kind) return false;
        switch (x->kind) {
        case CMD_KERNEL:
            if (x->program != y->program || strcmp(x->name, y->name) != 0 || x->dims != y->dims ||
                x->has_local != y->has_local || !same_args(x, y))
                return false;
            for (cl_uint j = 0; j < x->dims; j++)
                if (x->global[j] != y->global[j] || x->local[j] != y->local[j]) return false;
            break;
        case CMD_FILL:
            if (x->dst != y->dst || x->pattern_size != y->pattern_size || x->dst_off != y->dst_off ||
                x->size != y->size || memcmp(x->pattern, y->pattern, x->pattern_size) != 0)
                return false;
            break;
        case CMD_COPY:
            if (x->src != y->src || x->dst != y->dst || x->src_off != y->src_off ||
                x->dst_off != y->dst_off || x->size != y->size)
                return false;
            break;
        }
    }
    return true;
}

nd_status ocl_prepared_run(void *pp) {
    ocl_prepared *p = pp;
    ocl_device *d = p->d;
    for (int i = 0; i < p->n; i++) {
        const command *c = &p->cmd[i];
        cl_int e;
        cl_event ev = NULL;
        switch (c->kind) {
        case CMD_KERNEL:
            e = clEnqueueNDRangeKernel(d->queue, c->k, c->dims, NULL, c->global,
                                       c->has_local ? c->local : NULL, 0, NULL, OCL_TIMING_EVENT(ev));
            if (e != CL_SUCCESS) return ocl_fail(e, c->name, "kernel launch", d);
            ocl_timing_note(ev, c->name, c->op, c->dims, c->global);
            ocl_count_launch();
            break;
        case CMD_FILL:
            e = clEnqueueFillBuffer(d->queue, c->dst, c->pattern, c->pattern_size, c->dst_off, c->size,
                                    0, NULL, OCL_TIMING_EVENT(ev));
            if (e != CL_SUCCESS) return ocl_fail(e, "fill", "clEnqueueFillBuffer", d);
            ocl_timing_note(ev, "clEnqueueFillBuffer", "fill", 1, &c->size);
            break;
        case CMD_COPY:
            e = clEnqueueCopyBuffer(d->queue, c->src, c->dst, c->src_off, c->dst_off, c->size, 0,
                                    NULL, OCL_TIMING_EVENT(ev));
            if (e != CL_SUCCESS) return ocl_fail(e, "copy", "clEnqueueCopyBuffer", d);
            ocl_timing_note(ev, "clEnqueueCopyBuffer", "copy", 1, &c->size);
            break;
        }
    }
    return ND_OK;
}

void ocl_prepared_free(void *pp) {
    ocl_prepared *p = pp;
    if (!p) return;
    free_commands(p->cmd, p->n);
    free(p);
}
