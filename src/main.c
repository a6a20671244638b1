/*
 * needle-lua: the needle script runner and REPL.
 *
 * It behaves like the stock Lua 5.4 interpreter (lua.c): the same options,
 * the same `arg` table, LUA_INIT, exit status and error reports. On top of
 * that it
 *   - finds the needle Lua package next to the executable (build tree or
 *     install tree) and serves the statically linked C module needle.core
 *     through package.preload, so `require "needle"` works from any directory;
 *   - preloads the global `nd = require "needle"` for -e and the REPL;
 *   - gives the REPL readline editing, persistent history, Ctrl-C handling at
 *     the prompt, tab completion, ?name help and tables shown as tables
 *     (repl.c);
 *   - reports an error that names a line of the package at the user's line
 *     (needle.errors.at_user_line), with the whole traceback.
 * This file is the command line, the package setup and the script runner.
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 + realpath */

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "repl.h"

/* From needle.h (the library is linked in); repeated so that this file does
 * not depend on the header. */
extern int luaopen_needle_core(lua_State *L);
extern const char *nd_version(void);
extern bool nd_dist_initialized(void);
extern int nd_dist_rank(void);
extern int nd_dist_world_size(void);
extern int nd_dist_finalize(void); /* nd_status: ND_OK is 0 */
extern void nd_dist_abort(int code);
extern const char *nd_last_error(void);

#define PROGNAME "needle-lua"
#define LUA_DIR LUA_VERSION_MAJOR "." LUA_VERSION_MINOR /* "5.4" */

/* Prefix of error reports; NULL inside the REPL, where it would be noise. */
const char *nlua_progname = PROGNAME;

/* ---------------------------------------------------------------------------
 * Running chunks (as lua.c): message handler with traceback, Ctrl-C via hook
 * ------------------------------------------------------------------------- */

static lua_State *global_L; /* the state the SIGINT handler interrupts */

