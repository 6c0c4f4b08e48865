/*
 * log_merge.c - the k-way merge of experience logs (log_merge.h, docs/log.md).
 */
#define _GNU_SOURCE
#include "log_merge.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include "le.h"
#include "log.h"
#include "zheap.h"

#define META 29 /* ts, handle, pos (8 each), source (4), flags (1) */
#define KIND_RECORDS EXR_LOG_KIND_RECORDS
#define KIND_NOSTEP EXR_LOG_KIND_NOSTEP
#define CODEC_STORED 0u
#define CODEC_ZLIB 1u
#define MIXED 0xFFFFFFFFu
#define PIECE ((size_t)1 << 30) /* zlib's lengths are uInt: feed it in pieces */

enum { J_IDLE, J_QUEUED, J_RUNNING, J_DONE };
enum { K_DECODE, K_COMPRESS };

typedef struct mjob {
    int kind, state;
    struct mjob *next;
    exr_status st;
    int errnum;
    char what[112];
} mjob;

/* An input chunk: read, checked and inflated by a decode job, then merged. */
typedef struct {
    mjob j; /* first: a job is its slot */
    exr_merge_chunk c;
    unsigned char *body, *raw;
    size_t body_cap, raw_cap;
    const unsigned char *data; /* the raw body: raw, or body when stored */
    z_stream z;
    bool zinit, ready;
    size_t nrows;         /* records with a row (check_flags) */
    size_t rec, row, fin; /* the merge's cursor: next record, next row, next final state */
} inslot;

typedef struct {
    inslot *slot; /* EXR_MERGE_LOOK of them, a ring */
    size_t head, queued;
    bool ended;
} input;

/* An output chunk: filled by the merge, compressed by a job, written. */
typedef struct {
    mjob j;
    size_t n, nrows, nfin; /* records; rows (records without one: EXR_LOG_NOSTEP); finals */
    unsigned char *meta;  /* META * cap: the columns, each cap long */
    unsigned char *raw;   /* META * cap + rows + final states */
    unsigned char *fins;  /* final states until the chunk is sealed */
    size_t raw_cap, fins_cap, raw_len;
    unsigned char *zout;
    size_t zout_cap, body_len;
    const unsigned char *body;
    uint32_t source, body_crc;
    bool mixed, busy; /* busy: sealed, not yet written */
    z_stream z;
    bool zinit;
} outslot;

struct exr_merge {
    size_t nin, row, sb, chunk_bytes, cap; /* cap: records an output chunk holds at most */
    int level, fd, nthreads, nout;
    input *in;
    outslot *out;
    int cur, wnext; /* the slot being filled; the next to write */
    uint64_t records, chunks;
    int64_t last_ts;
    bool finished;
    exr_merge_error err;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    mjob *dq_head, *dq_tail, *cq_head, *cq_tail; /* decode jobs first, then compress */
    bool stop;
    pthread_t th[EXR_MERGE_MAX_THREADS];
    int started;
};


/* ---- Adler-32 --------------------------------------------------------------
 * The zlib stream's check (RFC 1950) of every raw body, computed once on
 * inflating and once on deflating. zlib's own is a byte loop; on x86-64
 * with SSSE3 this one sums 32 bytes a step (the method of Chromium's
 * adler32_simd.c), several times faster. The merge therefore inflates and
 * deflates raw streams (windowBits -15) and reads and writes the 2-byte
 * header and the Adler-32 trailer itself: the bytes are the same zlib
 * streams, checked as strictly. */

#define ADLER_BASE 65521u
#define ADLER_NMAX 5552u

