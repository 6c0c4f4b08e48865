/*
 * log.h - the experience log writer: an append-only, chunked file of every
 * step recorded (docs/log.md has the format byte by byte).
 *
 *   caller (record / append)          writer thread (one per log)
 *   ------------------------          ---------------------------
 *   open chunk += step (metadata,     sealed chunk -> raw body (copies rows,
 *   a pointer to the row)               unpins the buffer) -> zlib -> write()
 *   chunk >= chunk_bytes: seal it  ->  queue  -> written_seq, backlog -= bytes
 *
 * A step recorded into a buffer is not copied on the caller's thread: the
 * log keeps a pointer to the row in the buffer's own storage and pins that
 * storage (as get_batch does) until the writer thread has copied the rows of
 * the chunk. A step appended without a buffer is copied into the chunk.
 *
 * Back-pressure: the backlog is the raw bytes of every step not yet written.
 * exr_log_throttle waits while it is at least max_backlog; the binding calls
 * it before taking the buffer's lock, so memory stays bounded by
 * max_backlog plus one call's steps per recording thread, and no one waits
 * with the lock held.
 *
 * Locks: buffer mu -> log mu (the hook runs under the buffer's lock and
 * takes the log's). The writer thread takes the buffer's lock (to unpin)
 * only while it holds no log lock.
 */
#ifndef EXR_LOG_H
#define EXR_LOG_H

#include <stdbool.h>

#include "buffer.h"
#include "exr.h"

typedef struct exr_log exr_log;

/* Flags of a step (one byte a record in the file). */
#define EXR_LOG_END 1u        /* the step ends its episode */
#define EXR_LOG_TERMINATED 2u /* ... and its next state is terminal */
#define EXR_LOG_FINAL 4u      /* ... and a final state is stored for it */
/* The record is no step: it ends its episode (EXR_LOG_END) after `pos`
 * steps, without a step of its own (exr_buffer_end_episode_locked), and the
 * file holds no row for it. A chunk holding one has kind
 * EXR_LOG_KIND_NOSTEP, which readers without this record refuse by kind. */
#define EXR_LOG_NOSTEP 8u

/* Chunk kinds (docs/log.md, "Chunk"). */
#define EXR_LOG_KIND_RECORDS 1u
#define EXR_LOG_KIND_END 2u
#define EXR_LOG_KIND_NOSTEP 3u /* records, some of them EXR_LOG_NOSTEP */

#define EXR_LOG_MAX_SCHEMA 4096
#define EXR_LOG_MAX_CHUNK ((size_t)1 << 30) /* raw bytes of one chunk */
/* Dimensions of a shape in a log's schema: what its readers take (a chunk's
 * column of n items has one more, within NumPy 1.x's 32). */
#define EXR_LOG_MAX_DIMS 30
#define EXR_LOG_META_BYTES 29 /* a record's metadata: ts, handle, pos (8 each), source 4, flags 1 */

/* Whether a record layout of state, action, reward and extra bytes fits a
 * log: one step with its final state and its metadata within
 * EXR_LOG_MAX_CHUNK, so that no chunk's raw body ever passes it (a step
 * that would take the open chunk past it goes to a new chunk). */
bool exr_log_row_fits(size_t state_bytes, size_t action_bytes, size_t reward_bytes,
                      size_t extra_bytes);

typedef struct {
    uint32_t source;       /* the writer's source id (an actor's index) */
    int level;             /* zlib level 0..9; 0 = stored, not compressed */
    size_t chunk_bytes;    /* a chunk is sealed once its raw body reaches this */
    uint64_t flush_ns;     /* a chunk older than this is sealed and written (0: never) */
    bool fsync;            /* exr_log_flush also fsyncs */
    size_t max_backlog;    /* exr_log_throttle waits while this much is unwritten */
} exr_log_opts;

typedef struct {
    uint64_t records, chunks, file_bytes, raw_bytes; /* written so far (records: steps) */
    uint64_t ends;           /* ends without a step written (EXR_LOG_NOSTEP records) */
    uint64_t backlog;        /* raw bytes recorded, not yet written */
    uint64_t throttled, throttle_ns; /* waits in exr_log_throttle and their time */
    uint64_t dropped;        /* steps lost to out-of-memory in the buffer hook */
    uint64_t writer_ns;      /* the writer thread's time building, compressing, writing chunks */
    int error;               /* errno of the first failed write, or 0 */
} exr_log_stats;

/* Creates path (EXR_EIO with errno if it exists and !overwrite) and starts
 * the writer thread. Nothing is written before exr_log_set_schema. */
exr_status exr_log_open(const char *path, const exr_log_opts *o, bool overwrite, exr_log **out);

/* Whether exr_log_open created the file (false: overwrite truncated one,
 * which may be a symlink's target, a device or a FIFO with a reader). */
bool exr_log_created(const exr_log *lg);

