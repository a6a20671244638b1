/* memory_limit.c - how much memory this process can ever have.
 *
 * On a machine that overcommits (vm.overcommit_memory = 1, or a large
 * heuristic allowance), malloc of 4 TiB succeeds and the kernel kills the
 * process once zero-filling has touched what it really has. Storage checks
 * every CPU allocation against this limit first, so an absurd request is a
 * clear error whatever the kernel's overcommit policy.
 *
 * The limit is physical memory plus swap (/proc/meminfo), lowered by the
 * memory limit of the process's cgroup or any of its ancestors (v2:
 * memory.max + memory.swap.max; v1: memory.limit_in_bytes + swap, or
 * memory.memsw.limit_in_bytes). It is read once. Other systems: sysconf's
 * physical memory, or "unknown" (INT64_MAX), which refuses nothing. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tensor.h"

#define UNLIMITED INT64_MAX

static int64_t add_sat(int64_t a, int64_t b) { return a > UNLIMITED - b ? UNLIMITED : a + b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The number the file starts with, or UNLIMITED for "max", a missing or
 * unreadable file, and the "no limit" value cgroup v1 writes (PAGE_COUNTER_MAX
 * pages, about 2^63). */
static int64_t read_limit_file(const char *path) {
    FILE *f = fopen(path, "re");
    if (!f) return UNLIMITED;
    char line[64] = {0};
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok || line[0] < '0' || line[0] > '9') return UNLIMITED; /* "max", "-1", garbage */
    char *end;
    unsigned long long v = strtoull(line, &end, 10);
    if (end == line || v >= ((unsigned long long)1 << 62)) return UNLIMITED;
    return (int64_t)v;
}

/* "MemTotal:  24576000 kB" -> bytes, from root/proc/meminfo; -1 if absent */
static void read_meminfo(const char *root, int64_t *mem, int64_t *swap) {
    char path[512];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    *mem = *swap = -1;
    FILE *f = fopen(path, "re");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1 && kb >= 0) *mem = (int64_t)kb * 1024;
        else if (sscanf(line, "SwapTotal: %lld kB", &kb) == 1 && kb >= 0) *swap = (int64_t)kb * 1024;
    }
    fclose(f);
}

/* The smallest value of `file` in dir/<cgroup path> and each of its
 * ancestors up to dir itself (a limit anywhere above applies too; inside a
 * container the path may not exist under the mount, and then only the
 * ancestors that exist count). */
static int64_t hierarchy_min(const char *dir, const char *cgpath, const char *file) {
    char rel[4096];
    snprintf(rel, sizeof rel, "%s", cgpath);
    int64_t best = UNLIMITED;
    for (;;) {
        size_t n = strlen(rel);
        while (n > 0 && rel[n - 1] == '/') rel[--n] = 0;
        char path[8192];
        snprintf(path, sizeof path, "%s%s%s/%s", dir, n && rel[0] != '/' ? "/" : "", rel, file);
        best = min64(best, read_limit_file(path));
        if (n == 0) break;
        char *slash = strrchr(rel, '/');
        if (slash) *slash = 0;
        else rel[0] = 0;
    }
    return best;
}

/* The cgroup limit on memory plus swap for the process (UNLIMITED if none). */
static int64_t cgroup_limit(const char *root, int64_t swap_total) {
    char path[512];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "re");
    if (!f) return UNLIMITED;
    int64_t best = UNLIMITED;
    char line[4096];
    int64_t swap = swap_total > 0 ? swap_total : 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        /* "hierarchy-id:controllers:path" (the path may contain ':') */
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *controllers = c1 + 1, *cgpath = c2 + 1;
        char dir[600];
        if (strcmp(line, "0") == 0 && controllers[0] == 0) { /* v2 (unified) */
            snprintf(dir, sizeof dir, "%s/sys/fs/cgroup", root);
            int64_t mem = hierarchy_min(dir, cgpath, "memory.max");
            if (mem == UNLIMITED) {
                /* a hybrid system mounts v2 under unified/ */
                snprintf(dir, sizeof dir, "%s/sys/fs/cgroup/unified", root);
                mem = hierarchy_min(dir, cgpath, "memory.max");
                if (mem == UNLIMITED) continue;
            }
            int64_t sw = min64(hierarchy_min(dir, cgpath, "memory.swap.max"), swap);
            best = min64(best, add_sat(mem, sw));
            continue;
        }
        /* v1: the memory controller, alone or in a list ("memory" or "cpu,memory") */
        bool has_memory = false;
        char ctl[256];
        snprintf(ctl, sizeof ctl, "%s", controllers);
        for (char *save = NULL, *tok = strtok_r(ctl, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (strcmp(tok, "memory") == 0) has_memory = true;
        if (!has_memory) continue;
        snprintf(dir, sizeof dir, "%s/sys/fs/cgroup/memory", root);
        int64_t mem = hierarchy_min(dir, cgpath, "memory.limit_in_bytes");
        int64_t memsw = hierarchy_min(dir, cgpath, "memory.memsw.limit_in_bytes");
        best = min64(best, min64(add_sat(mem, swap), memsw));
    }
    fclose(f);
    return best;
}

/* Internal (tests call it with a fake root): the limit as seen under root
 * ("" for the real system) and which bound set it. */
int64_t nd_memory_limit_at(const char *root, const char **source) {
    int64_t mem, swap;
    read_meminfo(root, &mem, &swap);
    if (mem < 0 && root[0] == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) mem = (int64_t)pages * page;
    }
    int64_t system = mem < 0 ? UNLIMITED : add_sat(mem, swap > 0 ? swap : 0);
    int64_t cg = cgroup_limit(root, swap);
    if (source)
        *source = cg < system ? "the memory limit of its cgroup"
                  : system < UNLIMITED ? "physical memory plus swap" : "unknown";
    return min64(system, cg);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int64_t limit;
static const char *limit_source;

static void compute(void) { limit = nd_memory_limit_at("", &limit_source); }

int64_t nd_memory_limit(void) {
    pthread_once(&once, compute);
    return limit;
}

const char *nd_memory_limit_source(void) {
    pthread_once(&once, compute);
    return limit_source;
}
