/* lt_workers.c - DataLoader worker threads (the C half of
 * lua/needle/data/workers.lua; docs/data.md, "Worker threads").
 *
 *   core._workers_start(n, capacity, payloads) -> pool
 *       n threads, each with a Lua state of its own (luaL_openlibs, the
 *       calling state's package.path/cpath, its C preloads and C searchers)
 *       that requires "needle.data.worker" and calls its start(id, n,
 *       payloads[id], should_stop); then runs worker.run(task) for each task.
 *   pool:put(k, value)        queues a task for worker k (at most capacity
 *                             tasks put and not yet got per worker)
 *   pool:get(k, wait_s) -> true, value | false, message | nil (nothing yet)
 *                             worker k's next result, in the order of its tasks
 *   pool:close()              stops and joins the threads, frees what is
 *                             queued; also __close and __gc; idempotent
 *   core._workers_live() -> threads running now (all pools)
 *
 * Values cross between the states as messages: nil, booleans, numbers and
 * strings are copied, tables (plain ones: no metatable, no cycle, at most
 * MAX_DEPTH deep) are copied key by key, and tensors are NOT copied: the
 * sender takes a reference (nd_retain) that the receiving state adopts as a
 * userdata of its own. Only CPU tensors without gradient history cross, so
 * a worker never reaches an OpenCL queue or an autograd graph of the main
 * thread (the rest of what the threads share is in docs/data.md). */
#define _POSIX_C_SOURCE 200809L /* strdup, clock_gettime, pthread_sigmask */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <lualib.h>
#include "lt_internal.h"

#define POOL_MT "needle.data.worker_pool"
#define MSG_MT "needle.data.worker_message"
#define WHO "data.DataLoader"
#define MAX_DEPTH 100
#define MAX_WORKERS 256
#define MAX_COPIED 16 /* preloads / searchers copied from the calling state */

static atomic_int live_threads;

/* ------------------------------------------------------------- messages */

typedef struct msg {
    struct msg *next;
    bool error;   /* the payload is the worker's error message */
    char *buf;
    size_t len, cap;
    nd_tensor **ts; /* references owned by the message until adopted */
    int nts, capts;
} msg;

static void msg_free(msg *m) {
    if (!m) return;
    for (int i = 0; i < m->nts; i++) nd_release(m->ts[i]);
    free(m->ts);
    free(m->buf);
    free(m);
}

static void msg_free_list(msg *m) {
    while (m) {
        msg *next = m->next;
        msg_free(m);
        m = next;
    }
}

static bool put_bytes(msg *m, const void *p, size_t n) {
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->len + n) cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) return false;
        m->buf = b;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, p, n);
    m->len += n;
    return true;
}

static bool put_tag(msg *m, char tag) { return put_bytes(m, &tag, 1); }

/* ---- encoding: a Lua value into a message, without raising ---- */

typedef struct {
    msg *m;
    const void *open[MAX_DEPTH]; /* tables on the path from the root */
    char keys[MAX_DEPTH][40];    /* each level's key, as the path shows it */
    int depth;
    const char *root;
    char err[600];
} enc;

static void key_text(lua_State *L, int idx, char *out, size_t n) {
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *s = lua_tostring(L, idx);
        bool plain = (s[0] == '_' || isalpha((unsigned char)s[0])) && strlen(s) < 30;
        for (const char *c = s; plain && *c; c++) plain = *c == '_' || isalnum((unsigned char)*c);
        if (plain) snprintf(out, n, ".%s", s);
        else snprintf(out, n, "[\"%.28s\"]", s);
    } else if (lua_isinteger(L, idx)) {
        snprintf(out, n, "[%lld]", (long long)lua_tointeger(L, idx));
    } else if (lua_type(L, idx) == LUA_TNUMBER) {
        snprintf(out, n, "[%g]", (double)lua_tonumber(L, idx));
    } else {
        snprintf(out, n, "[%s]", lua_toboolean(L, idx) ? "true" : "false");
    }
}

