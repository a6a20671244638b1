/* lt_linalg.c - (filled by its commit) */
#include "lt_internal.h"

void lt_register_linalg(lua_State *L) { (void)L; }
