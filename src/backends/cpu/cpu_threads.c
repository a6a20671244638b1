/* cpu_threads.c - how many threads the CPU kernels use.
 *
 * The most they use is nd_set_num_threads(n), else NEEDLE_NUM_THREADS, else
 * OpenMP's default (OMP_NUM_THREADS, else the CPUs this process may run on,
 * capped by its cgroup's CPU quota).
 *
 * Adaptive (the default; NEEDLE_ADAPTIVE_THREADS=0 or
 * nd_set_adaptive_threads(false) turns it off). OpenMP splits a loop into
 * equal parts and a team is as fast as its slowest thread. When another
 * process keeps a core busy, the thread that shares that core gets half of
 * it, the others wait for it at every barrier, and their spinning takes
 * time from the threads that have work: on 2 cores with one kept busy, a CNN
 * training epoch took 3.4x as long as on the quiet machine, 1.9x as long as
 * with one thread. So the count in use is the most minus the cores that
 * other processes took, over the last ~100 ms, on the CPUs this process may
 * run on: /proc/stat's busy time on those CPUs (user, nice, system, irq,
 * softirq, steal) less this process's own CPU time (which includes its
 * spinning workers). The check runs when a kernel asks for the count and
 * 100 ms have passed since the last; reading /proc/stat costs tens of
 * microseconds, well under 0.1% of the interval. Without /proc/stat (not
 * Linux, a sandbox) the count stays at the most.
 *
 * The count reaches needle's kernels through nd_cpu_threads() (their
 * num_threads clauses) and OpenBLAS through the calling thread's OpenMP
 * setting (OpenBLAS's OpenMP build follows omp_get_max_threads()).
 *
 * A few kernels sum per-thread partial results (a full sum, layer norm and
 * convolution weight gradients), so their last bits depend on the count, as
 * in PyTorch; runs that must agree bit for bit fix the count (adaptive off,
 * e.g. the training scripts' --threads N). */
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cpu_kernels.h"

extern void openblas_set_num_threads(int);

#define CHECK_INTERVAL_NS 100000000LL /* 100 ms between looks at /proc/stat */
#define MAX_THREADS_ACCEPTED 4096

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cpu_set_t allowed;   /* the CPUs this process may run on, at start-up */
static int allowed_count;
static int quota; /* CPUs the cgroup's CPU quota allows; 0: none */
static _Atomic int max_threads, in_use;
static _Atomic bool adaptive, proc_ok;
static _Atomic int64_t next_check_ns;
static _Atomic int64_t elsewhere_milli; /* cores other processes took, x1000, for reports */
static atomic_flag sampling = ATOMIC_FLAG_INIT;
static _Thread_local int applied; /* the OpenMP setting this thread last made (0: none) */
static _Thread_local int thread_cap; /* nd_set_thread_max_threads: this thread's own most (0: none) */

/* The sampler's state: only the thread that holds `sampling` touches it. */
static struct {
    bool valid, smoothed;
    int64_t wall_ns, own_ns;
    long long busy_ticks;
    double elsewhere; /* smoothed */
} last;

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A positive thread count from the environment, else 0. */
static int env_count(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return *end == '\0' && v >= 1 && v <= MAX_THREADS_ACCEPTED ? (int)v : 0;
}

/* The first line of a small file, or false. */
static bool read_line(const char *dir, const char *name, char *buf, size_t size) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok;
}

/* CPUs the CPU quota of cgroup directory dir allows, ceil(quota / period):
 * cgroup v2's cpu.max ("200000 100000"; "max ..." is no limit), else v1's
 * cpu.cfs_quota_us (-1: no limit) and cpu.cfs_period_us. 0: no quota. */