/* "batch[2].image" for the current level */
static int enc_fail(enc *e, const char *fmt, ...) {
    char path[MAX_DEPTH * 12 + 64];
    size_t o = (size_t)snprintf(path, sizeof path, "%s", e->root);
    for (int i = 0; i < e->depth && o < sizeof path - 48; i++) {
        if (e->depth > 8 && i == 4) {
            o += (size_t)snprintf(path + o, sizeof path - o, "...");
            i = e->depth - 4;
        }
        o += (size_t)snprintf(path + o, sizeof path - o, "%s", e->keys[i]);
    }
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(e->err, sizeof e->err, "%.300s %.250s", path, what);
    return 0;
}

static int encode(lua_State *L, int idx, enc *e);

static int encode_table(lua_State *L, int idx, enc *e) {
    const void *self = lua_topointer(L, idx);
    for (int i = 0; i < e->depth; i++)
        if (e->open[i] == self) return enc_fail(e, "contains itself (a table with a cycle cannot be sent)");
    if (e->depth >= MAX_DEPTH)
        return enc_fail(e, "nests tables more than %d levels deep", MAX_DEPTH);
    if (lua_getmetatable(L, idx)) {
        lua_pop(L, 1);
        return enc_fail(e, "is a table with a metatable (only plain tables, numbers, strings, "
                        "booleans and CPU tensors can be sent between threads)");
    }
    if (!lua_checkstack(L, 4)) return enc_fail(e, "cannot be sent: Lua stack overflow");
    if (!put_tag(e->m, '{')) return enc_fail(e, "cannot be sent: out of memory");
    e->open[e->depth] = self;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int kt = lua_type(L, -2);
        if (kt != LUA_TSTRING && kt != LUA_TNUMBER && kt != LUA_TBOOLEAN) {
            lua_pop(L, 2);
            return enc_fail(e, "has a key of type %s (keys must be strings, numbers or booleans)",
                            lua_typename(L, kt));
        }
        key_text(L, lua_gettop(L) - 1, e->keys[e->depth], sizeof e->keys[0]);
        e->depth++;
        int ok = encode(L, lua_gettop(L) - 1, e) && encode(L, lua_gettop(L), e);
        e->depth--;
        lua_pop(L, 1);
        if (!ok) {
            lua_pop(L, 1);
            return 0;
        }
    }
    if (!put_tag(e->m, '}')) return enc_fail(e, "cannot be sent: out of memory");
    return 1;
}

static int encode_tensor(lua_State *L, int idx, enc *e) {
    nd_tensor *t = nd_lua_to_tensor(L, idx);
    if (!t) return enc_fail(e, "is a closed tensor or a userdata other than a tensor");
    if (!nd_on_cpu(t)) {
        char db[32];
        return enc_fail(e, "is a tensor on %s (worker threads work on the CPU: keep the dataset "
                        "on the CPU and move the batches in the training loop)",
                        nd_device_str(nd_get_device(t), db));
    }
    if (t->requires_grad)
        return enc_fail(e, "is a tensor that requires grad (worker threads run without "
                        "autograd: send x:detach())");
    if (e->m->nts == e->m->capts) {
        int cap = e->m->capts ? 2 * e->m->capts : 8;
        nd_tensor **ts = realloc(e->m->ts, (size_t)cap * sizeof *ts);
        if (!ts) return enc_fail(e, "cannot be sent: out of memory");
        e->m->ts = ts;
        e->m->capts = cap;
    }
    int32_t i = e->m->nts;
    if (!put_tag(e->m, 'T') || !put_bytes(e->m, &i, sizeof i))
        return enc_fail(e, "cannot be sent: out of memory");
    /* a header of its own (a view of the same storage, no copy): the other
     * state may change its header (requires_grad_, set_data_) while this one
     * still holds the original */
    nd_tensor *v;
    if (nd_tensor_view_of(t, t->shape, t->strides, t->ndim, t->offset, &v) != ND_OK)
        return enc_fail(e, "cannot be sent: out of memory");
    e->m->ts[e->m->nts++] = v;
    return 1;
}

