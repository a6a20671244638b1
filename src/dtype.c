/* dtype.c - names, sizes, promotion and scalar conversion of element types. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "tensor.h"

static const struct { const char *name; size_t size; } dtype_info[ND_NUM_DTYPES] = {
    [ND_FLOAT32] = {"float32", 4}, [ND_FLOAT64] = {"float64", 8}, [ND_INT64] = {"int64", 8},
    [ND_INT32] = {"int32", 4},     [ND_UINT8] = {"uint8", 1},     [ND_BOOL] = {"bool", 1},
    [ND_FLOAT16] = {"float16", 2}, [ND_BFLOAT16] = {"bfloat16", 2},
};

const char *nd_dtype_name(nd_dtype dt) {
    return (unsigned)dt < ND_NUM_DTYPES ? dtype_info[dt].name : "invalid";
}

size_t nd_dtype_size(nd_dtype dt) { return (unsigned)dt < ND_NUM_DTYPES ? dtype_info[dt].size : 0; }

nd_status nd_dtype_from_name(const char *name, nd_dtype *out) {
    static const struct { const char *alias; nd_dtype dt; } aliases[] = {
        {"float", ND_FLOAT32}, {"double", ND_FLOAT64}, {"long", ND_INT64}, {"int", ND_INT32},
        {"half", ND_FLOAT16}, {"byte", ND_UINT8},
    };
    for (int i = 0; i < ND_NUM_DTYPES; i++)
        if (strcmp(name, dtype_info[i].name) == 0) { *out = (nd_dtype)i; return ND_OK; }
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].dt; return ND_OK; }
    return nd_fail(ND_ERR_DTYPE,
                   "unknown dtype '%s' (expected float32, float64, int64, int32, uint8, bool, "
                   "float16 or bfloat16)", name);
}

int nd_dtype_is_float(nd_dtype dt) {
    return dt == ND_FLOAT32 || dt == ND_FLOAT64 || dt == ND_FLOAT16 || dt == ND_BFLOAT16;
}

int nd_dtype_is_half(nd_dtype dt) { return dt == ND_FLOAT16 || dt == ND_BFLOAT16; }

int nd_dtype_is_int(nd_dtype dt) { return dt == ND_INT64 || dt == ND_INT32 || dt == ND_UINT8; }

/* PyTorch's lattice restricted to our types: bool < uint8 < int32 < int64 <
 * float16/bfloat16 < float32 < float64. Half types compute as float32. */
nd_dtype nd_promote(nd_dtype a, nd_dtype b) {
    static const int rank[ND_NUM_DTYPES] = {
        [ND_BOOL] = 0, [ND_UINT8] = 1, [ND_INT32] = 2, [ND_INT64] = 3,
        [ND_FLOAT16] = 4, [ND_BFLOAT16] = 4, [ND_FLOAT32] = 5, [ND_FLOAT64] = 6};
    if (a == b) return a;
    nd_dtype r = rank[a] >= rank[b] ? a : b;
    if (r == ND_FLOAT16 || r == ND_BFLOAT16) r = ND_FLOAT32;
    return r;
}

