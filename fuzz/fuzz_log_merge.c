/*
 * fuzz_log_merge.c - libFuzzer harness for the experience log's merge engine
 * (src/core/log_merge.c: exr_merge_push + exr_merge_run), the C code that
 * reads log chunks from disk: each chunk's body is read (pread), its CRC
 * checked, inflated (the engine's own zlib wrapper and Adler-32) and its
 * records checked, then merged in timestamp order and written out
 * (docs/log.md, "Merging"; docs/fuzzing.md).
 *
 * An input is 4 bytes of setup, then up to 4 input logs:
 *   byte 0  bits 0-1 threads (0, 1, 2, 0), bits 2-3 level (0, 1, 6, 9),
 *           bits 4-5 chunk_bytes (1, 97, 1024, 2^20), bits 6-7 the mode below
 *   byte 1  state bytes - 1 (mod 64); byte 2 row - state bytes (mod 64)
 *   byte 3  inputs - 1 (mod 4)
 *   then per input: a u16 length and that many bytes, its chunks (a log
 *   without its file header, which the engine never reads).
 * Modes: 0 the chunks as they are (the CRCs must check out); 1 the header
 * CRC, body CRC and trailer fixed up; 2 each chunk's body is its raw body
 * (body length field: its length), which the harness compresses when the
 * codec is zlib, with raw length, body length, CRCs and trailer fixed up;
 * 3 as 2, and the header's first and last timestamps taken from the body.
 *
 * The harness plays exreplay/log.py's part: it walks each input's chunks
 * as merge's caller does (torn tail, end marker, header rules, order across
 * chunks), pushes the chunks the engine asks for into memfd files, and
 * decodes each chunk itself (zlib's own inflate, the reader's checks). Then:
 * - exr_merge_push takes a chunk exactly when the caller's header rules
 *   do (the engine checks the length rules itself);
 * - exr_merge_run succeeds exactly when every pushed chunk decodes; a
 *   failure is EXR_ECORRUPT naming an input and a chunk that does not;
 * - a merge's output read back (CRCs, lengths, zlib, trailers) holds every
 *   record of the inputs, byte for byte, in (timestamp, input, order)
 *   order, in chunks sealed when full, with counts exr_merge_result agrees
 *   with;
 * - exr_adler32 equals zlib's adler32 on the input.
 * Anything else aborts, which libFuzzer reports as a crash.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <zlib.h>

#include "le.h"
#include "log.h"
#include "log_merge.h"

#define MAXIN 4
#define MAXCH 512
#define META 29
#define HDR EXR_LOG_CHUNK_HEADER
#define TRL EXR_LOG_CHUNK_TRAILER
#define MIXED 0xFFFFFFFFu

typedef struct {
    exr_merge_chunk c;
    unsigned char *raw; /* the reference decode; NULL if the chunk does not decode */
    size_t nrows, nfin;
} chunk;

typedef struct {
    unsigned char *file; /* what is written to the input's memfd */
    size_t len, cap;
    chunk ch[MAXCH];
    size_t nch, pushed;
    bool has_bad; /* a chunk the caller refuses by its header: push must refuse it */
    exr_merge_chunk bad;
    int64_t last_ts;
    int fd;
} input;

typedef struct {
    size_t nin, row, sb, chunk_bytes;
    int level, threads, mode;
    input in[MAXIN];
} setup;

typedef struct { /* one record of an input, where the reference decode has it */
    const chunk *ch;
    size_t rec, row, fin, in, seq; /* seq: its place in the inputs' order */
} rec;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_log_merge: %s\n", what);
    abort();
}

static bool append(input *x, const void *p, size_t n)
{
    if (x->len + n > x->cap) {
        size_t cap = 2 * (x->len + n) + 256;
        unsigned char *q = realloc(x->file, cap);
        if (!q)
            return false;
        x->file = q;
        x->cap = cap;
    }
    if (n)
        memcpy(x->file + x->len, p, n);
    x->len += n;
    return true;
}