static int encode(lua_State *L, int idx, enc *e) {
    bool ok = true;
    switch (lua_type(L, idx)) {
    case LUA_TNIL: ok = put_tag(e->m, 'n'); break;
    case LUA_TBOOLEAN: ok = put_tag(e->m, lua_toboolean(L, idx) ? 't' : 'f'); break;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            lua_Integer v = lua_tointeger(L, idx);
            ok = put_tag(e->m, 'i') && put_bytes(e->m, &v, sizeof v);
        } else {
            lua_Number v = lua_tonumber(L, idx);
            ok = put_tag(e->m, 'd') && put_bytes(e->m, &v, sizeof v);
        }
        break;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        ok = put_tag(e->m, 's') && put_bytes(e->m, &n, sizeof n) && put_bytes(e->m, s, n);
        break;
    }
    case LUA_TTABLE: return encode_table(L, idx, e);
    case LUA_TUSERDATA: return encode_tensor(L, idx, e);
    default:
        return enc_fail(e, "is a %s (only plain tables, numbers, strings, booleans and CPU "
                        "tensors can be sent between threads)", luaL_typename(L, idx));
    }
    return ok ? 1 : enc_fail(e, "cannot be sent: out of memory");
}

/* A new message holding the value at idx, or NULL with the reason in err. */
static msg *encode_value(lua_State *L, int idx, const char *root, char *err, size_t errn) {
    idx = lua_absindex(L, idx);
    msg *m = calloc(1, sizeof *m);
    enc *e = calloc(1, sizeof *e);
    if (!m || !e) {
        free(m);
        free(e);
        snprintf(err, errn, "out of memory");
        return NULL;
    }
    e->m = m;
    e->root = root;
    int top = lua_gettop(L);
    if (!encode(L, idx, e)) {
        snprintf(err, errn, "%s", e->err);
        msg_free(m);
        m = NULL;
    }
    lua_settop(L, top);
    free(e);
    return m;
}

static msg *string_message(const char *s, bool error) {
    msg *m = calloc(1, sizeof *m);
    size_t n = strlen(s);
    if (!m || !put_tag(m, 's') || !put_bytes(m, &n, sizeof n) || !put_bytes(m, s, n)) {
        msg_free(m);
        return NULL;
    }
    m->error = error;
    return m;
}

/* ---- decoding: pushes the value (may raise a Lua memory error: the
 * message must be owned by something that frees it, see msg_box) ---- */

static void decode(lua_State *L, msg *m, size_t *pos, int depth) {
    luaL_checkstack(L, 3, "needle: worker message nests too deep");
    char tag = m->buf[(*pos)++];
    switch (tag) {
    case 'n': lua_pushnil(L); break;
    case 't': lua_pushboolean(L, 1); break;
    case 'f': lua_pushboolean(L, 0); break;
    case 'i': {
        lua_Integer v;
        memcpy(&v, m->buf + *pos, sizeof v);
        *pos += sizeof v;
        lua_pushinteger(L, v);
        break;
    }
    case 'd': {
        lua_Number v;
        memcpy(&v, m->buf + *pos, sizeof v);
        *pos += sizeof v;
        lua_pushnumber(L, v);
        break;
    }
    case 's': {
        size_t n;
        memcpy(&n, m->buf + *pos, sizeof n);
        *pos += sizeof n;
        lua_pushlstring(L, m->buf + *pos, n);
        *pos += n;
        break;
    }
    case 'T': {
        int32_t i;
        memcpy(&i, m->buf + *pos, sizeof i);
        *pos += sizeof i;
        lt_push(L, m->ts[i]); /* adopts the message's reference... */
        m->ts[i] = NULL;      /* ...once the userdata holds it */
        break;
    }
    case '{':
        lua_newtable(L);
        while (m->buf[*pos] != '}') {
            decode(L, m, pos, depth + 1);
            decode(L, m, pos, depth + 1);
            lua_rawset(L, -3);
        }
        (*pos)++;
        break;
    default: luaL_error(L, "needle: corrupt worker message (tag %d)", tag);
    }
}

