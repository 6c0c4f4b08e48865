#define _POSIX_C_SOURCE 200809L
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* "dir/name" -> "dir/.name.XXXXXX" and "dir" (or "."). */
static int temp_names(const char *path, char **tmp, char **dir)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    *tmp = malloc(strlen(path) + 16);
    *dir = malloc(dlen + 2);
    if (!*tmp || !*dir) {
        free(*tmp);
        free(*dir);
        return -1;
    }
    if (slash) {
        memcpy(*dir, path, dlen ? dlen : 1);
        (*dir)[dlen ? dlen : 1] = 0;
        sprintf(*tmp, "%.*s/.%s.XXXXXX", (int)dlen, path, base);
    } else {
        strcpy(*dir, ".");
        sprintf(*tmp, ".%s.XXXXXX", base);
    }
    return 0;
}

exr_status exr_file_save_locked(const exr_buffer *b, const void *meta, size_t meta_len, int level,
                                const char *path, exr_progress_fn progress, void *ctx, int *err)
{
    char *tmp, *dir;
    *err = 0;
    if (temp_names(path, &tmp, &dir) < 0)
        return EXR_ENOMEM;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        *err = errno;
        free(tmp);
        free(dir);
        return EXR_EIO;
    }
    fsink s = {fd, 0};
    unsigned char header[EXR_HEADER_BYTES] = {0};
    /* mkstemp makes the file 0600: give it what replacing the old file (or
     * creating a new one) should */
    struct stat old;
    mode_t mode = stat(path, &old) == 0 ? (old.st_mode & 07777) : default_mode();
    exr_status st = fchmod(fd, mode) == 0 ? EXR_OK : EXR_EIO;
    if (st != EXR_OK)
        *err = errno;
    if (st == EXR_OK)
        st = write_all(fd, header, sizeof header, err);
    if (st == EXR_OK) {
        st = exr_codec_write_locked(b, meta, meta_len, level, sink_file, &s, progress, ctx,
                                    header);
        if (st == EXR_EIO)
            *err = s.err;
    }
    if (st == EXR_OK && pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header) {
        *err = errno;
        st = EXR_EIO;
    }
    if (st == EXR_OK && fsync(fd) != 0) {
        *err = errno;
        st = EXR_EIO;
    }
    if (close(fd) != 0 && st == EXR_OK) {
        *err = errno;
        st = EXR_EIO;
    }
    if (st == EXR_OK && rename(tmp, path) != 0) {
        *err = errno;
        st = EXR_EIO;
    }
    if (st != EXR_OK) {
        unlink(tmp);
    } else {
        /* the rename itself must reach the disk */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
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
    int fd = open(path, O_RDONLY);
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
            size_t got;
            st = source_file(&s, header + have, sizeof header - have, &got);
            if (st == EXR_OK && !got)
                st = EXR_ECORRUPT;
            have += got;
        }
        uint64_t body;
        if (st == EXR_OK)
            st = exr_codec_check_header(header, (uint64_t)sb.st_size, &body);
        if (st == EXR_OK)
            st = exr_codec_read(header, source_file, &s, out, meta, meta_len);
        if (st == EXR_EIO)
            *err = s.err;
    }
    close(fd);
    return st;
}
