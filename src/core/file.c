#define _GNU_SOURCE /* O_TMPFILE, linkat */
#include "file.h"

#include <dirent.h>
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

/* An unnamed file in dir (O_TMPFILE): a crash leaves nothing behind. -1 if
 * the file system (or the kernel) has no O_TMPFILE, or /proc is missing
 * (linkat needs /proc/self/fd to give it a name). */
static int open_unnamed(const char *dir)
{
#ifdef O_TMPFILE
    if (access("/proc/self/fd", X_OK) != 0)
        return -1;
    return open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
#else
    (void)dir;
    return -1;
#endif
}

/* Gives the unnamed file fd the name tmp (a fresh .name.PID.XXXXXX). */
static int link_unnamed(int fd, char *tmp)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    for (int tries = 0; tries < 100; tries++) {
        random_suffix(tmp);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

/* The whole file into fd: mode, header room, payload, header, fsync. The
 * file is made 0600: it gets what replacing the old file at path (or
 * creating a new one) should. */
static exr_status write_file(int fd, const exr_buffer *b, const void *meta, size_t meta_len,
                             int level, const char *path, exr_progress_fn progress, void *ctx,
                             int *err)
{
    fsink s = {fd, 0};
    unsigned char header[EXR_HEADER_BYTES] = {0};
    struct stat old;
    mode_t mode = stat(path, &old) == 0 ? (old.st_mode & 07777) : default_mode();
    if (fchmod(fd, mode) != 0) {
        *err = errno;
        return EXR_EIO;
    }
    exr_status st = write_all(fd, header, sizeof header, err);
    if (st == EXR_OK) {
        st = exr_codec_write_locked(b, meta, meta_len, level, sink_file, &s, progress, ctx,
                                    header);
        if (st == EXR_EIO)
            *err = s.err;
    }
    if (st == EXR_OK && (pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header ||
                         fsync(fd) != 0)) {
        *err = errno;
        st = EXR_EIO;
    }
    return st;
}

/* The rename of a file in dir must reach the disk too. */
static void sync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* An unnamed file gets its temp name only once complete and on disk; then
 * it is closed and renamed over path. */
static exr_status publish_file(int fd, int *named, char *tmp, const char *path, exr_status st,
                               int *err)
{
    if (st == EXR_OK && !*named) {
        if (link_unnamed(fd, tmp) == 0) {
            *named = 1;
        } else {
            *err = errno;
            st = EXR_EIO;
        }
    }
    if (close(fd) != 0 && st == EXR_OK) {
        *err = errno;
        st = EXR_EIO;
    }
    if (st == EXR_OK && rename(tmp, path) != 0) {
        *err = errno;
        st = EXR_EIO;
    }
    return st;
}

exr_status exr_file_save_locked(const exr_buffer *b, const void *meta, size_t meta_len, int level,
                                const char *path, exr_progress_fn progress, void *ctx, int *err)
{
    char *tmp, *dir;
    const char *base;
    *err = 0;
    if (split_path(path, &dir, &base) < 0)
        return EXR_ENOMEM;
    if (!(tmp = temp_name(dir, base))) {
        free(dir);
        return EXR_ENOMEM;
    }
    sweep_stale(dir, base);
    int fd = open_unnamed(dir), named = 0;
    if (fd < 0) {
        fd = mkstemp(tmp);
        named = 1;
    }
    if (fd < 0) {
        *err = errno;
        free(tmp);
        free(dir);
        return EXR_EIO;
    }
    exr_status st = write_file(fd, b, meta, meta_len, level, path, progress, ctx, err);
    st = publish_file(fd, &named, tmp, path, st, err);
    if (st != EXR_OK && named)
        unlink(tmp);
    else if (st == EXR_OK)
        sync_dir(dir);
    free(tmp);
    free(dir);
    return st;
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
