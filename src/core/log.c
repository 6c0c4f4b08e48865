/*
 * log.c - the experience log writer (log.h; the format is docs/log.md).
 */
#define _GNU_SOURCE
#include "log.h"
#include "le.h"
#include "zheap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "buffer_impl.h"

#define FILE_MAGIC "EXRPLOG\n"
#define FILE_VERSION 1u
#define CHUNK_MAGIC 0x4b435258u   /* "XRCK" little-endian */
#define TRAILER_MAGIC 0x4e455258u /* "XREN" */
#define CHUNK_HEADER 56
#define CHUNK_TRAILER 16
#define KIND_RECORDS EXR_LOG_KIND_RECORDS
#define KIND_END EXR_LOG_KIND_END
#define KIND_NOSTEP EXR_LOG_KIND_NOSTEP
#define CODEC_STORED 0u
#define CODEC_ZLIB 1u
#define META_BYTES EXR_LOG_META_BYTES
#define ARENA_BLOCK ((size_t)1 << 20)

typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    unsigned char data[];
} arena_blk;

typedef struct chunk {
    struct chunk *next;
    size_t n, cap;
    int64_t *ts, *h, *pos;
    uint8_t *fl;
    const unsigned char **rows; /* NULL for a record without a row (EXR_LOG_NOSTEP) */
    const unsigned char **fins;
    size_t nfin, fincap;
    size_t nostep;      /* records without a row: the chunk is of kind KIND_NOSTEP */
    arena_blk *arena;
    size_t raw;         /* raw body bytes so far */
    exr_buffer *pinned; /* the buffer whose storage rows point into, or NULL */
    exr_reader reader;
    uint64_t seq;
    uint64_t born_ns;   /* monotonic time of the first step */
} chunk;

struct exr_log {
    pthread_mutex_t mu;
    pthread_cond_t wake;  /* to the writer: work, flush or stop */
    pthread_cond_t done;  /* from the writer: a chunk written, backlog shrank */
    pthread_t thread;
    bool thread_started, stop, closed, has_schema;
    bool created; /* exr_log_open made the file (it did not truncate one) */
    bool closing, close_done; /* a close under way / finished (later closes wait for it) */
    unsigned detaching;       /* detaches announced (exr_log_detach_begin) and not done */
    unsigned syncing;         /* flushes in fsync (without mu): close keeps fd open until 0 */
    int fd;
    exr_log_opts o;
    size_t sb, ab, rb, xb, row; /* row = sb + ab + rb + xb (xb: extras) */
    chunk *open;
    chunk *qhead, *qtail;
    uint64_t sealed_seq, written_seq;
    int64_t last_ts;
    int64_t call_ts; /* the clock read at the current record call's first step */
    exr_buffer *buf;
    exr_log_stats st;
    /* writer-thread scratch */
    unsigned char *raw, *zbuf;
    size_t raw_cap, zcap;
    z_stream z;         /* deflate state, reset for each chunk */
    bool z_ready;
    /* the process's open logs (fork_child), under reg_mu */
    struct exr_log *reg_prev, *reg_next;
    bool registered;
    bool forked; /* this process was made by fork after the log opened */
    chunk *writing; /* the chunk the writer took off the queue, until written */
};


static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int64_t real_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + (int64_t)t.tv_nsec;
}

exr_status exr_log_write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return EXR_EIO;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return EXR_OK;
}

/* ---- chunks --------------------------------------------------------------- */

static void chunk_free(chunk *c)
{
    if (!c)
        return;
    free(c->ts);
    free(c->h);
    free(c->pos);
    free(c->fl);
    free(c->rows);
    free(c->fins);
    for (arena_blk *a = c->arena, *nx; a; a = nx) {
        nx = a->next;
        free(a);
    }
    free(c);
}

/* Room for one more step (and a final state). */
static exr_status chunk_reserve(chunk *c, bool fin)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        int64_t *ts = realloc(c->ts, cap * sizeof *ts);
        if (!ts)
            return EXR_ENOMEM;
        c->ts = ts;
        int64_t *h = realloc(c->h, cap * sizeof *h);
        if (!h)
            return EXR_ENOMEM;
        c->h = h;
        int64_t *pos = realloc(c->pos, cap * sizeof *pos);
        if (!pos)
            return EXR_ENOMEM;
        c->pos = pos;
        uint8_t *fl = realloc(c->fl, cap);
        if (!fl)
            return EXR_ENOMEM;
        c->fl = fl;
        const unsigned char **rows = realloc(c->rows, cap * sizeof *rows);
        if (!rows)
            return EXR_ENOMEM;
        c->rows = rows;
        c->cap = cap;
    }
    if (fin && c->nfin == c->fincap) {
        size_t cap = c->fincap ? c->fincap * 2 : 16;
        const unsigned char **f = realloc(c->fins, cap * sizeof *f);
        if (!f)
            return EXR_ENOMEM;
        c->fins = f;
        c->fincap = cap;
    }
    return EXR_OK;
}

/* n bytes of the chunk's own storage (never moves). */
static unsigned char *chunk_alloc(chunk *c, size_t n)
{
    arena_blk *a = c->arena;
    if (!a || a->cap - a->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        a = malloc(sizeof *a + cap);
        if (!a)
            return NULL;
        a->used = 0;
        a->cap = cap;
        a->next = c->arena;
        c->arena = a;
    }
    unsigned char *p = a->data + a->used;
    a->used += n;
    return p;
}

/* ---- the writer thread ----------------------------------------------------- */

static exr_status grow(unsigned char **p, size_t *cap, size_t need)
{
    if (*cap >= need)
        return EXR_OK;
    unsigned char *q = realloc(*p, need);
    if (!q)
        return EXR_ENOMEM;
    *p = q;
    *cap = need;
    return EXR_OK;
}

void exr_log_chunk_header(unsigned char *hd, unsigned kind, unsigned codec, uint32_t count,
                          uint32_t source, int64_t first, int64_t last, uint64_t raw,
                          uint64_t body, uint32_t body_crc)
{
    put32(hd, CHUNK_MAGIC);
    put16(hd + 4, (uint16_t)kind);
    put16(hd + 6, (uint16_t)codec);
    put32(hd + 8, count);
    put32(hd + 12, source);
    put64(hd + 16, (uint64_t)first);
    put64(hd + 24, (uint64_t)last);
    put64(hd + 32, raw);
    put64(hd + 40, body);
    put32(hd + 48, body_crc);
    put32(hd + 52, (uint32_t)crc32(0L, hd, 52));
}