/* A message being decoded is held by a userdata, so that a Lua error during
 * decoding (out of memory) frees it with the userdata. */
static int msgbox_gc(lua_State *L) {
    msg **b = lua_touserdata(L, 1);
    if (b && *b) { msg_free(*b); *b = NULL; }
    return 0;
}

static msg **push_msgbox(lua_State *L) {
    msg **b = lua_newuserdatauv(L, sizeof *b, 0);
    *b = NULL;
    if (luaL_newmetatable(L, MSG_MT)) {
        lua_pushcfunction(L, msgbox_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    return b;
}

/* pushes the message's value, then frees the message (held by *box) */
static void decode_boxed(lua_State *L, msg **box) {
    size_t pos = 0;
    decode(L, *box, &pos, 0);
    msg_free(*box);
    *box = NULL;
}

/* ------------------------------------------------------------- the pool */

typedef struct pool pool;

typedef struct {
    pool *p;
    int id; /* 1-based */
    pthread_t thread;
    bool started;
    int run_ref;      /* worker.run in the worker's registry */
    msg *init;        /* the payload for start, taken by the worker */
    msg *tasks, *tasks_tail;
    msg *results, *results_tail;
    int outstanding;  /* tasks put and not yet got */
    bool oom;         /* a result could not be made: out of memory */
    pthread_cond_t wake; /* a task or stop (the worker waits) */
    pthread_cond_t done; /* a result (the main thread waits) */
} worker;

typedef struct {
    char *name;
    lua_CFunction fn;
    int pos;
} copied_fn;

struct pool {
    pthread_mutex_t lock;
    atomic_bool stop;
    bool closed;
    int n, capacity;
    char *path, *cpath;
    copied_fn preload[MAX_COPIED], searchers[MAX_COPIED];
    int npreload, nsearchers;
    worker w[];
};

typedef struct { pool *p; } pool_box;

static void push_back(msg **head, msg **tail, msg *m) {
    m->next = NULL;
    if (*tail) (*tail)->next = m;
    else *head = m;
    *tail = m;
}

static msg *pop_front(msg **head, msg **tail) {
    msg *m = *head;
    if (m) {
        *head = m->next;
        if (!*head) *tail = NULL;
        m->next = NULL;
    }
    return m;
}

/* the worker's result (or error) for the main thread */
static void post(worker *w, msg *m) {
    pthread_mutex_lock(&w->p->lock);
    if (m) push_back(&w->results, &w->results_tail, m);
    else w->oom = true;
    pthread_cond_signal(&w->done);
    pthread_mutex_unlock(&w->p->lock);
}

/* should_stop() in the worker: the pool is closing (the Lua side checks it
 * between items, so a break in the main loop does not wait for a batch) */
static int l_should_stop(lua_State *L) {
    pool *p = lua_touserdata(L, lua_upvalueindex(1));
    lua_pushboolean(L, atomic_load(&p->stop));
    return 1;
}

static int traceback(lua_State *L) {
    const char *m = lua_tostring(L, 1);
    if (!m) m = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, m, 1);
    return 1;
}

static int boot(lua_State *L) {
    worker *w = lua_touserdata(L, 1);
    pool *p = w->p;
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushstring(L, p->path);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, p->cpath);
    lua_setfield(L, -2, "cpath");
    lua_getfield(L, -1, "preload");
    for (int i = 0; i < p->npreload; i++) {
        lua_pushcfunction(L, p->preload[i].fn);
        lua_setfield(L, -2, p->preload[i].name);
    }
    lua_pop(L, 1);
    /* the calling state's own C searchers (the embedded sources of a C
     * host) at their positions, before the standard ones after them */
    lua_getfield(L, -1, "searchers");
    for (int i = 0; i < p->nsearchers; i++) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1), at = p->searchers[i].pos;
        if (at > n + 1) at = n + 1;
        for (lua_Integer k = n; k >= at; k--) {
            lua_rawgeti(L, -1, k);
            lua_rawseti(L, -2, k + 1);
        }
        lua_pushcfunction(L, p->searchers[i].fn);
        lua_rawseti(L, -2, at);
    }
    lua_pop(L, 2);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "needle.data.worker");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "run");
    w->run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "start");
    lua_pushinteger(L, w->id);
    lua_pushinteger(L, p->n);
    msg **box = push_msgbox(L);
    *box = w->init;
    w->init = NULL;
    decode_boxed(L, box);
    lua_remove(L, -2); /* the box */
    lua_pushlightuserdata(L, p);
    lua_pushcclosure(L, l_should_stop, 1);
    lua_call(L, 4, 0);
    return 0;
}

