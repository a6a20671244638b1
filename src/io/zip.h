/* zip.h - a read-only zip reader for torch.save archives (PyTorch >= 1.6)
 * and zips written by other tools.
 *
 * The archive is a byte buffer the caller keeps alive (a mapped file or a
 * fuzzer's input). nd_zip_open finds the end-of-central-directory record
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
    const uint8_t *buf;     /* borrowed */
    size_t len;
    nd_zip_entry *entries;  /* in central directory order */
    size_t n;
    size_t *sorted;         /* entry indices in name order (nd_zip_find's binary search) */
    char *what;             /* copy, for messages */
    char *op;
} nd_zip;

nd_status nd_zip_open(const char *op, const char *what, const void *buf, size_t len, nd_zip **out);
void nd_zip_close(nd_zip *z);

/* Index of the entry called name (exact bytes), or -1. */
int64_t nd_zip_find(const nd_zip *z, const char *name, size_t name_len);

/* Entry i's content. Stored entries: *data points into the buffer and
 * *owned is NULL. Deflated: inflated with zlib into a malloc'd buffer
 * returned in both *data and *owned (free(*owned) when done); the stream
 * must inflate to exactly the central directory's size, which must not
 * exceed max_bytes. The CRC-32 is checked in both cases. */
nd_status nd_zip_read(const nd_zip *z, size_t i, uint64_t max_bytes, const uint8_t **data,
                      size_t *len, void **owned);

#endif