void nlua_set_signal(int sig, void (*handler)(int)) {
    struct sigaction sa;
    sa.sa_handler = handler;
    sa.sa_flags = 0; /* no SA_RESTART: blocking reads return on Ctrl-C */
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Runs inside Lua at the next hook event, where raising an error is safe. */
static void stop_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

/* A signal handler may not touch the Lua state beyond lua_sethook, so it only
 * arms a hook that fires at the next instruction. A second Ctrl-C gets the
 * default action, in case the chunk is stuck in C code where hooks never run. */
static void on_sigint_running(int sig) {
    nlua_set_signal(sig, SIG_DFL);
    lua_sethook(global_L, stop_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

void nlua_print_message(const char *prefix, const char *msg) {
    /* in a distributed job, which process failed */
    if (prefix && nd_dist_initialized() && nd_dist_world_size() > 1)
        fprintf(stderr, "%s (rank %d of %d): ", prefix, nd_dist_rank(), nd_dist_world_size());
    else if (prefix) fprintf(stderr, "%s: ", prefix);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

/* Prints the error on top of the stack, if status is an error, and pops it. */
int nlua_report(lua_State *L, int status) {
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        nlua_print_message(nlua_progname, msg ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

/* needle.errors.at_user_line(msg), when the package is loaded: a message
 * that names a line of the package (a user's forward raising with level 2
 * lands on the container that called it) gets the position of the user's
 * line above it, found before the stack unwinds. Leaves the message to use on
 * the stack and returns it; msg itself when that cannot be done. */
static const char *at_user_line(lua_State *L, const char *msg) {
    int top = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    if (lua_getfield(L, -1, "needle.errors") == LUA_TTABLE &&
        lua_getfield(L, -1, "at_user_line") == LUA_TFUNCTION) {
        lua_pushstring(L, msg);
        if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING) {
            lua_replace(L, top + 1);
            lua_settop(L, top + 1);
            return lua_tostring(L, -1);
        }
    }
    lua_settop(L, top);
    lua_pushstring(L, msg);
    return lua_tostring(L, -1);
}

/* Error handler: turns any error object into a message with a traceback. */
static int msg_handler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            return 1; /* an object that knows how to print itself */
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    } else {
        msg = at_user_line(L, msg);
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Calls the function below narg arguments, with traceback and Ctrl-C. */
int nlua_docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, msg_handler);
    lua_insert(L, base);
    global_L = L;
    nlua_set_signal(SIGINT, on_sigint_running);
    int status = lua_pcall(L, narg, nres, base);
    nlua_set_signal(SIGINT, SIG_DFL);
    lua_remove(L, base);
    return status;
}

static int dochunk(lua_State *L, int status) {
    if (status == LUA_OK) status = nlua_docall(L, 0, 0);
    return nlua_report(L, status);
}

static int dofile(lua_State *L, const char *name) {
    return dochunk(L, luaL_loadfile(L, name));
}

static int dostring(lua_State *L, const char *s, const char *name) {
    return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* -l mod or -l g=mod: g = require "mod" */
static int dolibrary(lua_State *L, const char *spec) {
    const char *eq = strchr(spec, '=');
    const char *modname = eq ? eq + 1 : spec;
    lua_getglobal(L, "require");
    lua_pushstring(L, modname);
    int status = nlua_docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_pushlstring(L, spec, eq ? (size_t)(eq - spec) : strlen(spec));
        lua_insert(L, -2);
        lua_setglobal(L, lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    return nlua_report(L, status);
}

/* ---------------------------------------------------------------------------
 * Command line (same rules as lua.c, plus -h/--help)
 * ------------------------------------------------------------------------- */

enum {
    HAS_ERROR = 1, /* bad option: print usage, fail */
    HAS_I = 2,
    HAS_V = 4,
    HAS_E = 8,
    HAS_NOENV = 16, /* -E */
    HAS_HELP = 32,
    HAS_PROFILE = 64, /* --profile[=trace.json] */
};

/* --profile=FILE: where the Chrome trace goes ("" for none) */
static const char *profile_trace = "";

static void print_version(void) {
    printf("needle-lua %s -- %s\n", nd_version(), LUA_COPYRIGHT);
    fflush(stdout);
}

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: %s [options] [script [args]]\n"
            "Available options are:\n"
            "  -e stat   execute string 'stat' (the global 'nd' is the needle package)\n"
            "  -i        enter interactive mode after executing 'script'\n"
            "  -l mod    require library 'mod' into global 'mod'\n"
            "  -l g=mod  require library 'mod' into global 'g'\n"
            "  -v        show version information\n"
            "  -E        ignore environment variables\n"
            "  -W        turn warnings on\n"
            "  -h        show this help (also --help)\n"
            "  --profile[=trace.json]\n"
            "            profile the run: per-op table on stderr at exit, and a\n"
            "            Chrome trace when a file is given (docs/profiler.md)\n"
            "  --        stop handling options\n"
            "  -         stop handling options and execute stdin\n"
            "With no script and a terminal on stdin, starts the REPL.\n",
            PROGNAME);
}

static void print_bad_option(const char *opt) {
    if (opt[1] == 'e' || opt[1] == 'l')
        fprintf(stderr, "%s: '%s' needs argument\n", PROGNAME, opt);
    else
        fprintf(stderr, "%s: unrecognized option '%s'\n", PROGNAME, opt);
    print_usage(stderr);
}

/* Scans the options. Sets *first to the index of the script name (0 if there
 * is none) or, on HAS_ERROR, of the bad option. */
static int collect_args(int argc, char **argv, int *first) {
    int args = 0;
    *first = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        *first = i;
        if (a[0] != '-') return args; /* the script */
        switch (a[1]) {
        case '-':
            if (strcmp(a, "--help") == 0) return args | HAS_HELP;
            if (strcmp(a, "--profile") == 0 || strncmp(a, "--profile=", 10) == 0) {
                profile_trace = a[9] == '=' ? a + 10 : "";
                args |= HAS_PROFILE;
                break;
            }
            if (a[2] != '\0') return HAS_ERROR;
            *first = i + 1 < argc ? i + 1 : 0;
            return args;
        case '\0': /* "-": the script is stdin */
            return args;
        case 'h':
            if (a[2] != '\0') return HAS_ERROR;
            return args | HAS_HELP;
        case 'E':
            if (a[2] != '\0') return HAS_ERROR;
            args |= HAS_NOENV;
            break;
        case 'W':
            if (a[2] != '\0') return HAS_ERROR;
            break;
        case 'i': /* -i also shows the version */
            args |= HAS_I;
            /* fall through */
        case 'v':
            if (a[2] != '\0') return HAS_ERROR;
            args |= HAS_V;
            break;
        case 'e':
            args |= HAS_E;
            /* fall through */
        case 'l':
            if (a[2] == '\0') { /* argument is the next word */
                i++;
                if (i >= argc || argv[i][0] == '-') return HAS_ERROR;
            }
            break;
        default:
            return HAS_ERROR;
        }
    }
    *first = 0;
    return args;
}

/* require("needle.profile")[fn](arg), for --profile. */
static bool profile_call(lua_State *L, const char *fn, const char *arg) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "needle.profile");
    int status = nlua_docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_getfield(L, -1, fn);
        lua_remove(L, -2);
        lua_pushstring(L, arg);
        status = nlua_docall(L, 1, 0);
    }
    return nlua_report(L, status) == LUA_OK;
}