/* runs one task: the result message goes to *(msg **)arg 3 */
static int run_task(lua_State *L) {
    worker *w = lua_touserdata(L, 1);
    msg **task = lua_touserdata(L, 2);
    msg **out = lua_touserdata(L, 3);
    lua_rawgeti(L, LUA_REGISTRYINDEX, w->run_ref);
    size_t pos = 0;
    decode(L, *task, &pos, 0);
    lua_call(L, 1, 1);
    char err[600];
    *out = encode_value(L, -1, "the batch", err, sizeof err);
    if (!*out) return luaL_error(L, "%s", err);
    return 0;
}

/* pcall of fn(args...) with a traceback; on an error, posts it as the
 * worker's result and returns false */
static bool protected(worker *w, lua_State *L, lua_CFunction fn, void *a2, void *a3) {
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, w);
    int nargs = 1;
    if (a2) { lua_pushlightuserdata(L, a2); nargs++; }
    if (a3) { lua_pushlightuserdata(L, a3); nargs++; }
    int st = lua_pcall(L, nargs, 0, -nargs - 2);
    if (st == LUA_OK) {
        lua_pop(L, 1);
        return true;
    }
    if (!atomic_load(&w->p->stop)) {
        const char *m = lua_tostring(L, -1);
        post(w, string_message(m ? m : "(error object is not a string)", true));
    }
    lua_settop(L, 0);
    return false;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    pool *p = w->p;
    /* per-thread settings of the core (docs/data.md, "What the threads share") */
    nd_set_grad_enabled(false);
    nd_rng_thread_local(true);
    nd_set_thread_max_threads(1);
    nd_set_thread_cpu_only(true);
    lua_State *L = luaL_newstate();
    if (!L) {
        post(w, string_message("cannot create a Lua state (out of memory)", true));
    } else {
        bool ok = protected(w, L, boot, NULL, NULL);
        for (;;) {
            pthread_mutex_lock(&p->lock);
            while (!atomic_load(&p->stop) && !w->tasks) pthread_cond_wait(&w->wake, &p->lock);
            msg *task = atomic_load(&p->stop) ? NULL : pop_front(&w->tasks, &w->tasks_tail);
            pthread_mutex_unlock(&p->lock);
            if (!task) break;
            if (!ok) { /* boot failed: its error was posted; the rest is dropped */
                msg_free(task);
                continue;
            }
            msg *out = NULL;
            if (protected(w, L, run_task, &task, &out)) post(w, out);
            msg_free(task); /* what run_task did not adopt */
            lua_gc(L, LUA_GCSTEP, 0);
        }
        lua_close(L); /* releases the worker's references to tensors */
    }
    nd_rng_thread_local(false);
    atomic_fetch_sub(&live_threads, 1);
    return NULL;
}

/* Stops and joins the threads and frees everything (idempotent). */
static void pool_close(pool *p) {
    if (!p || p->closed) return;
    p->closed = true;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    for (int i = 0; i < p->n; i++) pthread_cond_broadcast(&p->w[i].wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n; i++)
        if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        msg_free(w->init);
        msg_free_list(w->tasks);
        msg_free_list(w->results);
        pthread_cond_destroy(&w->wake);
        pthread_cond_destroy(&w->done);
    }
    for (int i = 0; i < p->npreload; i++) free(p->preload[i].name);
    free(p->path);
    free(p->cpath);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static pool_box *check_pool(lua_State *L) {
    pool_box *b = luaL_checkudata(L, 1, POOL_MT);
    if (!b->p) lt_error(L, WHO, "the worker threads were stopped (the loop ended or was left)");
    return b;
}