void exr_log_chunk_trailer(unsigned char *tr, uint64_t total, const unsigned char *hd)
{
    put64(tr, total);
    memcpy(tr + 8, hd + 52, 4); /* the header's CRC */
    put32(tr + 12, TRAILER_MAGIC);
}

/* With lg->mu: a records chunk of n records, ends of them without a step,
 * written: the counts of stats. */
static void count_written_locked(exr_log *lg, size_t n, size_t ends, size_t raw_len)
{
    lg->st.chunks++;
    lg->st.records += n - ends; /* steps */
    lg->st.ends += ends;
    lg->st.raw_bytes += raw_len;
}

/* A chunk of count records, ends of them without a step (stats), with its
 * body as it goes to the file. */
static exr_status write_block(exr_log *lg, unsigned kind, unsigned codec, uint32_t count,
                              size_t ends, int64_t first, int64_t last, const unsigned char *body,
                              size_t body_len, size_t raw_len)
{
    unsigned char hd[CHUNK_HEADER], tr[CHUNK_TRAILER];
    uint32_t bc = (uint32_t)crc32(0L, body, (uInt)0);
    for (size_t off = 0; off < body_len;) {
        size_t k = body_len - off > (1u << 30) ? (1u << 30) : body_len - off;
        bc = (uint32_t)crc32(bc, body + off, (uInt)k);
        off += k;
    }
    exr_log_chunk_header(hd, kind, codec, count, lg->o.source, first, last, raw_len, body_len, bc);
    exr_log_chunk_trailer(tr, CHUNK_HEADER + body_len + CHUNK_TRAILER, hd);
    struct iovec iov[3] = {{hd, CHUNK_HEADER}, {(void *)body, body_len}, {tr, CHUNK_TRAILER}};
    exr_status s = exr_log_write_all(lg->fd, iov, 3);
    if (s == EXR_OK) {
        pthread_mutex_lock(&lg->mu);
        lg->st.file_bytes += CHUNK_HEADER + body_len + CHUNK_TRAILER;
        if (kind != KIND_END)
            count_written_locked(lg, count, ends, raw_len);
        pthread_mutex_unlock(&lg->mu);
    }
    return s;
}

/* With lg->mu: c lets go of the buffer its rows are in (the unpin takes
 * only the buffer's pin_mu, a leaf lock). */
static void unpin_chunk_locked(chunk *c)
{
    if (c->pinned) {
        exr_buffer_unpin_locked(c->pinned, &c->reader);
        c->pinned = NULL;
    }
}

/* unpin_chunk_locked under lg->mu, not the buffer's lock: a fork, which
 * holds every log's mu (fork_prepare), then finds the chunk either pinned or
 * not, and never leaves the child a buffer locked by the writer thread. Runs
 * on the writer thread, without lg->mu held. */
static void unpin_chunk(exr_log *lg, chunk *c)
{
    pthread_mutex_lock(&lg->mu);
    unpin_chunk_locked(c);
    pthread_mutex_unlock(&lg->mu);
}

/* A records chunk's kind: KIND_NOSTEP when a record has no row. */
static unsigned chunk_kind(const chunk *c)
{
    return c->nostep ? KIND_NOSTEP : KIND_RECORDS;
}

/* The metadata columns of the raw body into p (META_BYTES * n bytes). */
static void put_meta(const exr_log *lg, const chunk *c, unsigned char *p)
{
    size_t n = c->n;
    for (size_t i = 0; i < n; i++, p += 8)
        put64(p, (uint64_t)c->ts[i]);
    for (size_t i = 0; i < n; i++, p += 8)
        put64(p, (uint64_t)c->h[i]);
    for (size_t i = 0; i < n; i++, p += 8)
        put64(p, (uint64_t)c->pos[i]);
    for (size_t i = 0; i < n; i++, p += 4)
        put32(p, lg->o.source);
    memcpy(p, c->fl, n);
}

/* Adds [p, p + len) to the iovec list, joined to the last entry when it
 * continues it (consecutive rows of one segment). */
static void iov_add(struct iovec *v, size_t *nv, const unsigned char *p, size_t len)
{
    if (*nv && (const unsigned char *)v[*nv - 1].iov_base + v[*nv - 1].iov_len == p) {
        v[*nv - 1].iov_len += len;
        return;
    }
    v[*nv].iov_base = (void *)p;
    v[*nv].iov_len = len;
    (*nv)++;
}

/* Stored (level 0): the rows go to the file straight from where they are
 * (the buffer's pinned storage or the chunk's own), without a copy here;
 * the CRC is chained over the same pieces. Unpins after the write. */
static exr_status write_stored(exr_log *lg, chunk *c)
{
    size_t n = c->n, meta = META_BYTES * n, nv = 0;
    exr_status s = grow(&lg->raw, &lg->raw_cap, meta);
    struct iovec *v = NULL;
    size_t vbytes;
    if (s == EXR_OK && (!exr_mul_size(n + c->nfin + 3, sizeof *v, &vbytes) ||
                        !(v = malloc(vbytes))))
        s = EXR_ENOMEM;
    if (s != EXR_OK) {
        unpin_chunk(lg, c);
        return s;
    }
    unsigned char hd[CHUNK_HEADER], tr[CHUNK_TRAILER];
    put_meta(lg, c, lg->raw);
    v[nv].iov_base = hd;
    v[nv++].iov_len = CHUNK_HEADER;
    v[nv].iov_base = lg->raw;
    v[nv++].iov_len = meta;
    for (size_t i = 0; i < n; i++)
        if (c->rows[i])
            iov_add(v, &nv, c->rows[i], lg->row);
    for (size_t i = 0; i < c->nfin; i++)
        iov_add(v, &nv, c->fins[i], lg->sb);
    uint32_t bc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t k = 1; k < nv; k++) {
        const unsigned char *p = v[k].iov_base;
        for (size_t off = 0; off < v[k].iov_len;) {
            size_t m = v[k].iov_len - off > (1u << 30) ? (1u << 30) : v[k].iov_len - off;
            bc = (uint32_t)crc32(bc, p + off, (uInt)m);
            off += m;
        }
    }
    exr_log_chunk_header(hd, chunk_kind(c), CODEC_STORED, (uint32_t)n, lg->o.source, c->ts[0],
                         c->ts[n - 1], c->raw, c->raw, bc);
    exr_log_chunk_trailer(tr, CHUNK_HEADER + c->raw + CHUNK_TRAILER, hd);
    v[nv].iov_base = tr;
    v[nv++].iov_len = CHUNK_TRAILER;
    for (size_t k = 0; k < nv && s == EXR_OK;) {
        size_t m = nv - k > 512 ? 512 : nv - k;
        s = exr_log_write_all(lg->fd, v + k, (int)m);
        k += m;
    }
    int e = errno;
    free(v);
    unpin_chunk(lg, c);
    errno = e;
    if (s == EXR_OK) {
        pthread_mutex_lock(&lg->mu);
        lg->st.file_bytes += CHUNK_HEADER + c->raw + CHUNK_TRAILER;
        count_written_locked(lg, n, c->nostep, c->raw);
        pthread_mutex_unlock(&lg->mu);
    }
    return s;
}