static int quota_in(const char *dir) {
    char line[128];
    long long quota = -1, period = 0;
    if (read_line(dir, "cpu.max", line, sizeof line)) {
        if (sscanf(line, "%lld %lld", &quota, &period) != 2) return 0; /* "max 100000" */
    } else {
        char q[64], pd[64];
        if (!read_line(dir, "cpu.cfs_quota_us", q, sizeof q) || !read_line(dir, "cpu.cfs_period_us", pd, sizeof pd))
            return 0;
        quota = strtoll(q, NULL, 10);
        period = strtoll(pd, NULL, 10);
    }
    if (quota <= 0 || period <= 0) return 0;
    long long cpus = (quota + period - 1) / period;
    return cpus > MAX_THREADS_ACCEPTED ? MAX_THREADS_ACCEPTED : (int)cpus;
}

/* This process's cgroup CPU quota in CPUs (0: none found). A container
 * limited to 2 CPUs on a 64-core host sees 64 CPUs in its affinity mask,
 * and 64 threads there are throttled in turn. NEEDLE_CGROUP_DIR names the
 * directory to read instead (for tests). */
static int quota_cpus(void) {
    const char *dir = getenv("NEEDLE_CGROUP_DIR");
    if (dir && *dir) return quota_in(dir);
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[4096], v1[4096] = "", v2[4096] = "";
    while (fgets(line, sizeof line, f)) { /* "id:controllers:path" */
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (!strcmp(line, "0") && !*controllers) {
            snprintf(v2, sizeof v2, "/sys/fs/cgroup%s", path);
            continue;
        }
        char list[256];
        snprintf(list, sizeof list, ",%s,", controllers);
        if (strstr(list, ",cpu,")) snprintf(v1, sizeof v1, "/sys/fs/cgroup/%s%s", controllers, path);
    }
    fclose(f);
    int q = v2[0] ? quota_in(v2) : 0;
    if (!q && v1[0]) q = quota_in(v1);
    return q;
}

static void init(void) {
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) allowed_count = CPU_COUNT(&allowed);
    if (allowed_count < 1) allowed_count = 1;
    quota = quota_cpus();
    int n = env_count("NEEDLE_NUM_THREADS");
    if (n == 0) {
        n = omp_get_max_threads();
        /* OpenMP's default is the CPUs in the mask; a quota that allows
         * fewer caps it (an explicit OMP_NUM_THREADS stands) */
        if (!getenv("OMP_NUM_THREADS") && quota > 0 && quota < n) n = quota;
    }
    atomic_store(&max_threads, n);
    atomic_store(&in_use, n);
    const char *a = getenv("NEEDLE_ADAPTIVE_THREADS");
    bool off = a && (!strcmp(a, "0") || !strcmp(a, "off") || !strcmp(a, "false") || !strcmp(a, "no"));
    atomic_store(&adaptive, !off);
    atomic_store(&proc_ok, true);
}

/* Busy clock ticks, summed over the allowed CPUs' lines of /proc/stat. */
static bool read_busy_ticks(long long *busy) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    char line[512];
    long long sum = 0;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "cpu", 3) != 0) break; /* the per-CPU lines come first */
        char *p = line + 3;
        if (*p < '0' || *p > '9') continue; /* the all-CPU line */
        char *end;
        long cpu = strtol(p, &end, 10);
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET((int)cpu, &allowed)) continue;
        /* user nice system idle iowait irq softirq steal */
        long long v[8] = {0};
        p = end;
        for (int i = 0; i < 8; i++) {
            v[i] = strtoll(p, &end, 10);
            if (end == p) break;
            p = end;
        }
        sum += v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        seen++;
    }
    fclose(f);
    *busy = sum;
    return seen > 0;
}

/* The count the load allows: the most, less the cores taken elsewhere
 * (rounded to the nearest core), at least 1. */
static int count_for(double elsewhere) {
    int most = atomic_load(&max_threads);
    double free_cores = (double)allowed_count - elsewhere;
    int n = (int)floor(free_cores + 0.5);
    if (n > most) n = most;
    return n < 1 ? 1 : n;
}

