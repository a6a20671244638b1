/* test_memory_limit.c - the bound CPU allocations are checked against
 * (src/memory_limit.c): physical memory plus swap from /proc/meminfo,
 * lowered by a cgroup v1 or v2 memory limit anywhere on the process's cgroup
 * path. Each case builds a fake root (proc/meminfo, proc/self/cgroup,
 * sys/fs/cgroup/...) in a temporary directory; then the real limit refuses
 * an allocation above it with a clear error, before touching memory, on any
 * kernel overcommit policy (issue 15, item 13). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "tensor.h"

#define GiB ((int64_t)1 << 30)
#define KB_OF(b) ((long long)((b) / 1024))

static char base[256];
static int case_no;

/* a fresh fake root for one case */
static const char *new_root(void) {
    static char root[300];
    snprintf(root, sizeof root, "%s/case%d", base, ++case_no);
    mkdir(root, 0700);
    return root;
}

/* writes text to root/rel, creating the directories on the way */
static void put_file(const char *root, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(path, 0700);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f) { printf("cannot write %s\n", path); exit(1); }
    fputs(text, f);
    fclose(f);
}

static void meminfo(const char *root, int64_t mem, int64_t swap) {
    char text[256];
    snprintf(text, sizeof text, "MemTotal:       %lld kB\nMemFree:        1000 kB\n"
             "SwapTotal:      %lld kB\nSwapFree:       0 kB\n", KB_OF(mem), KB_OF(swap));
    put_file(root, "proc/meminfo", text);
}

static void expect(int line, const char *root, int64_t want, const char *want_source) {
    const char *source = NULL;
    int64_t got = nd_memory_limit_at(root, &source);
    checks++;
    if (got != want || !source || strcmp(source, want_source) != 0)
        FAIL_AT(line, "limit %lld (%s), expected %lld (%s)", (long long)got,
                source ? source : "?", (long long)want, want_source);
}
#define EXPECT(root, want, source) expect(__LINE__, root, want, source)

static void test_system_only(void) {
    const char *r = new_root();
    meminfo(r, 16 * GiB, 2 * GiB);
    EXPECT(r, 18 * GiB, "physical memory plus swap"); /* no proc/self/cgroup at all */

    r = new_root();
    meminfo(r, 16 * GiB, 0);
    put_file(r, "proc/self/cgroup", "0::/\n");
    EXPECT(r, 16 * GiB, "physical memory plus swap"); /* v2 without memory.max */

    r = new_root(); /* no meminfo under a fake root: unknown, refuses nothing */
    EXPECT(r, INT64_MAX, "unknown");
}

static void test_v2(void) {
    const char *r = new_root();
    meminfo(r, 64 * GiB, 8 * GiB);
    put_file(r, "proc/self/cgroup", "0::/user.slice/job.scope\n");
    put_file(r, "sys/fs/cgroup/memory.max", "max\n");
    put_file(r, "sys/fs/cgroup/user.slice/memory.max", "8589934592\n");          /* 8 GiB */
    put_file(r, "sys/fs/cgroup/user.slice/job.scope/memory.max", "max\n");
    put_file(r, "sys/fs/cgroup/user.slice/job.scope/memory.swap.max", "1073741824\n");
    /* the parent's 8 GiB applies to the child; swap is the child's 1 GiB */
    EXPECT(r, 9 * GiB, "the memory limit of its cgroup");

    r = new_root(); /* swap.max above the machine's swap counts only the swap there is */
    meminfo(r, 64 * GiB, 2 * GiB);
    put_file(r, "proc/self/cgroup", "0::/a\n");
    put_file(r, "sys/fs/cgroup/a/memory.max", "4294967296\n");
    put_file(r, "sys/fs/cgroup/a/memory.swap.max", "max\n");
    EXPECT(r, 6 * GiB, "the memory limit of its cgroup");

    r = new_root(); /* a container: the path is not under the mount, its root has the limit */
    meminfo(r, 64 * GiB, 0);
    put_file(r, "proc/self/cgroup", "0::/kubepods/pod1/abc\n");
    put_file(r, "sys/fs/cgroup/memory.max", "2147483648\n");
    EXPECT(r, 2 * GiB, "the memory limit of its cgroup");

    r = new_root(); /* a limit above the machine's memory does not raise it */
    meminfo(r, 4 * GiB, 0);
    put_file(r, "proc/self/cgroup", "0::/a\n");
    put_file(r, "sys/fs/cgroup/a/memory.max", "68719476736\n");
    EXPECT(r, 4 * GiB, "physical memory plus swap");

    r = new_root(); /* a hybrid system: v2 under unified/ */
    meminfo(r, 64 * GiB, 0);
    put_file(r, "proc/self/cgroup", "1:name=systemd:/x\n0::/x\n");
    put_file(r, "sys/fs/cgroup/unified/x/memory.max", "3221225472\n");
    EXPECT(r, 3 * GiB, "the memory limit of its cgroup");
}

