/* io.h - binary file primitives of the core (no Lua): crash-safe writes,
 * gzip-or-plain reads, and tensors from raw bytes. Every function returns
 * nd_status and sets nd_last_error() to a message that starts with the op
 * name and names the file. Little-endian hosts only (as safetensors). */
#ifndef ND_IO_H
#define ND_IO_H

#include <stddef.h>
#include <stdint.h>
#include "needle.h"

/* ---- atomic writes ----
 * Bytes go to "<path>.tmp.<pid>" (created exclusively; "<path>.tmp.<pid>.<k>"
 * when that exists); commit flushes, fsyncs, renames it over
 * path and fsyncs the directory. On any failure (and on abort) the temporary
 * is removed, so path holds either its old content or the complete new one.
 * `op` names the caller in error messages ("save", "write_file_atomic"). */
typedef struct nd_atomic_file nd_atomic_file;
nd_status nd_atomic_open(const char *op, const char *path, nd_atomic_file **out);
/* On failure the file is aborted (removed and freed): do not touch it again. */
nd_status nd_atomic_write(nd_atomic_file *f, const void *data, size_t n);
/* Frees f whatever the result. */
nd_status nd_atomic_commit(nd_atomic_file *f);
/* Removes the temporary and frees f (NULL is fine). */
void nd_atomic_abort(nd_atomic_file *f);
/* The whole thing at once. */
nd_status nd_write_file_atomic(const char *op, const char *path, const void *data, size_t n);

/* ---- gunzip ----
 * The decompressed content of a gzip file (or the bytes of a plain file:
 * zlib passes them through) in a malloc'd buffer *out of *len bytes (plus a
 * terminating NUL not counted). Fails on a missing/unreadable file, a
 * truncated or corrupt stream, or content beyond max_bytes. */
#define ND_GUNZIP_DEFAULT_MAX ((uint64_t)4 << 30) /* 4 GiB */
nd_status nd_gunzip(const char *op, const char *path, uint64_t max_bytes, char **out, size_t *len);

/* ---- raw bytes ----
 * A new contiguous tensor of shape/dtype from exactly numel * dtype size
 * little-endian element bytes. Bool bytes must be 0 or 1. */
nd_status nd_from_bytes(const char *op, const void *data, size_t n, const int64_t *shape,
                        int ndim, nd_dtype dt, nd_tensor **out);

/* ---- shared by the readers (io_common.c) ----
 * An error st whose message reads "<op>: '<what>': <formatted message>". */
nd_status nd_io_fail(nd_status st, const char *op, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Opens path read-only; it must be a regular file. *fd (close it) and its size. */
nd_status nd_open_regular(const char *op, const char *path, int *fd, uint64_t *size);
/* RFC 3629 UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF):
 * the offset of the first bad byte, or len when all is well. */
size_t nd_utf8_check(const unsigned char *s, size_t len);

#endif