static uint32_t crc(const void *p, size_t n)
{
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

/* ---- the caller's header rules (exreplay/log.py, _parse_header) ---------- */

/* Kind, codec and the length rules of docs/log.md: what exr_merge_push
 * checks again. */
static bool lengths_ok(const setup *s, const exr_merge_chunk *c)
{
    uint64_t n = c->count, raw = c->raw_len, row = s->row, sb = s->sb;
    if ((c->kind != EXR_LOG_KIND_RECORDS && c->kind != EXR_LOG_KIND_NOSTEP) || c->codec > 1)
        return false;
    if (n < 1 || raw > EXR_MERGE_MAX_RAW)
        return false;
    if (c->kind == EXR_LOG_KIND_NOSTEP) {
        if (n * META > raw || raw > n * (META + row + sb))
            return false;
    } else if (n * (META + row) > raw || (raw - n * (META + row)) % sb ||
               (raw - n * (META + row)) / sb > n) {
        return false;
    }
    if (c->codec == 0)
        return c->body_len == raw;
    return c->body_len >= ((uint64_t)1 << 40) || raw <= c->body_len * 1032 + 64;
}

static void parse_header(const unsigned char *h, exr_merge_chunk *c)
{
    memset(c, 0, sizeof *c);
    c->kind = get16(h + 4);
    c->codec = get16(h + 6);
    c->count = get32(h + 8);
    c->source = get32(h + 12);
    c->first = (int64_t)get64(h + 16);
    c->last = (int64_t)get64(h + 24);
    c->raw_len = get64(h + 32);
    c->body_len = get64(h + 40);
    c->body_crc = get32(h + 48);
}

/* ---- the reference decode (exreplay/log.py, _decode) ---------------------- */

static unsigned char *inflate_all(const unsigned char *body, size_t blen, size_t raw_len)
{
    unsigned char *raw = malloc(raw_len ? raw_len : 1);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (!raw || inflateInit(&z) != Z_OK)
        fail("out of memory in the reference decode");
    z.next_in = (unsigned char *)body;
    z.avail_in = (uInt)blen;
    z.next_out = raw;
    z.avail_out = (uInt)raw_len;
    int r = inflate(&z, Z_FINISH);
    bool ok = r == Z_STREAM_END && z.total_out == raw_len && z.avail_in == 0;
    inflateEnd(&z);
    if (!ok) {
        free(raw);
        return NULL;
    }
    return raw;
}

/* The flags column, and the raw length it implies. */
static bool ref_flags(const setup *s, chunk *k, const unsigned char *raw)
{
    const exr_merge_chunk *c = &k->c;
    size_t n = c->count, nrows = 0, nfin = 0;
    unsigned allowed = c->kind == EXR_LOG_KIND_NOSTEP ? 15u : 7u;
    for (size_t i = 0; i < n; i++) {
        unsigned f = raw[28 * n + i];
        if ((f & ~allowed) || ((f & 14u) && !(f & 1u)) || ((f & 8u) && !(f & 6u)))
            return false;
        nrows += !(f & 8u);
        nfin += (f & 4u) != 0;
    }
    k->nrows = nrows;
    k->nfin = nfin;
    return n * META + nrows * s->row + nfin * s->sb == c->raw_len;
}

static bool ref_records(const chunk *k, const unsigned char *raw)
{
    const exr_merge_chunk *c = &k->c;
    size_t n = c->count;
    if ((int64_t)get64(raw) != c->first || (int64_t)get64(raw + 8 * (n - 1)) != c->last)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (i && (int64_t)get64(raw + 8 * i) < (int64_t)get64(raw + 8 * (i - 1)))
            return false;
        if ((int64_t)get64(raw + 16 * n + 8 * i) < 0)
            return false;
        uint32_t src = get32(raw + 24 * n + 4 * i);
        if (src == MIXED || (c->source != MIXED && src != c->source))
            return false;
    }
    return true;
}

/* k->raw: the chunk's raw body if it decodes as the reader decodes it. */
static void ref_decode(const setup *s, chunk *k, const unsigned char *body)
{
    const exr_merge_chunk *c = &k->c;
    unsigned char *raw = NULL;
    k->raw = NULL;
    if (crc(body, c->body_len) != c->body_crc)
        return;
    if (c->codec == 0) {
        raw = malloc(c->raw_len ? c->raw_len : 1);
        if (!raw)
            fail("out of memory in the reference decode");
        memcpy(raw, body, c->raw_len);
    } else if (!(raw = inflate_all(body, c->body_len, c->raw_len))) {
        return;
    }
    if (ref_flags(s, k, raw) && ref_records(k, raw))
        k->raw = raw;
    else
        free(raw);
}

