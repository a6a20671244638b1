/*
 * repl.c - needle-lua's REPL: readline editing, persistent history, Ctrl-C
 * handling at the prompt, tab completion (globals, table fields, tensor
 * methods and fields, a module's methods and fields, the package's lazily
 * loaded entries), ?name for the documentation (needle.help), and lua.c's
 * loop (=expr, expressions printed, multi-line chunks), values shown by
 * needle.pretty (tables as tables). The script runner and the command line
 * are in main.c.
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 */

#include <errno.h>
#include <fcntl.h>
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

#include "repl.h"

#define PROMPT "> "
#define PROMPT2 ">> "
#define HISTORY_MAX 1000

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
    nlua_set_signal(SIGINT, on_sigint_prompt);
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
    nlua_set_signal(SIGINT, SIG_DFL);
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

/* A needle module instance keeps its fields in these tables of its own and
 * its methods in its class chain (the metatable's `class`, needle.nn.module),
 * behind an __index function that completion may not call. */
static const char *const module_fields[] = {"_params", "_buffers", "_children", "_attrs", NULL};

/* Pushes t[name] of the table at idx without metamethods (a metatable may
 * have one of its own); returns its type. */
static int raw_field(lua_State *L, int idx, const char *name) {
    idx = lua_absindex(L, idx);
    lua_pushstring(L, name);
    return lua_rawget(L, idx);
}

/* Calls t[k] for a key the metatable lists in __lazy (needle.lazy): the
 * package's own loader of a submodule, what its first use would run. */
static int load_lazy_entry(lua_State *L) {
    lua_gettable(L, 1);
    return 1;
}

/* Pushes value[key] found without running code: a raw get, then the __index
 * tables of the metatable chain. __index functions are never called:
 * completion must not have side effects. The exceptions are the package's
 * own: a needle module's fields and class chain are read as tables, and an
 * entry that a lazy table's metatable lists in __lazy is loaded as its first
 * use would load it. Pushes nil when not found. */
static void lookup_field(lua_State *L, int value, const char *key, size_t len, int depth) {
    value = lua_absindex(L, value);
    if (lua_type(L, value) == LUA_TTABLE) {
        lua_pushlstring(L, key, len);
        if (lua_rawget(L, value) != LUA_TNIL) return;
        lua_pop(L, 1);
    }
    if (depth <= 0 || !lua_getmetatable(L, value)) {
        lua_pushnil(L);
        return;
    }
    int mt = lua_gettop(L);
    if (lua_type(L, value) == LUA_TTABLE && raw_field(L, mt, "class") == LUA_TTABLE) {
        for (int i = 0; module_fields[i]; i++) {
            lua_pushstring(L, module_fields[i]);
            if (lua_rawget(L, value) == LUA_TTABLE) {
                lua_pushlstring(L, key, len);
                if (lua_rawget(L, -2) != LUA_TNIL) {
                    lua_replace(L, mt);
                    lua_settop(L, mt);
                    return;
                }
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
        lookup_field(L, -1, key, len, depth - 1); /* the class chain */
        lua_replace(L, mt);
        lua_settop(L, mt);
        return;
    }
    lua_settop(L, mt);
    if (raw_field(L, mt, "__lazy") == LUA_TTABLE) {
        lua_pushlstring(L, key, len);
        bool listed = lua_rawget(L, -2) != LUA_TNIL;
        lua_pop(L, 2);
        if (listed) {
            lua_pushcfunction(L, load_lazy_entry);
            lua_pushvalue(L, value);
            lua_pushlstring(L, key, len);
            if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
                lua_pop(L, 1);
                lua_pushnil(L);
            }
            lua_replace(L, mt);
            return;
        }
    } else {
        lua_pop(L, 1);
    }
    lua_pushliteral(L, "__index");
    if (lua_rawget(L, mt) == LUA_TTABLE) {
        lookup_field(L, -1, key, len, depth - 1);
        lua_replace(L, mt);
        lua_settop(L, mt);
        return;
    }
    lua_settop(L, mt - 1);
    lua_pushnil(L);
}

/* names[k] = v, unless k is named already (a name found first wins, as it
 * would at run time) */
static void add_name(lua_State *L, int names) {
    /* stack: key, value */
    lua_pushvalue(L, -2);
    if (lua_rawget(L, names) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_rawset(L, names);
    } else {
        lua_pop(L, 3);
    }
}

/* Adds the string keys of the table at idx, each with its value, or with
 * `as` (a placeholder whose type gives the suffix) when as != 0. */
static void add_keys(lua_State *L, int idx, int names, int as) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            lua_pushvalue(L, -2);
            if (as) lua_pushvalue(L, as); else lua_pushvalue(L, -2);
            add_name(L, names);
        }
        lua_pop(L, 1);
    }
}

/* Adds names[k] = v for the fields of a value: its own (if a table), then
 * what its metatable offers, recursively: a tensor's __methods and
 * __properties, a needle module's fields and class chain, a lazy table's
 * __lazy entries (not loaded: a whole submodule completes with ".", a field
 * of one with nothing), and __index tables. */