/* Feeds [p, p + n) to lg->z, whose output buffer has room for it all. */
static exr_status deflate_in(exr_log *lg, const unsigned char *p, size_t n)
{
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        lg->z.next_in = (Bytef *)p;
        lg->z.avail_in = k;
        if (deflate(&lg->z, Z_NO_FLUSH) != Z_OK || lg->z.avail_in)
            return EXR_ENOMEM; /* cannot happen: the output has compressBound room */
        p += k;
        n -= k;
    }
    return EXR_OK;
}

/* The deflate stream (made once, reset for each chunk) and its scratch. */
static exr_status deflate_begin(exr_log *lg, size_t raw, size_t bound)
{
    exr_status s = grow(&lg->raw, &lg->raw_cap, raw);
    if (s == EXR_OK)
        s = grow(&lg->zbuf, &lg->zcap, bound);
    if (s == EXR_OK && !lg->z_ready) {
        exr_zstream_init(&lg->z);
        if (deflateInit(&lg->z, lg->o.level) != Z_OK)
            return EXR_ENOMEM;
        lg->z_ready = true;
    }
    if (s == EXR_OK && deflateReset(&lg->z) != Z_OK)
        s = EXR_ENOMEM;
    if (s == EXR_OK) {
        lg->z.next_out = lg->zbuf;
        lg->z.avail_out = (uInt)bound;
    }
    return s;
}

/* Builds the chunk's raw body in lg->raw (metadata, rows, final states),
 * unpins, compresses it with the log's one zlib stream, writes. Runs on the
 * writer thread without lg->mu. (Feeding zlib straight from the rows, row by
 * row, measured slower: 0.81x zlib.compress against 0.91x.) */
static exr_status write_chunk(exr_log *lg, chunk *c)
{
    if (lg->o.level == 0)
        return write_stored(lg, c);
    size_t n = c->n;
    uLong bound = compressBound((uLong)c->raw);
    exr_status s = c->raw > (1u << 30) ? EXR_EOVERFLOW : deflate_begin(lg, c->raw, bound);
    if (s == EXR_OK) {
        put_meta(lg, c, lg->raw);
        unsigned char *p = lg->raw + META_BYTES * n;
        for (size_t i = 0; i < n; i++)
            if (c->rows[i]) {
                memcpy(p, c->rows[i], lg->row);
                p += lg->row;
            }
        for (size_t i = 0; i < c->nfin; i++, p += lg->sb)
            memcpy(p, c->fins[i], lg->sb);
    }
    unpin_chunk(lg, c); /* the rows are copied: the buffer may free what they were in */
    if (s == EXR_OK)
        s = deflate_in(lg, lg->raw, c->raw);
    if (s == EXR_OK && deflate(&lg->z, Z_FINISH) != Z_STREAM_END)
        s = EXR_ENOMEM;
    if (s != EXR_OK)
        return s;
    return write_block(lg, chunk_kind(c), CODEC_ZLIB, (uint32_t)n, c->nostep, c->ts[0],
                       c->ts[n - 1], lg->zbuf, lg->z.total_out, c->raw);
}

/* With lg->mu: the open chunk goes to the queue. */
static void seal_locked(exr_log *lg)
{
    chunk *c = lg->open;
    if (!c || !c->n)
        return;
    lg->open = NULL;
    c->seq = ++lg->sealed_seq;
    if (lg->qtail)
        lg->qtail->next = c;
    else
        lg->qhead = c;
    lg->qtail = c;
    pthread_cond_signal(&lg->wake);
}

/* A condition variable whose timed waits run on CLOCK_MONOTONIC: a step of
 * the wall clock neither delays nor hastens the flush timer. */
static bool cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return false;
    bool ok = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0 && pthread_cond_init(c, &a) == 0;
    pthread_condattr_destroy(&a);
    return ok;
}

/* With lg->mu: the queue's first chunk written (without lg->mu meanwhile,
 * lg->writing naming it for a fork), counted and freed. */
static void write_next_locked(exr_log *lg)
{
    chunk *c = lg->qhead;
    lg->qhead = c->next;
    if (!lg->qhead)
        lg->qtail = NULL;
    lg->writing = c;
    bool failed = lg->st.error != 0;
    pthread_mutex_unlock(&lg->mu);
    exr_status s = EXR_OK;
    int err = 0;
    uint64_t t0 = mono_ns();
    if (!failed) {
        s = write_chunk(lg, c);
        /* any failure loses the chunk, and so fails the log: a
         * status other than these two is a bug, still reported */
        err = s == EXR_OK ? 0 : s == EXR_EIO ? (errno ? errno : EIO) : s == EXR_ENOMEM ? ENOMEM : EFBIG;
    } else {
        unpin_chunk(lg, c);
    }
    uint64_t busy = mono_ns() - t0;
    pthread_mutex_lock(&lg->mu);
    lg->st.writer_ns += busy;
    if (err && !lg->st.error)
        lg->st.error = err;
    lg->st.backlog -= c->raw;
    lg->written_seq = c->seq;
    lg->writing = NULL;
    chunk_free(c);
    pthread_cond_broadcast(&lg->done);
}

