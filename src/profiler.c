#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* profiler.c - per-op timing for nd.profile and `needle-lua --profile`.
 *
 * Callers bracket an op with nd_profiler_push / nd_profiler_pop (the Lua
 * wrappers around every binding, the autograd engine around each node's
 * backward). Each name keeps running totals (calls, total and self time,
 * bytes allocated), so a long run costs O(names) memory; the individual
 * events are kept only when asked for (a Chrome trace), up to a cap.
 *
 * Off (the default), the only cost anywhere is the test of one global flag.
 * The state is not locked: pushes and pops come from the thread that runs
 * Lua (kernels' OpenMP threads never call it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "needle.h"

#define MAX_DEPTH 256
#define MAX_EVENTS ((size_t)4 << 20) /* 4 Mi events (192 MiB) */

bool nd_profiler_on_;
/* The thread that turned the profiler on or off is the one whose events it
 * records; on any other (a DataLoader worker thread) push and pop do nothing,
 * so the unlocked state below is only ever touched by one thread. */
static _Thread_local bool owner;

typedef struct {
    int name;
    int64_t start_ns, child_ns, start_bytes, child_bytes;
} frame;

static struct {
    char **names;
    nd_profile_stat *stats;
    int nnames, cap_names;
    frame stack[MAX_DEPTH];
    int depth;
    int overflow; /* pushes beyond MAX_DEPTH, not recorded */
    bool keep_events;
    nd_profile_event *events;
    size_t nevents, cap_events, dropped;
    /* op name pointer -> id of "<op>_backward" (op names are static strings) */
    const char *bw_ops[256];
    int bw_ids[256];
} P;

int64_t nd_profiler_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void nd_profiler_enable(bool on, bool keep_events) {
    owner = true;
    nd_profiler_on_ = on;
    P.keep_events = on && keep_events;
}

bool nd_profiler_enabled(void) { return nd_profiler_on_; }

int nd_profiler_intern(const char *name) {
    for (int i = 0; i < P.nnames; i++)
        if (strcmp(P.names[i], name) == 0) return i;
    if (P.nnames == P.cap_names) {
        int cap = P.cap_names ? 2 * P.cap_names : 256;
        char **names = realloc(P.names, (size_t)cap * sizeof *names);
        if (!names) return -1;
        P.names = names;
        nd_profile_stat *stats = realloc(P.stats, (size_t)cap * sizeof *stats);
        if (!stats) return -1;
        P.stats = stats;
        P.cap_names = cap;
    }
    size_t len = strlen(name);
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, name, len + 1);
    P.names[P.nnames] = copy;
    memset(&P.stats[P.nnames], 0, sizeof P.stats[P.nnames]);
    return P.nnames++;
}

int nd_profiler_num_names(void) { return P.nnames; }

const char *nd_profiler_name(int id) { return id >= 0 && id < P.nnames ? P.names[id] : NULL; }

void nd_profiler_stat(int id, nd_profile_stat *out) {
    if (id >= 0 && id < P.nnames) *out = P.stats[id];
    else memset(out, 0, sizeof *out);
}

int nd_profiler_push(int id) {
    if (!owner) return 0;
    int depth = P.depth + P.overflow;
    if (!nd_profiler_on_) return depth;
    if (id < 0 || id >= P.nnames || P.depth == MAX_DEPTH) { P.overflow++; return depth; }
    frame *f = &P.stack[P.depth++];
    f->name = id;
    f->child_ns = f->child_bytes = 0;
    f->start_bytes = nd_allocated_bytes();
    f->start_ns = nd_profiler_now_ns();
    return depth;
}

static void record(const frame *f, int depth, int64_t end_ns, int64_t end_bytes) {
    int64_t dur = end_ns - f->start_ns, bytes = end_bytes - f->start_bytes;
    nd_profile_stat *s = &P.stats[f->name];
    s->calls++;
    s->total_ns += dur;
    s->self_ns += dur - f->child_ns;
    s->total_bytes += bytes;
    s->self_bytes += bytes - f->child_bytes;
    if (depth > 0) {
        P.stack[depth - 1].child_ns += dur;
        P.stack[depth - 1].child_bytes += bytes;
    }
    if (!P.keep_events) return;
    if (P.nevents == P.cap_events) {
        size_t cap = P.cap_events ? 2 * P.cap_events : 4096;
        nd_profile_event *ev = cap <= MAX_EVENTS ? realloc(P.events, cap * sizeof *ev) : NULL;
        if (!ev) { P.dropped++; return; }
        P.events = ev;
        P.cap_events = cap;
    }
    P.events[P.nevents++] = (nd_profile_event){f->name, depth, f->start_ns, end_ns,
                                               bytes, bytes - f->child_bytes};
}

void nd_profiler_pop(int depth) {
    if (!owner) return;
    if (depth < 0) depth = 0;
    /* pops beyond MAX_DEPTH, and pushes made before the profiler was on */
    while (P.depth + P.overflow > depth && P.overflow > 0) P.overflow--;
    if (P.depth <= depth) return;
    int64_t now = nd_profiler_now_ns(), bytes = nd_allocated_bytes();
    while (P.depth > depth) {
        P.depth--;
        if (nd_profiler_on_) record(&P.stack[P.depth], P.depth, now, bytes);
    }
}

int nd_profiler_depth(void) { return P.depth + P.overflow; }

int nd_profiler_push_backward(const char *op) {
    if (!owner) return 0;
    if (!nd_profiler_on_) return nd_profiler_depth();
    unsigned h = (unsigned)(((uintptr_t)op >> 4) & 255);
    for (int k = 0; k < 256; k++, h = (h + 1) & 255) {
        if (P.bw_ops[h] == op) return nd_profiler_push(P.bw_ids[h]);
        if (P.bw_ops[h] == NULL) break;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s_backward", op ? op : "?");
    int id = nd_profiler_intern(buf);
    if (id >= 0 && P.bw_ops[h] == NULL) { P.bw_ops[h] = op; P.bw_ids[h] = id; }
    return nd_profiler_push(id);
}

size_t nd_profiler_events(const nd_profile_event **events, size_t *dropped) {
    if (events) *events = P.events;
    if (dropped) *dropped = P.dropped;
    return P.nevents;
}

void nd_profiler_reset(void) {
    for (int i = 0; i < P.nnames; i++) memset(&P.stats[i], 0, sizeof P.stats[i]);
    free(P.events); /* a long run's trace can be large: give it back */
    P.events = NULL;
    P.nevents = P.cap_events = 0;
    P.dropped = 0;
    /* frames still open restart their clocks: what they had is discarded */
    int64_t now = nd_profiler_now_ns(), bytes = nd_allocated_bytes();
    for (int i = 0; i < P.depth; i++) {
        P.stack[i].start_ns = now;
        P.stack[i].start_bytes = bytes;
        P.stack[i].child_ns = P.stack[i].child_bytes = 0;
    }
}
