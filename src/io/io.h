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

/* ---- images ----
 * The image file at path as a new uint8 tensor (H, W, C): PNG, JPEG or
 * binary PPM/PGM, told apart by their first bytes. channels 3 gives RGB, 1
 * gray (luma), 0 what the file has (3 or 1; PNG alpha is dropped, as
 * PIL's convert("RGB")). Untrusted input: sizes are bounded before allocating (image.c). */
nd_status nd_image_read(const char *op, const char *path, int channels, nd_tensor **out);

/* ---- raw bytes ----
 * A new contiguous tensor of shape/dtype from exactly numel * dtype size
 * little-endian element bytes. Bool bytes must be 0 or 1. */
nd_status nd_from_bytes(const char *op, const void *data, size_t n, const int64_t *shape,
                        int ndim, nd_dtype dt, nd_tensor **out);

/* ---- shared by the readers (io_common.c) ----
 * An error st whose message reads "<op>: '<what>': <formatted message>". */
nd_status nd_io_fail(nd_status st, const char *op, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Opens path read-only; it must be a regular file. *fd (close it) and its
 * size. Anything else (a FIFO, a device, a socket, a directory) is refused
 * without blocking and without side effects: the type is checked with stat
 * before the open, the open does not wait (O_NONBLOCK, cleared afterwards)
 * and fstat checks the type again. */
nd_status nd_open_regular(const char *op, const char *path, int *fd, uint64_t *size);
/* "a FIFO", "a character device", ... for a non-regular st_mode (messages) */
const char *nd_file_type_name(unsigned mode);
/* RFC 3629 UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF):
 * the offset of the first bad byte, or len when all is well. */
size_t nd_utf8_check(const unsigned char *s, size_t len);

/* ---- a source of bytes: a file read with pread, or a buffer ----
 * Every reader of src/io reads through one, so a file that shrinks while it
 * is read (another process truncating or rewriting it) fails with
 * "unexpected end of file (it was truncated while being read?)" in every
 * reader alike, never with a signal (no reader maps a file: SIGBUS would
 * kill the process and pcall could not catch it). */
typedef struct {
    const char *op, *what;     /* prefix of messages: "<op>: '<what>': ..." */
    int fd;                    /* >= 0: a file (nd_src_open), read with pread */
    const unsigned char *mem;  /* fd < 0: bytes in memory */
    uint64_t size;             /* the file's size when it was opened, or the buffer's */
} nd_io_src;

/* Opens path (nd_open_regular): close it with nd_src_close. */
nd_status nd_src_open(const char *op, const char *path, nd_io_src *s);
void nd_src_close(nd_io_src *s);
static inline nd_io_src nd_src_memory(const char *op, const char *what, const void *buf, size_t len) {
    nd_io_src s = {op, what, -1, (const unsigned char *)buf, len};
    return s;
}
/* Exactly n bytes at off into dst: "unexpected end of file" when
 * [off, off + n) is not inside size, or the file ends before it. */
nd_status nd_src_read(const nd_io_src *s, uint64_t off, void *dst, uint64_t n);
/* [off, off + n) where it can be read: a pointer into a memory source
 * (*owned = NULL), else a malloc'd copy (*owned = *p: free it). */
nd_status nd_src_view(const nd_io_src *s, uint64_t off, uint64_t n, const uint8_t **p, void **owned);

/* ---- file formats (format.c) ----
 * What a file is, decided from its structure in one place for every loader
 * (nd.load, nd.load_torch, checkpoints):
 *   safetensors    a header length N (8 bytes, little-endian) with 2 <= N <=
 *                  ND_ST_MAX_HEADER and 8 + N <= size, and '{' at offset 8
 *                  (after any JSON whitespace, which the reader skips too);
 *   torch legacy   the pickled magic number 0x1950a86a20f9469cfc6c that torch.save
 *                  wrote first before 1.6 (any pickle protocol);
 *   zip            an end-of-central-directory record (as nd_zip_open finds it),
 *                  or, having lost it (truncated, damaged), a first local header
 *                  ("PK\3\4", or "PK\5\6" of an empty archive), so that the
 *                  zip reader says what is wrong;
 * in that order, the tests of the first bytes before the weaker one of the
 * end (a safetensors file whose tensor data ends like a zip's end record is
 * still safetensors; a zip cannot pass the safetensors test: its bytes 8-9
 * are a compression method). Anything else is ND_FMT_UNKNOWN. */
typedef enum { ND_FMT_UNKNOWN, ND_FMT_SAFETENSORS, ND_FMT_ZIP, ND_FMT_TORCH_LEGACY } nd_file_format;
nd_status nd_detect_format(const nd_io_src *s, nd_file_format *out);
/* "safetensors", "zip", "torch_legacy", "unknown" */
const char *nd_file_format_name(nd_file_format f);

#endif