static void *writer_main(void *arg)
{
    exr_log *lg = arg;
    pthread_mutex_lock(&lg->mu);
    for (;;) {
        if (lg->qhead) {
            write_next_locked(lg);
            continue;
        }
        if (lg->stop)
            break;
        if (lg->open && lg->open->n && lg->o.flush_ns) {
            uint64_t due = lg->open->born_ns + lg->o.flush_ns, now = mono_ns();
            if (now >= due) {
                seal_locked(lg);
                continue;
            }
            struct timespec ts; /* on the monotonic clock, as wake is (cond_init_mono) */
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t wait = due - now;
            ts.tv_sec += (time_t)(wait / 1000000000u);
            ts.tv_nsec += (long)(wait % 1000000000u);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&lg->wake, &lg->mu, &ts);
        } else {
            pthread_cond_wait(&lg->wake, &lg->mu);
        }
    }
    pthread_mutex_unlock(&lg->mu);
    return NULL;
}

/* ---- fork ------------------------------------------------------------------- */

/* A log belongs to the process that opened it. A child made by fork gets a
 * copy of its file descriptor, which shares the parent's open file and so
 * its flock: the parent, once it closed the log, could not open the file
 * again while the child lived; a child's writes would interleave with the
 * parent's. So at a fork every open log is held (its mu taken, so that no
 * thread is inside one), and in the child each one's descriptor is pointed
 * at /dev/null and the log marked forked and closed: it writes nothing
 * there, its writer thread is not there to wait for, and closing or freeing
 * it only lets go of its memory (docs/log.md, "Logs and fork"). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static exr_log *reg_head;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
    pthread_mutex_lock(&reg_mu);
    for (exr_log *lg = reg_head; lg; lg = lg->reg_next)
        pthread_mutex_lock(&lg->mu);
}

static void fork_parent(void)
{
    for (exr_log *lg = reg_head; lg; lg = lg->reg_next)
        pthread_mutex_unlock(&lg->mu);
    pthread_mutex_unlock(&reg_mu);
}

static void fork_child(void)
{
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (exr_log *lg = reg_head; lg; lg = lg->reg_next) {
        if (lg->writing) { /* back on the queue: detach unpins it, free frees it */
            chunk *c = lg->writing;
            c->next = lg->qhead;
            lg->qhead = c;
            if (!lg->qtail)
                lg->qtail = c;
            lg->writing = NULL;
        }
        /* waiters of the parent's (the writer, a flush) may be recorded in
         * them: new ones, as only this thread exists */
        (void)cond_init_mono(&lg->wake);
        (void)pthread_cond_init(&lg->done, NULL);
        if (lg->fd >= 0 && (null_fd < 0 || dup3(null_fd, lg->fd, O_CLOEXEC) < 0)) {
            close(lg->fd); /* the lock goes with it; fd -1: nothing to close later */
            lg->fd = -1;
        }
        lg->forked = lg->closed = true;
        lg->thread_started = false; /* the writer thread is the parent's */
        lg->syncing = 0;
        lg->detaching = 0;
        if (lg->closing)
            lg->close_done = true;
        pthread_mutex_unlock(&lg->mu);
    }
    if (null_fd >= 0)
        close(null_fd);
    pthread_mutex_unlock(&reg_mu);
}

static int fork_handlers_err; /* pthread_atfork's, set once */

static void fork_handlers(void)
{
    fork_handlers_err = pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* EXR_ENOMEM if the fork handlers could not be installed. */
static exr_status reg_add(exr_log *lg)
{
    if (pthread_once(&fork_once, fork_handlers) != 0 || fork_handlers_err != 0)
        return EXR_ENOMEM;
    pthread_mutex_lock(&reg_mu);
    lg->reg_prev = NULL;
    lg->reg_next = reg_head;
    if (reg_head)
        reg_head->reg_prev = lg;
    reg_head = lg;
    lg->registered = true;
    pthread_mutex_unlock(&reg_mu);
    return EXR_OK;
}

static void reg_remove(exr_log *lg)
{
    if (!lg->registered)
        return;
    pthread_mutex_lock(&reg_mu);
    if (lg->reg_prev)
        lg->reg_prev->reg_next = lg->reg_next;
    else
        reg_head = lg->reg_next;
    if (lg->reg_next)
        lg->reg_next->reg_prev = lg->reg_prev;
    lg->registered = false;
    pthread_mutex_unlock(&reg_mu);
}

bool exr_log_forked(const exr_log *lg) { return lg->forked; }

/* ---- lifecycle -------------------------------------------------------------- */

/* How long a log waits for the lock of a file another log holds: one that
 * is being closed (dropped while a record call still held it, which closes
 * it when the call ends) lets go within it. */
#define OWN_WAIT_NS 2000000000LL

/* The file of fd made this log's own. A regular file is locked (flock,
 * exclusive, for as long as fd is open), so that a second log opened on the
 * same file, in this process or another, is refused (EBUSY, after
 * OWN_WAIT_NS) before it empties the file the first one is writing; then,
 * if it existed, truncated. A FIFO or a device is neither locked nor
 * truncated: it has nothing to empty, and two writers of one are the
 * user's choice. A file system without flock leaves the file unlocked. 0,
 * or -1 with errno. */
static int own_file(int fd, bool existed)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    if (!S_ISREG(st.st_mode))
        return 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) > OWN_WAIT_NS) {
            errno = EBUSY;
            return -1;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return existed && ftruncate(fd, 0) != 0 ? -1 : 0;
}

/* With lg->mu released: closes lg->fd (if open) under lg->mu, so that a
 * fork sees the descriptor either open and in lg->fd (fork_child points it
 * at /dev/null) or closed. close's result, or 0. */
static int close_fd(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    int r = lg->fd >= 0 ? close(lg->fd) : 0;
    lg->fd = -1;
    pthread_mutex_unlock(&lg->mu);
    return r;
}

/* The log's file in lg->fd, made (lg->created) or, with overwrite, an
 * existing one truncated (own_file). Opened under lg->mu (a fork meanwhile
 * finds it in lg->fd) and without blocking, so that a FIFO with no reader is
 * an error (ENXIO), not a wait for ever; then writes block again. 0, or -1
 * with errno and lg->fd closed. */
