/* zip.h - a read-only zip reader for torch.save archives (PyTorch >= 1.6)
 * and zips written by other tools.
 *
 * The archive is a byte buffer the caller keeps alive (a fuzzer's input),
 * or a file read through an nd_io_src (io.h) the caller keeps open: a file
 * is read with pread, never mapped, so one truncated while it is read fails
 * with "unexpected end of file (it was truncated while being read?)"
 * instead of killing the process with SIGBUS. nd_zip_open finds the end-of-central-directory record
 * (and the ZIP64 locator/record when present), reads every central
 * directory entry (ZIP64 extra fields included) and checks each against
 * its local header: the name, the method and, unless the local header
 * defers them to a data descriptor, the sizes and CRC must agree, and the
 * entry's bytes must lie inside the buffer, before the central directory,
 * without overlapping another entry. Duplicate names, encrypted entries,
 * methods other than stored (0) and deflated (8) and multi-disk archives
 * are rejected. Sizes always come from the central directory.
 *
 * Failures are nd_status errors whose message reads "<op>: '<what>': ..."
 * with what was wrong (and the entry's name where there is one). */
#ifndef ND_ZIP_H
#define ND_ZIP_H

#include <stddef.h>
#include <stdint.h>
#include "needle.h"
#include "io/io.h"

#define ND_ZIP_MAX_ENTRIES 1000000

typedef struct {
    char *name;             /* NUL-terminated copy; name_len bytes (no NULs: rejected) */
    size_t name_len;
    uint16_t method;        /* 0 stored, 8 deflated */
    uint64_t comp_size;     /* bytes in the archive */
    uint64_t size;          /* bytes once inflated */
    uint32_t crc32;
    uint64_t data_offset;   /* where the entry's bytes start in the buffer */
} nd_zip_entry;

typedef struct nd_zip {
    nd_io_src src;          /* where the bytes are read from (borrowed) */
    const uint8_t *buf;     /* a memory archive's bytes (borrowed), NULL for a file */
    size_t len;             /* the archive's size */
    nd_zip_entry *entries;  /* in central directory order */
    size_t n;
    size_t *sorted;         /* entry indices in name order (nd_zip_find's binary search) */
    char *what;             /* copy, for messages */
    char *op;
} nd_zip;

nd_status nd_zip_open(const char *op, const char *what, const void *buf, size_t len, nd_zip **out);
/* The same from a source (its op and what name it in messages). */
nd_status nd_zip_open_src(const nd_io_src *src, nd_zip **out);
/* Whether src ends with an end-of-central-directory record (what
 * nd_zip_open looks for first): nd_detect_format's test for a zip. Fails
 * only when src cannot be read. */
nd_status nd_zip_probe(const nd_io_src *src, bool *is_zip);
void nd_zip_close(nd_zip *z);

/* Index of the entry called name (exact bytes), or -1. */
int64_t nd_zip_find(const nd_zip *z, const char *name, size_t name_len);

/* Entry i's content. Stored entries: *data points into a memory archive
 * (*owned is NULL), or into a copy read from the file (*owned = *data).
 * Deflated: inflated with zlib into a malloc'd buffer
 * returned in both *data and *owned (free(*owned) when done); the stream
 * must inflate to exactly the central directory's size, which must not
 * exceed max_bytes. The CRC-32 is checked in both cases. */
nd_status nd_zip_read(const nd_zip *z, size_t i, uint64_t max_bytes, const uint8_t **data,
                      size_t *len, void **owned);
/* Entry i's content written into dst, which has room for exactly its n
 * bytes (n must be its size: the caller allocated for it, so no limit
 * applies but deflate's 1032:1), read or inflated straight there, CRC
 * checked; dst holds garbage on failure. */
nd_status nd_zip_read_into(const nd_zip *z, size_t i, void *dst, uint64_t n);

#endif
