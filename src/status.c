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