static int open_file(exr_log *lg, const char *path, bool overwrite)
{
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK;
    pthread_mutex_lock(&lg->mu);
    lg->fd = open(path, flags, 0644);
    lg->created = lg->fd >= 0;
    if (lg->fd < 0 && errno == EEXIST && overwrite)
        lg->fd = open(path, flags & ~O_EXCL, 0644);
    int fd = lg->fd;
    pthread_mutex_unlock(&lg->mu);
    if (fd < 0)
        return -1;
    int fl = fcntl(fd, F_GETFL);
    if (own_file(fd, !lg->created) != 0 || fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close_fd(lg);
        errno = e;
        return -1;
    }
    return 0;
}

exr_status exr_log_open(const char *path, const exr_log_opts *o, bool overwrite, exr_log **out)
{
    if (o->level < 0 || o->level > 9 || o->chunk_bytes == 0 || o->chunk_bytes > EXR_LOG_MAX_CHUNK)
        return EXR_EINVAL;
    exr_log *lg = calloc(1, sizeof *lg);
    if (!lg)
        return EXR_ENOMEM;
    lg->o = *o;
    lg->fd = -1;
    if (pthread_mutex_init(&lg->mu, NULL) != 0) {
        free(lg);
        return EXR_ENOMEM;
    }
    if (!cond_init_mono(&lg->wake)) {
        pthread_mutex_destroy(&lg->mu);
        free(lg);
        return EXR_ENOMEM;
    }
    if (pthread_cond_init(&lg->done, NULL) != 0) {
        pthread_cond_destroy(&lg->wake);
        pthread_mutex_destroy(&lg->mu);
        free(lg);
        return EXR_ENOMEM;
    }
    exr_status rs = reg_add(lg);
    if (rs != EXR_OK) {
        exr_log_free(lg);
        return rs;
    }
    if (open_file(lg, path, overwrite) != 0) {
        int e = errno;
        exr_log_free(lg);
        errno = e;
        return EXR_EIO;
    }
    if (pthread_create(&lg->thread, NULL, writer_main, lg) != 0) {
        exr_log_free(lg);
        return EXR_ENOMEM;
    }
    lg->thread_started = true;
    *out = lg;
    return EXR_OK;
}

/* The file header: magic 8, version 4, header bytes 4, state/action/reward
 * bytes 3x8, (version 2: extras bytes 8,) schema length 4, schema, CRC 4.
 * Version 1 unless the rows carry extras (docs/log.md). Returns its length
 * (0: no memory) in a new allocation *out. */
static size_t file_header(const void *schema, size_t len, size_t sb, size_t ab, size_t rb,
                          size_t xb, unsigned char **out)
{
    size_t at = xb ? 48 : 40, hl = at + 4 + len + 4;
    unsigned char *hd = *out = malloc(hl);
    if (!hd)
        return 0;
    memcpy(hd, FILE_MAGIC, 8);
    put32(hd + 8, xb ? 2 : FILE_VERSION);
    put32(hd + 12, (uint32_t)hl);
    put64(hd + 16, sb);
    put64(hd + 24, ab);
    put64(hd + 32, rb);
    if (xb)
        put64(hd + 40, xb);
    put32(hd + at, (uint32_t)len);
    if (len)
        memcpy(hd + at + 4, schema, len);
    put32(hd + at + 4 + len, (uint32_t)crc32(0L, hd, (uInt)(at + 4 + len)));
    return hl;
}

/* The row of a layout (*row), when one step of it with its final state
 * fits a chunk. */
static bool row_of(size_t sb, size_t ab, size_t rb, size_t xb, size_t *row)
{
    size_t step;
    return sb != 0 && exr_add_size(sb, ab, row) && exr_add_size(*row, rb, row) &&
           exr_add_size(*row, xb, row) && exr_add_size(*row, sb, &step) &&
           step <= EXR_LOG_MAX_CHUNK - META_BYTES;
}

bool exr_log_row_fits(size_t sb, size_t ab, size_t rb, size_t xb)
{
    size_t row;
    return row_of(sb, ab, rb, xb, &row);
}

static exr_status writer_error_locked(const exr_log *lg);

/* With lg->mu: after a failed write of the file header, what it wrote is
 * taken back (the file is empty again, its offset 0), so that a later
 * attach writes the header at the start; where that cannot be (a pipe, a
 * device), the log is failed with the write's error. */
static void unwrite_header_locked(exr_log *lg)
{
    int e = errno ? errno : EIO;
    if ((ftruncate(lg->fd, 0) != 0 || lseek(lg->fd, 0, SEEK_SET) != 0) && !lg->st.error)
        lg->st.error = e;
    errno = e;
}

exr_status exr_log_set_schema(exr_log *lg, const void *schema, size_t len, size_t sb, size_t ab,
                              size_t rb, size_t xb)
{
    size_t row;
    if (len > EXR_LOG_MAX_SCHEMA || !row_of(sb, ab, rb, xb, &row))
        return EXR_EINVAL;
    pthread_mutex_lock(&lg->mu);
    exr_status s = EXR_OK;
    unsigned char *hd = NULL;
    size_t hl;
    if (lg->closed) {
        s = EXR_EINVAL;
    } else if (lg->has_schema) {
        if (sb != lg->sb || ab != lg->ab || rb != lg->rb || xb != lg->xb)
            s = EXR_EINVAL;
    } else if (lg->st.error) {
        s = writer_error_locked(lg); /* a header write failed and could not be undone */
    } else if (!(hl = file_header(schema, len, sb, ab, rb, xb, &hd))) {
        s = EXR_ENOMEM;
    } else {
        struct iovec iov = {hd, hl};
        /* nothing else writes before the schema is set */
        s = exr_log_write_all(lg->fd, &iov, 1);
        if (s == EXR_OK) {
            lg->st.file_bytes += hl;
            lg->sb = sb;
            lg->ab = ab;
            lg->rb = rb;
            lg->xb = xb;
            lg->row = row;
            lg->has_schema = true;
        } else {
            unwrite_header_locked(lg);
        }
    }
    free(hd);
    pthread_mutex_unlock(&lg->mu);
    return s;
}

bool exr_log_has_schema(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    bool r = lg->has_schema;
    pthread_mutex_unlock(&lg->mu);
    return r;
}

bool exr_log_has_extras(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    bool r = lg->has_schema && lg->xb;
    pthread_mutex_unlock(&lg->mu);
    return r;
}

/* With lg->mu: a step into the open chunk. row/fin are already where they
 * will stay until the writer copies them. */
