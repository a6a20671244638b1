/* io_common.c - what every file reader of src/io shares: the error format
 * "<op>: '<file>': <message>", opening a regular file, and UTF-8 checks. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/io.h"
#include "tensor.h"

nd_status nd_io_fail(nd_status st, const char *op, const char *what, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nd_fail(st, "%s: '%s': %s", op, what, msg);
}

nd_status nd_open_regular(const char *op, const char *path, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path,
                       S_ISDIR(sb.st_mode) ? strerror(EISDIR) : "not a regular file");
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return ND_OK;
}

size_t nd_utf8_check(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t n;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) n = 1;
        else if (c == 0xe0) { n = 2; lo = 0xa0; }
        else if (c >= 0xe1 && c <= 0xec) n = 2;
        else if (c == 0xed) { n = 2; hi = 0x9f; }
        else if (c >= 0xee && c <= 0xef) n = 2;
        else if (c == 0xf0) { n = 3; lo = 0x90; }
        else if (c >= 0xf1 && c <= 0xf3) n = 3;
        else if (c == 0xf4) { n = 3; hi = 0x8f; }
        else return i;
        if (len - i - 1 < n) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= n; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
        i += n + 1;
    }
    return len;
}