/* ---- the caller's walk (exreplay/log.py, LogReader._headers) -------------- */

/* A chunk's header, body and trailer as the mode makes them from the input
 * at p (n bytes left); false at a torn tail. *used: input bytes taken. */
static bool make_chunk(const setup *s, const unsigned char *p, size_t n, unsigned char *hd,
                       unsigned char **body, size_t *used)
{
    memcpy(hd, p, HDR);
    uint64_t blen = get64(hd + 40);
    if (blen > n - HDR || n - HDR - blen < TRL)
        return false;
    *used = HDR + blen + TRL;
    *body = malloc(blen ? blen : 1);
    if (!*body)
        fail("out of memory");
    memcpy(*body, p + HDR, blen);
    if (s->mode >= 2) {
        put64(hd + 32, blen); /* the raw length */
        if (get16(hd + 6) == 1) {
            uLongf zl = compressBound((uLong)blen);
            unsigned char *z = malloc(zl);
            if (!z || compress2(z, &zl, *body, (uLong)blen, 1) != Z_OK)
                fail("out of memory");
            free(*body);
            *body = z;
            put64(hd + 40, zl);
        }
        uint32_t cnt = get32(hd + 8);
        if (s->mode == 3 && cnt && blen >= 8 * (uint64_t)cnt) {
            memcpy(hd + 16, p + HDR, 8);
            memcpy(hd + 24, p + HDR + 8 * ((size_t)cnt - 1), 8);
        }
    }
    if (s->mode >= 1) {
        put32(hd + 48, crc(*body, get64(hd + 40)));
        put32(hd + 52, crc(hd, 52));
    }
    return true;
}

/* The caller's checks of a chunk, in its order; false: the input ends here. */
static bool caller_takes(const setup *s, input *x, const unsigned char *hd,
                         const unsigned char *tr, exr_merge_chunk *c)
{
    if (memcmp(hd, "XRCK", 4) || crc(hd, 52) != get32(hd + 52))
        return false;
    parse_header(hd, c);
    if (c->kind == EXR_LOG_KIND_END)
        return false; /* the end marker: nothing after it counts */
    if (!lengths_ok(s, c)) {
        x->has_bad = true;
        x->bad = *c;
        return false;
    }
    if (c->first > c->last)
        return false;
    if (s->mode == 0 && (get64(tr) != HDR + c->body_len + TRL || get32(tr + 8) != get32(hd + 52) ||
                         memcmp(tr + 12, "XREN", 4)))
        return false;
    if (x->nch && c->first < x->last_ts)
        return false;
    return true;
}

/* A header (as the input has it) that the caller refuses by its lengths. */
static bool header_refused(const setup *s, input *x, const unsigned char *hd)
{
    exr_merge_chunk c;
    if (memcmp(hd, "XRCK", 4) || (s->mode == 0 && crc(hd, 52) != get32(hd + 52)))
        return false;
    parse_header(hd, &c);
    if (c.kind == EXR_LOG_KIND_END || lengths_ok(s, &c))
        return false;
    x->has_bad = true;
    x->bad = c;
    return true;
}

static void walk(const setup *s, input *x, const unsigned char *p, size_t n)
{
    size_t off = 0, used = 0;
    unsigned char hd[HDR], tr[TRL];
    while (n - off >= HDR && x->nch < MAXCH) {
        unsigned char *body = NULL;
        if (s->mode < 2 && header_refused(s, x, p + off))
            return; /* the caller checks a header before it looks for the body */
        if (!make_chunk(s, p + off, n - off, hd, &body, &used))
            return;
        memcpy(tr, p + off + used - TRL, TRL);
        chunk *k = &x->ch[x->nch];
        if (!caller_takes(s, x, hd, tr, &k->c)) {
            free(body);
            return;
        }
        k->c.tag = x->len;
        k->c.body_off = x->len + HDR;
        exr_log_chunk_trailer(tr, HDR + k->c.body_len + TRL, hd);
        if (!append(x, hd, HDR) || !append(x, body, k->c.body_len) || !append(x, tr, TRL))
            fail("out of memory");
        ref_decode(s, k, body);
        free(body);
        x->last_ts = k->c.last;
        x->nch++;
        off += used;
    }
}

/* ---- the merge ------------------------------------------------------------ */