static exr_status add_locked(exr_log *lg, int64_t h, uint64_t pos, const unsigned char *row,
                             const unsigned char *fin, unsigned flags, unsigned char **copy_row,
                             unsigned char **copy_fin, int64_t now)
{
    bool has_fin = (flags & EXR_LOG_FINAL) != 0, has_row = !(flags & EXR_LOG_NOSTEP);
    size_t add = META_BYTES + (has_row ? lg->row : 0) + (has_fin ? lg->sb : 0);
    /* never past EXR_LOG_MAX_CHUNK, which write_chunk refuses: a step that
     * does not fit goes to a chunk of its own (exr_log_row_fits: it fits one) */
    if (lg->open && lg->open->raw + add > EXR_LOG_MAX_CHUNK)
        seal_locked(lg);
    chunk *c = lg->open;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            return EXR_ENOMEM;
        c->born_ns = mono_ns();
        lg->open = c;
        pthread_cond_signal(&lg->wake); /* the writer's flush timer starts */
    }
    exr_status s = chunk_reserve(c, has_fin);
    if (s != EXR_OK)
        return s;
    if (copy_row) { /* room in the chunk for the row (if any) and final state */
        unsigned char *r = has_row ? chunk_alloc(c, lg->row) : NULL;
        unsigned char *f = has_fin ? chunk_alloc(c, lg->sb) : NULL;
        if ((has_row && !r) || (has_fin && !f))
            return EXR_ENOMEM; /* the arena keeps what it got; harmless */
        *copy_row = r;
        if (copy_fin)
            *copy_fin = f;
        row = r;
        fin = f;
    }
    int64_t ts = now;
    if (ts < lg->last_ts)
        ts = lg->last_ts; /* time never goes back within a log */
    lg->last_ts = ts;
    size_t i = c->n++;
    c->ts[i] = ts;
    c->h[i] = h;
    c->pos[i] = (int64_t)pos;
    c->fl[i] = (uint8_t)flags;
    c->rows[i] = row;
    if (has_fin)
        c->fins[c->nfin++] = fin;
    c->nostep += !has_row;
    c->raw += add;
    lg->st.backlog += add;
    if (c->raw >= lg->o.chunk_bytes)
        seal_locked(lg);
    return EXR_OK;
}

/* What a failed append_many puts back: the log as it was before the call. */
typedef struct {
    chunk *open, *qtail;
    size_t n, nfin, nostep, raw, backlog;
    uint64_t sealed_seq;
    int64_t last_ts;
} log_mark;

static void mark_locked(const exr_log *lg, log_mark *m)
{
    chunk *c = lg->open;
    *m = (log_mark){c,
                    lg->qtail,
                    c ? c->n : 0,
                    c ? c->nfin : 0,
                    c ? c->nostep : 0,
                    c ? c->raw : 0,
                    lg->st.backlog,
                    lg->sealed_seq,
                    lg->last_ts};
}

/* With lg->mu, held since mark_locked: drops every step added since. The
 * writer has not seen the chunks sealed meanwhile (it needs lg->mu to take
 * one), so they are unlinked from the queue and freed; the chunk that was
 * open is open again with its old contents (its arena keeps what it got). */
static void rollback_locked(exr_log *lg, const log_mark *m)
{
    chunk *x = m->qtail ? m->qtail->next : lg->qhead;
    if (m->qtail)
        m->qtail->next = NULL;
    else
        lg->qhead = NULL;
    lg->qtail = m->qtail;
    if (lg->open && lg->open != m->open)
        chunk_free(lg->open);
    while (x) {
        chunk *nx = x->next;
        if (x != m->open)
            chunk_free(x);
        x = nx;
    }
    lg->open = m->open;
    if (m->open) {
        m->open->next = NULL;
        m->open->n = m->n;
        m->open->nfin = m->nfin;
        m->open->nostep = m->nostep;
        m->open->raw = m->raw;
    }
    lg->sealed_seq = m->sealed_seq;
    lg->st.backlog = m->backlog;
    lg->last_ts = m->last_ts;
}

/* With lg->mu: one step, copied. */
static exr_status append_locked(exr_log *lg, int64_t h, uint64_t pos, const unsigned char *state,
                                const unsigned char *action, const unsigned char *reward,
                                const void *fin, unsigned flags, int64_t now)
{
    unsigned char *r = NULL, *f = NULL;
    exr_status s = add_locked(lg, h, pos, NULL, NULL, flags, &r, &f, now);
    if (s == EXR_OK) {
        memcpy(r, state, lg->sb);
        memcpy(r + lg->sb, action, lg->ab);
        memcpy(r + lg->sb + lg->ab, reward, lg->rb);
        if (f)
            memcpy(f, fin, lg->sb);
    }
    return s;
}

exr_status exr_log_append_many(exr_log *lg, int64_t h, uint64_t pos, const void *states,
                               const void *actions, const void *rewards, size_t T, const void *fin,
                               unsigned flags)
{
    if (T == 0)
        return EXR_OK;
    if (flags & ~7u ||
        ((flags & (EXR_LOG_TERMINATED | EXR_LOG_FINAL)) && !(flags & EXR_LOG_END)) ||
        (!fin != !(flags & EXR_LOG_FINAL)) || pos > (uint64_t)INT64_MAX ||
        T - 1 > (uint64_t)INT64_MAX - pos)
        return EXR_EINVAL;
    const unsigned char *sp = states, *ap = actions, *rp = rewards;
    pthread_mutex_lock(&lg->mu);
    /* a log with extras takes its steps from its buffer, which has them */
    exr_status s = lg->closed || !lg->has_schema || lg->xb ? EXR_EINVAL : EXR_OK;
    log_mark m;
    mark_locked(lg, &m);
    int64_t now = real_ns(); /* one clock read per call */
    for (size_t t = 0; s == EXR_OK && t < T; t++) {
        bool last = t + 1 == T;
        s = append_locked(lg, h, pos + t, sp + t * lg->sb, ap + t * lg->ab, rp + t * lg->rb,
                          last ? fin : NULL, last ? flags : 0, now);
    }
    if (s != EXR_OK)
        rollback_locked(lg, &m);
    pthread_mutex_unlock(&lg->mu);
    return s;
}

exr_status exr_log_append(exr_log *lg, int64_t h, uint64_t pos, const void *state,
                          const void *action, const void *reward, const void *fin,
                          unsigned flags)
{
    return exr_log_append_many(lg, h, pos, state, action, reward, 1, fin, flags);
}

