#define _GNU_SOURCE /* O_TMPFILE, linkat */
#include "file.h"

#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    int err;
} fsink;

static exr_status write_all(int fd, const void *p, size_t n, int *err)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            *err = errno;
            return EXR_EIO;
        }
        c += w;
        n -= (size_t)w;
    }
    return EXR_OK;
}

static exr_status sink_file(void *ctx, const void *p, size_t n)
{
    fsink *s = ctx;
    return write_all(s->fd, p, n, &s->err);
}

/* The mode a newly created file would get: 0666 less the umask, read without
 * changing it (umask() would race with other threads). */
static mode_t default_mode(void)
{
    mode_t mask = 022;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[128];
        unsigned m;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "Umask: %o", &m) == 1) {
                mask = (mode_t)m;
                break;
            }
        fclose(f);
    }
    return 0666 & ~mask;
}

/* Temp files: "dir/.NAME.PID.XXXXXX" (NAME cut to TMP_BASE_MAX bytes), in
 * the target's directory so that the rename is atomic. The writer's pid in
 * the name lets a later save tell the temp file of a crashed writer (pid
 * gone) from that of a save still running, in this process or another. */
#define TMP_SUFFIX_MAX 40 /* ".%ld." + "XXXXXX" + NUL, with room */
/* At most this much of the name goes into the temp file's: with the dot,
 * the pid (at most 9 digits) and the suffix it stays within NAME_MAX (255),
 * so that a name of up to 255 bytes gets a temp file too. */
#define TMP_BASE_MAX 236

/* How much of base a temp name takes: all of it, or a prefix cut before a
 * UTF-8 continuation byte. */
static size_t temp_base_len(const char *base)
{
    size_t n = strlen(base);
    if (n <= TMP_BASE_MAX)
        return n;
    n = TMP_BASE_MAX;
    while (n > 0 && ((unsigned char)base[n] & 0xC0) == 0x80)
        n--;
    return n;
}

/* "dir/name" -> "dir" (or ".") and the base name. */
static int split_path(const char *path, char **dir, const char **base)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    *base = slash ? slash + 1 : path;
    *dir = malloc(dlen + 2);
    if (!*dir)
        return -1;
    if (slash) {
        memcpy(*dir, path, dlen ? dlen : 1);
        (*dir)[dlen ? dlen : 1] = 0;
    } else {
        strcpy(*dir, ".");
    }
    return 0;
}

/* "dir/.name.PID.XXXXXX" (the X's for mkstemp or random_suffix to fill). */
static char *temp_name(const char *dir, const char *base)
{
    size_t n = strlen(dir) + strlen(base) + TMP_SUFFIX_MAX;
    char *tmp = malloc(n);
    if (tmp)
        snprintf(tmp, n, "%s/.%.*s.%ld.XXXXXX", dir, (int)temp_base_len(base), base,
                 (long)getpid());
    return tmp;
}

static void random_suffix(char *tmp)
{
    static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    static unsigned long long ctr;
    unsigned long long x = (unsigned long long)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^
                           __atomic_add_fetch(&ctr, 0x632BE59BD9B4E019ULL, __ATOMIC_RELAXED);
    char *p = tmp + strlen(tmp) - 6;
    for (int i = 0; i < 6; i++, x /= 62)
        p[i] = chars[x % 62];
}

/* Unlinks dir/.base.PID.XXXXXX files whose PID is no running process: temp
 * files of saves that were killed before they could clean up. Only regular
 * files of this user with exactly that name pattern are touched; a pid that
 * has been reused by a live process keeps its file until that one ends too. */
static void sweep_stale(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t blen = temp_base_len(base);
    int dfd = dirfd(d);
    struct dirent *ent;
    while ((ent = readdir(d))) {
        const char *n = ent->d_name;
        if (n[0] != '.' || strncmp(n + 1, base, blen) != 0 || n[1 + blen] != '.')
            continue;
        const char *p = n + 2 + blen, *q = p;
        long pid = 0;
        while (*q >= '0' && *q <= '9' && pid < 100000000)
            pid = pid * 10 + (*q++ - '0');
        if (q == p || pid <= 0 || *q != '.' || strlen(q + 1) != 6)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* running (or not ours to ask about): leave it */
        struct stat st;
        if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid())
            unlinkat(dfd, n, 0);
    }
    closedir(d);
}

/* Test hooks (exr_file_set_unnamed, exr_file_set_sync_dir_errno). */
static _Atomic int unnamed_off, sync_dir_errno;

int exr_file_set_unnamed(int on)
{
    return !atomic_exchange(&unnamed_off, !on);
}

int exr_file_set_sync_dir_errno(int errnum)
{
    return atomic_exchange(&sync_dir_errno, errnum);
}

/* An unnamed file in dir (O_TMPFILE): a crash leaves nothing behind. -1 if
 * the file system (or the kernel) has no O_TMPFILE, or /proc is missing
 * (linkat needs /proc/self/fd to give it a name). */
