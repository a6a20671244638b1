/* atomic.c - crash-safe file replacement: write a temporary next to the
 * target, fsync it, rename it over the target, fsync the directory. A
 * reader (or a crash) sees the old file or the complete new one, never a
 * partial one. Only a regular file (or a symbolic link to one, or nothing)
 * is replaced; writes stay within the file size limit (RLIMIT_FSIZE) so that
 * SIGXFSZ never kills the process; an interrupted save's temporaries are
 * removed by the next save to the same path. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h> /* flock */
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/io.h"
#include "tensor.h"

#define BUF_CAP ((size_t)1 << 20) /* small writes are gathered into 1 MiB */

struct nd_atomic_file {
    int fd;
    char *path, *tmp;
    const char *op;
    char *buf;
    size_t used;
    uint64_t written; /* bytes in the temporary so far (its size: writes are sequential) */
};

static void destroy(nd_atomic_file *f, bool remove_tmp) {
    if (f->fd >= 0) close(f->fd);
    if (remove_tmp) unlink(f->tmp);
    free(f->buf);
    free(f->path);
    free(f->tmp);
    free(f);
}

void nd_atomic_abort(nd_atomic_file *f) {
    if (f) destroy(f, true);
}

/* fails f (removing the temporary) with "<op>: cannot <what> '<path>': <strerror>" */
static nd_status fail_errno(nd_atomic_file *f, int err, const char *what) {
    nd_status st = nd_fail(ND_ERR_IO, "%s: cannot %s '%s': %s", f->op, what, f->path, strerror(err));
    destroy(f, true);
    return st;
}

/* path must be nothing yet, a regular file, or a symbolic link to one (or
 * to nothing): rename would replace a device node, a FIFO or a socket by a
 * regular file (as root, nd.save(t, "/dev/null") would replace /dev/null). */
static nd_status check_target(const char *op, const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return ND_OK; /* nothing there (or not visible: the open will say) */
    bool link = S_ISLNK(sb.st_mode);
    if (link && stat(path, &sb) != 0) return ND_OK; /* a dangling link is replaced */
    if (S_ISREG(sb.st_mode)) return ND_OK;
    if (S_ISDIR(sb.st_mode) && !link) return nd_fail(ND_ERR_IO, "%s: cannot replace '%s': %s", op, path, strerror(EISDIR));
    return nd_fail(ND_ERR_IO, "%s: cannot replace '%s': it is %s%s, not a regular file", op, path,
                   link ? "a symbolic link to " : "", nd_file_type_name((unsigned)sb.st_mode));
}

/* "<digits>" or "<digits>.<digits>" (all of s): the pid of a temporary's
 * name after "<base>.tmp.", else 0 */
static pid_t temp_pid(const char *s) {
    long long pid = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        pid = pid * 10 + (*p - '0');
        if (pid > 0x7fffffff) return 0;
    }
    if (p == s) return 0;
    if (*p == '.') {
        const char *k = ++p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == k) return 0;
    }
    return *p ? 0 : (pid_t)pid;
}

/* Removes the temporaries "<path>.tmp.<pid>[.<k>]" left by saves that were
 * interrupted (killed, out of power), up to the size of the file each: one
 * whose process is gone (kill(pid, 0) fails with ESRCH), that is a regular
 * file and that belongs to this user. A live process's (this one's
 * included: another thread may be saving) is never touched. Best effort:
 * nothing here makes the save fail. A process of another PID namespace
 * (another container writing to a shared directory) is not seen by kill(),
 * so a writer also holds an flock on its temporary while it writes, and a
 * temporary that is locked is kept whatever its pid says. */
static void remove_stale(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t bl = strlen(base);
    char *dir = slash ? malloc((size_t)(slash - path) + 2) : NULL;
    if (slash && !dir) return;
    if (dir) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, dl);
        dir[dl] = 0;
    }
    DIR *d = opendir(dir ? dir : ".");
    free(dir);
    if (!d) return;
    int dfd = dirfd(d);
    pid_t self = getpid();
    uid_t me = geteuid();
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0) continue;
        pid_t pid = temp_pid(name + bl + 5);
        if (pid <= 0 || pid == self) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue; /* alive (or someone else's: EPERM) */
        /* O_NOFOLLOW|O_NONBLOCK: a symlink or a FIFO planted under the name
         * is neither followed nor waited on */
        int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == me &&
            flock(fd, LOCK_EX | LOCK_NB) == 0) /* no writer holds it */
            (void)unlinkat(dfd, name, 0);
        close(fd); /* and the lock with it */
    }
    closedir(d);
}

