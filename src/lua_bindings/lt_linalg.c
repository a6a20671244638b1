/* lt_linalg.c - the C half of nd.linalg: core._linalg_<fn> over the
 * nd_linalg_* ops (needle.h). These take plain arguments (the Lua face,
 * lua/needle/linalg.lua, checks the options tables and records the
 * gradients); several results are several returns. */
#include <math.h>
#include <string.h>
#include "lt_internal.h"

/* core._linalg_inv(A) */
static int l_inv(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.inv"), *out;
    LT_CHECK(L, nd_linalg_inv(a, &out));
    lt_push(L, out);
    return 1;
}

/* core._linalg_solve(A, B) */
static int l_solve(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.solve"), *b = lt_check(L, 2, "linalg.solve"), *out;
    LT_CHECK(L, nd_linalg_solve(a, b, &out));
    lt_push(L, out);
    return 1;
}

/* core._linalg_det(A) */
static int l_det(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.det"), *det;
    LT_CHECK(L, nd_linalg_det(a, &det, NULL, NULL));
    lt_push(L, det);
    return 1;
}

/* core._linalg_slogdet(A) -> sign, logabsdet */
static int l_slogdet(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.slogdet"), *sign, *logabs;
    LT_CHECK(L, nd_linalg_det(a, NULL, &sign, &logabs));
    lt_push(L, sign);
    lt_push(L, logabs);
    return 2;
}

/* core._linalg_cholesky(A, upper) */
static int l_cholesky(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.cholesky"), *out;
    LT_CHECK(L, nd_linalg_cholesky(a, lua_toboolean(L, 2), &out));
    lt_push(L, out);
    return 1;
}

/* core._linalg_qr(A, mode) -> Q, R; mode "reduced", "complete" or "r" */
static int l_qr(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.qr"), *q, *r;
    const char *mode = luaL_optstring(L, 2, "reduced");
    nd_qr_mode m = !strcmp(mode, "reduced") ? ND_QR_REDUCED : !strcmp(mode, "complete") ? ND_QR_COMPLETE
                 : !strcmp(mode, "r") ? ND_QR_R : (nd_qr_mode)-1;
    if ((int)m < 0)
        return lt_error(L, "linalg.qr", "mode must be 'reduced', 'complete' or 'r', got '%s'", mode);
    LT_CHECK(L, nd_linalg_qr(a, m, &q, &r));
    lt_push(L, q);
    lt_push(L, r);
    return 2;
}

/* core._linalg_svd(A, full_matrices) -> U, S, Vh */
static int l_svd(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.svd"), *u, *s, *vh;
    LT_CHECK(L, nd_linalg_svd(a, lua_toboolean(L, 2), &u, &s, &vh));
    lt_push(L, u);
    lt_push(L, s);
    lt_push(L, vh);
    return 3;
}

/* core._linalg_svdvals(A) -> S */
static int l_svdvals(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.svdvals"), *s;
    LT_CHECK(L, nd_linalg_svd(a, false, NULL, &s, NULL));
    lt_push(L, s);
    return 1;
}

/* core._linalg_eigh(A, upper) -> eigenvalues, eigenvectors */
static int l_eigh(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.eigh"), *w, *v;
    LT_CHECK(L, nd_linalg_eigh(a, lua_toboolean(L, 2), &w, &v));
    lt_push(L, w);
    lt_push(L, v);
    return 2;
}

/* core._linalg_eigvalsh(A, upper) -> eigenvalues */
static int l_eigvalsh(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.eigvalsh"), *w;
    LT_CHECK(L, nd_linalg_eigh(a, lua_toboolean(L, 2), &w, NULL));
    lt_push(L, w);
    return 1;
}

/* core._linalg_lstsq(A, B[, rcond]) -> solution, residuals, rank, singular_values */
static int l_lstsq(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "linalg.lstsq"), *b = lt_check(L, 2, "linalg.lstsq");
    double rcond = lua_isnoneornil(L, 3) ? NAN : luaL_checknumber(L, 3);
    nd_tensor *x, *res, *rank, *sv;
    LT_CHECK(L, nd_linalg_lstsq(a, b, rcond, &x, &res, &rank, &sv));
    lt_push(L, x);
    lt_push(L, res);
    lt_push(L, rank);
    lt_push(L, sv);
    return 4;
}

void lt_register_linalg(lua_State *L) {
    static const lt_reg regs[] = {
        {"_linalg_inv", l_inv, false, true, 1, "A"},
        {"_linalg_solve", l_solve, false, true, 2, "A, B"},
        {"_linalg_det", l_det, false, true, 1, "A"},
        {"_linalg_slogdet", l_slogdet, false, true, 1, "A"},
        {"_linalg_cholesky", l_cholesky, false, true, 2, "A[, upper]"},
        {"_linalg_qr", l_qr, false, true, 2, "A[, mode]"},
        {"_linalg_svd", l_svd, false, true, 2, "A[, full_matrices]"},
        {"_linalg_svdvals", l_svdvals, false, true, 1, "A"},
        {"_linalg_eigh", l_eigh, false, true, 2, "A[, upper]"},
        {"_linalg_eigvalsh", l_eigvalsh, false, true, 2, "A[, upper]"},
        {"_linalg_lstsq", l_lstsq, false, true, 3, "A, B[, rcond]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