static void sample(void) {
    long long busy;
    if (!read_busy_ticks(&busy)) {
        atomic_store(&proc_ok, false);
        return;
    }
    int64_t wall = now_ns(CLOCK_MONOTONIC), own = now_ns(CLOCK_PROCESS_CPUTIME_ID);
    if (last.valid && wall > last.wall_ns) {
        static long ticks_per_s;
        if (!ticks_per_s) ticks_per_s = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
        double span = (double)(wall - last.wall_ns) * 1e-9;
        double others = ((double)(busy - last.busy_ticks) / (double)ticks_per_s -
                         (double)(own - last.own_ns) * 1e-9) / span;
        if (others < 0) others = 0; /* clock ticks are coarser than our own clock */
        /* smoothed over about two intervals: a short burst elsewhere (a
         * shell command) does not take a thread away, a busy core does
         * within ~0.3 s */
        last.elsewhere = last.smoothed ? 0.4 * last.elsewhere + 0.6 * others : others;
        last.smoothed = true;
        atomic_store(&elsewhere_milli, (int64_t)(last.elsewhere * 1000 + 0.5));
        atomic_store(&in_use, count_for(last.elsewhere));
    }
    last.valid = true;
    last.wall_ns = wall;
    last.own_ns = own;
    last.busy_ticks = busy;
}

int nd_cpu_threads(void) {
    pthread_once(&once, init);
    if (atomic_load_explicit(&adaptive, memory_order_relaxed) &&
        atomic_load_explicit(&proc_ok, memory_order_relaxed)) {
        int64_t now = now_ns(CLOCK_MONOTONIC_COARSE);
        if (now >= atomic_load_explicit(&next_check_ns, memory_order_relaxed) && !omp_in_parallel() &&
            !atomic_flag_test_and_set(&sampling)) {
            if (now >= atomic_load(&next_check_ns)) {
                atomic_store(&next_check_ns, now + CHECK_INTERVAL_NS);
                sample();
            }
            atomic_flag_clear(&sampling);
        }
    }
    int n = atomic_load_explicit(&in_use, memory_order_relaxed);
    if (thread_cap > 0 && n > thread_cap) n = thread_cap;
    if (n != applied && !omp_in_parallel()) {
        applied = n;
        omp_set_num_threads(n);
        /* OpenBLAS's count is process-wide: a capped thread leaves it alone
         * (OpenBLAS follows the calling thread's OpenMP setting per call) */
        if (thread_cap == 0) openblas_set_num_threads(n);
    }
    return n;
}

void nd_set_thread_max_threads(int n) {
    thread_cap = n > 0 ? n : 0;
    nd_cpu_threads();
}

void nd_set_num_threads(int n) {
    pthread_once(&once, init);
    if (n < 1) n = 1;
    if (n > MAX_THREADS_ACCEPTED) n = MAX_THREADS_ACCEPTED;
    atomic_store(&max_threads, n);
    /* what the last look at the machine allows under the new most */
    bool adapt = atomic_load(&adaptive) && atomic_load(&proc_ok);
    atomic_store(&in_use, adapt ? count_for((double)atomic_load(&elsewhere_milli) * 1e-3) : n);
    nd_cpu_threads();
}

int nd_get_num_threads(void) {
    pthread_once(&once, init);
    return atomic_load(&max_threads);
}

void nd_set_adaptive_threads(bool on) {
    pthread_once(&once, init);
    while (atomic_flag_test_and_set(&sampling)) sched_yield();
    atomic_store(&adaptive, on);
    atomic_store(&in_use, atomic_load(&max_threads));
    last.valid = last.smoothed = false; /* measure afresh */
    atomic_store(&elsewhere_milli, 0);
    atomic_flag_clear(&sampling);
    nd_cpu_threads();
}

void nd_threads_info(nd_threads_state *out) {
    out->in_use = nd_cpu_threads();
    out->max = atomic_load(&max_threads);
    out->cpus = allowed_count;
    out->adaptive = atomic_load(&adaptive);
    out->measured = atomic_load(&proc_ok);
    out->busy_elsewhere = (double)atomic_load(&elsewhere_milli) * 1e-3;
    out->quota_cpus = quota;
}
