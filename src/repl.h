/*
 * repl.h - needle-lua's interactive loop (repl.c) and what it borrows from
 * the script runner (main.c). Private to the needle-lua executable.
 *
 * The executable exports its symbols (ENABLE_EXPORTS, for C modules), so the
 * names shared between the two files carry the nlua_ prefix.
 */
#ifndef NEEDLE_LUA_REPL_H
#define NEEDLE_LUA_REPL_H

#include <lua.h>

/* main.c: prefix of error reports; NULL inside the REPL, where it would be
 * noise. */
extern const char *nlua_progname;

/* main.c: installs a signal handler without SA_RESTART. */
void nlua_set_signal(int sig, void (*handler)(int));
/* main.c: prints "prefix: msg" (no prefix when NULL) on stderr. */
void nlua_print_message(const char *prefix, const char *msg);
/* main.c: prints the error on top of the stack, if status is an error, and
 * pops it; returns status. */
int nlua_report(lua_State *L, int status);
/* main.c: calls the function below narg arguments, with traceback and Ctrl-C. */
int nlua_docall(lua_State *L, int narg, int nres);

/* repl.c: reads, runs and prints chunks until end of input. readline on a
 * terminal (editing, persistent history, Ctrl-C at the prompt, tab
 * completion of globals, table fields, tensor and module methods and lazily
 * loaded entries), plain lines otherwise; unfinished chunks read continuation
 * lines, as lua.c; "?name" prints the documentation of a name. */
void nlua_repl_run(lua_State *L);

#endif
