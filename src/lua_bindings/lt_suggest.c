/* lt_suggest.c - "did you mean ...?": the closest of a set of names to a
 * misspelt one. The tensor's __index uses it for a missing method or field
 * (lt_tensor.c); Lua gets it as core._closest, for needle.suggest (a module's
 * misspelt method, nd.help's unknown names), so that both suggest alike. */
#include <string.h>
#include "lt_internal.h"

/* Edit distance with adjacent transpositions (optimal string alignment), so
 * that "resahpe" is 1 from "reshape". Names are short; longer ones than the
 * buffer are never close. */
static int edit_distance(const char *a, size_t n, const char *b, size_t m) {
    if (n >= LT_NAME_MAX || m >= LT_NAME_MAX) return LT_NAME_MAX;
    int d[LT_NAME_MAX][LT_NAME_MAX];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

void lt_closest_init(lt_closest *c, const char *word, size_t len) {
    c->word = word;
    c->len = len;
    /* 1 edit for short words, 2 from 5 letters, 3 from 9 */
    c->best_d = (len <= 4 ? 1 : len <= 8 ? 2 : 3) + 1;
    c->best[0] = '\0';
}

bool lt_closest_add(lt_closest *c, const char *name, size_t n) {
    if (n == 0 || n >= LT_NAME_MAX || (name[0] == '_' && c->word[0] != '_')) return false;
    if (n == c->len && memcmp(name, c->word, n) == 0) return false; /* the word itself */
    int d = edit_distance(c->word, c->len, name, n);
    if (d > 0 && n == c->len) {
        size_t i = 0;
        while (i < n && (name[i] | 0x20) == (c->word[i] | 0x20)) i++;
        if (i == n) d = 0; /* "Reshape" */
    }
    if (d < c->best_d || (d == c->best_d && c->best[0] && strcmp(name, c->best) < 0)) {
        c->best_d = d;
        memcpy(c->best, name, n + 1);
        return true;
    }
    return false;
}

void lt_closest_add_keys(lua_State *L, lt_closest *c, int idx) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) continue;
        size_t n;
        const char *name = lua_tolstring(L, -1, &n); /* n is set only here */
        lt_closest_add(c, name, n);
    }
}

/* core._closest(word, names) -> the name of the list (or key of the set)
 * names closest to word, or nil */
int lt_closest_fn(lua_State *L) {
    size_t len;
    const char *word = luaL_checklstring(L, 1, &len);
    luaL_checktype(L, 2, LUA_TTABLE);
    lt_closest c;
    lt_closest_init(&c, word, len);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        int key = lua_type(L, -2) == LUA_TSTRING ? -2 : -1; /* a set's key, a list's value */
        if (lua_type(L, key) == LUA_TSTRING) {
            size_t n;
            const char *s = lua_tolstring(L, key, &n);
            lt_closest_add(&c, s, n);
        }
        lua_pop(L, 1);
    }
    if (c.best[0]) lua_pushstring(L, c.best); else lua_pushnil(L);
    return 1;
}