static void test_v1(void) {
    const char *r = new_root();
    meminfo(r, 32 * GiB, 4 * GiB);
    put_file(r, "proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/process_api/abc\n1:name=systemd:/\n");
    put_file(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put_file(r, "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "2147483648\n");
    /* no memsw accounting: the limit plus all the swap there is */
    EXPECT(r, 6 * GiB, "the memory limit of its cgroup");

    r = new_root(); /* memsw bounds memory plus swap */
    meminfo(r, 32 * GiB, 4 * GiB);
    put_file(r, "proc/self/cgroup", "4:memory,hugetlb:/a\n");
    put_file(r, "sys/fs/cgroup/memory/a/memory.limit_in_bytes", "2147483648\n");
    put_file(r, "sys/fs/cgroup/memory/a/memory.memsw.limit_in_bytes", "3221225472\n");
    EXPECT(r, 3 * GiB, "the memory limit of its cgroup");

    r = new_root(); /* "no limit" as v1 writes it, and a controller list without memory */
    meminfo(r, 32 * GiB, 0);
    put_file(r, "proc/self/cgroup", "3:cpuset:/a\n4:memory:/\n");
    put_file(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put_file(r, "sys/fs/cgroup/cpuset/a/memory.limit_in_bytes", "1024\n");
    EXPECT(r, 32 * GiB, "physical memory plus swap");

    r = new_root(); /* garbage in the files is no limit, not a crash */
    meminfo(r, 32 * GiB, 0);
    put_file(r, "proc/self/cgroup", "garbage\n::\n4:memory:/a:b\n");
    put_file(r, "sys/fs/cgroup/memory/a:b/memory.limit_in_bytes", "-5x\n");
    EXPECT(r, 32 * GiB, "physical memory plus swap");
}

/* The real limit: an allocation above it is refused with a message naming
 * the op, dtype, shape, sizes and the bound, without touching memory. */
static void test_refusal(void) {
    int64_t limit = nd_memory_limit();
    CHECKM(limit > 0, "limit %lld", (long long)limit);
    if (limit <= 0 || limit > ((int64_t)1 << 50)) return; /* unknown here: nothing to refuse */
    int64_t n = limit / 4 + 1; /* float32 elements: one more byte than the limit allows */
    nd_tensor *t = NULL;
    EXPECT_ERR("zeros above the limit", nd_zeros(&n, 1, ND_FLOAT32, &t), ND_ERR_MEMORY,
               "cannot allocate a float32 tensor of shape {", "of memory this process can have");
    CHECK(t == NULL);
    EXPECT_ERR("empty above the limit", nd_empty(&n, 1, ND_FLOAT32, &t), ND_ERR_MEMORY,
               "empty: cannot allocate", nd_memory_limit_source());
}

int main(void) {
    snprintf(base, sizeof base, "%s/needle-memlimit.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(base)) { printf("mkdtemp failed\n"); return 1; }
    test_system_only();
    test_v2();
    test_v1();
    test_refusal();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) printf("could not remove %s\n", base);
    printf("test_memory_limit: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