/* Fixes the record layout and writes the file header (once). schema is the
 * binding's description of the fields (docs/log.md), at most
 * EXR_LOG_MAX_SCHEMA bytes. A record's row is state|action|reward|extras,
 * extra_bytes being 0 without per-step extras (then the header is version
 * 1, else 2). A second call with the same layout and schema is a no-op; a
 * different one, or one that !exr_log_row_fits, is EXR_EINVAL. */
exr_status exr_log_set_schema(exr_log *lg, const void *schema, size_t len, size_t state_bytes,
                              size_t action_bytes, size_t reward_bytes, size_t extra_bytes);
bool exr_log_has_schema(exr_log *lg);
/* Whether its rows carry per-step extras (then only its buffer's hook logs
 * steps: exr_log_append and exr_log_append_many are EXR_EINVAL). */
bool exr_log_has_extras(exr_log *lg);

/* One step, copied. fin is the final state (with EXR_LOG_FINAL) or NULL. */
exr_status exr_log_append(exr_log *lg, int64_t h, uint64_t pos, const void *state,
                          const void *action, const void *reward, const void *fin,
                          unsigned flags);

/* T steps at positions pos, pos + 1, ... (rows of states/actions/rewards
 * one after another), copied; flags and fin belong to the last step. All
 * or nothing: on failure (EXR_ENOMEM) the log is as it was before the call. */
exr_status exr_log_append_many(exr_log *lg, int64_t h, uint64_t pos, const void *states,
                               const void *actions, const void *rewards, size_t T, const void *fin,
                               unsigned flags);

/* The end of episode h after its pos >= 1 steps, without a step: one record
 * without a row (EXR_LOG_NOSTEP), as the buffer's hook logs an end made by
 * exr_buffer_end_episode_locked, byte for byte. fin (copied) is its final
 * state or NULL; fin or terminated is needed (EXR_EINVAL otherwise, and on
 * a closed log or one without a schema). A log with extras takes it too:
 * the record has no row. */
exr_status exr_log_end(exr_log *lg, int64_t h, uint64_t pos, const void *fin, bool terminated);

/* Waits (without any buffer lock held) while the backlog is >= max_backlog. */
void exr_log_throttle(exr_log *lg);

/* Returns once every step appended or recorded before it is in the file
 * (and on disk, with opts.fsync or sync). EXR_EIO if a write failed. */
exr_status exr_log_flush(exr_log *lg, bool sync);

/* Flushes, writes the end marker, stops the writer and closes the file.
 * Further appends are EXR_EINVAL. Once: a second close (at once in another
 * thread too) waits for the first and returns EXR_OK. A write error of the
 * writer, even of steps that came during the close, is returned and keeps
 * the end marker out. */
exr_status exr_log_close(exr_log *lg);
bool exr_log_closed(exr_log *lg);
/* Whether this process was made by fork after the log opened: then the log
 * is the parent's and closed here (its file descriptor points at /dev/null,
 * nothing is written, close and free only let go of its memory; docs/log.md,
 * "Logs and fork"). */
bool exr_log_forked(const exr_log *lg);

/* Closes (if needed) and frees. The log must not be attached. */
void exr_log_free(exr_log *lg);

/* With b locked: every step b records from now on is logged. At most one
 * buffer at a time (EXR_EINVAL); the schema must be set. */
exr_status exr_log_attach_locked(exr_log *lg, exr_buffer *b);
/* Takes b's lock itself: stops logging b's steps (b's hook, if it is this
 * log's), then waits until the writer holds no pointer into b (b may be
 * freed afterwards), whether or not this call was the one that detached. */
void exr_log_detach(exr_log *lg, exr_buffer *b);
/* Announces a detach, before the binding lets go of the GIL for
 * exr_log_detach (which ends it): a close meanwhile waits for it, and never
 * detaches the buffer itself. */
void exr_log_detach_begin(exr_log *lg);
exr_buffer *exr_log_attached(exr_log *lg);

/* The 56-byte header and 16-byte trailer of a chunk (docs/log.md), for
 * writers of the format other than exr_log (the merge, log_merge.h). */
#define EXR_LOG_CHUNK_HEADER 56
#define EXR_LOG_CHUNK_TRAILER 16
void exr_log_chunk_header(unsigned char *hd, unsigned kind, unsigned codec, uint32_t count,
                          uint32_t source, int64_t first, int64_t last, uint64_t raw,
                          uint64_t body, uint32_t body_crc);
void exr_log_chunk_trailer(unsigned char *tr, uint64_t total, const unsigned char *hd);
/* Writes all n iovecs (retrying short writes and EINTR); EXR_EIO on error,
 * with errno set. The iovecs are consumed. */
struct iovec;
exr_status exr_log_write_all(int fd, struct iovec *iov, int n);

void exr_log_get_stats(exr_log *lg, exr_log_stats *st);
const exr_log_opts *exr_log_options(const exr_log *lg);

#endif
