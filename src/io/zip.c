/* zip.c - a read-only zip reader for torch.save archives and zips written by
 * other tools (see zip.h). The archive is untrusted: every length and offset
 * is checked against the archive's size with overflow-safe arithmetic before
 * it is used, and the central directory (the one source of sizes) is checked
 * against each local header, so a reader that walks local headers (as some
 * tools do) and this one cannot be shown different contents. A file is read
 * with pread through an nd_io_src, never mapped: one that shrinks while it
 * is read fails with an error instead of a SIGBUS. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "io/io.h"
#include "io/zip.h"
#include "tensor.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u

#define LOCAL_LEN 30
#define CENTRAL_LEN 46
#define EOCD_LEN 22
#define EOCD64_LEN 56
#define LOC64_LEN 20

#define FLAG_ENCRYPTED 0x0001u
#define FLAG_DESCRIPTOR 0x0008u
#define FLAG_STRONG_ENCRYPTION 0x0040u
#define FLAG_MASKED_HEADERS 0x2000u

#define EXTRA_ZIP64 0x0001u

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

/* [off, off + n) lies inside a buffer of len bytes */
static bool in_buf(uint64_t off, uint64_t n, uint64_t len) { return off <= len && n <= len - off; }

/* An entry name for messages: printable ASCII as is, other bytes as \xNN,
 * cut at ~120 characters. */
static const char *show_name(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o > 120) { memcpy(buf + o, "...", 3); o += 3; break; }
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}
#define NAME_BUF 160


