/* image.c - image files into uint8 tensors (H, W, C): PNG through libpng's
 * simplified API, JPEG through libjpeg-turbo's TurboJPEG, binary PPM/PGM
 * (P6/P5) by hand. The format comes from the file's first bytes, not its
 * name. Files are untrusted input: every size is checked before anything is
 * allocated (at most ND_IMAGE_MAX_SIDE per side and ND_IMAGE_MAX_PIXELS in
 * all, so a 20-byte header cannot ask for gigabytes), and a corrupt or
 * truncated file is an error naming the file, never a crash. A build without
 * libpng or libturbojpeg (NEEDLE_PNG / NEEDLE_JPEG undefined) says so when
 * such a file is read. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io.h"
#include "tensor.h"
#ifdef NEEDLE_PNG
#include <png.h>
#endif
#ifdef NEEDLE_JPEG
#include <turbojpeg.h>
#endif

#define ND_IMAGE_MAX_SIDE 65535
#define ND_IMAGE_MAX_PIXELS ((int64_t)1 << 28) /* 268M pixels: 805 MB as RGB */
#define ND_IMAGE_MAX_FILE ((long)1 << 30)

static nd_status too_big(const char *op, const char *path, int64_t w, int64_t h) {
    return nd_fail(ND_ERR_IO, "%s: %s: the image is %lld x %lld pixels, more than needle reads "
                   "(at most %d per side, %lld in all)", op, path, (long long)w, (long long)h,
                   ND_IMAGE_MAX_SIDE, (long long)ND_IMAGE_MAX_PIXELS);
}

static nd_status check_size(const char *op, const char *path, int64_t w, int64_t h) {
    if (w <= 0 || h <= 0) return nd_fail(ND_ERR_IO, "%s: %s: the image has no pixels (%lld x %lld)", op, path,
                                         (long long)w, (long long)h);
    if (w > ND_IMAGE_MAX_SIDE || h > ND_IMAGE_MAX_SIDE || w * h > ND_IMAGE_MAX_PIXELS) return too_big(op, path, w, h);
    return ND_OK;
}

static nd_status new_image(int64_t h, int64_t w, int c, nd_tensor **out) {
    int64_t shape[3] = {h, w, c};
    return nd_empty(shape, 3, ND_UINT8, out);
}

/* the whole file, at most ND_IMAGE_MAX_FILE bytes */
static nd_status read_all(const char *op, const char *path, unsigned char **buf, size_t *len) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return nd_fail(ND_ERR_IO, "%s: cannot open %s: %s", op, path, strerror(errno));
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return nd_fail(ND_ERR_IO, "%s: cannot read %s: not a regular file", op, path);
    }
    if (n > ND_IMAGE_MAX_FILE) {
        fclose(f);
        return nd_fail(ND_ERR_IO, "%s: %s is %ld bytes, more than the %ld an image file may have", op, path, n,
                       ND_IMAGE_MAX_FILE);
    }
    unsigned char *b = malloc((size_t)n + 1);
    if (!b) {
        fclose(f);
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory reading %s (%ld bytes)", op, path, n);
    }
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(b);
        return nd_fail(ND_ERR_IO, "%s: cannot read %s: got %zu of %ld bytes", op, path, got, n);
    }
    *buf = b;
    *len = (size_t)n;
    return ND_OK;
}

/* ---- PPM / PGM (binary P6 / P5, maxval 1..255) ---- */

/* the next header number, after whitespace and # comments */
static bool pnm_number(const unsigned char *b, size_t len, size_t *pos, int64_t *out) {
    size_t p = *pos;
    for (;;) {
        while (p < len && (b[p] == ' ' || b[p] == '\t' || b[p] == '\n' || b[p] == '\r' || b[p] == '\f' || b[p] == '\v'))
            p++;
        if (p < len && b[p] == '#') {
            while (p < len && b[p] != '\n') p++;
            continue;
        }
        break;
    }
    if (p >= len || b[p] < '0' || b[p] > '9') return false;
    int64_t v = 0;
    while (p < len && b[p] >= '0' && b[p] <= '9') {
        v = v * 10 + (b[p] - '0');
        if (v > (int64_t)1 << 31) return false;
        p++;
    }
    *pos = p;
    *out = v;
    return true;
}