static worker *check_worker(lua_State *L, pool *p) {
    lua_Integer k = luaL_checkinteger(L, 2);
    if (k < 1 || k > p->n) lt_error(L, WHO, "worker %lld does not exist (1..%d)", (long long)k, p->n);
    return &p->w[k - 1];
}

static int pool_gc(lua_State *L) {
    pool_box *b = lua_touserdata(L, 1);
    if (b && b->p) {
        pool_close(b->p);
        b->p = NULL;
    }
    return 0;
}

static bool has_upvalue(lua_State *L, int idx) {
    if (!lua_getupvalue(L, idx, 1)) return false;
    lua_pop(L, 1);
    return true;
}

/* the calling state's package settings, for the workers' states */
static void copy_package(lua_State *L, pool *p) {
    lua_getglobal(L, "package");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        p->path = strdup("");
        p->cpath = strdup("");
        return;
    }
    lua_getfield(L, -1, "path");
    const char *s = lua_tostring(L, -1);
    p->path = strdup(s ? s : "");
    lua_pop(L, 1);
    lua_getfield(L, -1, "cpath");
    s = lua_tostring(L, -1);
    p->cpath = strdup(s ? s : "");
    lua_pop(L, 1);
    /* C functions without upvalues can be pushed into another state */
    if (lua_getfield(L, -1, "preload") == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, -2) && p->npreload < MAX_COPIED) {
            lua_CFunction fn = lua_tocfunction(L, -1);
            if (fn && lua_type(L, -2) == LUA_TSTRING && !has_upvalue(L, -1)) {
                p->preload[p->npreload].name = strdup(lua_tostring(L, -2));
                p->preload[p->npreload].fn = fn;
                if (p->preload[p->npreload].name) p->npreload++;
            }
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    if (lua_getfield(L, -1, "searchers") == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= n && p->nsearchers < MAX_COPIED; i++) {
            lua_rawgeti(L, -1, i);
            lua_CFunction fn = lua_tocfunction(L, -1);
            if (fn && !has_upvalue(L, -1)) {
                p->searchers[p->nsearchers].fn = fn;
                p->searchers[p->nsearchers].pos = (int)i;
                p->nsearchers++;
            }
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 2);
}