/* Feeds the engine what it asks for, as exreplay/log.py's _merge_run does. */
static exr_status drive(setup *s, exr_merge *m)
{
    for (;;) {
        long need = -2;
        exr_status st = exr_merge_run(m, &need);
        if (st != EXR_OK || need == -1)
            return st;
        if (need < 0 || (size_t)need >= s->nin)
            fail("exr_merge_run asked for an input that is not there");
        input *x = &s->in[need];
        if (x->pushed < x->nch) {
            chunk *k = &x->ch[x->pushed++];
            k->c.fd = x->fd;
            if (exr_merge_push(m, (size_t)need, &k->c) != EXR_OK)
                fail("exr_merge_push refused a chunk whose header the caller takes");
            continue;
        }
        if (x->has_bad) {
            x->bad.fd = x->fd;
            if (exr_merge_push(m, (size_t)need, &x->bad) == EXR_OK)
                fail("exr_merge_push took a chunk whose lengths break docs/log.md");
            x->has_bad = false;
        }
        exr_merge_end(m, (size_t)need);
    }
}

/* A failed merge: ECORRUPT, naming an input and a pushed chunk that does not
 * decode. */
static void check_failure(const setup *s, exr_merge *m, exr_status st)
{
    const exr_merge_error *e = exr_merge_last_error(m);
    if (st != EXR_ECORRUPT || e->st != EXR_ECORRUPT)
        fail("the merge failed with a status other than EXR_ECORRUPT");
    if (e->input >= s->nin || !e->what[0])
        fail("a merge's error names no input or says nothing");
    const input *x = &s->in[e->input];
    for (size_t j = 0; j < x->pushed; j++)
        if (x->ch[j].c.tag == e->tag && !x->ch[j].raw)
            return;
    fprintf(stderr, "error: input %zu tag %llu: %s\n", e->input, (unsigned long long)e->tag,
            e->what);
    fail("a merge failed on a chunk that decodes");
}

static int64_t ts_of(const rec *r) { return (int64_t)get64(r->ch->raw + 8 * r->rec); }

static int rec_cmp(const void *a, const void *b)
{
    const rec *x = a, *y = b;
    int64_t tx = ts_of(x), ty = ts_of(y);
    if (tx != ty)
        return tx < ty ? -1 : 1;
    if (x->in != y->in)
        return x->in < y->in ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Every record of the inputs, in the order the merge must write them. */
static rec *expected(const setup *s, size_t *nrec)
{
    size_t total = 0, k = 0;
    for (size_t i = 0; i < s->nin; i++)
        for (size_t j = 0; j < s->in[i].nch; j++)
            total += s->in[i].ch[j].c.count;
    rec *r = malloc((total ? total : 1) * sizeof *r);
    if (!r)
        fail("out of memory");
    for (size_t i = 0; i < s->nin; i++)
        for (size_t j = 0; j < s->in[i].nch; j++) {
            const chunk *c = &s->in[i].ch[j];
            size_t row = 0, fin = 0;
            for (size_t q = 0; q < c->c.count; q++) {
                unsigned f = c->raw[28 * c->c.count + q];
                r[k] = (rec){c, q, row, fin, i, k};
                k++;
                row += !(f & EXR_LOG_NOSTEP);
                fin += (f & EXR_LOG_FINAL) != 0;
            }
        }
    qsort(r, total, sizeof *r, rec_cmp);
    *nrec = total;
    return r;
}

static const unsigned char *rec_field(const rec *r, size_t col_off, size_t width)
{
    return r->ch->raw + col_off * r->ch->c.count + width * r->rec;
}

/* The raw body the merge must write for records e[0..n). */
static unsigned char *expected_raw(const setup *s, const rec *e, size_t n, size_t *len,
                                   size_t *nrows_out)
{
    size_t nrows = 0, nfin = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned f = *rec_field(&e[i], 28, 1);
        nrows += !(f & EXR_LOG_NOSTEP);
        nfin += (f & EXR_LOG_FINAL) != 0;
    }
    *len = n * META + nrows * s->row + nfin * s->sb;
    *nrows_out = nrows;
    unsigned char *raw = malloc(*len), *rows = raw + n * META, *fins = rows + nrows * s->row;
    if (!raw)
        fail("out of memory");
    static const size_t col[5] = {0, 8, 16, 24, 28}, width[5] = {8, 8, 8, 4, 1};
    for (size_t i = 0; i < n; i++) {
        const rec *r = &e[i];
        const chunk *c = r->ch;
        for (int k = 0; k < 5; k++)
            memcpy(raw + col[k] * n + width[k] * i, rec_field(r, col[k], width[k]), width[k]);
        unsigned f = *rec_field(r, 28, 1);
        const unsigned char *crows = c->raw + META * c->c.count;
        if (!(f & EXR_LOG_NOSTEP)) {
            memcpy(rows, crows + r->row * s->row, s->row);
            rows += s->row;
        }
        if (f & EXR_LOG_FINAL) {
            memcpy(fins, crows + c->nrows * s->row + r->fin * s->sb, s->sb);
            fins += s->sb;
        }
    }
    return raw;
}