static char *dupstr(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void nd_zip_close(nd_zip *z) {
    if (!z) return;
    if (z->entries)
        for (size_t i = 0; i < z->n; i++) free(z->entries[i].name);
    free(z->entries);
    free(z->sorted);
    free(z->what);
    free(z->op);
    free(z);
}

/* ---- extra fields ----
 * A sequence of (id u16, size u16, data). Only ZIP64 (0x0001) matters here;
 * torch's 64-byte alignment padding ('FB') and the rest are skipped. A
 * field running past the end is corrupt; 1 to 3 trailing bytes (alignment
 * padding of some tools) are tolerated. */
typedef struct {
    const uint8_t *z64;
    size_t z64_len;
    bool has_z64;
} extras;

static bool parse_extras(const uint8_t *p, size_t n, extras *x) {
    memset(x, 0, sizeof *x);
    size_t i = 0;
    while (n - i >= 4) {
        uint16_t id = rd16(p + i), sz = rd16(p + i + 2);
        if (sz > n - i - 4) return false;
        if (id == EXTRA_ZIP64 && !x->has_z64) {
            x->has_z64 = true;
            x->z64 = p + i + 4;
            x->z64_len = sz;
        }
        i += 4 + (size_t)sz;
    }
    return true;
}

/* Replaces the 32-bit fields that are 0xFFFFFFFF (and the 16-bit disk number
 * that is 0xFFFF) by their 64-bit values from the ZIP64 extra field, which
 * holds only those fields, in this order. Returns an error text or NULL. */
static const char *apply_zip64(const extras *x, uint64_t *size, uint64_t *comp, uint64_t *offset,
                               uint32_t *disk) {
    size_t need = 0;
    bool want_size = *size == 0xFFFFFFFFu, want_comp = *comp == 0xFFFFFFFFu;
    bool want_off = offset && *offset == 0xFFFFFFFFu, want_disk = disk && *disk == 0xFFFFu;
    need = 8 * (size_t)(want_size + want_comp + want_off) + 4 * (size_t)want_disk;
    if (need == 0) return NULL;
    if (!x->has_z64) return "a size or offset is 0xFFFFFFFF but there is no ZIP64 extra field";
    if (x->z64_len < need) return "its ZIP64 extra field is too short for the fields it must hold";
    const uint8_t *p = x->z64;
    if (want_size) { *size = rd64(p); p += 8; }
    if (want_comp) { *comp = rd64(p); p += 8; }
    if (want_off) { *offset = rd64(p); p += 8; }
    if (want_disk) *disk = rd32(p);
    return NULL;
}

/* A local header's ZIP64 extra field must hold both sizes, size first,
 * whichever of them is 0xFFFFFFFF (APPNOTE 4.5.3); a short one is read as
 * the central directory's kind (only the fields that are all ones). */
static const char *apply_local_zip64(const extras *x, uint64_t *size, uint64_t *comp) {
    bool want_size = *size == 0xFFFFFFFFu, want_comp = *comp == 0xFFFFFFFFu;
    if ((want_size || want_comp) && x->has_z64 && x->z64_len >= 16) {
        if (want_size) *size = rd64(x->z64);
        if (want_comp) *comp = rd64(x->z64 + 8);
        return NULL;
    }
    return apply_zip64(x, size, comp, NULL, NULL);
}

/* ---- end of central directory ---- */
typedef struct {
    uint64_t n, cd_size, cd_offset;
    uint64_t end; /* where the central directory must end: the first record after it */
} eocd_info;

/* The end record: the last thing in the archive, followed only by its
 * comment. Scanning back from the end, the first signature whose comment
 * length reaches exactly the end of the file is it (a comment cannot fake
 * one that way without also ending exactly there). *found says whether
 * there is one; *rec gets its 22 bytes and *at its offset. Fails only when
 * the bytes cannot be read. */
static nd_status scan_eocd(const nd_io_src *src, bool *found, uint8_t rec[EOCD_LEN], uint64_t *at) {
    *found = false;
    uint64_t len = src->size;
    if (len < EOCD_LEN) return ND_OK;
    uint64_t tail = len < (uint64_t)EOCD_LEN + 0xFFFF ? len : (uint64_t)EOCD_LEN + 0xFFFF;
    const uint8_t *b;
    void *owned;
    ND_TRY(nd_src_view(src, len - tail, tail, &b, &owned));
    size_t pos = (size_t)tail - EOCD_LEN;
    for (;;) {
        if (rd32(b + pos) == SIG_EOCD && (uint64_t)rd16(b + pos + 20) == tail - pos - EOCD_LEN) {
            *found = true;
            memcpy(rec, b + pos, EOCD_LEN);
            *at = len - tail + pos;
            break;
        }
        if (pos == 0) break;
        pos--;
    }
    free(owned);
    return ND_OK;
}

nd_status nd_zip_probe(const nd_io_src *src, bool *is_zip) {
    uint8_t rec[EOCD_LEN];
    uint64_t at;
    return scan_eocd(src, is_zip, rec, &at);
}

static nd_status find_eocd(const nd_io_src *src, eocd_info *e) {
    const char *op = src->op, *what = src->what;
    uint64_t len = src->size;
    if (len < EOCD_LEN)
        return nd_io_fail(ND_ERR_IO, op, what, "not a zip archive (%llu bytes, too short)", (unsigned long long)len);
    bool found;
    uint8_t r[EOCD_LEN];
    uint64_t pos;
    ND_TRY(scan_eocd(src, &found, r, &pos));
    if (!found)
        return nd_io_fail(ND_ERR_IO, op, what, "no end of central directory record (a truncated or damaged zip archive)");
    uint64_t disk = rd16(r + 4), cd_disk = rd16(r + 6);
    uint64_t n_disk = rd16(r + 8), n = rd16(r + 10);
    uint64_t cd_size = rd32(r + 12), cd_offset = rd32(r + 16);
    uint64_t end = pos;
    /* ZIP64: a locator right before the record points at the ZIP64 record */
    uint8_t l[LOC64_LEN];
    if (pos >= LOC64_LEN) ND_TRY(nd_src_read(src, pos - LOC64_LEN, l, LOC64_LEN));
    if (pos >= LOC64_LEN && rd32(l) == SIG_LOC64) {
        uint32_t l_disk = rd32(l + 4), l_total = rd32(l + 16);
        uint64_t off64 = rd64(l + 8), limit = pos - LOC64_LEN;
        if (l_disk != 0 || l_total > 1)
            return nd_io_fail(ND_ERR_IO, op, what, "multi-disk (split) zip archives are not supported");
        uint8_t r64[EOCD64_LEN];
        bool inside = in_buf(off64, EOCD64_LEN, limit);
        if (inside) ND_TRY(nd_src_read(src, off64, r64, EOCD64_LEN));
        if (!inside || rd32(r64) != SIG_EOCD64)
            return nd_io_fail(ND_ERR_IO, op, what, "the ZIP64 end of central directory locator points outside the "
                         "archive or at something else (offset %llu)", (unsigned long long)off64);
        uint64_t rec_size = rd64(r64 + 4); /* what follows its first 12 bytes */
        if (rec_size < EOCD64_LEN - 12 || rec_size > limit || !in_buf(off64, rec_size + 12, limit))
            return nd_io_fail(ND_ERR_IO, op, what, "the ZIP64 end of central directory record has a bad size (%llu)",
                         (unsigned long long)rec_size);
        uint64_t disk64 = rd32(r64 + 16), cd_disk64 = rd32(r64 + 20);
        uint64_t n_disk64 = rd64(r64 + 24), n64 = rd64(r64 + 32);
        uint64_t cd_size64 = rd64(r64 + 40), cd_offset64 = rd64(r64 + 48);
        /* the classic record's fields either say "see ZIP64" (all ones) or agree */
        if ((disk != 0xFFFF && disk != disk64) || (cd_disk != 0xFFFF && cd_disk != cd_disk64) ||
            (n_disk != 0xFFFF && n_disk != n_disk64) || (n != 0xFFFF && n != n64) ||
            (cd_size != 0xFFFFFFFFu && cd_size != cd_size64) ||
            (cd_offset != 0xFFFFFFFFu && cd_offset != cd_offset64))
            return nd_io_fail(ND_ERR_IO, op, what, "the end of central directory record and its ZIP64 record disagree");
        disk = disk64;
        cd_disk = cd_disk64;
        n_disk = n_disk64;
        n = n64;
        cd_size = cd_size64;
        cd_offset = cd_offset64;
        end = off64; /* the central directory lies before the ZIP64 record */
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n)
        return nd_io_fail(ND_ERR_IO, op, what, "multi-disk (split) zip archives are not supported");
    if (!in_buf(cd_offset, cd_size, end))
        return nd_io_fail(ND_ERR_IO, op, what, "the central directory (offset %llu, %llu bytes) lies outside the archive "
                     "(truncated?)", (unsigned long long)cd_offset, (unsigned long long)cd_size);
    if (n > ND_ZIP_MAX_ENTRIES)
        return nd_io_fail(ND_ERR_IO, op, what, "too many entries (%llu; at most %d)", (unsigned long long)n, ND_ZIP_MAX_ENTRIES);
    if (n > cd_size / CENTRAL_LEN)
        return nd_io_fail(ND_ERR_IO, op, what, "the central directory (%llu bytes) is too small for the %llu entries "
                     "the end record counts", (unsigned long long)cd_size, (unsigned long long)n);
    e->n = n;
    e->cd_size = cd_size;
    e->cd_offset = cd_offset;
    e->end = cd_offset + cd_size;
    return ND_OK;
}

/* ---- checks across entries ---- */
typedef struct {
    uint64_t start, end; /* local header .. end of data */
    size_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static const nd_zip *sort_zip; /* qsort has no context argument in C11 */
static int cmp_name_idx(const void *a, const void *b) {
    const nd_zip_entry *x = &sort_zip->entries[*(const size_t *)a];
    const nd_zip_entry *y = &sort_zip->entries[*(const size_t *)b];
    size_t m = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, m);
    if (c) return c;
    return x->name_len < y->name_len ? -1 : x->name_len > y->name_len;
}

/* name order for nd_zip_find, comparing a key against an entry */
static int cmp_key(const char *k, size_t kn, const nd_zip_entry *e) {
    size_t m = kn < e->name_len ? kn : e->name_len;
    int c = memcmp(k, e->name, m);
    if (c) return c;
    return kn < e->name_len ? -1 : kn > e->name_len;
}

/* A data descriptor (after an entry whose local header defers its CRC and
 * sizes, as torch.save's writer does) at p, with `avail` bytes before the
 * central directory: an optional signature, the CRC, then both sizes in 4
 * bytes each (8 in ZIP64 archives). One of those forms must hold the central
 * directory's values. Returns the matching form's length (it belongs to the
 * entry: no other entry may start inside it), or 0 when none matches. */
static uint64_t descriptor_len(const uint8_t *p, uint64_t avail, uint32_t crc, uint64_t comp, uint64_t size) {
    for (int sig = 1; sig >= 0; sig--) {
        const uint8_t *q = p + 4 * sig;
        if (sig && (avail < 4 || rd32(p) != 0x08074b50u)) continue;
        if (avail >= (uint64_t)4 * sig + 12 && rd32(q) == crc && rd32(q + 4) == comp && rd32(q + 8) == size)
            return (uint64_t)4 * sig + 12;
        if (avail >= (uint64_t)4 * sig + 20 && rd32(q) == crc && rd64(q + 4) == comp && rd64(q + 12) == size)
            return (uint64_t)4 * sig + 20;
    }
    return 0;
}

/* Reads central entry i at *pos (cd holds the central directory, which
 * starts at e->cd_offset) and checks it against its local header. */
static nd_status read_entry(nd_zip *z, const eocd_info *e, const uint8_t *cd, uint64_t *pos, size_t i, span *sp) {
    const char *op = z->op, *what = z->what;
    char nb[NAME_BUF];
    uint64_t cd_end = e->cd_offset + e->cd_size;
    if (!in_buf(*pos, CENTRAL_LEN, cd_end) || rd32(cd + (*pos - e->cd_offset)) != SIG_CENTRAL)
        return nd_io_fail(ND_ERR_IO, op, what, "central directory entry %zu is damaged (no signature at offset %llu)", i + 1,
                     (unsigned long long)*pos);
    const uint8_t *c = cd + (*pos - e->cd_offset);
    uint16_t flags = rd16(c + 8), method = rd16(c + 10);
    uint32_t crc = rd32(c + 16);
    uint64_t comp = rd32(c + 20), size = rd32(c + 24);
    size_t nlen = rd16(c + 28), xlen = rd16(c + 30), clen = rd16(c + 32);
    uint32_t disk = rd16(c + 34);
    uint64_t lho = rd32(c + 42);
    uint64_t total = (uint64_t)CENTRAL_LEN + nlen + xlen + clen;
    if (!in_buf(*pos, total, cd_end))
        return nd_io_fail(ND_ERR_IO, op, what, "central directory entry %zu runs past the end of the central directory", i + 1);
    const char *name = (const char *)c + CENTRAL_LEN;
    if (nlen == 0) return nd_io_fail(ND_ERR_IO, op, what, "central directory entry %zu has an empty name", i + 1);
    if (memchr(name, 0, nlen))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': its name contains a NUL byte", show_name(name, nlen, nb, sizeof nb));
    show_name(name, nlen, nb, sizeof nb);
    extras x;
    if (!parse_extras(c + CENTRAL_LEN + nlen, xlen, &x))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': corrupt extra field in the central directory", nb);
    const char *err = apply_zip64(&x, &size, &comp, &lho, &disk);
    if (err) return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': %s (central directory)", nb, err);
    if (flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_HEADERS))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s' is encrypted, which is not supported", nb);
    if (method != 0 && method != 8)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s' uses compression method %u (only stored (0) and deflated (8) "
                     "are supported)", nb, method);
    if (disk != 0) return nd_io_fail(ND_ERR_IO, op, what, "entry '%s' is on another disk (multi-disk archives are not "
                                "supported)", nb);
    if (method == 0 && comp != size)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s' is stored but its compressed size (%llu) differs from its size "
                     "(%llu)", nb, (unsigned long long)comp, (unsigned long long)size);

    /* the local header must agree */
    uint8_t l[LOCAL_LEN];
    bool inside = in_buf(lho, LOCAL_LEN, e->cd_offset);
    if (inside) ND_TRY(nd_src_read(&z->src, lho, l, LOCAL_LEN));
    if (!inside || rd32(l) != SIG_LOCAL)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': no local header at offset %llu (inside the archive, before the "
                     "central directory)", nb, (unsigned long long)lho);
    uint16_t lflags = rd16(l + 6), lmethod = rd16(l + 8);
    uint32_t lcrc = rd32(l + 14);
    uint64_t lcomp = rd32(l + 18), lsize = rd32(l + 22);
    size_t lnlen = rd16(l + 26), lxlen = rd16(l + 28);
    uint64_t data = lho + LOCAL_LEN + lnlen + lxlen;
    if (!in_buf(lho, data - lho, e->cd_offset))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': its local header runs into the central directory", nb);
    /* the local header's name and extra field */
    const uint8_t *lv;
    void *lv_owned;
    ND_TRY(nd_src_view(&z->src, lho + LOCAL_LEN, lnlen + lxlen, &lv, &lv_owned));
    if (lnlen != nlen || memcmp(lv, name, nlen) != 0) {
        char lb[NAME_BUF];
        nd_status st = nd_io_fail(ND_ERR_IO, op, what, "entry '%s': the local header names it '%s' (the central directory "
                                  "and local headers disagree)", nb, show_name((const char *)lv, lnlen, lb, sizeof lb));
        free(lv_owned);
        return st;
    }
    extras lx;
    bool lx_ok = parse_extras(lv + lnlen, lxlen, &lx);
    /* lx points into lv: keep only what is used of it */
    uint8_t lz64[16];
    if (lx_ok && lx.has_z64) {
        size_t k = lx.z64_len < sizeof lz64 ? lx.z64_len : sizeof lz64;
        memcpy(lz64, lx.z64, k);
        lx.z64 = lz64;
        lx.z64_len = k;
    }
    free(lv_owned);
    if (lmethod != method)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': compression method %u in the central directory but %u in the "
                     "local header", nb, method, lmethod);
    if (lflags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s' is encrypted, which is not supported", nb);
    if (!lx_ok)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': corrupt extra field in the local header", nb);
    if (!(lflags & FLAG_DESCRIPTOR)) {
        err = apply_local_zip64(&lx, &lsize, &lcomp);
        if (err) return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': %s (local header)", nb, err);
        if (lcrc != crc || lcomp != comp || lsize != size)
            return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': the central directory says %llu bytes (%llu compressed, CRC "
                         "%08x) but the local header says %llu (%llu compressed, CRC %08x)", nb,
                         (unsigned long long)size, (unsigned long long)comp, crc, (unsigned long long)lsize,
                         (unsigned long long)lcomp, lcrc);
    }
    if (!in_buf(data, comp, e->cd_offset))
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': its %llu bytes of data at offset %llu run past the start of the "
                     "central directory (truncated or damaged archive)", nb, (unsigned long long)comp,
                     (unsigned long long)data);
    uint64_t dlen = 0;
    if (lflags & FLAG_DESCRIPTOR) {
        /* at most 24 bytes: signature, CRC and two 8-byte sizes */
        uint8_t dd[24];
        uint64_t avail = e->cd_offset - (data + comp);
        if (avail > sizeof dd) avail = sizeof dd;
        ND_TRY(nd_src_read(&z->src, data + comp, dd, avail));
        dlen = descriptor_len(dd, avail, crc, comp, size);
    }
    if ((lflags & FLAG_DESCRIPTOR) && dlen == 0)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': the data descriptor after its data disagrees with the central "
                     "directory (%llu bytes, %llu compressed, CRC %08x) or is missing", nb,
                     (unsigned long long)size, (unsigned long long)comp, crc);
    if (method == 8 && size > 0 && comp == 0)
        return nd_io_fail(ND_ERR_IO, op, what, "entry '%s': deflated to 0 bytes but its size is %llu", nb,
                     (unsigned long long)size);
    nd_zip_entry *en = &z->entries[i];
    en->name = dupstr(name, nlen);
    if (!en->name) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", op, what);
    en->name_len = nlen;
    en->method = method;
    en->comp_size = comp;
    en->size = size;
    en->crc32 = crc;
    en->data_offset = data;
    sp->start = lho;
    sp->end = data + comp + dlen;
    sp->idx = i;
    *pos += total;
    return ND_OK;
}