/* With lg->mu: the end of episode h after its pos steps, a record without
 * a row (EXR_LOG_NOSTEP) whose final state, if any, is copied into the
 * chunk: its bytes are the same whoever ends the episode (the buffer's
 * hook or exr_log_end). */
static exr_status end_locked(exr_log *lg, int64_t h, uint64_t pos, const void *fin,
                             bool terminated, int64_t now)
{
    unsigned flags = EXR_LOG_END | EXR_LOG_NOSTEP | (terminated ? EXR_LOG_TERMINATED : 0) |
                     (fin ? EXR_LOG_FINAL : 0);
    unsigned char *r = NULL, *f = NULL;
    exr_status s = add_locked(lg, h, pos, NULL, NULL, flags, &r, &f, now);
    if (s == EXR_OK && f)
        memcpy(f, fin, lg->sb);
    return s;
}

exr_status exr_log_end(exr_log *lg, int64_t h, uint64_t pos, const void *fin, bool terminated)
{
    if ((!fin && !terminated) || pos == 0 || pos > (uint64_t)INT64_MAX)
        return EXR_EINVAL;
    pthread_mutex_lock(&lg->mu);
    /* no row, so a log with extras takes it too (it needs none) */
    exr_status s = lg->closed || !lg->has_schema ? EXR_EINVAL : EXR_OK;
    if (s == EXR_OK)
        s = end_locked(lg, h, pos, fin, terminated, real_ns());
    pthread_mutex_unlock(&lg->mu);
    return s;
}

/* The buffer's step hook: runs with b locked. row NULL: an episode ended
 * without a step (exr_buffer_end_episode_locked), logged without a row, its
 * final state copied (fin may be the caller's, for an episode not held). */
static void on_step(void *ctx, exr_buffer *b, int64_t h, uint64_t pos, const unsigned char *row,
                    const unsigned char *fin, bool end, bool terminated, bool first)
{
    exr_log *lg = ctx;
    unsigned flags = (end ? EXR_LOG_END : 0) | (end && terminated ? EXR_LOG_TERMINATED : 0) |
                     (end && fin ? EXR_LOG_FINAL : 0);
    pthread_mutex_lock(&lg->mu);
    exr_status s = EXR_EINVAL;
    /* a chunk pinned to the buffer this log was detached from takes no row
     * of another (rows are safe only in the buffer a chunk pins) */
    if (lg->open && lg->open->pinned && lg->open->pinned != b)
        seal_locked(lg);
    if (!lg->closed) {
        if (first || !lg->call_ts)
            lg->call_ts = real_ns(); /* one clock read per record call */
        s = row ? add_locked(lg, h, pos, row, end ? fin : NULL, flags, NULL, NULL, lg->call_ts)
                : end_locked(lg, h, pos, fin, terminated, lg->call_ts);
        chunk *c = lg->open;
        if (s == EXR_OK && !c) {
            /* sealed by this step: pin the sealed one if it is not yet */
            c = lg->qtail;
        }
        if (s == EXR_OK && c && !c->pinned) {
            exr_buffer_pin_locked(b, &c->reader);
            c->pinned = b;
        }
    }
    if (s != EXR_OK)
        lg->st.dropped++;
    pthread_mutex_unlock(&lg->mu);
}

void exr_log_throttle(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    if (lg->o.max_backlog && lg->st.backlog >= lg->o.max_backlog && !lg->closed) {
        uint64_t t0 = mono_ns();
        lg->st.throttled++;
        /* what it waits for must reach the writer even if its chunk is open */
        seal_locked(lg);
        while (lg->st.backlog >= lg->o.max_backlog && !lg->closed &&
               lg->written_seq < lg->sealed_seq)
            pthread_cond_wait(&lg->done, &lg->mu);
        lg->st.throttle_ns += mono_ns() - t0;
    }
    pthread_mutex_unlock(&lg->mu);
}

/* With lg->mu: the writer's first error as a status (EXR_OK if none). */
static exr_status writer_error_locked(const exr_log *lg)
{
    int err = lg->st.error;
    if (!err)
        return EXR_OK;
    if (err == ENOMEM)
        return EXR_ENOMEM; /* the writer could not allocate: a chunk is lost */
    errno = err;
    return EXR_EIO;
}

exr_status exr_log_flush(exr_log *lg, bool sync)
{
    if (lg->forked) /* the parent's steps: no writer here to wait for */
        return EXR_OK;
    pthread_mutex_lock(&lg->mu);
    seal_locked(lg);
    uint64_t target = lg->sealed_seq;
    while (lg->written_seq < target)
        pthread_cond_wait(&lg->done, &lg->mu);
    exr_status s = writer_error_locked(lg);
    int fd = lg->fd;
    bool do_sync = s == EXR_OK && (sync || lg->o.fsync) && fd >= 0;
    if (do_sync)
        lg->syncing++; /* a close meanwhile waits before it closes fd */
    pthread_mutex_unlock(&lg->mu);
    if (!do_sync)
        return s;
    if (fsync(fd) != 0)
        s = EXR_EIO;
    int e = errno; /* fsync's, for the caller's message */
    pthread_mutex_lock(&lg->mu);
    if (--lg->syncing == 0)
        pthread_cond_broadcast(&lg->done);
    pthread_mutex_unlock(&lg->mu);
    errno = e;
    return s;
}

static exr_status close_body(exr_log *lg, exr_buffer *b);
static void detach(exr_log *lg, exr_buffer *b, bool announced);
static void unpin_forked(exr_log *lg, exr_buffer *b);

/* Closes once: a second close, here or in another thread, waits for the
 * first to end and returns EXR_OK. A detach announced by the binding
 * (exr_log_detach_begin) ends first, so that close never touches a buffer
 * that another thread is taking the log from (and may free right after). */
static bool close_begin(exr_log *lg, exr_buffer **b)
{
    pthread_mutex_lock(&lg->mu);
    while (lg->detaching)
        pthread_cond_wait(&lg->done, &lg->mu);
    bool first = !lg->closing;
    lg->closing = true;
    while (!first && !lg->close_done)
        pthread_cond_wait(&lg->done, &lg->mu);
    *b = lg->buf;
    pthread_mutex_unlock(&lg->mu);
    return first;
}

