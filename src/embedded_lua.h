/*
 * embedded_lua.h - the Lua half of the needle package, compiled into the C
 * library.
 *
 * The build (cmake/embed_lua.cmake) turns every .lua file under lua/needle/ into an
 * entry of nd_embedded_lua[]: the module name as `require` spells it
 * ("needle", "needle.nn", "needle.tensor_print", ...), its source bytes and
 * their length. The table is sorted by file path and ends with an entry whose
 * name is NULL. `source` is also NUL-terminated, but use `len` (a chunk may in
 * principle contain NUL bytes). Load an entry with
 *     luaL_loadbufferx(L, e->source, e->len, "=needle/nn/init.lua"-ish name, "t")
 */
#ifndef NEEDLE_EMBEDDED_LUA_H
#define NEEDLE_EMBEDDED_LUA_H

struct nd_embedded_lua {
    const char *name;   /* module name, e.g. "needle.nn"; NULL ends the table */
    const char *source; /* Lua source text (NUL-terminated) */
    unsigned long len;  /* bytes of source, excluding the NUL */
};

extern const struct nd_embedded_lua nd_embedded_lua[];
extern const unsigned long nd_embedded_lua_count; /* entries before the {0} */

#endif
