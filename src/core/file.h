/*
 * file.h - save and load a buffer to and from a file, streaming (no second
 * full copy in memory); the temp files that save and the log merge write.
 *
 *   save: follow path's symbolic links to the target (docs/format.md,
 *         "Writing") --> sweep tdir/.name.PID.XXXXXX of dead PIDs -->
 *         unnamed file in tdir (O_TMPFILE; else mkostemp
 *         tdir/.name.PID.XXXXXX) --write header hole, stream body, write
 *         header, fsync--> linkat as tdir/.name.PID.XXXXXX --> rename over
 *         tdir/name --> fsync(tdir), its failure the save's
 *   merge's output (docs/log.md, "Merging"): the same without following
 *         links, and a link (never over anything) in place of the rename
 *
 * A crash at any moment leaves either the old file or the new one complete:
 * the new bytes only get the file's name once they are on disk. What else a
 * crash can leave (a named temp file) the next save or merge of that name
 * removes. The new file gets the old one's permissions, or 0666 less the
 * umask if there was none.
 */
#ifndef EXR_FILE_H
#define EXR_FILE_H

#include <stdbool.h>

#include "codec.h"

/* Links followed by save, as open() follows them (ELOOP past them). */
#define EXR_FILE_MAX_LINKS 40

/* A file written in its target's directory and given the target's name
 * only once complete: save's (replace: over what is there, through its
 * symbolic links) and a merged log's (a new file: nothing may be at the
 * path, a symbolic link included). On EXR_EIO, *err is errno. */
typedef struct {
    int fd;          /* write the file's bytes here */
    bool replace;    /* save's; else a new file */
    int named;       /* tmp is the file's name on disk (no O_TMPFILE, or being renamed) */
    char *target;    /* the path it gets (save: with the path's links followed) */
    char *dir, *tmp; /* target's directory; dir/.NAME.PID.XXXXXX */
} exr_tmpfile;

/* Sweeps the target's dead temp files (file.c) and opens a new one, an
 * unnamed file where the file system allows. Without replace, EEXIST if
 * something is at path. On failure nothing is left and t holds nothing. */
exr_status exr_tmpfile_open(exr_tmpfile *t, const char *path, bool replace, int *err);
/* fsync, then the target's name (a rename over it; a new file's a link,
 * EEXIST if something got there meanwhile), then fsync of the directory.
 * On failure the temp file is removed, and so is a new file's name if it
 * was given; a file that replaced another stays replaced (only the
 * directory's fsync can fail after the rename). Releases t either way. */
exr_status exr_tmpfile_publish(exr_tmpfile *t, int *err);
/* Closes and removes the temp file; releases t. */
void exr_tmpfile_discard(exr_tmpfile *t);

/* Test hooks: whether temp files may be unnamed (O_TMPFILE; the default),
 * and an errno that every directory fsync fails with (0: none, the
 * default). Each returns the setting before. */
int exr_file_set_unnamed(int on);
int exr_file_set_sync_dir_errno(int errnum);

/* Saves b (lock held) to path atomically. On EXR_EIO, *err is errno. */
exr_status exr_file_save_locked(const exr_buffer *b, const void *meta, size_t meta_len, int level,
                                const char *path, exr_progress_fn progress, void *ctx, int *err);

/* Loads the buffer saved at path. EXR_ECORRUPT for invalid content, EXR_EIO
 * (with *err) if the file cannot be read. */
exr_status exr_file_load(const char *path, exr_buffer **out, unsigned char *meta,
                         size_t *meta_len, int *err);

#endif