/* core._workers_start(n, capacity, payloads) -> pool */
static int l_start(lua_State *L) {
    lua_Integer n = luaL_checkinteger(L, 1), cap = luaL_checkinteger(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    if (n < 1 || n > MAX_WORKERS) lt_error(L, WHO, "num_workers must be 1..%d here, got %lld", MAX_WORKERS, (long long)n);
    if (cap < 1 || cap > 1 << 20)
        lt_error(L, WHO, "prefetch_factor must be 1..%d, got %lld", 1 << 20, (long long)cap);
    pool_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->p = NULL;
    luaL_setmetatable(L, POOL_MT);
    pool *p = calloc(1, sizeof *p + (size_t)n * sizeof(worker));
    if (!p) lt_error(L, WHO, "out of memory starting %lld worker threads", (long long)n);
    p->n = (int)n;
    p->capacity = (int)cap;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->stop, false);
    for (int i = 0; i < p->n; i++) {
        p->w[i].p = p;
        p->w[i].id = i + 1;
        pthread_cond_init(&p->w[i].wake, NULL);
        pthread_cond_init(&p->w[i].done, NULL);
    }
    b->p = p; /* from here the userdata's __gc frees it */
    copy_package(L, p);
    if (!p->path || !p->cpath) lt_error(L, WHO, "out of memory starting the worker threads");
    for (int i = 0; i < p->n; i++) {
        char err[600];
        lua_rawgeti(L, 3, i + 1);
        p->w[i].init = encode_value(L, -1, "the dataset", err, sizeof err);
        lua_pop(L, 1);
        if (!p->w[i].init) lt_error(L, WHO, "num_workers > 0: %s", err);
    }
    /* the threads take no signals: SIGINT stays with the thread running Lua */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int failed = 0;
    for (int i = 0; i < p->n && !failed; i++) {
        atomic_fetch_add(&live_threads, 1);
        failed = pthread_create(&p->w[i].thread, NULL, worker_main, &p->w[i]);
        if (failed) atomic_fetch_sub(&live_threads, 1);
        else p->w[i].started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (failed) {
        pool_close(p);
        b->p = NULL;
        lt_error(L, WHO, "cannot start %lld worker threads: %s", (long long)n, strerror(failed));
    }
    return 1;
}

/* pool:put(k, value) */
static int l_put(lua_State *L) {
    pool *p = check_pool(L)->p;
    worker *w = check_worker(L, p);
    char err[600];
    msg *m = encode_value(L, 3, "the task", err, sizeof err);
    if (!m) return lt_error(L, WHO, "%s", err);
    pthread_mutex_lock(&p->lock);
    bool full = w->outstanding >= p->capacity;
    if (!full) {
        push_back(&w->tasks, &w->tasks_tail, m);
        w->outstanding++;
        pthread_cond_signal(&w->wake);
    }
    pthread_mutex_unlock(&p->lock);
    if (full) {
        msg_free(m);
        return lt_error(L, WHO, "worker %d already has %d tasks queued (the prefetch bound)", w->id,
                        p->capacity);
    }
    return 0;
}

/* pool:get(k, wait_s) -> true, value | false, message | nil */
static int l_get(lua_State *L) {
    pool *p = check_pool(L)->p;
    worker *w = check_worker(L, p);
    double wait_s = luaL_optnumber(L, 3, 0.1);
    if (!(wait_s >= 0)) wait_s = 0;
    if (wait_s > 3600) wait_s = 3600;
    msg **box = push_msgbox(L); /* before taking the message: this may raise */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = (long long)(wait_s * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec += (long)(ns % 1000000000);
    if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
    pthread_mutex_lock(&p->lock);
    while (!w->results && !w->oom) {
        if (pthread_cond_timedwait(&w->done, &p->lock, &until) == ETIMEDOUT) break;
    }
    msg *m = pop_front(&w->results, &w->results_tail);
    bool oom = !m && w->oom;
    if (m) w->outstanding--;
    pthread_mutex_unlock(&p->lock);
    if (oom) {
        lua_pushboolean(L, 0);
        lua_pushliteral(L, "out of memory (a result could not be made)");
        return 2;
    }
    if (!m) return 0;
    *box = m;
    bool error = m->error;
    lua_pushboolean(L, !error);
    decode_boxed(L, box);
    return 2;
}

static int l_close(lua_State *L) {
    pool_box *b = luaL_checkudata(L, 1, POOL_MT);
    if (b->p) {
        pool_close(b->p);
        b->p = NULL;
    }
    return 0;
}

static int l_closed(lua_State *L) {
    pool_box *b = luaL_checkudata(L, 1, POOL_MT);
    lua_pushboolean(L, b->p == NULL);
    return 1;
}

static int l_live(lua_State *L) {
    lua_pushinteger(L, atomic_load(&live_threads));
    return 1;
}

void lt_register_workers(lua_State *L) {
    if (luaL_newmetatable(L, POOL_MT)) {
        static const lt_reg methods[] = {
            {"put", l_put, false, true, 3, "pool, k, value"},
            {"get", l_get, false, true, 3, "pool, k[, wait_s]"},
            {"close", l_close, false, true, 1, "pool"},
            {"closed", l_closed, false, true, 1, "pool"},
            {NULL, NULL, false, false}};
        lua_newtable(L);
        lt_register(L, -1, -1, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, pool_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, pool_gc);
        lua_setfield(L, -2, "__close");
    }
    lua_pop(L, 1);
    static const lt_reg regs[] = {
        {"_workers_start", l_start, false, true, 3, "n, capacity, payloads"},
        {"_workers_live", l_live, false, true, 0, ""},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
