/*
 * log_merge.h - the k-way merge of experience logs (docs/log.md, "Merging").
 *
 *   caller (exreplay/log.py)          the merge (this file)
 *   ------------------------          ---------------------------------------
 *   reads and checks chunk headers,   decode jobs: read the body (pread),
 *   pushes them per input      ->       check its CRC, inflate into the
 *                                       input slot's buffer, check the records
 *   exr_merge_run (no GIL)     ->     the merge: the record with the smallest
 *                                       (timestamp, input index) next, its
 *                                       metadata and row copied straight into
 *                                       the output chunk's raw body
 *                                     compress jobs: deflate a full output
 *                                       chunk; written in order (writev)
 *
 * Jobs run on `threads` worker threads (0: on the caller's thread when it
 * needs them). Every buffer belongs to a slot that is reused: each input
 * has EXR_MERGE_LOOK chunk slots (its current chunk and the ones decoded
 * ahead), the output threads + 2 chunk slots. Memory is therefore a few
 * chunks per input, whatever the logs' sizes.
 *
 * Equal timestamps keep the order of the inputs (a lower input index
 * first) and, within an input, its order: the merge is stable.
 */
#ifndef EXR_LOG_MERGE_H
#define EXR_LOG_MERGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exr.h"

#define EXR_MERGE_LOOK 2 /* chunks queued per input: the current one, one ahead */
#define EXR_MERGE_MAX_THREADS 64
#define EXR_MERGE_MAX_RAW ((uint64_t)1 << 31) /* a chunk's raw body at most (docs/log.md) */

typedef struct exr_merge exr_merge;

/* A records chunk of an input, its header already checked by the caller
 * (magic, CRC, kind, codec, the length rules of docs/log.md, which
 * exr_merge_push checks again: EXR_EINVAL if broken): the body is
 * body_len bytes at offset body_off of fd. tag is reported with an error
 * in this chunk (the caller's offset of it). A record without a row
 * (EXR_LOG_NOSTEP, in a chunk of kind EXR_LOG_KIND_NOSTEP) is merged as
 * any other; an output chunk holding one is of that kind too. */
typedef struct {
    int fd;
    uint64_t body_off, tag;
    /* EXR_LOG_KIND_RECORDS, or EXR_LOG_KIND_NOSTEP: records without a row may come */
    uint32_t kind;
    uint32_t codec, count, source, body_crc;
    int64_t first, last;
    uint64_t raw_len, body_len;
} exr_merge_chunk;

/* What failed: EXR_ECORRUPT in the chunk of input `input` tagged `tag`
 * (what says how), EXR_EIO with errnum (reading input `input`, or writing
 * the output: `input` EXR_MERGE_OUTPUT), or EXR_ENOMEM. */
#define EXR_MERGE_OUTPUT SIZE_MAX
typedef struct {
    exr_status st;
    size_t input;
    uint64_t tag;
    int errnum;
    char what[128];
} exr_merge_error;

/* nin inputs with rows of `row` bytes (state_bytes of them the state),
 * output chunks of chunk_bytes raw bytes (one record at least) at zlib
 * level (0: stored), written to out_fd at its current offset. */
exr_status exr_merge_new(size_t nin, size_t row, size_t state_bytes, size_t chunk_bytes,
                         int level, int out_fd, int threads, exr_merge **out);

/* Queues a chunk of input i (EXR_EINVAL if it has EXR_MERGE_LOOK queued or
 * was ended, or count is 0). */
exr_status exr_merge_push(exr_merge *m, size_t i, const exr_merge_chunk *c);
/* Input i has no more chunks. */
void exr_merge_end(exr_merge *m, size_t i);

/* Merges until an input that was not ended has fewer than EXR_MERGE_LOOK
 * chunks queued (*need = its index) or everything is merged and written
 * (*need = -1). Not with the GIL: it blocks. On failure the merge is over
 * (every later call fails the same way); exr_merge_last_error says why. */
exr_status exr_merge_run(exr_merge *m, long *need);
const exr_merge_error *exr_merge_last_error(const exr_merge *m);

/* Records and chunks written and the last timestamp, so far. */
void exr_merge_result(const exr_merge *m, uint64_t *records, uint64_t *chunks,
                      int64_t *last_ts);

/* Adler-32 (RFC 1950) of n bytes continuing adler (1 to start): zlib's
 * adler32, faster where the CPU has SSSE3. */
uint32_t exr_adler32(uint32_t adler, const void *p, size_t n);

/* Stops the worker threads (each finishes the job it is on) and frees. */
void exr_merge_free(exr_merge *m);

#endif
