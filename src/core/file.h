/*
 * file.h - save and load a buffer to and from a file, streaming (no second
 * full copy in memory).
 *
 *   save: sweep dir/.name.PID.XXXXXX of dead PIDs --> unnamed file in dir
 *         (O_TMPFILE; else mkstemp dir/.name.PID.XXXXXX)  --write header
 *         hole, stream body, write header, fsync--> linkat as
 *         dir/.name.PID.XXXXXX --> rename over dir/name --> fsync(dir)
 *
 * A crash at any moment leaves either the old file or the new one complete:
 * the new bytes only get the file's name once they are on disk. What else a
 * crash can leave (a named temp file) the next save of that name removes.
 * The new file gets the old one's permissions, or 0666 less the umask if
 * there was none.
 */
#ifndef EXR_FILE_H
#define EXR_FILE_H

#include "codec.h"

/* Saves b (lock held) to path atomically. On EXR_EIO, *err is errno. */
exr_status exr_file_save_locked(const exr_buffer *b, const void *meta, size_t meta_len, int level,
                                const char *path, exr_progress_fn progress, void *ctx, int *err);

/* Loads the buffer saved at path. EXR_ECORRUPT for invalid content, EXR_EIO
 * (with *err) if the file cannot be read. */
exr_status exr_file_load(const char *path, exr_buffer **out, unsigned char *meta,
                         size_t *meta_len, int *err);

#endif
