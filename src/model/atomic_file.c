/* atomic_file.c — write "<path>.tmp", fsync, rename over path, fsync the directory:
 * readers see the old file or the new one, never a torn one, and a crash before the
 * rename leaves the old file as it was. Used by every checkpoint writer. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/checkpoint.h"
#include "atomic_file.h"

struct lk_atomic_file {
    int fd;
    lk_status failed;      /* sticky: a failed write fails the commit */
    char *path, *tmp;
};

static _Thread_local int fail_next_commit;

void lk_atomic_file_fail_next_commit(void) { fail_next_commit = 1; }

lk_status lk_atomic_file_begin(const char *path, lk_atomic_file **out) {
    if (!out) return lk_error(LK_EINVAL, "atomic write: out: expected a pointer, got NULL");
    *out = NULL;
    if (!path || !*path) return lk_error(LK_EINVAL, "atomic write: path: expected a file name, got none");
    size_t n = strlen(path);
    lk_atomic_file *f = calloc(1, sizeof *f);
    char *p = malloc(2 * n + 6);
    if (!f || !p) { free(f); free(p); return lk_error(LK_ENOMEM, "atomic write: %s: out of memory", path); }
    f->path = p;
    f->tmp = p + n + 1;
    memcpy(f->path, path, n + 1);
    memcpy(f->tmp, path, n);
    memcpy(f->tmp + n, ".tmp", 5);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        lk_status s = lk_error(LK_EIO, "atomic write: %s: cannot create %s: %s", path, f->tmp, strerror(errno));
        free(p);
        free(f);
        return s;
    }
    *out = f;
    return LK_OK;
}

lk_status lk_atomic_file_write(lk_atomic_file *f, const void *data, size_t n) {
    if (!f) return lk_error(LK_EINVAL, "atomic write: file: expected an open file, got NULL");
    if (f->failed) return f->failed;
    const char *p = data;
    while (n) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t k = write(f->fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            f->failed = lk_error(LK_EIO, "atomic write: %s: writing %s: %s", f->path, f->tmp,
                                 k < 0 ? strerror(errno) : "no progress");
            return f->failed;
        }
        p += k;
        n -= (size_t)k;
    }
    return LK_OK;
}

static void discard(lk_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    free(f->path);
    free(f);
}

/* The rename is durable only once the directory entry is on disk. */
static lk_status sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else if ((size_t)(slash - path) < sizeof dir) { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = '\0'; }
    else return lk_error(LK_EIO, "atomic write: %s: directory name too long", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return lk_error(LK_EIO, "atomic write: %s: cannot open directory %s: %s", path, dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL)   /* some filesystems cannot sync a directory: nothing to do */
        return lk_error(LK_EIO, "atomic write: %s: fsync of directory %s: %s", path, dir, strerror(err));
    return LK_OK;
}

lk_status lk_atomic_file_commit(lk_atomic_file *f) {
    if (!f) return lk_error(LK_EINVAL, "atomic write: file: expected an open file, got NULL");
    lk_status s = f->failed;
    if (!s && fsync(f->fd) != 0)
        s = lk_error(LK_EIO, "atomic write: %s: fsync of %s: %s", f->path, f->tmp, strerror(errno));
    if (!s) {
        int rc = close(f->fd);
        f->fd = -1;
        if (rc != 0) s = lk_error(LK_EIO, "atomic write: %s: closing %s: %s", f->path, f->tmp, strerror(errno));
    }
    if (!s && fail_next_commit) {
        fail_next_commit = 0;
        s = lk_error(LK_EIO, "atomic write: %s: simulated failure before the rename", f->path);
    }
    if (!s && rename(f->tmp, f->path) != 0)
        s = lk_error(LK_EIO, "atomic write: %s: renaming %s over it: %s", f->path, f->tmp, strerror(errno));
    if (s) { discard(f); return s; }
    s = sync_dir(f->path);
    free(f->path);
    free(f);
    return s;
}

void lk_atomic_file_abort(lk_atomic_file *f) {
    if (f) discard(f);
}

lk_status lk_write_file_atomic(const char *path, const void *data, size_t n) {
    lk_atomic_file *f;
    lk_status s = lk_atomic_file_begin(path, &f);
    if (s) return s;
    s = lk_atomic_file_write(f, data, n);
    if (s) { lk_atomic_file_abort(f); return s; }
    return lk_atomic_file_commit(f);
}
