/* cache_dir.c - where needle keeps what it measured for this machine (the
 * OpenCL program binaries and GEMM choices, nd.compile's tuning choices):
 * $NEEDLE_CACHE_DIR, else $XDG_CACHE_HOME/needle, else ~/.cache/needle. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "tensor.h"

int nd_mkdirs(const char *path) {
    char tmp[1024];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

bool nd_cache_dir(const char *sub, char *out, size_t n) {
    const char *base = getenv("NEEDLE_CACHE_DIR");
    int w;
    if (base && *base) w = snprintf(out, n, "%s/%s", base, sub);
    else if ((base = getenv("XDG_CACHE_HOME")) && *base) w = snprintf(out, n, "%s/needle/%s", base, sub);
    else if ((base = getenv("HOME")) && *base) w = snprintf(out, n, "%s/.cache/needle/%s", base, sub);
    else return false;
    return w > 0 && (size_t)w < n && nd_mkdirs(out) == 0;
}