/* Runs -e, -l and -W in command-line order, up to the script. */
static bool run_args(lua_State *L, char **argv, int n) {
    for (int i = 1; i < n; i++) {
        int option = argv[i][1];
        if (option == 'e' || option == 'l') {
            const char *extra = argv[i][2] ? argv[i] + 2 : argv[++i];
            int status = option == 'e' ? dostring(L, extra, "=(command line)")
                                       : dolibrary(L, extra);
            if (status != LUA_OK) return false;
        } else if (option == 'W') {
            lua_warning(L, "@on", 0);
        }
    }
    return true;
}

/* arg[0] is the script, interpreter and options get negative indices, script
 * arguments positive ones. Without a script, argv[0] is arg[0]. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script) {
    int narg = argc - (script + 1);
    lua_createtable(L, narg > 0 ? narg : 0, script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

/* Pushes arg[1..#arg], which the script receives as `...`. */
static int push_args(lua_State *L) {
    if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
    int n = (int)luaL_len(L, -1);
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
    lua_remove(L, -n - 1);
    return n;
}

static int handle_script(lua_State *L, char **argv) {
    const char *fname = argv[0];
    /* "-" means stdin, unless it came after "--" (then it is a file name) */
    if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL;
    int status = luaL_loadfile(L, fname);
    if (status == LUA_OK) status = nlua_docall(L, push_args(L), LUA_MULTRET);
    return nlua_report(L, status);
}

/* LUA_INIT_5_4, else LUA_INIT: "@file" runs a file, anything else is code. */
static int handle_luainit(lua_State *L) {
    const char *name = "=LUA_INIT" LUA_VERSUFFIX;
    const char *init = getenv(name + 1);
    if (init == NULL) {
        name = "=LUA_INIT";
        init = getenv(name + 1);
    }
    if (init == NULL) return LUA_OK;
    if (init[0] == '@') return dofile(L, init + 1);
    return dostring(L, init, name);
}

/* ---------------------------------------------------------------------------
 * Finding the needle package
 * ------------------------------------------------------------------------- */

/* Looks a bare command name up in PATH, as the shell did to start us. */
static char *find_in_path(const char *name) {
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t len = strcspn(path, ":");
        char buf[PATH_MAX];
        snprintf(buf, sizeof buf, "%.*s/%s", len ? (int)len : 1, len ? path : ".", name);
        if (access(buf, X_OK) == 0) return realpath(buf, NULL);
        path += len + (path[len] == ':');
    }
    return NULL;
}

/* Directory of the running executable (malloc'd), or NULL. /proc/self/exe
 * resolves symlinks, so a needle-lua linked into PATH still finds its tree. */
static char *exe_dir(const char *argv0) {
    char buf[PATH_MAX];
    char *full = NULL;
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = '\0';
        full = strdup(buf);
    } else if (argv0 && strchr(argv0, '/')) {
        full = realpath(argv0, NULL);
    } else if (argv0 && *argv0) {
        full = find_in_path(argv0);
    }
    if (full) *strrchr(full, '/') = '\0'; /* "/x/bin/needle-lua" -> "/x/bin" */
    return full;
}

/* Build tree: <exe dir>/lua/needle; install tree: <prefix>/share/lua/5.4/needle.
 * These come first in package.path; the rest (LUA_PATH_5_4, LUA_PATH or the
 * default) was already set by luaopen_package, honouring -E. */