nd_status nd_zip_open(const char *op, const char *what, const void *buf, size_t len, nd_zip **out) {
    nd_io_src src = nd_src_memory(op ? op : "zip", what ? what : "(memory)", buf, len);
    return nd_zip_open_src(&src, out);
}

nd_status nd_zip_open_src(const nd_io_src *src, nd_zip **out) {
    *out = NULL;
    const char *op = src->op ? src->op : "zip", *what = src->what ? src->what : "(memory)";
    nd_io_src named = *src;
    named.op = op;
    named.what = what;
    eocd_info e = {0, 0, 0, 0};
    ND_TRY(find_eocd(&named, &e));
    nd_zip *z = calloc(1, sizeof *z);
    if (!z) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", op, what);
    z->src = *src;
    z->buf = src->fd < 0 ? src->mem : NULL;
    z->len = (size_t)src->size;
    z->op = dupstr(op, strlen(op));
    z->what = dupstr(what, strlen(what));
    z->src.op = z->op; /* the source's messages name the copies */
    z->src.what = z->what;
    size_t n = (size_t)e.n;
    z->entries = calloc(n ? n : 1, sizeof *z->entries);
    z->sorted = malloc((n ? n : 1) * sizeof *z->sorted);
    span *spans = malloc((n ? n : 1) * sizeof *spans);
    const uint8_t *cd = NULL;
    void *cd_owned = NULL;
    nd_status st = ND_OK;
    if (!z->op || !z->what || !z->entries || !z->sorted || !spans) {
        st = nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory reading a zip archive of %zu entries", op, what, n);
        goto done;
    }
    /* the central directory lies inside the archive (find_eocd checked it) */
    st = nd_src_view(&z->src, e.cd_offset, e.cd_size, &cd, &cd_owned);
    if (st != ND_OK) goto done;
    uint64_t pos = e.cd_offset;
    for (size_t i = 0; i < n; i++) {
        z->n = i + 1; /* nd_zip_close frees the names read so far */
        st = read_entry(z, &e, cd, &pos, i, &spans[i]);
        if (st != ND_OK) goto done;
    }
    z->n = n;
    if (pos != e.cd_offset + e.cd_size) {
        st = nd_io_fail(ND_ERR_IO, op, what, "the central directory has %llu bytes after its %zu entries (the end record "
                   "and the central directory disagree)", (unsigned long long)(e.cd_offset + e.cd_size - pos), n);
        goto done;
    }
    /* no two entries may share bytes */
    qsort(spans, n, sizeof *spans, cmp_span);
    for (size_t i = 1; i < n; i++)
        if (spans[i].start < spans[i - 1].end) {
            char b1[NAME_BUF], b2[NAME_BUF];
            const nd_zip_entry *a = &z->entries[spans[i - 1].idx], *c = &z->entries[spans[i].idx];
            st = nd_io_fail(ND_ERR_IO, op, what, "entries '%s' and '%s' overlap in the archive", show_name(a->name, a->name_len, b1,
                       sizeof b1), show_name(c->name, c->name_len, b2, sizeof b2));
            goto done;
        }
    /* names must be unique (a name lookup must not depend on which copy wins) */
    for (size_t i = 0; i < n; i++) z->sorted[i] = i;
    sort_zip = z;
    qsort(z->sorted, n, sizeof *z->sorted, cmp_name_idx);
    sort_zip = NULL;
    for (size_t i = 1; i < n; i++) {
        const nd_zip_entry *a = &z->entries[z->sorted[i - 1]], *c = &z->entries[z->sorted[i]];
        if (a->name_len == c->name_len && memcmp(a->name, c->name, a->name_len) == 0) {
            char b1[NAME_BUF];
            st = nd_io_fail(ND_ERR_IO, op, what, "entry '%s' appears twice", show_name(a->name, a->name_len, b1, sizeof b1));
            goto done;
        }
    }
done:
    free(spans);
    free(cd_owned);
    if (st != ND_OK) {
        nd_zip_close(z);
        return st;
    }
    *out = z;
    return ND_OK;
}