exr_status exr_log_close(exr_log *lg)
{
    exr_buffer *b;
    if (!close_begin(lg, &b))
        return EXR_OK;
    exr_status s = close_body(lg, b);
    pthread_mutex_lock(&lg->mu);
    lg->close_done = true;
    pthread_cond_broadcast(&lg->done);
    pthread_mutex_unlock(&lg->mu);
    return s;
}

/* exr_log_close's work, once; b: the buffer still attached (NULL: none). */
static exr_status close_body(exr_log *lg, exr_buffer *b)
{
    if (b)
        detach(lg, b, false);
    if (lg->forked) { /* the parent's file: nothing written here */
        close_fd(lg);
        return EXR_OK;
    }
    exr_status s = exr_log_has_schema(lg) ? exr_log_flush(lg, false) : EXR_OK;
    pthread_mutex_lock(&lg->mu);
    lg->closed = true;
    seal_locked(lg); /* the writer drains its queue before it stops */
    lg->stop = true;
    pthread_cond_signal(&lg->wake);
    pthread_mutex_unlock(&lg->mu);
    if (lg->thread_started) {
        pthread_join(lg->thread, NULL);
        lg->thread_started = false;
    }
    /* the chunks sealed after the flush (steps that came meanwhile) are
     * written too: an error there keeps the end marker out, so that the
     * file ends in a torn tail, not a hole before an end */
    pthread_mutex_lock(&lg->mu);
    if (s == EXR_OK)
        s = writer_error_locked(lg);
    pthread_mutex_unlock(&lg->mu);
    /* the queue is empty: the writer drained it and nothing is added once closed */
    if (s == EXR_OK && lg->has_schema) {
        s = write_block(lg, KIND_END, CODEC_STORED, 0, 0, lg->last_ts, lg->last_ts,
                        (const unsigned char *)"", 0, 0);
        if (s == EXR_OK && lg->o.fsync && fsync(lg->fd) != 0)
            s = EXR_EIO;
    }
    pthread_mutex_lock(&lg->mu);
    while (lg->syncing) /* a flush's fsync of fd, begun before closed was set */
        pthread_cond_wait(&lg->done, &lg->mu);
    pthread_mutex_unlock(&lg->mu);
    if (close_fd(lg) != 0 && s == EXR_OK)
        s = EXR_EIO;
    return s;
}

bool exr_log_created(const exr_log *lg) { return lg->created; }

bool exr_log_closed(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    bool c = lg->closed;
    pthread_mutex_unlock(&lg->mu);
    return c;
}

void exr_log_free(exr_log *lg)
{
    if (!lg)
        return;
    int e = errno;
    if (lg->thread_started)
        (void)exr_log_close(lg);
    close_fd(lg); /* before it leaves the registry: a fork meanwhile finds it */
    errno = e;
    reg_remove(lg);
    if (lg->forked) { /* the parent's queue, unwritten here (unpinned by detach) */
        while (lg->qhead) {
            chunk *c = lg->qhead;
            lg->qhead = c->next;
            if (!c->pinned)
                chunk_free(c);
        }
        if (lg->open && lg->open->pinned)
            lg->open = NULL;
    }
    chunk_free(lg->open);
    free(lg->raw);
    free(lg->zbuf);
    if (lg->z_ready)
        deflateEnd(&lg->z);
    pthread_cond_destroy(&lg->done);
    pthread_cond_destroy(&lg->wake);
    pthread_mutex_destroy(&lg->mu);
    free(lg);
}

exr_status exr_log_attach_locked(exr_log *lg, exr_buffer *b)
{
    const exr_config *cfg = exr_buffer_config(b);
    pthread_mutex_lock(&lg->mu);
    exr_status s = EXR_OK;
    if (lg->buf || lg->closed || !lg->has_schema || cfg->state_bytes != lg->sb ||
        cfg->action_bytes != lg->ab || cfg->reward_bytes != lg->rb || cfg->extra_bytes != lg->xb)
        s = EXR_EINVAL;
    else
        lg->buf = b;
    pthread_mutex_unlock(&lg->mu);
    if (s == EXR_OK)
        exr_buffer_set_hook_locked(b, on_step, lg);
    return s;
}

void exr_log_detach_begin(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    lg->detaching++;
    pthread_mutex_unlock(&lg->mu);
}

void exr_log_detach(exr_log *lg, exr_buffer *b) { detach(lg, b, true); }

/* announced: by exr_log_detach_begin (the binding's detach), whose count
 * this one ends; close_body's own detach is not counted. */
static void detach(exr_log *lg, exr_buffer *b, bool announced)
{
    exr_buffer_lock(b);
    exr_buffer_unset_hook_locked(b, lg); /* only this log's hook */
    exr_buffer_unlock(b);
    pthread_mutex_lock(&lg->mu);
    if (lg->buf == b)
        lg->buf = NULL;
    /* Sealed under the hold that let go of b (no row of a buffer attached
     * next joins a chunk pinned to b), then waited for whoever detached:
     * when this returns the writer holds no pointer into b. */
    seal_locked(lg);
    uint64_t target = lg->sealed_seq;
    while (!lg->forked && lg->written_seq < target)
        pthread_cond_wait(&lg->done, &lg->mu);
    if (announced && lg->detaching) {
        lg->detaching--;
        pthread_cond_broadcast(&lg->done);
    }
    pthread_mutex_unlock(&lg->mu);
    if (lg->forked)
        unpin_forked(lg, b);
}

/* In a child made by fork (no writer, nothing added: the log is closed):
 * the sealed chunks, which no writer will write here, let go of b. */
static void unpin_forked(exr_log *lg, exr_buffer *b)
{
    pthread_mutex_lock(&lg->mu);
    for (chunk *c = lg->qhead; c; c = c->next)
        if (c->pinned == b)
            unpin_chunk_locked(c);
    pthread_mutex_unlock(&lg->mu);
}

exr_buffer *exr_log_attached(exr_log *lg)
{
    pthread_mutex_lock(&lg->mu);
    exr_buffer *b = lg->buf;
    pthread_mutex_unlock(&lg->mu);
    return b;
}

void exr_log_get_stats(exr_log *lg, exr_log_stats *st)
{
    pthread_mutex_lock(&lg->mu);
    *st = lg->st;
    pthread_mutex_unlock(&lg->mu);
}

const exr_log_opts *exr_log_options(const exr_log *lg) { return &lg->o; }