static int open_unnamed(const char *dir)
{
#ifdef O_TMPFILE
    if (atomic_load(&unnamed_off) || access("/proc/self/fd", X_OK) != 0)
        return -1;
    return open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
#else
    (void)dir;
    return -1;
#endif
}

/* Gives the unnamed file fd the name tmp (a fresh .name.PID.XXXXXX), or,
 * with path, the name path (EEXIST if something has it). */
static int link_unnamed(int fd, char *tmp, const char *path)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (path)
        return linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
    for (int tries = 0; tries < 100; tries++) {
        random_suffix(tmp);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

/* EXR_EIO with *err = e. */
static exr_status io_error(int *err, int e)
{
    *err = e;
    return EXR_EIO;
}

/* A copy of s (NULL if out of memory). */
static char *copy_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    return c ? memcpy(c, s, n) : NULL;
}

/* The target of the symbolic link at path (st its lstat), a relative one
 * taken from the link's directory. */
static exr_status read_link(const char *path, const struct stat *st, char **out, int *err)
{
    size_t cap = st->st_size > 0 && st->st_size < PATH_MAX ? (size_t)st->st_size + 1 : PATH_MAX;
    char *to = malloc(cap);
    if (!to)
        return EXR_ENOMEM;
    ssize_t n = readlink(path, to, cap);
    if (n < 0 || (size_t)n >= cap) {
        int e = n < 0 ? errno : ENAMETOOLONG;
        free(to);
        return io_error(err, e);
    }
    to[n] = 0;
    if (to[0] == '/') {
        *out = to;
        return EXR_OK;
    }
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0; /* "dir/" */
    if ((*out = malloc(dlen + (size_t)n + 1))) {
        memcpy(*out, path, dlen);
        memcpy(*out + dlen, to, (size_t)n + 1);
    }
    free(to);
    return *out ? EXR_OK : EXR_ENOMEM;
}

/* What path names once its symbolic links are followed, as open() follows
 * them (at most EXR_FILE_MAX_LINKS, else ELOOP): the file a link leads to,
 * or the path a dangling link names, which is then created. Only the last
 * component is resolved here; the kernel resolves the directories' links. */
static exr_status resolve_links(const char *path, char **out, int *err)
{
    char *cur = copy_str(path);
    for (int hops = 0; cur; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) {
            *out = cur; /* not a link, or nothing there (yet) */
            return EXR_OK;
        }
        char *next = NULL;
        exr_status s =
            hops == EXR_FILE_MAX_LINKS ? io_error(err, ELOOP) : read_link(cur, &st, &next, err);
        free(cur);
        if (s != EXR_OK)
            return s;
        cur = next;
    }
    return EXR_ENOMEM;
}

static void tmpfile_release(exr_tmpfile *t)
{
    if (t->fd >= 0)
        close(t->fd);
    if (t->named)
        unlink(t->tmp);
    free(t->tmp);
    free(t->dir);
    free(t->target);
    *t = (exr_tmpfile){.fd = -1};
}

/* The file itself: sweep, create (unnamed, else named), permission bits. */
static exr_status tmpfile_create(exr_tmpfile *t, const char *base, int *err)
{
    struct stat old;
    if (!t->replace && lstat(t->target, &old) == 0)
        return io_error(err, EEXIST);
    sweep_stale(t->dir, base);
    if ((t->fd = open_unnamed(t->dir)) < 0)
        t->named = (t->fd = mkostemp(t->tmp, O_CLOEXEC)) >= 0;
    if (t->fd < 0)
        return io_error(err, errno);
    mode_t mode = stat(t->target, &old) == 0 ? (old.st_mode & 07777) : default_mode();
    return fchmod(t->fd, mode) == 0 ? EXR_OK : io_error(err, errno);
}

exr_status exr_tmpfile_open(exr_tmpfile *t, const char *path, bool replace, int *err)
{
    *t = (exr_tmpfile){.fd = -1, .replace = replace};
    *err = 0;
    const char *base;
    exr_status st = EXR_OK;
    if (replace)
        st = resolve_links(path, &t->target, err);
    else if (!(t->target = copy_str(path)))
        st = EXR_ENOMEM;
    if (st == EXR_OK && split_path(t->target, &t->dir, &base) < 0)
        st = EXR_ENOMEM;
    if (st == EXR_OK && !(t->tmp = temp_name(t->dir, base)))
        st = EXR_ENOMEM;
    if (st == EXR_OK)
        st = tmpfile_create(t, base, err);
    if (st != EXR_OK)
        tmpfile_release(t);
    return st;
}

void exr_tmpfile_discard(exr_tmpfile *t)
{
    tmpfile_release(t);
}

/* The directory's entry for the file must reach the disk too. Not a
 * failure: a directory this user may not open for reading (EACCES), or a
 * file system that cannot fsync one (EINVAL, EBADF): nothing more can be
 * done there. */
static exr_status sync_dir(const char *dir, int *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == EACCES ? EXR_OK : io_error(err, errno);
    int fail = atomic_load(&sync_dir_errno);
    int r = fail ? (errno = fail, -1) : fsync(dfd);
    int e = errno;
    close(dfd);
    return r == 0 || e == EINVAL || e == EBADF ? EXR_OK : io_error(err, e);
}