/* The header the merge must write for records e[0..n) (body_len, body CRC
 * and header CRC aside). */
static void check_out_header(const setup *s, const exr_merge_chunk *c, const rec *e, size_t n,
                             size_t raw_len, size_t nrows, bool last)
{
    uint32_t src = get32(rec_field(&e[0], 24, 4));
    for (size_t i = 1; i < n; i++)
        if (get32(rec_field(&e[i], 24, 4)) != src)
            src = MIXED;
    if (c->kind != (nrows < n ? EXR_LOG_KIND_NOSTEP : EXR_LOG_KIND_RECORDS))
        fail("output chunk of the wrong kind");
    if (c->codec != (s->level ? 1u : 0u) || c->source != src)
        fail("output chunk of the wrong codec or source");
    if (c->first != ts_of(&e[0]) || c->last != ts_of(&e[n - 1]) || c->raw_len != raw_len)
        fail("output chunk's timestamps or raw length are not its records'");
    size_t cap = s->chunk_bytes / (META + s->row);
    if (cap < 1)
        cap = 1;
    if (n > cap)
        fail("output chunk holds more records than fit chunk_bytes");
    /* sealed once full, not before and not later; the last chunk holds the rest */
    unsigned f = *rec_field(&e[n - 1], 28, 1);
    size_t lastlen = META + (f & EXR_LOG_NOSTEP ? 0 : s->row) + (f & EXR_LOG_FINAL ? s->sb : 0);
    if (n > 1 && raw_len - lastlen >= s->chunk_bytes)
        fail("output chunk sealed later than chunk_bytes says");
    if (!last && n < cap && raw_len < s->chunk_bytes)
        fail("output chunk sealed before it was full");
}

/* The output chunk at p (left bytes) holds records e[0..n) with n its count;
 * returns its length. */
static size_t check_out_chunk(const setup *s, const unsigned char *p, size_t left, const rec *e,
                              size_t nleft, size_t *n_out)
{
    exr_merge_chunk c;
    if (left < HDR + TRL || memcmp(p, "XRCK", 4) || crc(p, 52) != get32(p + 52))
        fail("output chunk header broken");
    parse_header(p, &c);
    size_t n = c.count, raw_len, nrows;
    if (!n || n > nleft || c.body_len > left - HDR - TRL)
        fail("output chunk count or length out of range");
    unsigned char *want = expected_raw(s, e, n, &raw_len, &nrows);
    check_out_header(s, &c, e, n, raw_len, nrows, n == nleft);
    const unsigned char *body = p + HDR;
    if (crc(body, c.body_len) != c.body_crc)
        fail("output chunk body CRC mismatch");
    unsigned char *raw = NULL;
    if (c.codec == 0 && c.body_len != raw_len)
        fail("stored output chunk of the wrong length");
    if (c.codec == 1 && !(raw = inflate_all(body, c.body_len, raw_len)))
        fail("output chunk body does not inflate (zlib) to its raw length");
    if (memcmp(raw ? raw : body, want, raw_len))
        fail("output chunk holds other records than the inputs'");
    free(raw);
    free(want);
    unsigned char tr[TRL];
    exr_log_chunk_trailer(tr, HDR + c.body_len + TRL, p);
    if (memcmp(p + HDR + c.body_len, tr, TRL))
        fail("output chunk trailer broken");
    *n_out = n;
    return HDR + c.body_len + TRL;
}