static void add_names(lua_State *L, int value, int names, int depth) {
    value = lua_absindex(L, value);
    if (lua_type(L, value) == LUA_TTABLE) add_keys(L, value, names, 0);
    if (depth <= 0 || !lua_getmetatable(L, value)) return;
    int mt = lua_gettop(L);
    lua_pushboolean(L, 0); /* placeholder: no suffix, not a method */
    int plain = lua_gettop(L);
    lua_newtable(L);       /* placeholder: a table, completes with "." */
    int table = lua_gettop(L);
    if (raw_field(L, mt, "__methods") == LUA_TTABLE) add_keys(L, -1, names, 0);
    lua_pop(L, 1);
    if (raw_field(L, mt, "__properties") == LUA_TTABLE) {
        for (lua_Integer i = 1; lua_rawgeti(L, -1, i) == LUA_TSTRING; i++) {
            lua_pushvalue(L, plain);
            add_name(L, names);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (lua_type(L, value) == LUA_TTABLE && raw_field(L, mt, "class") == LUA_TTABLE) {
        for (int i = 0; module_fields[i]; i++) {
            lua_pushstring(L, module_fields[i]);
            if (lua_rawget(L, value) == LUA_TTABLE) add_keys(L, -1, names, 0);
            lua_pop(L, 1);
        }
        add_names(L, -1, names, depth - 1);
    }
    lua_settop(L, table);
    if (raw_field(L, mt, "__lazy") == LUA_TTABLE) {
        int lazy = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, lazy)) {
            if (lua_type(L, -2) == LUA_TSTRING) {
                bool module = lua_type(L, -1) == LUA_TSTRING;
                lua_pushvalue(L, -2);
                lua_pushvalue(L, module ? table : plain);
                add_name(L, names);
            }
            lua_pop(L, 1);
        }
    }
    lua_settop(L, table);
    lua_pushliteral(L, "__index");
    if (lua_rawget(L, mt) == LUA_TTABLE) add_names(L, -1, names, depth - 1);
    lua_settop(L, mt - 1);
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
    /* "_x" and "__x" names (the package's internals, metamethods) only
     * when the partial name asks for them */
    size_t private_len = partial[0] == '_' ? (partial[1] == '_' ? 2 : 1) : 0;
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
            (name[0] != '_' || (private_len >= 1 && (name[1] != '_' || private_len == 2))) &&
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

/* "?name" is the chunk `require("needle.help").repl("name")`: the name goes
 * in as a Lua string literal (every byte that is not a letter, a digit or a
 * plain punctuation mark as an escape), so that nothing in it is code. */
static int load_help_call(lua_State *L, const char *name) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "require(\"needle.help\").repl(\"");
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("_.: ", *p)) {
            luaL_addchar(&b, (char)*p);
        } else {
            char esc[8];
            snprintf(esc, sizeof esc, "\\%03u", *p);
            luaL_addstring(&b, esc);
        }
    }
    luaL_addstring(&b, "\")");
    luaL_pushresult(&b);
    size_t len;
    const char *code = lua_tolstring(L, -1, &len);
    int status = luaL_loadbuffer(L, code, len, "=stdin");
    lua_remove(L, -2); /* the code */
    return status;
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

/* Tries the line as an expression, so that its values get printed. The
 * values are returned through a function call rather than as `return
 * <line>;` (lua.c's form): there the last call of the line would be a tail
 * call, which removes the chunk's frame, and an error raised inside the
 * package would find no line of the user's to point at. A line that ends in
 * a comment (which would swallow the parenthesis) gets lua.c's form. On
 * failure leaves only the line on the stack. */
static int add_return(lua_State *L) {
    const char *line = lua_tostring(L, -1);
    const char *code = lua_pushfstring(L, "return %s;", line); /* what is an expression: lua.c's test */
    int status = luaL_loadbuffer(L, code, strlen(code), "=stdin");
    if (status == LUA_OK) {
        const char *call = lua_pushfstring(L, "return (function(...) return ... end)(%s)", line);
        if (luaL_loadbuffer(L, call, strlen(call), "=stdin") == LUA_OK) {
            lua_replace(L, -3); /* the call's function in place of lua.c's */
            lua_pop(L, 1);
        } else {
            lua_pop(L, 2); /* its error and code */
        }
    }
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
        if (r == INPUT_EOF) { /* nlua_report the unfinished chunk's syntax error */
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
    const char *line = lua_tostring(L, 1);
    int status;
    if (line[0] == '?') { /* "?name": help on a name */
        save_line(line);
        status = load_help_call(L, line + 1);
    } else {
        status = add_return(L);
        if (status != LUA_OK) status = multiline(L);
    }
    if (status == STATUS_CANCELLED) return status;
    lua_remove(L, 1); /* the source text */
    return status;
}

/* Pushes require(module)[field], or nil when the package cannot give it. */
static void push_package_function(lua_State *L, const char *module, const char *field) {
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
        lua_getfield(L, -1, field);
        lua_remove(L, -2);
    } else {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
}

/* Prints the chunk's results, tab-separated: needle.pretty.print shows a
 * table as a table (a shape as {3, 4}) and the rest as tostring does (a
 * tensor, a module's tree); without the package, the global print, as lua.c. */
static void print_results(lua_State *L) {
    int n = lua_gettop(L);
    if (n == 0) return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    push_package_function(L, "needle.pretty", "print");
    if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        lua_getglobal(L, "print");
    }
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
        nlua_print_message(nlua_progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
}

void nlua_repl_run(lua_State *L) {
    const char *old_progname = nlua_progname;
    nlua_progname = NULL;
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
        if (status == LUA_OK) status = nlua_docall(L, 0, LUA_MULTRET);
        if (status == LUA_OK)
            print_results(L);
        else
            nlua_report(L, status);
    }
    lua_settop(L, 0);
    fputc('\n', stdout); /* leave the shell prompt on a fresh line */
    fflush(stdout);
    if (use_readline) history_close();
    if (key_fd >= 0) close(key_fd);
    nlua_progname = old_progname;
}
