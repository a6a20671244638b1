/* gunzip.c - a whole gzip (or plain) file into memory through zlib's gzFile
 * API, which passes non-gzip files through unchanged. Only a regular file
 * is read (nd_open_regular). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "io/io.h"
#include "tensor.h"

/* the error of a failed read: zlib's message, or errno's for Z_ERRNO */
static nd_status gz_fail(const char *op, const char *path, gzFile gz, int saved_errno) {
    int errnum = Z_OK;
    const char *msg = gz ? gzerror(gz, &errnum) : NULL;
    if (errnum == Z_ERRNO || !msg || !*msg) msg = strerror(saved_errno ? saved_errno : EIO);
    /* zlib's message reads "<path>: <what>": the path is already in ours */
    size_t pl = strlen(path);
    if (strncmp(msg, path, pl) == 0 && msg[pl] == ':' && msg[pl + 1] == ' ') msg += pl + 2;
    if (errnum == Z_BUF_ERROR) /* zlib: "unexpected end of file" */
        return nd_fail(ND_ERR_IO, "%s: '%s': truncated gzip stream (%s)", op, path, msg);
    if (errnum == Z_DATA_ERROR)
        return nd_fail(ND_ERR_IO, "%s: '%s': corrupt gzip stream (%s)", op, path, msg);
    return nd_fail(ND_ERR_IO, "%s: cannot read '%s': %s", op, path, msg);
}

nd_status nd_gunzip(const char *op, const char *path, uint64_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    if (max_bytes > (uint64_t)SIZE_MAX / 2) max_bytes = (uint64_t)SIZE_MAX / 2;
    /* a regular file, opened without waiting (a FIFO is refused, not read) */
    int fd;
    uint64_t fsize;
    ND_TRY(nd_open_regular(op, path, &fd, &fsize));
    errno = 0;
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        int err = errno ? errno : ENOMEM;
        close(fd);
        return nd_fail(ND_ERR_IO, "%s: cannot open '%s': %s", op, path, strerror(err));
    }
    gzbuffer(gz, 1 << 17);
    size_t cap = (uint64_t)1 << 16 < max_bytes ? (size_t)1 << 16 : (size_t)max_bytes, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { gzclose(gz); return nd_fail(ND_ERR_MEMORY, "%s: out of memory reading '%s'", op, path); }
    for (;;) {
        if (n == cap) {
            if ((uint64_t)n >= max_bytes) {
                /* at the limit: one more byte means too big */
                char probe;
                errno = 0;
                int r = gzread(gz, &probe, 1);
                if (r < 0) { nd_status st = gz_fail(op, path, gz, errno); free(buf); gzclose(gz); return st; }
                if (r == 0) break;
                free(buf);
                gzclose(gz);
                return nd_fail(ND_ERR_MEMORY, "%s: '%s': decompressed content exceeds the limit of "
                               "%llu bytes", op, path, (unsigned long long)max_bytes);
            }
            size_t ncap = cap * 2;
            if ((uint64_t)ncap > max_bytes) ncap = (size_t)max_bytes;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                gzclose(gz);
                return nd_fail(ND_ERR_MEMORY, "%s: out of memory reading '%s' (%zu bytes so far)", op,
                               path, n);
            }
            buf = nb;
            cap = ncap;
        }
        size_t want = cap - n;
        if (want > (size_t)1 << 30) want = (size_t)1 << 30; /* gzread takes an unsigned, returns int */
        errno = 0;
        int r = gzread(gz, buf + n, (unsigned)want);
        if (r < 0) { nd_status st = gz_fail(op, path, gz, errno); free(buf); gzclose(gz); return st; }
        if (r == 0) break;
        n += (size_t)r;
    }
    /* a stream that ended early reads as EOF with Z_BUF_ERROR pending */
    int errnum = Z_OK;
    gzerror(gz, &errnum);
    if (errnum != Z_OK) { nd_status st = gz_fail(op, path, gz, errno); free(buf); gzclose(gz); return st; }
    int rc = gzclose(gz);
    if (rc != Z_OK) {
        free(buf);
        if (rc == Z_BUF_ERROR)
            return nd_fail(ND_ERR_IO, "%s: '%s': truncated gzip stream (unexpected end of file)", op, path);
        return nd_fail(ND_ERR_IO, "%s: cannot read '%s': %s", op, path,
                       rc == Z_ERRNO ? strerror(errno) : "zlib error");
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return ND_OK;
}