int64_t nd_zip_find(const nd_zip *z, const char *name, size_t name_len) {
    size_t lo = 0, hi = z->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_key(name, name_len, &z->entries[z->sorted[mid]]);
        if (c == 0) return (int64_t)z->sorted[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return -1;
}

static uint32_t crc_of(const uint8_t *p, uint64_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

#define IN_CHUNK ((size_t)1 << 20) /* compressed bytes read from a file at a time */

/* Inflates entry en (raw deflate) into out[0, en->size): the stream must
 * produce exactly that many bytes and end exactly at the end of its
 * compressed data. A memory archive is inflated in place; a file's
 * compressed bytes are read IN_CHUNK at a time. */
static nd_status inflate_entry(const nd_zip *z, const nd_zip_entry *en, uint8_t *out, const char *nb) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    uint8_t *chunk = NULL;
    if (z->src.fd >= 0 && !(chunk = malloc(IN_CHUNK)))
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': entry '%s': out of memory inflating", z->op, z->what, nb);
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
        free(chunk);
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': entry '%s': zlib could not start", z->op, z->what, nb);
    }
    uint64_t in_at = en->data_offset; /* the next compressed byte */
    uint64_t in_left = en->comp_size, out_left = en->size;
    uint8_t probe;
    bool probing = false;
    nd_status st = ND_OK;
    for (;;) {
        if (zs.avail_in == 0 && in_left > 0) {
            uInt k = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            if (chunk) {
                if (k > IN_CHUNK) k = (uInt)IN_CHUNK;
                st = nd_src_read(&z->src, in_at, chunk, k);
                if (st != ND_OK) break;
                zs.next_in = chunk;
            } else {
                zs.next_in = (Bytef *)(z->buf + in_at);
            }
            zs.avail_in = k;
            in_at += k;
            in_left -= k;
        }
        if (zs.avail_out == 0) {
            if (out_left > 0) {
                uInt k = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
                zs.next_out = out;
                zs.avail_out = k;
                out += k;
                out_left -= k;
            } else if (!probing) {
                /* the expected size is reached: one more byte means overlong */
                probing = true;
                zs.next_out = &probe;
                zs.avail_out = 1;
            }
        }
        int r = inflate(&zs, Z_NO_FLUSH);
        if (probing && zs.avail_out == 0) {
            st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s' inflates to more than the %llu bytes the central directory "
                       "says", nb, (unsigned long long)en->size);
            break;
        }
        if (r == Z_STREAM_END) {
            if (!probing && (zs.avail_out > 0 || out_left > 0)) {
                st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s' inflates to %llu bytes but the central directory says "
                           "%llu", nb, (unsigned long long)zs.total_out, (unsigned long long)en->size);
            } else if (zs.avail_in > 0 || in_left > 0) {
                st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s': %llu bytes of its compressed data follow the end of the "
                           "deflate stream", nb, (unsigned long long)(zs.avail_in + in_left));
            }
            break;
        }
        if (r == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) {
            if (probing) /* every byte is there, but not the stream's end (its final block) */
                st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s': the deflate stream does not end after %llu bytes (its %llu "
                           "compressed bytes give the central directory's size but no end of stream: damaged "
                           "or cut short)", nb, (unsigned long long)en->size, (unsigned long long)en->comp_size);
            else
                st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s': the deflate stream is truncated (%llu compressed bytes "
                           "give only %llu of %llu bytes)", nb, (unsigned long long)en->comp_size,
                           (unsigned long long)zs.total_out, (unsigned long long)en->size);
            break;
        }
        if (r != Z_OK && r != Z_BUF_ERROR) {
            if (r == Z_MEM_ERROR)
                st = nd_fail(ND_ERR_MEMORY, "%s: '%s': entry '%s': out of memory inflating", z->op, z->what, nb);
            else
                st = nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s': corrupt deflate stream (%s)", nb,
                           zs.msg ? zs.msg : "zlib error");
            break;
        }
    }
    inflateEnd(&zs);
    free(chunk);
    return st;
}