/* The merge's output (out_fd, from offset 0) against the inputs' records. */
static void check_output(const setup *s, exr_merge *m, int out_fd)
{
    off_t size = lseek(out_fd, 0, SEEK_END);
    unsigned char *out = malloc(size > 0 ? (size_t)size : 1);
    if (size < 0 || !out || pread(out_fd, out, (size_t)size, 0) != (ssize_t)size)
        fail("cannot read the merge's output back");
    size_t nrec = 0, done = 0, off = 0, chunks = 0, n = 0;
    rec *e = expected(s, &nrec);
    while (off < (size_t)size) {
        if (done == nrec)
            fail("output holds more chunks than the inputs have records for");
        off += check_out_chunk(s, out + off, (size_t)size - off, e + done, nrec - done, &n);
        done += n;
        chunks++;
    }
    if (done != nrec)
        fail("output lacks records of the inputs");
    uint64_t records = 0, nchunks = 0;
    int64_t last_ts = 0;
    exr_merge_result(m, &records, &nchunks, &last_ts);
    if (records != nrec || nchunks != chunks || (nrec && last_ts != ts_of(&e[nrec - 1])))
        fail("exr_merge_result disagrees with the output");
    free(e);
    free(out);
}

static bool all_decode(const setup *s)
{
    for (size_t i = 0; i < s->nin; i++)
        for (size_t j = 0; j < s->in[i].nch; j++)
            if (!s->in[i].ch[j].raw)
                return false;
    return true;
}

static void run_merge(setup *s)
{
    int out_fd = memfd_create("out", MFD_CLOEXEC);
    exr_merge *m = NULL;
    if (out_fd < 0)
        fail("memfd_create");
    if (exr_merge_new(s->nin, s->row, s->sb, s->chunk_bytes, s->level, out_fd, s->threads, &m))
        fail("exr_merge_new refused a valid setup");
    exr_status st = drive(s, m);
    if (st != EXR_OK)
        check_failure(s, m, st);
    else if (!all_decode(s))
        fail("a merge took a chunk that does not decode");
    else
        check_output(s, m, out_fd);
    exr_merge_free(m);
    close(out_fd);
}

/* The inputs' files, from the fuzzer's bytes (p, n) after the setup. */
static void make_inputs(setup *s, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < s->nin; i++) {
        input *x = &s->in[i];
        size_t len = n >= 2 ? get16(p) : 0;
        size_t skip = n >= 2 ? 2 : n;
        p += skip;
        n -= skip;
        if (len > n)
            len = n;
        walk(s, x, p, len);
        p += len;
        n -= len;
        x->fd = memfd_create("in", MFD_CLOEXEC);
        if (x->fd < 0 || (x->len && write(x->fd, x->file, x->len) != (ssize_t)x->len))
            fail("cannot write an input file");
    }
}

/* exr_adler32 (SSSE3 where the CPU has it) against zlib's. */
static void check_adler(const uint8_t *data, size_t size)
{
    uint32_t start = size >= 4 ? get32(data) : 1;
    start = (start & 0xffff) % 65521u | ((start >> 16) % 65521u) << 16;
    for (size_t skip = 0; skip < 4 && skip <= size; skip += 3)
        if (exr_adler32(start, data + skip, size - skip) !=
            (uint32_t)adler32(start, data + skip, (uInt)(size - skip)))
            fail("exr_adler32 differs from zlib's adler32");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int levels[4] = {0, 1, 6, 9};
    static const size_t chunk_bytes[4] = {1, 97, 1024, (size_t)1 << 20};
    check_adler(data, size);
    if (size < 4)
        return 0;
    setup *s = calloc(1, sizeof *s);
    if (!s)
        return 0;
    s->threads = (data[0] & 3) == 3 ? 0 : data[0] & 3;
    s->level = levels[(data[0] >> 2) & 3];
    s->chunk_bytes = chunk_bytes[(data[0] >> 4) & 3];
    s->mode = data[0] >> 6;
    s->sb = 1 + data[1] % 64;
    s->row = s->sb + data[2] % 64;
    s->nin = 1 + data[3] % MAXIN;
    make_inputs(s, data + 4, size - 4);
    run_merge(s);
    for (size_t i = 0; i < s->nin; i++) {
        for (size_t j = 0; j < s->in[i].nch; j++)
            free(s->in[i].ch[j].raw);
        free(s->in[i].file);
        close(s->in[i].fd);
    }
    free(s);
    return 0;
}
