/* status.c - the thread-local error message behind nd_status. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"

#ifndef NEEDLE_VERSION
#define NEEDLE_VERSION "0.0.0"
#endif

static _Thread_local char last_error[1024];  /* raw, with index markers */
static _Thread_local char rendered[1100];

nd_status nd_fail(nd_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *nd_last_error_based(int base) {
    size_t o = 0;
    for (const char *p = last_error; *p && o < sizeof rendered - 24; p++) {
        if (*p != '\x01') { rendered[o++] = *p; continue; }
        char *end;
        long long v = strtoll(p + 1, &end, 10);
        /* LLONG_MAX has no successor: show it as it is */
        o += (size_t)snprintf(rendered + o, sizeof rendered - o, "%lld",
                              v >= 0 && v < LLONG_MAX ? v + base : v);
        p = *end == '\x02' ? end : end - 1;
    }
    rendered[o] = 0;
    return rendered;
}

const char *nd_last_error(void) { return nd_last_error_based(0); }

const char *nd_last_error_raw(void) { return last_error; }

const char *nd_version(void) { return NEEDLE_VERSION; }

const char *nd_status_name(nd_status s) {
    static const char *names[] = {"ok", "bad argument", "shape mismatch", "unsupported dtype",
                                  "index out of range", "out of memory", "device error",
                                  "unsupported", "I/O error", "internal error"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown status";
}

const char *nd_shape_str(const int64_t *shape, int ndim, char *buf) {
    size_t n = 0;
    buf[n++] = '{';
    for (int i = 0; i < ndim && n < ND_SHAPE_BUF - 24; i++)
        n += (size_t)snprintf(buf + n, ND_SHAPE_BUF - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    buf[n++] = '}';
    buf[n] = 0;
    return buf;
}

const char *nd_bytes_str(uint64_t n, char *buf) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) {
        snprintf(buf, ND_BYTES_BUF, "%llu bytes", (unsigned long long)n);
        return buf;
    }
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 6) { v /= 1024; u++; }
    snprintf(buf, ND_BYTES_BUF, "%.1f %s", v, units[u]);
    return buf;
}

nd_status nd_fail_index_bounds(const char *op, const nd_tensor *index, int64_t flat_pos,
                               int64_t value, int dim, int64_t limit) {
    int64_t pos[ND_MAX_DIMS], rem = flat_pos;
    for (int d = index->ndim - 1; d >= 0; d--) {
        pos[d] = rem % index->shape[d];
        rem /= index->shape[d];
    }
    /* The position is a multi-index: each coordinate goes through ND_IXF so
     * Lua users see it 1-based, like the index value and the dim. */
    char b1[ND_MAX_DIMS * 26 + 3];
    size_t o = 0;
    b1[o++] = '{';
    for (int d = 0; d < index->ndim; d++)
        o += (size_t)snprintf(b1 + o, sizeof b1 - o, d ? "," ND_IXF : ND_IXF, ND_IX(pos[d]));
    b1[o++] = '}';
    b1[o] = 0;
    return nd_fail(ND_ERR_INDEX, "%s: index " ND_IXF " is out of bounds for dim " ND_IXF " with size %lld "
                   "(at position %s of the index tensor)", op, ND_IX(value), ND_IX(dim),
                   (long long)limit, b1);
}

nd_status nd_fail_dtype_kernel(const char *op, nd_dtype dt) {
    return nd_fail(ND_ERR_DTYPE, "%s: not supported for dtype %s", op, nd_dtype_name(dt));
}
