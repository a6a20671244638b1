/* cpu_caches.c - the L2 size a core has (cpu_caches.h). Linux describes
 * each cache level of a CPU in /sys/devices/system/cpu/cpuN/cache/indexI/
 * (files level, type and size, "2048K"); cpuid would need a table per
 * vendor (Intel's leaf 4, AMD's 0x8000001D) for the same answer. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_caches.h"
#include "needle.h"

#define DEFAULT_L2 (1 << 20)
#define MIN_L2 (64 << 10)
#define MAX_L2 (64 << 20)

/* the first line of /sys/devices/system/cpu/cpu0/cache/index<i>/<what>
 * into buf; false when it cannot be read */
static int read_cache_file(int index, const char *what, char *buf, size_t n) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", index, what);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    return ok;
}

/* "2048K", "1M", "524288": bytes, or 0 when not a size */
static int64_t parse_size(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v <= 0) return 0;
    if (v > (1LL << 40)) return 1LL << 40; /* far above any cache, and no overflow below */
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    return v;
}

static int64_t detect_l2(void) {
    const char *env = getenv("NEEDLE_L2_BYTES");
    if (env && *env) {
        int64_t v = parse_size(env);
        if (v > 0) return v;
    }
    char level[16], type[32], size[32];
    for (int i = 0; i < 16; i++) {
        if (!read_cache_file(i, "level", level, sizeof level)) break;
        if (atoi(level) != 2 || !read_cache_file(i, "type", type, sizeof type)) continue;
        if (strncmp(type, "Instruction", 11) == 0) continue; /* Unified or Data */
        if (read_cache_file(i, "size", size, sizeof size)) {
            int64_t v = parse_size(size);
            if (v > 0) return v;
        }
    }
    return DEFAULT_L2;
}

int64_t nd_cpu_l2_bytes(void) {
    static _Atomic int64_t cached = 0; /* 0: not read yet (threads may race to the same answer) */
    int64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v) return v;
    v = detect_l2();
    if (v < MIN_L2) v = MIN_L2;
    if (v > MAX_L2) v = MAX_L2;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

int64_t nd_cpu_l2_cache_bytes(void) { return nd_cpu_l2_bytes(); }

bool nd_cpu_is_intel(void) {
    static atomic_int intel = -1; /* (racing readers store the same value) */
    if (intel < 0) {
        __builtin_cpu_init();
        intel = __builtin_cpu_is("intel") ? 1 : 0;
    }
    return intel == 1;
}