static uint32_t adler_bytes(uint32_t adler, const unsigned char *p, size_t n)
{
    uint32_t a = adler & 0xffff, b = adler >> 16;
    while (n) {
        size_t k = n < ADLER_NMAX ? n : ADLER_NMAX;
        n -= k;
        while (k--) {
            a += *p++;
            b += a;
        }
        a %= ADLER_BASE;
        b %= ADLER_BASE;
    }
    return a | (b << 16);
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(EXR_NO_SIMD_ADLER) /* (defined: zlib's byte loop, for comparisons) */
#include <immintrin.h>
#define HAVE_ADLER_SSSE3 1

__attribute__((target("ssse3"))) static uint32_t adler_ssse3(uint32_t adler,
                                                              const unsigned char *p, size_t n)
{
    uint32_t a = adler & 0xffff, b = adler >> 16;
    size_t blocks = n / 32;
    n -= blocks * 32;
    const __m128i tap1 = _mm_setr_epi8(32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17);
    const __m128i tap2 = _mm_setr_epi8(16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m128i zero = _mm_setzero_si128(), ones = _mm_set1_epi16(1);
    while (blocks) {
        size_t k = ADLER_NMAX / 32;
        if (k > blocks)
            k = blocks;
        blocks -= k;
        __m128i vps = _mm_set_epi32(0, 0, 0, (int)(a * (uint32_t)k));
        __m128i vb = _mm_set_epi32(0, 0, 0, (int)b);
        __m128i va = zero;
        do {
            const __m128i x1 = _mm_loadu_si128((const __m128i *)p);
            const __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
            vps = _mm_add_epi32(vps, va);
            va = _mm_add_epi32(va, _mm_sad_epu8(x1, zero));
            vb = _mm_add_epi32(vb, _mm_madd_epi16(_mm_maddubs_epi16(x1, tap1), ones));
            va = _mm_add_epi32(va, _mm_sad_epu8(x2, zero));
            vb = _mm_add_epi32(vb, _mm_madd_epi16(_mm_maddubs_epi16(x2, tap2), ones));
            p += 32;
        } while (--k);
        vb = _mm_add_epi32(vb, _mm_slli_epi32(vps, 5));
        va = _mm_add_epi32(va, _mm_shuffle_epi32(va, _MM_SHUFFLE(2, 3, 0, 1)));
        va = _mm_add_epi32(va, _mm_shuffle_epi32(va, _MM_SHUFFLE(1, 0, 3, 2)));
        a += (uint32_t)_mm_cvtsi128_si32(va);
        vb = _mm_add_epi32(vb, _mm_shuffle_epi32(vb, _MM_SHUFFLE(2, 3, 0, 1)));
        vb = _mm_add_epi32(vb, _mm_shuffle_epi32(vb, _MM_SHUFFLE(1, 0, 3, 2)));
        b = (uint32_t)_mm_cvtsi128_si32(vb);
        a %= ADLER_BASE;
        b %= ADLER_BASE;
    }
    return adler_bytes(a | (b << 16), p, n);
}
#endif

uint32_t exr_adler32(uint32_t adler, const void *p, size_t n)
{
#ifdef HAVE_ADLER_SSSE3
    if (__builtin_cpu_supports("ssse3"))
        return adler_ssse3(adler, p, n);
#endif
    return adler_bytes(adler, p, n);
}

/* ---- jobs ----------------------------------------------------------------- */

static void job_fail(mjob *j, exr_status st, int errnum, const char *what)
{
    j->st = st;
    j->errnum = errnum;
    snprintf(j->what, sizeof j->what, "%s", what);
}

static exr_status reserve(unsigned char **p, size_t *cap, size_t need)
{
    if (*cap >= need)
        return EXR_OK;
    unsigned char *q = realloc(*p, need ? need : 1);
    if (!q)
        return EXR_ENOMEM;
    *p = q;
    *cap = need;
    return EXR_OK;
}

static uint32_t crc_of(const unsigned char *p, size_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < n; off += PIECE)
        c = crc32(c, p + off, (uInt)(n - off < PIECE ? n - off : PIECE));
    return (uint32_t)c;
}

/* The flags of a decoded chunk, and its length against its rows and final
 * states, checked as the Python reader checks them. */
static bool check_flags(exr_merge *m, inslot *s)
{
    const exr_merge_chunk *c = &s->c;
    size_t n = c->count, nrows = 0, nfin = 0;
    const unsigned char *fl = s->data + 28 * n;
    unsigned allowed = c->kind == KIND_NOSTEP ? 15u : 7u;
    char msg[112];
    for (size_t i = 0; i < n; i++) {
        unsigned f = fl[i];
        /* bits 1 to 3 need bit 0; bit 3 needs bit 1 or 2 (how the episode ended) */
        if ((f & ~allowed) || ((f & 14u) && !(f & EXR_LOG_END)) ||
            ((f & EXR_LOG_NOSTEP) && !(f & 6u))) {
            job_fail(&s->j, EXR_ECORRUPT, 0, "record flags");
            return false;
        }
        nrows += !(f & EXR_LOG_NOSTEP);
        nfin += (f & EXR_LOG_FINAL) != 0;
    }
    if (n * META + nrows * m->row + nfin * m->sb != c->raw_len) {
        snprintf(msg, sizeof msg,
                 "chunk has %zu rows and %zu final states, its length says otherwise", nrows,
                 nfin);
        job_fail(&s->j, EXR_ECORRUPT, 0, msg);
        return false;
    }
    s->nrows = nrows;
    return true;
}

/* The records of a decoded chunk, checked as the Python reader checks them. */
static void check_records(exr_merge *m, inslot *s)
{
    const exr_merge_chunk *c = &s->c;
    size_t n = c->count;
    const unsigned char *d = s->data, *ts = d, *pos = d + 16 * n, *src = d + 24 * n;
    if (!check_flags(m, s))
        return;
    int64_t prev = (int64_t)get64(ts);
    bool bad = prev != c->first || (int64_t)get64(ts + 8 * (n - 1)) != c->last;
    for (size_t i = 1; i < n && !bad; i++) {
        int64_t t = (int64_t)get64(ts + 8 * i);
        bad = t < prev;
        prev = t;
    }
    if (bad) {
        job_fail(&s->j, EXR_ECORRUPT, 0, "timestamps out of order or not those of the header");
        return;
    }
    for (size_t i = 0; i < n; i++)
        if ((int64_t)get64(pos + 8 * i) < 0) {
            job_fail(&s->j, EXR_ECORRUPT, 0, "negative position");
            return;
        }
    if (c->source != MIXED)
        for (size_t i = 0; i < n; i++)
            if (get32(src + 4 * i) != c->source) {
                job_fail(&s->j, EXR_ECORRUPT, 0, "record source differs from the chunk's");
                return;
            }
    for (size_t i = 0; i < n; i++)
        if (get32(src + 4 * i) == MIXED) {
            job_fail(&s->j, EXR_ECORRUPT, 0, "record source 4294967295");
            return;
        }
}

/* Reads the chunk's body into the slot and checks its CRC. */
static bool read_body(inslot *s)
{
    const exr_merge_chunk *c = &s->c;
    if (c->body_len > SIZE_MAX - 1 || reserve(&s->body, &s->body_cap, (size_t)c->body_len)) {
        job_fail(&s->j, EXR_ENOMEM, 0, "");
        return false;
    }
    for (size_t got = 0; got < c->body_len;) {
        ssize_t r = pread(c->fd, s->body + got, c->body_len - got, (off_t)(c->body_off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            job_fail(&s->j, EXR_EIO, errno, "");
            return false;
        }
        if (r == 0) {
            job_fail(&s->j, EXR_ECORRUPT, 0, "file shrank while reading");
            return false;
        }
        got += (size_t)r;
    }
    if (crc_of(s->body, c->body_len) != c->body_crc) {
        job_fail(&s->j, EXR_ECORRUPT, 0, "chunk body CRC mismatch");
        return false;
    }
    return true;
}

/* The zlib wrapper by hand (RFC 1950): CMF/FLG checked, the slot's raw
 * inflate stream made or reset. */
static bool inflate_begin(inslot *s)
{
    const unsigned char *b = s->body;
    if (s->c.body_len < 6 || (b[0] & 0x0f) != 8 || (b[0] >> 4) > 7 ||
        ((unsigned)b[0] * 256 + b[1]) % 31) {
        job_fail(&s->j, EXR_ECORRUPT, 0, "chunk body: incorrect header check");
        return false;
    }
    if (b[1] & 0x20) {
        job_fail(&s->j, EXR_ECORRUPT, 0, "chunk body: a preset dictionary");
        return false;
    }
    if (!s->zinit) {
        exr_zstream_init(&s->z); /* the allocation-failure build's allocator too */
        if (inflateInit2(&s->z, -15) != Z_OK) {
            job_fail(&s->j, EXR_ENOMEM, 0, "");
            return false;
        }
        s->zinit = true;
    } else if (inflateReset(&s->z) != Z_OK) {
        job_fail(&s->j, EXR_ENOMEM, 0, "");
        return false;
    }
    return true;
}

/* Room for the inflated raw body after what has been inflated: the slot's
 * array, at least RAW_FIRST, doubled once full, never past raw_len. A body
 * may claim 1032 times its size: the array stays a small multiple of what
 * it really inflates to (or of RAW_FIRST), not of what it claims. */
#define RAW_FIRST ((size_t)1 << 20)

static bool raw_room(inslot *s)
{
    size_t have = (size_t)s->z.total_out, want = (size_t)s->c.raw_len;
    if (s->raw_cap <= have) {
        size_t cap = have > RAW_FIRST / 2 ? 2 * have : RAW_FIRST; /* have < raw_len <= 2^31 */
        if (reserve(&s->raw, &s->raw_cap, cap < want ? cap : want)) {
            job_fail(&s->j, EXR_ENOMEM, 0, "");
            return false;
        }
    }
    s->z.next_out = s->raw + have;
    s->z.avail_out = (uInt)((s->raw_cap < want ? s->raw_cap : want) - have); /* <= 2^31 */
    return true;
}

/* Inflates the body's deflate stream (between the 2-byte header and the
 * 4-byte Adler-32) to exactly raw_len bytes, then checks the Adler-32. */
static bool inflate_body(inslot *s)
{
    const exr_merge_chunk *c = &s->c;
    unsigned char *b = s->body;
    char msg[112];
    s->z.avail_in = 0;
    if (!raw_room(s))
        return false;
    size_t fed = 2, end = c->body_len - 4;
    int zr = Z_OK;
    while (zr == Z_OK) {
        if (s->z.avail_in == 0 && fed < end) {
            size_t k = end - fed < PIECE ? end - fed : PIECE;
            s->z.next_in = b + fed;
            s->z.avail_in = (uInt)k;
            fed += k;
        }
        if (!s->z.avail_out && s->z.total_out < c->raw_len && !raw_room(s))
            return false;
        /* Z_FINISH once all of it is fed and the room is all of raw_len */
        zr = inflate(&s->z, fed == end && s->raw_cap >= c->raw_len ? Z_FINISH : Z_NO_FLUSH);
    }
    if (zr == Z_DATA_ERROR || zr == Z_NEED_DICT || zr == Z_MEM_ERROR) {
        snprintf(msg, sizeof msg, "chunk body: %s",
                 zr == Z_MEM_ERROR ? "out of memory" : s->z.msg ? s->z.msg : "invalid data");
        job_fail(&s->j, zr == Z_MEM_ERROR ? EXR_ENOMEM : EXR_ECORRUPT, 0, msg);
        return false;
    }
    if (zr != Z_STREAM_END || s->z.total_out != c->raw_len || s->z.avail_in || fed != end) {
        snprintf(msg, sizeof msg, "chunk body does not inflate to %llu bytes",
                 (unsigned long long)c->raw_len);
        job_fail(&s->j, EXR_ECORRUPT, 0, msg);
        return false;
    }
    uint32_t want = (uint32_t)b[end] << 24 | (uint32_t)b[end + 1] << 16 |
                    (uint32_t)b[end + 2] << 8 | b[end + 3];
    if (exr_adler32(1, s->raw, (size_t)c->raw_len) != want) {
        job_fail(&s->j, EXR_ECORRUPT, 0, "chunk body: incorrect data check");
        return false;
    }
    return true;
}

static void run_decode(exr_merge *m, inslot *s)
{
    if (!read_body(s))
        return;
    if (s->c.codec == CODEC_STORED) {
        s->data = s->body;
    } else {
        if (!inflate_begin(s) || !inflate_body(s))
            return;
        s->data = s->raw;
    }
    check_records(m, s);
}

/* The slot's raw deflate stream made or reset, its output room reserved and
 * the zlib header deflate writes for this level put in front (RFC 1950). */
static bool deflate_begin(outslot *o, int level)
{
    uLong bound = deflateBound(NULL, (uLong)o->raw_len) + 64;
    if (reserve(&o->zout, &o->zout_cap, (size_t)bound)) {
        job_fail(&o->j, EXR_ENOMEM, 0, "");
        return false;
    }
    if (!o->zinit) {
        exr_zstream_init(&o->z);
        if (deflateInit2(&o->z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
            job_fail(&o->j, EXR_ENOMEM, 0, "");
            return false;
        }
        o->zinit = true;
    } else if (deflateReset(&o->z) != Z_OK) {
        job_fail(&o->j, EXR_ENOMEM, 0, "");
        return false;
    }
    unsigned hdr = 0x7800u | (level < 2 ? 0u : level < 6 ? 1u : level == 6 ? 2u : 3u) << 6;
    hdr += 31 - hdr % 31;
    o->zout[0] = (unsigned char)(hdr >> 8);
    o->zout[1] = (unsigned char)hdr;
    return true;
}

static void run_compress(exr_merge *m, outslot *o)
{
    if (m->level == 0) {
        o->body = o->raw;
        o->body_len = o->raw_len;
        o->body_crc = crc_of(o->body, o->body_len);
        return;
    }
    if (!deflate_begin(o, m->level))
        return;
    size_t fed = 0, made = 2, room = o->zout_cap - 4; /* 4: the trailer */
    int zr = Z_OK;
    o->z.avail_in = 0;
    o->z.avail_out = 0;
    while (zr == Z_OK || zr == Z_BUF_ERROR) {
        if (o->z.avail_in == 0 && fed < o->raw_len) {
            size_t k = o->raw_len - fed < PIECE ? o->raw_len - fed : PIECE;
            o->z.next_in = o->raw + fed;
            o->z.avail_in = (uInt)k;
            fed += k;
        }
        if (o->z.avail_out == 0) {
            size_t k = room - made < PIECE ? room - made : PIECE;
            if (!k)
                break;
            o->z.next_out = o->zout + made;
            o->z.avail_out = (uInt)k;
            made += k;
        }
        zr = deflate(&o->z, fed == o->raw_len ? Z_FINISH : Z_NO_FLUSH);
    }
    if (zr != Z_STREAM_END) {
        job_fail(&o->j, EXR_ENOMEM, 0, "");
        return;
    }
    size_t len = 2 + (size_t)o->z.total_out;
    uint32_t ad = exr_adler32(1, o->raw, o->raw_len);
    for (int i = 0; i < 4; i++)
        o->zout[len + (size_t)i] = (unsigned char)(ad >> (24 - 8 * i));
    o->body = o->zout;
    o->body_len = len + 4;
    o->body_crc = crc_of(o->body, o->body_len);
}

static void run_job(exr_merge *m, mjob *j)
{
    j->st = EXR_OK;
    if (j->kind == K_DECODE)
        run_decode(m, (inslot *)j);
    else
        run_compress(m, (outslot *)j);
}

/* With mu: j joins its queue. */
static void enqueue_locked(exr_merge *m, mjob *j)
{
    mjob **head = j->kind == K_DECODE ? &m->dq_head : &m->cq_head;
    mjob **tail = j->kind == K_DECODE ? &m->dq_tail : &m->cq_tail;
    j->state = J_QUEUED;
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
    pthread_cond_signal(&m->work);
}

/* With mu: takes j out of its queue (it is queued). */
static void unqueue_locked(exr_merge *m, mjob *j)
{
    mjob **head = j->kind == K_DECODE ? &m->dq_head : &m->cq_head;
    mjob **tail = j->kind == K_DECODE ? &m->dq_tail : &m->cq_tail;
    mjob *prev = NULL;
    for (mjob *x = *head; x; prev = x, x = x->next)
        if (x == j) {
            if (prev)
                prev->next = x->next;
            else
                *head = x->next;
            if (*tail == x)
                *tail = prev;
            x->next = NULL;
            return;
        }
}

static void enqueue(exr_merge *m, mjob *j)
{
    pthread_mutex_lock(&m->mu);
    enqueue_locked(m, j);
    pthread_mutex_unlock(&m->mu);
}

static void *worker(void *arg)
{
    exr_merge *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->stop && !m->dq_head && !m->cq_head)
            pthread_cond_wait(&m->work, &m->mu);
        if (m->stop)
            break;
        mjob *j = m->dq_head ? m->dq_head : m->cq_head;
        unqueue_locked(m, j);
        j->state = J_RUNNING;
        pthread_mutex_unlock(&m->mu);
        run_job(m, j);
        pthread_mutex_lock(&m->mu);
        j->state = J_DONE;
        pthread_cond_broadcast(&m->done);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* Returns once j is done: runs it here if no worker has taken it. */
static void wait_job(exr_merge *m, mjob *j)
{
    pthread_mutex_lock(&m->mu);
    while (j->state != J_DONE) {
        if (j->state == J_QUEUED) {
            unqueue_locked(m, j);
            j->state = J_RUNNING;
            pthread_mutex_unlock(&m->mu);
            run_job(m, j);
            pthread_mutex_lock(&m->mu);
            j->state = J_DONE;
            pthread_cond_broadcast(&m->done);
        } else {
            pthread_cond_wait(&m->done, &m->mu);
        }
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- setup ------------------------------------------------------------------ */

/* m's mutex and condition variables; false (none left made) if one fails. */
static bool sync_init(exr_merge *m)
{
    if (pthread_mutex_init(&m->mu, NULL) != 0)
        return false;
    if (pthread_cond_init(&m->work, NULL) == 0) {
        if (pthread_cond_init(&m->done, NULL) == 0)
            return true;
        pthread_cond_destroy(&m->work);
    }
    pthread_mutex_destroy(&m->mu);
    return false;
}

exr_status exr_merge_new(size_t nin, size_t row, size_t state_bytes, size_t chunk_bytes,
                         int level, int out_fd, int threads, exr_merge **out)
{
    if (!nin || !row || !state_bytes || state_bytes > row || row > SIZE_MAX / 4 ||
        !chunk_bytes || level < 0 || level > 9 || threads < 0 ||
        threads > EXR_MERGE_MAX_THREADS || nin > SIZE_MAX / sizeof(input))
        return EXR_EINVAL;
    exr_merge *m = calloc(1, sizeof *m);
    if (!m)
        return EXR_ENOMEM;
    m->nin = nin;
    m->row = row;
    m->sb = state_bytes;
    m->chunk_bytes = chunk_bytes;
    m->cap = chunk_bytes / (META + row);
    if (m->cap < 1)
        m->cap = 1;
    m->level = level;
    m->fd = out_fd;
    m->nthreads = threads;
    m->nout = threads + 2;
    m->cur = 0;
    m->in = calloc(nin, sizeof *m->in);
    m->out = calloc((size_t)m->nout, sizeof *m->out);
    if (!m->in || !m->out)
        goto nomem;
    for (size_t i = 0; i < nin; i++) {
        m->in[i].slot = calloc(EXR_MERGE_LOOK, sizeof(inslot));
        if (!m->in[i].slot)
            goto nomem;
        for (int k = 0; k < EXR_MERGE_LOOK; k++)
            m->in[i].slot[k].j.kind = K_DECODE;
    }
    for (int k = 0; k < m->nout; k++)
        m->out[k].j.kind = K_COMPRESS;
    if (!sync_init(m))
        goto nomem;
    for (int t = 0; t < threads; t++) {
        if (pthread_create(&m->th[t], NULL, worker, m) != 0)
            break; /* fewer workers: the caller's thread runs what they leave */
        m->started++;
    }
    *out = m;
    return EXR_OK;
nomem:
    if (m->in)
        for (size_t i = 0; i < nin; i++)
            free(m->in[i].slot);
    free(m->in);
    free(m->out);
    free(m);
    return EXR_ENOMEM;
}

void exr_merge_free(exr_merge *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_broadcast(&m->work);
    pthread_mutex_unlock(&m->mu);
    for (int t = 0; t < m->started; t++)
        pthread_join(m->th[t], NULL);
    for (size_t i = 0; i < m->nin; i++) {
        for (int k = 0; k < EXR_MERGE_LOOK; k++) {
            inslot *s = &m->in[i].slot[k];
            if (s->zinit)
                inflateEnd(&s->z);
            free(s->body);
            free(s->raw);
        }
        free(m->in[i].slot);
    }
    for (int k = 0; k < m->nout; k++) {
        outslot *o = &m->out[k];
        if (o->zinit)
            deflateEnd(&o->z);
        free(o->meta);
        free(o->raw);
        free(o->fins);
        free(o->zout);
    }
    free(m->in);
    free(m->out);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->work);
    pthread_cond_destroy(&m->done);
    free(m);
}

/* The length rules of docs/log.md, which the caller has checked already
 * (exreplay/log.py): checked again here, since the decode and the copy
 * index the body by them. */
static bool chunk_lengths_ok(const exr_merge *m, const exr_merge_chunk *c)
{
    if (m->row > EXR_MERGE_MAX_RAW)
        return false;
    uint64_t n = c->count, fixed = n * (uint64_t)(META + m->row); /* < 2^32 * 2^32 */
    if (!n || c->raw_len > EXR_MERGE_MAX_RAW)
        return false;
    if (c->kind == KIND_NOSTEP) { /* rows for some records only: checked exactly on decoding */
        if (n * META > c->raw_len || c->raw_len > fixed + n * (uint64_t)m->sb)
            return false;
    } else if (c->kind != KIND_RECORDS || fixed > c->raw_len || (c->raw_len - fixed) % m->sb ||
               (c->raw_len - fixed) / m->sb > n) {
        return false;
    }
    if (c->codec == CODEC_STORED)
        return c->body_len == c->raw_len;
    /* a zlib body too short for its wrapper passes, as the reader's header
     * rules pass it: decoding refuses it (inflate_begin), naming the chunk */
    return c->codec == CODEC_ZLIB &&
           (c->body_len >= ((uint64_t)1 << 40) || c->raw_len <= c->body_len * 1032 + 64);
}

exr_status exr_merge_push(exr_merge *m, size_t i, const exr_merge_chunk *c)
{
    if (i >= m->nin || m->in[i].ended || m->in[i].queued >= EXR_MERGE_LOOK ||
        !chunk_lengths_ok(m, c) || m->finished || m->err.st != EXR_OK)
        return EXR_EINVAL;
    input *in = &m->in[i];
    inslot *s = &in->slot[(in->head + in->queued) % EXR_MERGE_LOOK];
    s->c = *c;
    s->ready = false;
    s->rec = s->row = s->fin = 0;
    s->data = NULL;
    in->queued++;
    enqueue(m, &s->j);
    return EXR_OK;
}

void exr_merge_end(exr_merge *m, size_t i)
{
    if (i < m->nin)
        m->in[i].ended = true;
}

const exr_merge_error *exr_merge_last_error(const exr_merge *m) { return &m->err; }

void exr_merge_result(const exr_merge *m, uint64_t *records, uint64_t *chunks, int64_t *last_ts)
{
    *records = m->records;
    *chunks = m->chunks;
    *last_ts = m->last_ts;
}

/* ---- the merge ---------------------------------------------------------------- */

static exr_status fail(exr_merge *m, exr_status st, size_t input, uint64_t tag, int errnum,
                       const char *what)
{
    if (m->err.st == EXR_OK) {
        m->err.st = st;
        m->err.input = input;
        m->err.tag = tag;
        m->err.errnum = errnum;
        snprintf(m->err.what, sizeof m->err.what, "%s", what);
    }
    return m->err.st;
}

/* Waits for output slot k's job and writes its chunk (it is the next in order). */
static exr_status write_slot(exr_merge *m, int k)
{
    outslot *o = &m->out[k];
    wait_job(m, &o->j);
    if (o->j.st != EXR_OK)
        return fail(m, o->j.st, 0, 0, o->j.errnum, o->j.what);
    unsigned char hd[EXR_LOG_CHUNK_HEADER], tr[EXR_LOG_CHUNK_TRAILER];
    const unsigned char *ts = o->raw;
    unsigned kind = o->nrows < o->n ? KIND_NOSTEP : KIND_RECORDS;
    exr_log_chunk_header(hd, kind, m->level ? CODEC_ZLIB : CODEC_STORED, (uint32_t)o->n,
                         o->mixed ? MIXED : o->source, (int64_t)get64(ts),
                         (int64_t)get64(ts + 8 * (o->n - 1)), o->raw_len, o->body_len,
                         o->body_crc);
    exr_log_chunk_trailer(tr, EXR_LOG_CHUNK_HEADER + o->body_len + EXR_LOG_CHUNK_TRAILER, hd);
    struct iovec iov[3] = {{hd, sizeof hd}, {(void *)o->body, o->body_len}, {tr, sizeof tr}};
    if (exr_log_write_all(m->fd, iov, 3) != EXR_OK)
        return fail(m, EXR_EIO, EXR_MERGE_OUTPUT, 0, errno, "");
    m->records += o->n;
    m->chunks++;
    m->last_ts = (int64_t)get64(ts + 8 * (o->n - 1));
    o->busy = false;
    o->n = o->nrows = o->nfin = 0;
    o->j.state = J_IDLE;
    m->wnext = (m->wnext + 1) % m->nout;
    return EXR_OK;
}

/* Writes every sealed chunk whose job is done, in order; with `all`, waits
 * for the rest too. */
static exr_status write_done(exr_merge *m, bool all)
{
    for (;;) {
        outslot *o = &m->out[m->wnext];
        if (!o->busy)
            return EXR_OK;
        if (!all) {
            pthread_mutex_lock(&m->mu);
            int st = o->j.state;
            pthread_mutex_unlock(&m->mu);
            if (st != J_DONE)
                return EXR_OK;
        }
        exr_status s = write_slot(m, m->wnext);
        if (s != EXR_OK)
            return s;
    }
}

/* The current output chunk's raw body is made whole (columns, rows, final
 * states in place) and goes to a compress job; the next slot becomes current. */
static exr_status seal(exr_merge *m)
{
    outslot *o = &m->out[m->cur];
    size_t n = o->n, cap = m->cap, nrows = o->nrows;
    size_t rows_at = META * n, need = META * n + nrows * m->row + o->nfin * m->sb;
    if (need > o->raw_cap) {
        if (reserve(&o->raw, &o->raw_cap, need))
            return fail(m, EXR_ENOMEM, 0, 0, 0, "");
    }
    if (n < cap)
        memmove(o->raw + rows_at, o->raw + META * cap, nrows * m->row);
    static const size_t width[5] = {8, 8, 8, 4, 1};
    unsigned char *p = o->raw, *q = o->meta;
    for (int c = 0; c < 5; c++) {
        memcpy(p, q, width[c] * n);
        p += width[c] * n;
        q += width[c] * cap;
    }
    if (o->nfin)
        memcpy(o->raw + rows_at + nrows * m->row, o->fins, o->nfin * m->sb);
    o->raw_len = need;
    o->busy = true;
    enqueue(m, &o->j);
    m->cur = (m->cur + 1) % m->nout;
    exr_status s = write_done(m, false);
    if (s == EXR_OK && m->out[m->cur].busy)
        s = write_slot(m, m->cur); /* the oldest: wnext == cur */
    return s;
}

/* Room in the current output slot for its first record. */
static exr_status out_ready(exr_merge *m, outslot *o)
{
    size_t cap = m->cap;
    if (!o->meta && !(o->meta = malloc(META * cap)))
        return fail(m, EXR_ENOMEM, 0, 0, 0, "");
    if (reserve(&o->raw, &o->raw_cap, META * cap + cap * m->row))
        return fail(m, EXR_ENOMEM, 0, 0, 0, "");
    return EXR_OK;
}

/* The head chunk of input i, decoded (or the error of its decoding). */
static exr_status head_ready(exr_merge *m, size_t i, inslot **out)
{
    input *in = &m->in[i];
    inslot *s = &in->slot[in->head];
    if (!s->ready) {
        wait_job(m, &s->j);
        if (s->j.st != EXR_OK)
            return fail(m, s->j.st, i, s->c.tag, s->j.errnum, s->j.what);
        s->ready = true;
    }
    *out = s;
    return EXR_OK;
}

/* Copies record bs->rec of input chunk bs into the current output chunk
 * (sealing it when full) and advances bs's cursor. */
static exr_status copy_record(exr_merge *m, inslot *bs)
{
    size_t row = m->row, sb = m->sb, cap = m->cap, n = bs->c.count;
    const unsigned char *d = bs->data, *fl = d + 28 * n;
    outslot *o = &m->out[m->cur];
    exr_status s;
    if (o->n == 0 && (s = out_ready(m, o)) != EXR_OK)
        return s;
    size_t r = bs->rec, k = o->n;
    unsigned char *q = o->meta;
    memcpy(q + 8 * k, d + 8 * r, 8);
    memcpy(q + 8 * cap + 8 * k, d + 8 * n + 8 * r, 8);
    memcpy(q + 16 * cap + 8 * k, d + 16 * n + 8 * r, 8);
    memcpy(q + 24 * cap + 4 * k, d + 24 * n + 4 * r, 4);
    q[28 * cap + k] = fl[r];
    uint32_t src = get32(d + 24 * n + 4 * r);
    if (k == 0) {
        o->source = src;
        o->mixed = false;
    } else if (src != o->source) {
        o->mixed = true;
    }
    if (!(fl[r] & EXR_LOG_NOSTEP)) { /* a record without a step has no row */
        memcpy(o->raw + META * cap + o->nrows * row, d + META * n + bs->row * row, row);
        o->nrows++;
        bs->row++;
    }
    if (fl[r] & EXR_LOG_FINAL) {
        if (o->fins_cap < (o->nfin + 1) * sb &&
            reserve(&o->fins, &o->fins_cap, (2 * o->nfin + 1) * sb))
            return fail(m, EXR_ENOMEM, 0, 0, 0, "");
        memcpy(o->fins + o->nfin * sb, d + META * n + bs->nrows * row + bs->fin * sb, sb);
        o->nfin++;
        bs->fin++;
    }
    o->n++;
    bs->rec++;
    if (o->n == cap || o->n * META + o->nrows * row + o->nfin * sb >= m->chunk_bytes)
        return seal(m);
    return EXR_OK;
}

/* The input whose next record comes first (*best: the smallest timestamp,
 * the lowest index among equals; nin if every input is done) and the next
 * after it (*second, its timestamp *t2). */
static exr_status pick(exr_merge *m, size_t *best, inslot **bs, size_t *second, int64_t *t2)
{
    size_t nin = m->nin;
    int64_t bt = 0;
    *best = *second = nin;
    *t2 = 0;
    for (size_t i = 0; i < nin; i++) {
        if (!m->in[i].queued)
            continue;
        inslot *x = NULL;
        exr_status s = head_ready(m, i, &x);
        if (s != EXR_OK)
            return s;
        int64_t t = (int64_t)get64(x->data + 8 * x->rec);
        if (*best == nin || t < bt) {
            *second = *best;
            *t2 = bt;
            *best = i;
            bt = t;
            *bs = x;
        } else if (*second == nin || t < *t2) {
            *second = i;
            *t2 = t;
        }
    }
    return EXR_OK;
}

exr_status exr_merge_run(exr_merge *m, long *need)
{
    if (m->err.st != EXR_OK)
        return m->err.st;
    size_t nin = m->nin, best, second;
    exr_status s;
    while (!m->finished) {
        for (size_t i = 0; i < nin; i++)
            if (!m->in[i].ended && m->in[i].queued < EXR_MERGE_LOOK) {
                *need = (long)i;
                return EXR_OK;
            }
        inslot *bs = NULL;
        int64_t t2;
        if ((s = pick(m, &best, &bs, &second, &t2)) != EXR_OK)
            return s;
        if (best == nin) {
            if (m->out[m->cur].n && (s = seal(m)) != EXR_OK)
                return s;
            if ((s = write_done(m, true)) != EXR_OK)
                return s;
            m->finished = true;
            break;
        }
        /* a run of best's records: up to the other inputs' next timestamp
         * (equal ones too when best comes first among them) or the end of
         * its chunk */
        size_t n = bs->c.count;
        for (;;) {
            if ((s = copy_record(m, bs)) != EXR_OK)
                return s;
            if (bs->rec == n)
                break;
            int64_t t = (int64_t)get64(bs->data + 8 * bs->rec);
            if (second != nin && (t > t2 || (t == t2 && second < best)))
                break;
        }
        if (bs->rec == n) {
            input *in = &m->in[best];
            bs->j.state = J_IDLE;
            in->head = (in->head + 1) % EXR_MERGE_LOOK;
            in->queued--;
        }
    }
    *need = -1;
    return EXR_OK;
}