static nd_status crc_check(const nd_zip *z, const nd_zip_entry *en, const uint8_t *p, const char *nb) {
    uint32_t c = crc_of(p, en->size);
    if (c != en->crc32)
        return nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s': CRC-32 mismatch (computed %08x, recorded %08x): the data "
                          "is damaged", nb, c, en->crc32);
    return ND_OK;
}

/* What a deflated entry must pass before memory is allocated for it. */
static nd_status inflate_checks(const nd_zip *z, const nd_zip_entry *en, uint64_t max_bytes, const char *nb) {
    if (en->size > max_bytes)
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': entry '%s' inflates to %llu bytes, beyond the limit of %llu",
                       z->op, z->what, nb, (unsigned long long)en->size, (unsigned long long)max_bytes);
    /* deflate cannot beat ~1032:1, so a size beyond that is a lie (and a bomb) */
    if (en->comp_size < UINT64_MAX / 2048 && en->size > (en->comp_size + 16) * 1032)
        return nd_io_fail(ND_ERR_IO, z->op, z->what, "entry '%s' claims %llu bytes from %llu compressed bytes, more than "
                     "deflate can encode", nb, (unsigned long long)en->size, (unsigned long long)en->comp_size);
    if (en->size >= SIZE_MAX)
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': entry '%s' is too large (%llu bytes)", z->op, z->what, nb,
                       (unsigned long long)en->size);
    return ND_OK;
}

