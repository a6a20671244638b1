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
 *     the prompt, and tab completion of globals, table fields and tensor
 *     methods.
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 + realpath */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* From needle.h (the library is linked in); repeated so that this file does
 * not depend on the header. */
extern int luaopen_needle_core(lua_State *L);
extern const char *nd_version(void);

#define PROGNAME "needle-lua"
#define PROMPT "> "
#define PROMPT2 ">> "
#define HISTORY_MAX 1000
#define LUA_DIR LUA_VERSION_MAJOR "." LUA_VERSION_MINOR /* "5.4" */

/* Prefix of error reports; NULL inside the REPL, where it would be noise. */
static const char *progname = PROGNAME;

/* ---------------------------------------------------------------------------
 * Running chunks (as lua.c): message handler with traceback, Ctrl-C via hook
 * ------------------------------------------------------------------------- */

static lua_State *global_L; /* the state the SIGINT handler interrupts */

static void set_signal(int sig, void (*handler)(int)) {
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
    set_signal(sig, SIG_DFL);
    lua_sethook(global_L, stop_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

static void print_message(const char *prefix, const char *msg) {
    if (prefix) fprintf(stderr, "%s: ", prefix);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

/* Prints the error on top of the stack, if status is an error, and pops it. */
static int report(lua_State *L, int status) {
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        print_message(progname, msg ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

/* Error handler: turns any error object into a message with a traceback. */
static int msg_handler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            return 1; /* an object that knows how to print itself */
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Calls the function below narg arguments, with traceback and Ctrl-C. */
static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, msg_handler);
    lua_insert(L, base);
    global_L = L;
    set_signal(SIGINT, on_sigint_running);
    int status = lua_pcall(L, narg, nres, base);
    set_signal(SIGINT, SIG_DFL);
    lua_remove(L, base);
    return status;
}

static int dochunk(lua_State *L, int status) {
    if (status == LUA_OK) status = docall(L, 0, 0);
    return report(L, status);
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
    int status = docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_pushlstring(L, spec, eq ? (size_t)(eq - spec) : strlen(spec));
        lua_insert(L, -2);
        lua_setglobal(L, lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    return report(L, status);
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
    int status = docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_getfield(L, -1, fn);
        lua_remove(L, -2);
        lua_pushstring(L, arg);
        status = docall(L, 1, 0);
    }
    return report(L, status) == LUA_OK;
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
    if (status == LUA_OK) status = docall(L, push_args(L), LUA_MULTRET);
    return report(L, status);
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
 * REPL input: readline on a terminal, plain lines otherwise
 * ------------------------------------------------------------------------- */

enum { INPUT_OK, INPUT_EOF, INPUT_CANCELLED };

#define CTRL_G 7 /* readline's abort key */

static bool use_readline;   /* stdin is a terminal */
static char *history_path;  /* NULL: history is not saved */
static volatile sig_atomic_t prompt_interrupted;
static bool abort_sent;     /* read_key answered the Ctrl-C already */
static sigset_t wait_mask;  /* signal mask while waiting for a key */
/* The terminal opened again, non-blocking: a Ctrl-C flushes typed-ahead
 * input, so a key that pselect saw may be gone by the time we read it, and a
 * blocking read would then hang with SIGINT blocked. (Setting O_NONBLOCK on
 * stdin itself would leak to the shell, which shares that file.) */
static int key_fd = -1;
static char *accepted_line; /* set by on_line */
static bool line_done;
static pthread_t repl_thread; /* the one that runs read_key */

/* A Ctrl-C is sent to the whole process, and the kernel hands it to any
 * thread that does not block it: while the REPL thread has SIGINT blocked,
 * that is an OpenBLAS/OpenMP worker (they start with it unblocked, some
 * before main). Setting the flag there races with read_key, which may have
 * just checked it and then sleeps in pselect for good. So pass the signal on
 * to the REPL thread, where it waits, pending, for pselect to unblock it. */
static void on_sigint_prompt(int sig) {
    if (!pthread_equal(pthread_self(), repl_thread)) {
        pthread_kill(repl_thread, sig);
        return;
    }
    prompt_interrupted = 1;
}

static void on_line(char *line) {
    accepted_line = line;
    line_done = true;
    rl_callback_handler_remove();
}

/* readline's rl_getc_function. SIGINT is blocked while readline runs and
 * unblocked only inside pselect here, so a Ctrl-C can never slip in between
 * the check and the wait. After a Ctrl-C it hands readline the abort key
 * once: readline may be reading keys inside a command (typeahead, a y/n
 * question) and must return to read_line_tty, which drops the input. */
static int read_key(FILE *in) {
    int fd = key_fd >= 0 ? key_fd : fileno(in);
    for (;;) {
        if (prompt_interrupted && !abort_sent) {
            abort_sent = true;
            return CTRL_G;
        }
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(fd, &fds);
        int n = pselect(fd + 1, &fds, NULL, NULL, NULL, &wait_mask);
        if (n > 0) {
            unsigned char c;
            ssize_t r = read(fd, &c, 1);
            if (r == 1) return c;
            if (r == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return EOF;
        } else if (n < 0 && errno != EINTR) {
            return EOF;
        } else {
            rl_check_signals(); /* e.g. SIGWINCH: the terminal was resized */
        }
    }
}

/* Reads a line with readline's callback interface: unlike a blocking
 * readline(), it lets Ctrl-C at the prompt throw away the typed input (and a
 * half-typed multi-line chunk) without jumping out of readline. */
static int read_line_tty(const char *prompt, char **line) {
    sigset_t sigint, orig;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    sigprocmask(SIG_BLOCK, &sigint, &orig);
    wait_mask = orig;
    sigdelset(&wait_mask, SIGINT);
    set_signal(SIGINT, on_sigint_prompt);
    prompt_interrupted = 0;
    abort_sent = false;
    line_done = false;
    accepted_line = NULL;
    rl_callback_handler_install(prompt, on_line);
    while (!line_done && !prompt_interrupted) rl_callback_read_char();
    int result = accepted_line ? INPUT_OK : INPUT_EOF;
    if (!line_done) { /* Ctrl-C */
        rl_free_line_state();
        rl_callback_sigcleanup();
        rl_callback_handler_remove();
        fputc('\n', rl_outstream ? rl_outstream : stdout);
        result = INPUT_CANCELLED;
    }
    set_signal(SIGINT, SIG_DFL);
    sigprocmask(SIG_SETMASK, &orig, NULL);
    *line = accepted_line;
    return result;
}

static int read_line_plain(const char *prompt, char **line) {
    fputs(prompt, stdout);
    fflush(stdout);
    size_t cap = 0;
    *line = NULL;
    ssize_t n = getline(line, &cap, stdin);
    if (n < 0) {
        free(*line);
        return INPUT_EOF;
    }
    if (n > 0 && (*line)[n - 1] == '\n') (*line)[n - 1] = '\0';
    return INPUT_OK;
}

static void history_open(void) {
    const char *path = getenv("NEEDLE_HISTORY");
    const char *home = getenv("HOME");
    if (path && *path) {
        history_path = strdup(path);
    } else if (home && *home) {
        history_path = malloc(strlen(home) + sizeof "/.needle_history");
        if (history_path) sprintf(history_path, "%s/.needle_history", home);
    }
    using_history();
    stifle_history(HISTORY_MAX);
    if (history_path) read_history(history_path);
}

/* Adds an entered chunk to the history and appends it to the history file at
 * once, so that history survives os.exit() and crashes. */
static void save_line(const char *line) {
    if (!use_readline || line[0] == '\0') return;
    HIST_ENTRY *last = history_length > 0 ? history_get(history_base + history_length - 1) : NULL;
    if (last && strcmp(last->line, line) == 0) return; /* no repeats */
    add_history(line);
    if (history_path && append_history(1, history_path) != 0)
        write_history(history_path); /* the file did not exist yet */
}

static void history_close(void) {
    if (history_path) history_truncate_file(history_path, HISTORY_MAX);
}

/* ---------------------------------------------------------------------------
 * Tab completion
 * ------------------------------------------------------------------------- */

static lua_State *completion_L;

static const char *const keywords[] = {
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function",
    "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then",
    "true", "until", "while", NULL};

static bool is_keyword(const char *s, size_t len) {
    for (int i = 0; keywords[i]; i++)
        if (strlen(keywords[i]) == len && memcmp(keywords[i], s, len) == 0) return true;
    return false;
}

/* Only names that can follow '.' or ':' are worth completing. */
static bool is_name(const char *s, size_t len) {
    if (len == 0 || (s[0] >= '0' && s[0] <= '9')) return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return !is_keyword(s, len);
}

/* Pushes value[key] found without running code: a raw get, then the __index
 * tables of the metatable chain. __index functions are never called:
 * completion must not have side effects. Pushes nil when not found. */
static void lookup_field(lua_State *L, int value, const char *key, size_t len, int depth) {
    value = lua_absindex(L, value);
    if (lua_type(L, value) == LUA_TTABLE) {
        lua_pushlstring(L, key, len);
        if (lua_rawget(L, value) != LUA_TNIL) return;
        lua_pop(L, 1);
    }
    if (depth > 0 && lua_getmetatable(L, value)) {
        lua_pushliteral(L, "__index");
        if (lua_rawget(L, -2) == LUA_TTABLE) {
            lookup_field(L, -1, key, len, depth - 1);
            lua_replace(L, -3); /* result in place of the metatable */
            lua_pop(L, 1);
            return;
        }
        lua_pop(L, 2);
    }
    lua_pushnil(L);
}

/* Adds names[k] = v for the fields of a value: its own (if a table), then
 * its metatable's __methods (tensors) and __index tables, recursively. A name
 * found first wins, as it would at run time. */
static void add_names(lua_State *L, int value, int names, int depth) {
    value = lua_absindex(L, value);
    if (lua_type(L, value) == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, value)) {
            lua_pushvalue(L, -2); /* key */
            if (lua_type(L, -1) == LUA_TSTRING && lua_rawget(L, names) == LUA_TNIL) {
                lua_pushvalue(L, -3);
                lua_pushvalue(L, -3);
                lua_rawset(L, names);
            }
            lua_pop(L, 2); /* lookup result (or key copy), value */
        }
    }
    if (depth > 0 && lua_getmetatable(L, value)) {
        lua_pushliteral(L, "__methods");
        if (lua_rawget(L, -2) == LUA_TTABLE) add_names(L, -1, names, 0);
        lua_pop(L, 1);
        lua_pushliteral(L, "__index");
        if (lua_rawget(L, -2) == LUA_TTABLE) add_names(L, -1, names, depth - 1);
        lua_pop(L, 2);
    }
}

/* Completion candidates for `text` ("pri", "string.fo", "x:ex"), as a list of
 * full replacements. Runs under lua_pcall, so a memory error only loses the
 * completion. */
static int collect_completions(lua_State *L) {
    const char *text = luaL_checkstring(L, 1);
    const char *sep = NULL; /* the last '.' or ':' */
    for (const char *p = text; *p; p++)
        if (*p == '.' || *p == ':') sep = p;
    const char *partial = sep ? sep + 1 : text;
    size_t partial_len = strlen(partial);

    /* Resolve the prefix "a.b" from _G, one name at a time. */
    lua_pushglobaltable(L);
    for (const char *p = text; sep && p < sep;) {
        size_t len = strcspn(p, ".:");
        if (p + len < sep && p[len] == ':') return 0; /* "a:b.c" is not a value */
        if (!is_name(p, len)) return 0;
        lookup_field(L, -1, p, len, 16);
        lua_remove(L, -2);
        if (lua_isnil(L, -1)) return 0;
        p += len + 1;
    }
    int value = lua_gettop(L);
    lua_newtable(L);
    int names = lua_gettop(L);
    add_names(L, value, names, 16);
    if (!sep)
        for (int i = 0; keywords[i]; i++) {
            lua_pushboolean(L, 1); /* a keyword gets no suffix */
            lua_setfield(L, names, keywords[i]);
        }

    bool method = sep && *sep == ':';
    bool show_private = partial_len >= 2 && partial[0] == '_' && partial[1] == '_';
    lua_newtable(L);
    int list = lua_gettop(L);
    lua_Integer n = 0;
    lua_pushnil(L);
    while (lua_next(L, names)) {
        size_t len;
        const char *name = lua_tolstring(L, -2, &len);
        int type = lua_type(L, -1);
        bool keyword = !sep && lua_isboolean(L, -1) && is_keyword(name, len);
        if ((keyword || is_name(name, len)) && len >= partial_len &&
            memcmp(name, partial, partial_len) == 0 &&
            (show_private || strncmp(name, "__", 2) != 0) &&
            (!method || type == LUA_TFUNCTION)) {
            const char *suffix = keyword ? "" : type == LUA_TTABLE ? "."
                                            : method               ? "("
                                                                   : "";
            lua_pushlstring(L, text, (size_t)(partial - text));
            lua_pushvalue(L, -3);
            lua_pushstring(L, suffix);
            lua_concat(L, 3);
            lua_rawseti(L, list, ++n);
        }
        lua_pop(L, 1);
    }
    return 1;
}

/* readline's hook: matches[0] is what replaces the text (the longest common
 * prefix of the candidates), then the candidates; NULL for none. */
static char **complete(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1;      /* never fall back to file names */
    rl_completion_append_character = '\0'; /* suffixes are part of matches */
    lua_State *L = completion_L;
    int top = lua_gettop(L);
    char **matches = NULL;
    lua_pushcfunction(L, collect_completions);
    lua_pushstring(L, text);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
        size_t n = (size_t)lua_rawlen(L, -1);
        if (n > 0 && (matches = calloc(n + 2, sizeof *matches)) != NULL) {
            for (size_t i = 1; i <= n; i++) {
                lua_rawgeti(L, -1, (lua_Integer)i);
                matches[i] = strdup(lua_tostring(L, -1));
                lua_pop(L, 1);
            }
            size_t common = strlen(matches[1]);
            for (size_t i = 2; i <= n; i++) {
                size_t k = 0;
                while (k < common && matches[i][k] == matches[1][k]) k++;
                common = k;
            }
            if (n == 1) { /* a single match is its own substitution */
                matches[0] = matches[1];
                matches[1] = NULL;
            } else {
                matches[0] = strndup(matches[1], common);
            }
        }
    }
    lua_settop(L, top);
    return matches;
}

/* ---------------------------------------------------------------------------
 * The REPL (the structure of lua.c's doREPL)
 * ------------------------------------------------------------------------- */

enum { STATUS_EOF = -1, STATUS_CANCELLED = -2 };

/* _PROMPT / _PROMPT2 override the prompts, as in lua.c. Leaves the prompt
 * string on the stack to keep it alive. */
static const char *get_prompt(lua_State *L, bool first) {
    if (lua_getglobal(L, first ? "_PROMPT" : "_PROMPT2") == LUA_TNIL) {
        lua_pop(L, 1);
        lua_pushstring(L, first ? PROMPT : PROMPT2);
        return lua_tostring(L, -1);
    }
    const char *p = luaL_tolstring(L, -1, NULL);
    lua_remove(L, -2);
    return p;
}

/* Reads a line and pushes it as a string. */
static int push_line(lua_State *L, bool first) {
    const char *prompt = get_prompt(L, first);
    char *line;
    int r = use_readline ? read_line_tty(prompt, &line) : read_line_plain(prompt, &line);
    lua_pop(L, 1); /* prompt */
    if (r != INPUT_OK) return r;
    if (first && line[0] == '=') /* "=expr", as in Lua 5.2 */
        lua_pushfstring(L, "return %s", line + 1);
    else
        lua_pushstring(L, line);
    free(line);
    return INPUT_OK;
}

/* A syntax error at <eof> means the chunk is unfinished: read more. */
static bool incomplete(lua_State *L, int status) {
    static const char mark[] = "<eof>";
    size_t len;
    const char *msg;
    if (status != LUA_ERRSYNTAX) return false;
    msg = lua_tolstring(L, -1, &len);
    if (len < sizeof mark - 1 || strcmp(msg + len - (sizeof mark - 1), mark) != 0) return false;
    lua_pop(L, 1);
    return true;
}

/* Tries the line as an expression ("return <line>;"), so that its values get
 * printed. On failure leaves only the line on the stack. */
static int add_return(lua_State *L) {
    const char *line = lua_tostring(L, -1);
    const char *code = lua_pushfstring(L, "return %s;", line);
    int status = luaL_loadbuffer(L, code, strlen(code), "=stdin");
    if (status == LUA_OK) {
        lua_remove(L, -2); /* the "return" code */
        save_line(line);
    } else {
        lua_pop(L, 2); /* error and "return" code */
    }
    return status;
}

/* Compiles the line at index 1 as statements, appending continuation lines
 * while the chunk is incomplete. */
static int multiline(lua_State *L) {
    for (;;) {
        size_t len;
        const char *chunk = lua_tolstring(L, 1, &len);
        int status = luaL_loadbuffer(L, chunk, len, "=stdin");
        if (!incomplete(L, status)) {
            save_line(chunk);
            return status;
        }
        int r = push_line(L, false);
        if (r == INPUT_CANCELLED) return STATUS_CANCELLED;
        if (r == INPUT_EOF) { /* report the unfinished chunk's syntax error */
            save_line(chunk);
            return luaL_loadbuffer(L, chunk, len, "=stdin");
        }
        lua_pushliteral(L, "\n");
        lua_insert(L, -2);
        lua_concat(L, 3); /* chunk .. "\n" .. line */
    }
}

/* Leaves the compiled chunk (or an error message) as the only stack value. */
static int load_input(lua_State *L) {
    lua_settop(L, 0);
    int r = push_line(L, true);
    if (r != INPUT_OK) return r == INPUT_EOF ? STATUS_EOF : STATUS_CANCELLED;
    int status = add_return(L);
    if (status != LUA_OK) status = multiline(L);
    if (status == STATUS_CANCELLED) return status;
    lua_remove(L, 1); /* the source text */
    return status;
}

/* Prints the chunk's results with the global print (tostring, tabs). */
static void print_results(lua_State *L) {
    int n = lua_gettop(L);
    if (n == 0) return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
        print_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
}

static void run_repl(lua_State *L) {
    const char *old_progname = progname;
    progname = NULL;
    use_readline = isatty(STDIN_FILENO);
    if (use_readline) {
        rl_readline_name = "needle-lua"; /* for $if needle-lua in ~/.inputrc */
        rl_catch_signals = 0;              /* we handle SIGINT ourselves */
        rl_persistent_signal_handlers = 1; /* catch SIGWINCH while waiting */
        rl_getc_function = read_key;
        repl_thread = pthread_self();
        const char *tty = ttyname(STDIN_FILENO);
        if (tty) key_fd = open(tty, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        rl_basic_word_break_characters = " \t\n\"'`@$><=;|&{}()[],+-*/%^~#";
        rl_attempted_completion_function = complete;
        completion_L = L;
        history_open();
    }
    int status;
    while ((status = load_input(L)) != STATUS_EOF) {
        if (status == STATUS_CANCELLED) continue;
        if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
        if (status == LUA_OK)
            print_results(L);
        else
            report(L, status);
    }
    lua_settop(L, 0);
    fputc('\n', stdout); /* leave the shell prompt on a fresh line */
    fflush(stdout);
    if (use_readline) history_close();
    if (key_fd >= 0) close(key_fd);
    progname = old_progname;
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
        run_repl(L);
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
        print_message(PROGNAME, "cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    lua_gc(L, LUA_GCSTOP); /* no collections while starting up */
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    int status = lua_pcall(L, 2, 1, 0);
    int ok = lua_toboolean(L, -1);
    report(L, status);
    lua_close(L);
    return ok && status == LUA_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
