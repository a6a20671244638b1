/* lt_workers.c - (filled by its commit) */
#include "lt_internal.h"

void lt_register_workers(lua_State *L) { (void)L; }
