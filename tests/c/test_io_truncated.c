/* test_io_truncated.c - a checkpoint truncated while it is being read (a
 * trainer re-saving the file another process is loading) fails with
 * "unexpected end of file (it was truncated while being read?)", an error
 * pcall catches, in the torch reader as in the safetensors reader, at
 * every point of the load. (Before, nd.load_torch mapped the file: a
 * truncation after the mapping killed the process with SIGBUS.)
 *
 * The truncation is injected from this test, not from the library: the test
 * defines fstat and pread, which take the place of the C library's for the
 * statically linked needle code, call the real system calls and, when
 * armed, truncate the file:
 *  - right after the reader's fstat of the file (it has its size, nothing is
 *    read yet): the old mmap-based reader mapped that size and died with
 *    SIGBUS on the first page past the new end;
 *  - before the k-th pread of the load, for every k a whole load takes. */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "check.h"
#include "io/safetensors.h"
#include "io/torch_load.h"
#include "needle.h"

/* ------------------------------------------------------------ injection */

static const char *target;   /* the file to truncate */
static ino_t target_ino;
static off_t cut_to;         /* its length after the cut */
static bool cut_on_fstat;    /* at the reader's fstat of target */
static long cut_before_read; /* > 0: before that pread (counted from arming) */
static long reads;           /* preads since arming */
static bool cut_done;

static void cut(void) {
    if (cut_done) return;
    cut_done = true;
    if (truncate(target, cut_to) != 0) perror("truncate");
}

static int real_fstat(int fd, struct stat *sb) { return (int)syscall(SYS_fstat, fd, sb); }

int fstat(int fd, struct stat *sb) {
    int r = real_fstat(fd, sb);
    if (r == 0 && cut_on_fstat && target && sb->st_ino == target_ino && S_ISREG(sb->st_mode)) cut();
    return r;
}
int fstat64(int fd, struct stat64 *sb) { return fstat(fd, (struct stat *)sb); }

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    if (target && cut_before_read > 0 && ++reads == cut_before_read) cut();
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}
ssize_t pread64(int fd, void *buf, size_t n, off64_t off) { return pread(fd, buf, n, (off_t)off); }

static void arm(const char *path, off_t to, bool on_fstat, long before_read) {
    struct stat sb;
    if (stat(path, &sb) != 0) { perror(path); exit(1); }
    target = path;
    target_ino = sb.st_ino;
    cut_to = to;
    cut_on_fstat = on_fstat;
    cut_before_read = before_read;
    reads = 0;
    cut_done = false;
}
static void disarm(void) { target = NULL; cut_on_fstat = false; cut_before_read = 0; }

/* ------------------------------------------------------------ helpers */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) { printf("cannot read %s\n", path); exit(1); }
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void spit(const char *path, const char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) { printf("cannot write %s\n", path); exit(1); }
}

static const char *TRUNCATED = "unexpected end of file (it was truncated while being read?)";

/* ------------------------------------------------------------ tests */

/* nd.load_torch and nd.load through pcall: the file shrinks to half right
 * after the reader learned its size. */
static void test_lua_pcall(const char *path, const char *orig, size_t n) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "needle", luaopen_needle, 1);
    lua_pop(L, 1);
    const char *loaders[] = {"load_torch", "load"};
    for (int i = 0; i < 2; i++) {
        spit(path, orig, n);
        arm(path, (off_t)(n / 2), true, 0);
        lua_getglobal(L, "pcall");
        lua_getglobal(L, "needle");
        lua_getfield(L, -1, loaders[i]);
        lua_remove(L, -2);
        lua_pushstring(L, path);
        checks++;
        if (lua_pcall(L, 2, 2, 0) != LUA_OK) {
            FAIL("pcall itself failed: %s", lua_tostring(L, -1));
            lua_pop(L, 1);
            continue;
        }
        disarm();
        CHECKM(cut_done, "nd.%s: the file was not truncated (no fstat of it?)", loaders[i]);
        CHECKM(!lua_toboolean(L, -2), "nd.%s accepted a file truncated while it was read", loaders[i]);
        const char *msg = lua_tostring(L, -1);
        char head[64];
        snprintf(head, sizeof head, "needle.%s: '", loaders[i]);
        CHECKM(msg && strncmp(msg, head, strlen(head)) == 0 && strstr(msg, path) && strstr(msg, TRUNCATED),
               "nd.%s: unexpected message '%s'", loaders[i], msg ? msg : "(none)");
        lua_pop(L, 2);
    }
    lua_close(L);
}

/* The C readers, the file cut before each pread a whole load takes (and at
 * a few lengths): each load fails with the truncation error, or succeeds
 * when every byte it reads lies before the cut. */
static void test_every_read(const char *what, const char *path, const char *orig, size_t n,
                            nd_status (*load)(const char *path)) {
    spit(path, orig, n);
    arm(path, 0, false, 1L << 40); /* count the reads of a whole load */
    nd_status st = load(path);
    long total = reads;
    disarm();
    CHECKM(st == ND_OK, "%s: the intact file does not load: %s", what, nd_last_error());
    CHECKM(total >= 2, "%s: a load took %ld reads", what, total);
    const size_t cuts[] = {0, 9, n / 3, n / 2, n - 23, n - 1};
    int failed = 0;
    for (long k = 1; k <= total; k++)
        for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
            spit(path, orig, n);
            arm(path, (off_t)cuts[c], false, k);
            st = load(path);
            disarm();
            checks++;
            if (st == ND_OK) continue; /* every byte it needed came before the cut */
            failed++;
            if (!strstr(nd_last_error(), TRUNCATED) || !strstr(nd_last_error(), path))
                FAIL("%s cut to %zu bytes before read %ld: '%s'", what, cuts[c], k, nd_last_error());
        }
    CHECKM(failed > 0, "%s: no cut made a load fail", what);
}

static nd_status load_torch_file(const char *path) {
    nd_torch_file *f;
    nd_status st = nd_torch_load("load_torch", path, NULL, &f);
    nd_torch_free(f);
    return st;
}

static nd_status load_safetensors_file(const char *path) {
    nd_st_header *h;
    nd_tensor **ts;
    nd_status st = nd_st_load_file("load", path, &h, &ts);
    if (st == ND_OK) {
        nd_st_free_tensors(ts, h->ntensors);
        nd_st_header_free(h);
    }
    return st;
}

int main(void) {
    char dir[] = "/tmp/needle-test-truncated.XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char pt[256], st[256];
    snprintf(pt, sizeof pt, "%s/mlp.pt", dir);
    snprintf(st, sizeof st, "%s/state.safetensors", dir);
    size_t npt, nst;
    char *opt = slurp("spec/fixtures/torch_ckpt/mlp.pt", &npt);
    char *ost = slurp("spec/fixtures/torch_state.safetensors", &nst);

    test_lua_pcall(pt, opt, npt);
    test_every_read("nd_torch_load", pt, opt, npt, load_torch_file);
    test_every_read("nd_st_load_file", st, ost, nst, load_safetensors_file);

    unlink(pt);
    unlink(st);
    rmdir(dir);
    free(opt);
    free(ost);
    if (failures) {
        printf("%d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("%d checks passed\n", checks);
    return 0;
}