nd_status nd_zip_read(const nd_zip *z, size_t i, uint64_t max_bytes, const uint8_t **data, size_t *len,
                      void **owned) {
    *data = NULL;
    *len = 0;
    *owned = NULL;
    if (i >= z->n) return nd_fail(ND_ERR_INDEX, "%s: '%s': no zip entry %zu", z->op, z->what, i);
    const nd_zip_entry *en = &z->entries[i];
    char nb[NAME_BUF];
    show_name(en->name, en->name_len, nb, sizeof nb);
    if (en->method == 0) {
        /* inside the archive (checked at open): a pointer into a memory
         * archive, a copy read from a file */
        const uint8_t *p;
        void *copy;
        ND_TRY(nd_src_view(&z->src, en->data_offset, en->size, &p, &copy));
        nd_status st = crc_check(z, en, p, nb);
        if (st != ND_OK) {
            free(copy);
            return st;
        }
        *data = p;
        *len = (size_t)en->size;
        *owned = copy;
        return ND_OK;
    }
    ND_TRY(inflate_checks(z, en, max_bytes, nb));
    uint8_t *buf = malloc(en->size ? (size_t)en->size : 1);
    if (!buf)
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory inflating entry '%s' (%llu bytes)", z->op, z->what,
                       nb, (unsigned long long)en->size);
    nd_status st = inflate_entry(z, en, buf, nb);
    if (st == ND_OK) st = crc_check(z, en, buf, nb);
    if (st != ND_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    *len = (size_t)en->size;
    *owned = buf;
    return ND_OK;
}

nd_status nd_zip_read_into(const nd_zip *z, size_t i, void *dst, uint64_t n) {
    if (i >= z->n) return nd_fail(ND_ERR_INDEX, "%s: '%s': no zip entry %zu", z->op, z->what, i);
    const nd_zip_entry *en = &z->entries[i];
    char nb[NAME_BUF];
    show_name(en->name, en->name_len, nb, sizeof nb);
    if (n != en->size)
        return nd_fail(ND_ERR_ARG, "%s: '%s': entry '%s' has %llu bytes, not %llu", z->op, z->what, nb,
                       (unsigned long long)en->size, (unsigned long long)n);
    if (en->method == 0) {
        ND_TRY(nd_src_read(&z->src, en->data_offset, dst, en->size));
    } else {
        ND_TRY(inflate_checks(z, en, UINT64_MAX, nb));
        ND_TRY(inflate_entry(z, en, dst, nb));
    }
    return crc_check(z, en, dst, nb);
}