/* A new file's name: linked at the target, never over something there
 * (EEXIST). A named temp file on a file system without hard links is
 * renamed instead, if nothing is at the target by then. */
static exr_status publish_new(exr_tmpfile *t, int *err)
{
    if (!t->named)
        return link_unnamed(t->fd, NULL, t->target) == 0 ? EXR_OK : io_error(err, errno);
    if (link(t->tmp, t->target) == 0)
        return EXR_OK; /* the temp name goes in tmpfile_release */
    struct stat st;
    if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS)
        return io_error(err, errno);
    if (lstat(t->target, &st) == 0)
        return io_error(err, EEXIST);
    if (rename(t->tmp, t->target) != 0)
        return io_error(err, errno);
    t->named = 0;
    return EXR_OK;
}

/* Over the target: an unnamed file gets its temp name only now that it is
 * complete and on disk (the rename follows the close). */
static exr_status name_temp(exr_tmpfile *t, int *err)
{
    if (!t->named) {
        if (link_unnamed(t->fd, t->tmp, NULL) != 0)
            return io_error(err, errno);
        t->named = 1;
    }
    return EXR_OK;
}

exr_status exr_tmpfile_publish(exr_tmpfile *t, int *err)
{
    *err = 0;
    exr_status st = fsync(t->fd) == 0 ? EXR_OK : io_error(err, errno);
    if (st == EXR_OK)
        st = t->replace ? name_temp(t, err) : publish_new(t, err);
    bool placed = st == EXR_OK && !t->replace; /* a new file has its name */
    int fd = t->fd;
    t->fd = -1;
    if (close(fd) != 0 && st == EXR_OK)
        st = io_error(err, errno);
    if (st == EXR_OK && t->replace) {
        if (rename(t->tmp, t->target) != 0)
            st = io_error(err, errno);
        else
            t->named = 0;
    }
    if (st == EXR_OK)
        st = sync_dir(t->dir, err);
    if (st != EXR_OK && placed)
        unlink(t->target); /* a new file is there only if all went well */
    tmpfile_release(t);
    return st;
}

exr_status exr_file_save_locked(const exr_buffer *b, const void *meta, size_t meta_len, int level,
                                const char *path, exr_progress_fn progress, void *ctx, int *err)
{
    exr_tmpfile t;
    exr_status st = exr_tmpfile_open(&t, path, true, err);
    if (st != EXR_OK)
        return st;
    fsink s = {t.fd, 0};
    unsigned char header[EXR_HEADER_BYTES] = {0};
    st = write_all(t.fd, header, sizeof header, err);
    if (st == EXR_OK) {
        st = exr_codec_write_locked(b, meta, meta_len, level, sink_file, &s, progress, ctx, header);
        if (st == EXR_EIO)
            *err = s.err;
    }
    if (st == EXR_OK && pwrite(t.fd, header, sizeof header, 0) != (ssize_t)sizeof header)
        st = io_error(err, errno);
    if (st != EXR_OK) {
        exr_tmpfile_discard(&t);
        return st;
    }
    return exr_tmpfile_publish(&t, err);
}

typedef struct {
    int fd;
    int err;
} fsource;

static exr_status source_file(void *ctx, void *p, size_t cap, size_t *got)
{
    fsource *s = ctx;
    for (;;) {
        ssize_t r = read(s->fd, p, cap);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            s->err = errno;
            return EXR_EIO;
        }
        *got = (size_t)r;
        return EXR_OK;
    }
}

exr_status exr_file_load(const char *path, exr_buffer **out, unsigned char *meta,
                         size_t *meta_len, int *err)
{
    *err = 0;
    /* O_NONBLOCK: a FIFO at path is refused below, not waited on for a
     * writer for ever (a regular file's reads ignore the flag) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *err = errno;
        return EXR_EIO;
    }
    struct stat sb;
    unsigned char header[EXR_HEADER_BYTES];
    fsource s = {fd, 0};
    exr_status st = EXR_OK;
    if (fstat(fd, &sb) != 0) {
        *err = errno;
        st = EXR_EIO;
    } else if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < EXR_HEADER_BYTES) {
        st = EXR_ECORRUPT;
    } else {
        size_t have = 0;
        while (st == EXR_OK && have < sizeof header) {
            size_t got = 0; /* source_file leaves it alone on an error */
            st = source_file(&s, header + have, sizeof header - have, &got);
            if (st == EXR_OK && !got)
                st = EXR_ECORRUPT;
            have += got;
        }
        exr_codec_header h;
        if (st == EXR_OK)
            st = exr_codec_check_header(header, (uint64_t)sb.st_size, &h);
        if (st == EXR_OK)
            st = exr_codec_read(&h, source_file, &s, out, meta, meta_len);
        if (st == EXR_EIO)
            *err = s.err;
    }
    close(fd);
    return st;
}