static nd_status read_pnm(const char *op, const char *path, const unsigned char *b, size_t len, int want,
                          nd_tensor **out) {
    int have = b[1] == '6' ? 3 : 1;
    size_t pos = 2;
    int64_t w, h, maxval;
    if (!pnm_number(b, len, &pos, &w) || !pnm_number(b, len, &pos, &h) || !pnm_number(b, len, &pos, &maxval))
        return nd_fail(ND_ERR_IO, "%s: %s: a malformed P%c header (expected width, height and maxval)", op, path, b[1]);
    ND_TRY(check_size(op, path, w, h));
    if (maxval < 1 || maxval > 255)
        return nd_fail(ND_ERR_IO, "%s: %s: maxval %lld is not supported (1..255: 8-bit samples)", op, path,
                       (long long)maxval);
    if (pos >= len) return nd_fail(ND_ERR_IO, "%s: %s: truncated after the header", op, path);
    pos++; /* the single whitespace byte before the samples */
    int64_t need = w * h * have;
    if ((int64_t)(len - pos) < need)
        return nd_fail(ND_ERR_IO, "%s: %s: truncated: %lld bytes of samples, expected %lld", op, path,
                       (long long)(len - pos), (long long)need);
    int c = want ? want : have;
    ND_TRY(new_image(h, w, c, out));
    uint8_t *dst = (uint8_t *)nd_ptr(*out);
    const unsigned char *src = b + pos;
    for (int64_t i = 0; i < w * h; i++) {
        unsigned v[3];
        for (int k = 0; k < 3; k++) {
            unsigned s = src[i * have + (have == 3 ? k : 0)];
            v[k] = maxval == 255 ? s : (s > (unsigned)maxval ? 255 : (s * 255 + (unsigned)maxval / 2) / (unsigned)maxval);
        }
        for (int k = 0; k < c; k++) dst[i * c + k] = (uint8_t)v[k];
    }
    return ND_OK;
}

/* ---- PNG ---- */

static nd_status read_png(const char *op, const char *path, const unsigned char *b, size_t len, int want,
                          nd_tensor **out) {
#ifdef NEEDLE_PNG
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, b, len))
        return nd_fail(ND_ERR_IO, "%s: %s: not a readable PNG (%s)", op, path, img.message);
    nd_status st = check_size(op, path, img.width, img.height);
    if (st != ND_OK) { png_image_free(&img); return st; }
    int c = want ? want : ((img.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1);
    /* alpha is dropped, not composited, as PIL's convert("RGB") and
     * torchvision's read_image do: read with it, then keep the colour bytes */
    bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    img.format = c == 3 ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB) : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
    int64_t px = (int64_t)img.width * img.height;
    st = new_image(img.height, img.width, c, out);
    unsigned char *tmp = NULL;
    if (st == ND_OK && alpha && !(tmp = malloc((size_t)px * (size_t)(c + 1))))
        st = nd_fail(ND_ERR_MEMORY, "%s: out of memory reading %s", op, path);
    if (st != ND_OK) {
        nd_release(*out);
        *out = NULL;
        png_image_free(&img);
        return st;
    }
    unsigned char *dst = (unsigned char *)nd_ptr(*out);
    if (!png_image_finish_read(&img, NULL, alpha ? tmp : dst, 0, NULL)) {
        free(tmp);
        nd_release(*out);
        *out = NULL;
        return nd_fail(ND_ERR_IO, "%s: %s: a corrupt PNG (%s)", op, path, img.message);
    }
    if (alpha) {
        for (int64_t i = 0; i < px; i++)
            for (int k = 0; k < c; k++) dst[i * c + k] = tmp[i * (c + 1) + k];
        free(tmp);
    }
    return ND_OK;
#else
    (void)b; (void)len; (void)want; (void)out;
    return nd_fail(ND_ERR_UNSUPPORTED, "%s: %s is a PNG, and this needle was built without libpng "
                   "(apt install libpng-dev, then rebuild)", op, path);
#endif
}

/* ---- JPEG ---- */