float nd_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else { /* subnormal: value = mant * 2^-24 */
            float f = ldexpf((float)mant, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
    else bits = sign | ((exp + 112) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t nd_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);
    if (absx >= 0x477ff000u) return sign | 0x7c00; /* overflow to inf */
    if (absx < 0x38800000u) { /* subnormal or zero: round to nearest even */
        float a;
        memcpy(&a, &absx, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f); /* a / 2^-24 */
    }
    uint32_t mant = absx & 0x7fffff, exp = (absx >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* may carry into exponent: fine */
    return sign | (uint16_t)h;
}

float nd_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t nd_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

double nd_load_f64(const void *p, nd_dtype dt) {
    switch (dt) {
    case ND_FLOAT32: return *(const float *)p;
    case ND_FLOAT64: return *(const double *)p;
    case ND_INT64: return (double)*(const int64_t *)p;
    case ND_INT32: return *(const int32_t *)p;
    case ND_UINT8: return *(const uint8_t *)p;
    case ND_BOOL: return *(const uint8_t *)p != 0;
    case ND_FLOAT16: return nd_half_to_float(*(const uint16_t *)p);
    case ND_BFLOAT16: return nd_bf16_to_float(*(const uint16_t *)p);
    default: return 0;
    }
}

/* The values of integer dtype dt (false for the others). */
static bool int_range(nd_dtype dt, int64_t *lo, int64_t *hi) {
    switch (dt) {
    case ND_INT64: *lo = INT64_MIN; *hi = INT64_MAX; return true;
    case ND_INT32: *lo = INT32_MIN; *hi = INT32_MAX; return true;
    case ND_UINT8: *lo = 0; *hi = UINT8_MAX; return true;
    default: return false;
    }
}

/* The one conversion rule into an integer dtype (docs/tensor.md, dtypes):
 * truncate toward zero, saturate at [lo, hi], NaN gives 0; never a wrap,
 * never C's undefined float-to-integer cast. (double)hi rounds INT64_MAX up
 * to 2^63, so v >= it saturates exactly the values that do not fit. */
static int64_t f64_to_int(double v, int64_t lo, int64_t hi) {
    if (isnan(v)) return 0;
    if (v >= (double)hi) return hi;
    if (v <= (double)lo) return lo;
    return (int64_t)v;
}

static int64_t i64_to_int(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

void nd_store_f64(void *p, nd_dtype dt, double v) {
    switch (dt) {
    case ND_FLOAT32: *(float *)p = (float)v; break;
    case ND_FLOAT64: *(double *)p = v; break;
    case ND_INT64: *(int64_t *)p = f64_to_int(v, INT64_MIN, INT64_MAX); break;
    case ND_INT32: *(int32_t *)p = (int32_t)f64_to_int(v, INT32_MIN, INT32_MAX); break;
    case ND_UINT8: *(uint8_t *)p = (uint8_t)f64_to_int(v, 0, UINT8_MAX); break;
    case ND_BOOL: *(uint8_t *)p = v != 0; break; /* NaN is not 0: true */
    case ND_FLOAT16: *(uint16_t *)p = nd_float_to_half((float)v); break;
    case ND_BFLOAT16: *(uint16_t *)p = nd_float_to_bf16((float)v); break;
    default: break;
    }
}

void nd_store_number(void *p, nd_dtype dt, nd_number n) {
    if (!n.is_int) { nd_store_f64(p, dt, n.f); return; }
    switch (dt) {
    case ND_INT64: *(int64_t *)p = n.i; break;
    case ND_INT32: *(int32_t *)p = (int32_t)i64_to_int(n.i, INT32_MIN, INT32_MAX); break;
    case ND_UINT8: *(uint8_t *)p = (uint8_t)i64_to_int(n.i, 0, UINT8_MAX); break;
    case ND_BOOL: *(uint8_t *)p = n.i != 0; break;
    default: nd_store_f64(p, dt, (double)n.i); break;
    }
}

/* n as an exact value of dt: 0 it is, 1 it is not an integer, 2 out of range */
static int number_fit(nd_dtype dt, nd_number n, int64_t *lo, int64_t *hi) {
    if (!int_range(dt, lo, hi)) return 0;
    if (n.is_int) return n.i >= *lo && n.i <= *hi ? 0 : 2;
    if (isnan(n.f) || n.f != trunc(n.f)) return 1;
    /* (double)INT64_MAX is 2^63, which does not fit: compare with < there */
    bool in = n.f >= (double)*lo && (*hi == INT64_MAX ? n.f < (double)*hi : n.f <= (double)*hi);
    return in ? 0 : 2;
}

bool nd_number_fits(nd_dtype dt, nd_number n) {
    int64_t lo, hi;
    return number_fit(dt, n, &lo, &hi) == 0;
}

nd_status nd_check_number_fits(const char *op, nd_dtype dt, nd_number n) {
    int64_t lo, hi;
    int fit = number_fit(dt, n, &lo, &hi);
    if (fit == 0) return ND_OK;
    char v[48];
    if (n.is_int) snprintf(v, sizeof v, "%lld", (long long)n.i);
    else if (isnan(n.f)) snprintf(v, sizeof v, "nan");
    else if (n.f == trunc(n.f) && fabs(n.f) < 1e20) snprintf(v, sizeof v, "%.0f", n.f); /* 2^63 in full */
    else snprintf(v, sizeof v, "%.15g", n.f);
    if (fit == 1)
        return nd_fail(ND_ERR_ARG, "%s: value %s is not an integer (%s holds the integers "
                       "%lld..%lld)", op, v, nd_dtype_name(dt), (long long)lo, (long long)hi);
    return nd_fail(ND_ERR_ARG, "%s: value %s is out of range for %s (%lld..%lld)", op, v,
                   nd_dtype_name(dt), (long long)lo, (long long)hi);
}

int64_t nd_load_i64(const void *p, nd_dtype dt) {
    switch (dt) {
    case ND_INT64: return *(const int64_t *)p;
    case ND_INT32: return *(const int32_t *)p;
    case ND_UINT8: return *(const uint8_t *)p;
    case ND_BOOL: return *(const uint8_t *)p != 0;
    default: {
        double v = nd_load_f64(p, dt);
        int64_t r;
        nd_store_f64(&r, ND_INT64, v); /* saturating */
        return r;
    }
    }
}