static void setup_package(lua_State *L, const char *argv0) {
    lua_getglobal(L, "package");
    char *dir = exe_dir(argv0);
    if (dir) {
        lua_pushfstring(L,
                        "%s/lua/?.lua;%s/lua/?/init.lua;"
                        "%s/../share/lua/" LUA_DIR "/?.lua;%s/../share/lua/" LUA_DIR "/?/init.lua;",
                        dir, dir, dir, dir);
        free(dir);
        lua_getfield(L, -2, "path");
        lua_concat(L, 2);
        lua_setfield(L, -2, "path");
    }
    /* the C module is linked into this executable, not a separate .so */
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_needle_core);
    lua_setfield(L, -2, "needle.core");
    lua_pop(L, 2);
}

/* nd = require "needle", for -e and the REPL. A missing or broken package
 * must not keep the interpreter from starting, so failure is a warning. */
static void preload_nd(lua_State *L) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "needle");
    if (lua_pcall(L, 1, 1, 0) == LUA_OK) {
        lua_setglobal(L, "nd");
    } else {
        fprintf(stderr, "%s: warning: the global 'nd' is not set: %s\n", PROGNAME,
                lua_tostring(L, -1));
        lua_pop(L, 1);
    }
}

/* ---------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------- */

/* Everything runs protected, so that even a memory error is reported. */
static int pmain(lua_State *L) {
    int argc = (int)lua_tointeger(L, 1);
    char **argv = (char **)lua_touserdata(L, 2);
    int script;
    int args = collect_args(argc, argv, &script);
    int optlim = script > 0 ? script : argc; /* options end before the script */
    luaL_checkversion(L);
    if (args & HAS_ERROR) {
        print_bad_option(argv[script]);
        return 0;
    }
    if (args & HAS_HELP) {
        print_usage(stdout);
        lua_pushboolean(L, 1);
        return 1;
    }
    if (args & HAS_V) print_version();
    if (args & HAS_NOENV) { /* tells luaopen_package to ignore LUA_PATH etc. */
        lua_pushboolean(L, 1);
        lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
    }
    luaL_openlibs(L);
    setup_package(L, argc > 0 ? argv[0] : NULL);
    create_arg_table(L, argc, argv, script);
    lua_gc(L, LUA_GCRESTART);
    lua_gc(L, LUA_GCGEN, 0, 0); /* as lua.c 5.4 */
    if (!(args & HAS_NOENV) && handle_luainit(L) != LUA_OK) return 0;

    bool nothing_to_do = script < 1 && !(args & (HAS_E | HAS_V));
    bool repl = (args & HAS_I) || (nothing_to_do && isatty(STDIN_FILENO));
    if (repl && !(args & HAS_I)) print_version(); /* -i printed it already */
    /* scripts `require "needle"` themselves; interactive use gets `nd` */
    if (repl || (args & HAS_E)) preload_nd(L);

    /* --profile covers -e, -l, the script and the REPL; the table is
     * printed even when the script fails (not after os.exit) */
    if ((args & HAS_PROFILE) && !profile_call(L, "_cli_start", profile_trace)) return 0;
    bool ok = run_args(L, argv, optlim);
    if (ok && script > 0) ok = handle_script(L, argv + script) == LUA_OK;
    if (ok && repl) {
        nlua_repl_run(L);
    } else if (ok && nothing_to_do) {
        ok = dofile(L, NULL) == LUA_OK; /* stdin is a script */
    }
    if ((args & HAS_PROFILE) && !profile_call(L, "_cli_stop", "")) ok = false;
    if (!ok) return 0;
    lua_pushboolean(L, 1);
    return 1;
}

int main(int argc, char **argv) {
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        nlua_print_message(PROGNAME, "cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    lua_gc(L, LUA_GCSTOP); /* no collections while starting up */
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    int status = lua_pcall(L, 2, 1, 0);
    int ok = lua_toboolean(L, -1);
    nlua_report(L, status);
    /* A distributed job: a failed rank ends all of them (the others may be
     * waiting for it in a collective); a finished one leaves MPI cleanly. */
    if (!(ok && status == LUA_OK) && nd_dist_initialized() && nd_dist_world_size() > 1)
        nd_dist_abort(EXIT_FAILURE);
    lua_close(L);
    if (ok && status == LUA_OK && nd_dist_initialized() && nd_dist_finalize() != 0) {
        nlua_print_message(PROGNAME, nd_last_error());
        return EXIT_FAILURE;
    }
    return ok && status == LUA_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
