/* io_common.c - what every file reader of src/io shares: the error format
 * "<op>: '<file>': <message>", opening a regular file without blocking,
 * reading a file or a buffer through one source type, and UTF-8 checks. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

const char *nd_file_type_name(unsigned mode) {
    mode_t m = (mode_t)mode;
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

/* the error for a file of the wrong type; a directory keeps the system's words */
static nd_status not_regular(const char *op, const char *path, unsigned mode) {
    if (S_ISDIR(mode)) return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(EISDIR));
    return nd_fail(ND_ERR_IO, "%s: cannot open '%s': not a regular file (%s)", op, path, nd_file_type_name(mode));
}

nd_status nd_open_regular(const char *op, const char *path, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    /* stat first: opening a device can have effects of its own, and opening
     * a FIFO for reading waits for a writer */
    struct stat sb;
    if (stat(path, &sb) != 0) return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return not_regular(op, path, (unsigned)sb.st_mode);
    /* the name may be replaced by a FIFO between the stat and the open:
     * O_NONBLOCK keeps the open from waiting, fstat sees what was opened */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(errno));
    int flags;
    if (fstat(fd, &sb) != 0 || (flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int err = errno;
        close(fd);
        return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return not_regular(op, path, (unsigned)sb.st_mode);
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return ND_OK;
}

nd_status nd_src_open(const char *op, const char *path, nd_io_src *s) {
    *s = nd_src_memory(op, path, NULL, 0);
    return nd_open_regular(op, path, &s->fd, &s->size);
}

void nd_src_close(nd_io_src *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

nd_status nd_src_read(const nd_io_src *s, uint64_t off, void *dst, uint64_t n) {
    if (off > s->size || n > s->size - off)
        return nd_io_fail(ND_ERR_IO, s->op, s->what, "unexpected end of file (reading %llu bytes at %llu)",
                          (unsigned long long)n, (unsigned long long)off);
    if (s->fd < 0) {
        if (n) memcpy(dst, s->mem + off, (size_t)n);
        return ND_OK;
    }
    char *d = dst;
    while (n > 0) {
        size_t chunk = n > ((uint64_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
        ssize_t r = pread(s->fd, d, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return nd_io_fail(ND_ERR_IO, s->op, s->what, "read error: %s", strerror(errno));
        }
        /* inside the size the file had when it was opened: it shrank since */
        if (r == 0)
            return nd_io_fail(ND_ERR_IO, s->op, s->what, "unexpected end of file (it was truncated while being read?)");
        d += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return ND_OK;
}

nd_status nd_src_view(const nd_io_src *s, uint64_t off, uint64_t n, const uint8_t **p, void **owned) {
    *p = NULL;
    *owned = NULL;
    if (off > s->size || n > s->size - off)
        return nd_io_fail(ND_ERR_IO, s->op, s->what, "unexpected end of file (reading %llu bytes at %llu)",
                          (unsigned long long)n, (unsigned long long)off);
    if (s->fd < 0) {
        *p = s->mem + off;
        return ND_OK;
    }
    if (n >= SIZE_MAX) return nd_io_fail(ND_ERR_MEMORY, s->op, s->what, "out of memory (%llu bytes)", (unsigned long long)n);
    uint8_t *b = malloc(n ? (size_t)n : 1);
    if (!b) return nd_io_fail(ND_ERR_MEMORY, s->op, s->what, "out of memory reading %llu bytes", (unsigned long long)n);
    nd_status st = nd_src_read(s, off, b, n);
    if (st != ND_OK) {
        free(b);
        return st;
    }
    *p = b;
    *owned = b;
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