nd_status nd_atomic_open(const char *op, const char *path, nd_atomic_file **out) {
    *out = NULL;
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    ND_TRY(check_target(op, path));
    remove_stale(path);
    nd_atomic_file *f = calloc(1, sizeof *f);
    size_t n = strlen(path);
    if (f) {
        f->fd = -1;
        f->op = op;
        f->path = malloc(n + 1);
        f->tmp = malloc(n + 32);
        f->buf = malloc(BUF_CAP);
    }
    if (!f || !f->path || !f->tmp || !f->buf) {
        if (f) { free(f->path); free(f->tmp); free(f->buf); free(f); }
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory writing '%s'", op, path);
    }
    memcpy(f->path, path, n + 1);
    /* O_EXCL|O_NOFOLLOW: never write through a planted link, never share a
     * temporary. "<path>.tmp.<pid>" is taken (another thread of this
     * process saving the same path, or a stale file of an earlier process
     * with this pid): try "<path>.tmp.<pid>.<k>". Nothing is ever removed but
     * our own temporary. */
    for (int k = 0; k < 64; k++) {
        if (k == 0) snprintf(f->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
        else snprintf(f->tmp, n + 32, "%s.tmp.%ld.%d", path, (long)getpid(), k);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (f->fd >= 0 || errno != EEXIST) break;
    }
    if (f->fd < 0) {
        int err = errno;
        nd_status st = nd_fail(ND_ERR_IO, "%s: cannot write '%s' (temporary '%s'): %s", op, path,
                               f->tmp, strerror(err));
        f->fd = -1;
        destroy(f, false); /* not ours to remove */
        return st;
    }
    /* held until the temporary is closed: remove_stale in another PID
     * namespace, which cannot see this process, leaves a locked file alone */
    (void)flock(f->fd, LOCK_EX | LOCK_NB);
    /* keep the permissions of the file being replaced */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) (void)fchmod(f->fd, sb.st_mode & 07777);
    *out = f;
    return ND_OK;
}

/* The file size limit (ulimit -f, RLIMIT_FSIZE): a write that would take
 * the file past it raises SIGXFSZ, whose default action kills the process
 * (exit 153) and leaves the temporary behind. Checked before every write,
 * so the save fails with EFBIG ("File too large") instead, whatever the
 * signal's disposition, and the process's signal handling is left alone. */
static int within_fsize_limit(uint64_t end) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
    return end > (uint64_t)rl.rlim_cur ? EFBIG : 0;
}

static int write_all(nd_atomic_file *f, const char *p, size_t n) {
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        int err = within_fsize_limit(f->written + chunk);
        if (err) return err;
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        p += w;
        n -= (size_t)w;
        f->written += (uint64_t)w;
    }
    return 0;
}

static nd_status flush_buf(nd_atomic_file *f) {
    if (f->used == 0) return ND_OK;
    int err = write_all(f, f->buf, f->used);
    f->used = 0;
    return err ? fail_errno(f, err, "write") : ND_OK;
}

nd_status nd_atomic_write(nd_atomic_file *f, const void *data, size_t n) {
    if (n == 0) return ND_OK;
    if (f->used + n <= BUF_CAP) {
        memcpy(f->buf + f->used, data, n);
        f->used += n;
        return ND_OK;
    }
    ND_TRY(flush_buf(f));
    if (n <= BUF_CAP / 2) {
        memcpy(f->buf, data, n);
        f->used = n;
        return ND_OK;
    }
    int err = write_all(f, data, n);
    return err ? fail_errno(f, err, "write") : ND_OK;
}

/* fsync of the directory holding path: makes the rename itself durable.
 * Filesystems that cannot sync directories (EINVAL) are not an error. */
static int sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = strdup(".");
    else if (slash == path) dir = strdup("/");
    else {
        dir = malloc((size_t)(slash - path) + 1);
        if (dir) { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    }
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return errno == EACCES ? 0 : errno;
    int err = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return err == EINVAL || err == ENOTSUP || err == EBADF ? 0 : err;
}

nd_status nd_atomic_commit(nd_atomic_file *f) {
    ND_TRY(flush_buf(f));
    if (fsync(f->fd) != 0) return fail_errno(f, errno, "sync");
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) return fail_errno(f, errno, "close");
    if (rename(f->tmp, f->path) != 0) return fail_errno(f, errno, "replace");
    int err = sync_dir(f->path);
    nd_status st = ND_OK;
    if (err) /* the new file is in place; only its durability is in doubt */
        st = nd_fail(ND_ERR_IO, "%s: cannot sync the directory of '%s': %s", f->op, f->path,
                     strerror(err));
    destroy(f, false);
    return st;
}

nd_status nd_write_file_atomic(const char *op, const char *path, const void *data, size_t n) {
    nd_atomic_file *f;
    ND_TRY(nd_atomic_open(op, path, &f));
    /* large payloads skip the copy into the buffer */
    ND_TRY(nd_atomic_write(f, data, n));
    return nd_atomic_commit(f);
}