static nd_status read_jpeg(const char *op, const char *path, const unsigned char *b, size_t len, int want,
                           nd_tensor **out) {
#ifdef NEEDLE_JPEG
    tjhandle tj = tjInitDecompress();
    if (!tj) return nd_fail(ND_ERR_MEMORY, "%s: cannot start the JPEG decoder", op);
    int w = 0, h = 0, sub = 0, space = 0;
    nd_status st = ND_OK;
    if (tjDecompressHeader3(tj, b, (unsigned long)len, &w, &h, &sub, &space) != 0)
        st = nd_fail(ND_ERR_IO, "%s: %s: not a readable JPEG (%s)", op, path, tjGetErrorStr2(tj));
    if (st == ND_OK && (w <= 0 || h <= 0))
        st = nd_fail(ND_ERR_IO, "%s: %s: not a readable JPEG (no frame header)", op, path);
    if (st == ND_OK) st = check_size(op, path, w, h);
    int c = want ? want : (space == TJCS_GRAY ? 1 : 3);
    if (st == ND_OK) st = new_image(h, w, c, out);
    if (st == ND_OK &&
        tjDecompress2(tj, b, (unsigned long)len, (unsigned char *)nd_ptr(*out), w, 0, h, c == 3 ? TJPF_RGB : TJPF_GRAY,
                      TJFLAG_ACCURATEDCT) != 0) {
        /* a warning (a truncated scan still decodes) is kept; an error is not */
        if (tjGetErrorCode(tj) == TJERR_FATAL) {
            st = nd_fail(ND_ERR_IO, "%s: %s: a corrupt JPEG (%s)", op, path, tjGetErrorStr2(tj));
            nd_release(*out);
            *out = NULL;
        }
    }
    tjDestroy(tj);
    return st;
#else
    (void)b; (void)len; (void)want; (void)out;
    return nd_fail(ND_ERR_UNSUPPORTED, "%s: %s is a JPEG, and this needle was built without libturbojpeg "
                   "(apt install libturbojpeg0-dev, then rebuild)", op, path);
#endif
}

/* RGB to gray with PIL's convert("L") rule (ITU-R 601-2 luma in 16-bit
 * fixed point), so every format gives the same gray; gray to RGB repeats it */
static nd_status convert_channels(const nd_tensor *img, int c, nd_tensor **out) {
    int64_t h = img->shape[0], w = img->shape[1], px = h * w;
    ND_TRY(new_image(h, w, c, out));
    const uint8_t *src = (const uint8_t *)nd_ptr(img);
    uint8_t *dst = (uint8_t *)nd_ptr(*out);
    for (int64_t i = 0; i < px; i++) {
        if (c == 1) {
            uint32_t r = src[3 * i], g = src[3 * i + 1], bl = src[3 * i + 2];
            dst[i] = (uint8_t)((r * 19595 + g * 38470 + bl * 7471 + 0x8000) >> 16);
        } else {
            dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[i];
        }
    }
    return ND_OK;
}

nd_status nd_image_read(const char *op, const char *path, int channels, nd_tensor **out) {
    *out = NULL;
    if (channels != 0 && channels != 1 && channels != 3)
        return nd_fail(ND_ERR_ARG, "%s: channels must be 1 (gray) or 3 (RGB), got %d", op, channels);
    unsigned char *b;
    size_t len = 0;
    ND_TRY(read_all(op, path, &b, &len));
    /* each reader gives the file's own channels (3 or 1); the conversion
     * is one rule for every format (convert_channels) */
    nd_status st;
    nd_tensor *img = NULL;
    if (len >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) st = read_png(op, path, b, len, 0, &img);
    else if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) st = read_jpeg(op, path, b, len, 0, &img);
    else if (len >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) st = read_pnm(op, path, b, len, 0, &img);
    else st = nd_fail(ND_ERR_IO, "%s: %s is not a PNG, JPEG or binary PPM/PGM image (by its first bytes)", op, path);
    free(b);
    if (st != ND_OK) return st;
    if (channels == 0 || img->shape[2] == channels) {
        *out = img;
        return ND_OK;
    }
    st = convert_channels(img, channels, out);
    nd_release(img);
    return st;
}
