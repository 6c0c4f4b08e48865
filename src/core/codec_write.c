/*
 * codec_write.c - writes the serialized form (docs/format.md): the payload
 * streamed through zlib into a sink.
 */
#include "codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "buffer_impl.h"
#include "codec_impl.h"

struct exr_out {
    exr_progress_fn progress;
    void *progress_ctx;
    uint64_t total, next_report;
    int level;
    z_stream z;
    unsigned char *buf; /* CHUNK bytes of output waiting for the sink */
    size_t used;
    exr_sink_fn sink;
    void *ctx;
    uint32_t crc;
    uint64_t raw, body;
};

static exr_status out_flush(exr_out *o)
{
    if (!o->used)
        return EXR_OK;
    exr_status st = o->sink(o->ctx, o->buf, o->used);
    o->body += o->used;
    o->used = 0;
    return st;
}

static exr_status deflate_some(exr_out *o, int flush)
{
    for (;;) {
        o->z.next_out = o->buf + o->used;
        o->z.avail_out = (uInt)(CHUNK - o->used);
        int r = deflate(&o->z, flush);
        o->used = CHUNK - o->z.avail_out;
        if (r == Z_STREAM_ERROR)
            return EXR_ENOMEM;
        if (o->used == CHUNK) {
            exr_status st = out_flush(o);
            if (st != EXR_OK)
                return st;
            continue;
        }
        if (flush == Z_FINISH ? r == Z_STREAM_END : o->z.avail_in == 0)
            return EXR_OK;
    }
}

static exr_status out_write_raw(exr_out *o, const void *p, size_t n);

/* Large writes go in pieces so that progress is reported between them. */
exr_status exr_out_write(exr_out *o, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n) {
        size_t part = n > CHUNK ? CHUNK : n;
        exr_status st = out_write_raw(o, c, part);
        if (st != EXR_OK)
            return st;
        if (o->progress && o->raw >= o->next_report) {
            o->next_report = o->raw + EXR_PROGRESS_EVERY;
            if (o->progress(o->progress_ctx, o->raw, o->total))
                return EXR_EINVAL;
        }
        c += part;
        n -= part;
    }
    return EXR_OK;
}

static exr_status out_write_raw(exr_out *o, const void *p, size_t n)
{
    o->crc = crc_update(o->crc, p, n);
    o->raw += n;
    const unsigned char *c = p;
    if (o->level == 0) {
        while (n) {
            size_t room = CHUNK - o->used, part = n < room ? n : room;
            memcpy(o->buf + o->used, c, part);
            o->used += part;
            c += part;
            n -= part;
            if (o->used == CHUNK) {
                exr_status st = out_flush(o);
                if (st != EXR_OK)
                    return st;
            }
        }
        return EXR_OK;
    }
    while (n) {
        uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
        o->z.next_in = (Bytef *)(uintptr_t)c;
        o->z.avail_in = part;
        exr_status st = deflate_some(o, Z_NO_FLUSH);
        if (st != EXR_OK)
            return st;
        c += part;
        n -= part;
    }
    return EXR_OK;
}

static exr_status out_u32(exr_out *o, uint32_t v) { return exr_out_write(o, &v, 4); }
static exr_status out_u64(exr_out *o, uint64_t v) { return exr_out_write(o, &v, 8); }

static exr_status out_section(exr_out *o, uint32_t tag, uint64_t len)
{
    exr_status st = out_u32(o, tag);
    if (st == EXR_OK)
        st = out_u32(o, 0);
    if (st == EXR_OK)
        st = out_u64(o, len);
    return st;
}

/* Writes an episode's n rows, segment by segment. */
static exr_status out_rows(exr_out *o, const exr_buffer *b, const exr_episode *e)
{
    const exr_store_layout *L = &b->lay;
    uint64_t p = 0;
    for (size_t k = 0; p < e->n; k++) {
        size_t cap = exr_store_seg_cap(L, k), cnt = e->n - p < cap ? (size_t)(e->n - p) : cap;
        exr_status st = exr_out_write(o, exr_seg_row(L, e->body->segs[k], 0), cnt * L->row_bytes);
        if (st != EXR_OK)
            return st;
        p += cnt;
    }
    return EXR_OK;
}

static exr_status write_payload(exr_out *o, const exr_buffer *b, const void *meta,
                                size_t meta_len, uint32_t *ordinal)
{
    const exr_config *c = &b->cfg;
    exr_status st;
    unsigned char cfg[CONFIG_BYTES] = {0};
    put64(cfg + 0, c->state_bytes);
    put64(cfg + 8, c->action_bytes);
    put64(cfg + 16, c->reward_bytes);
    put64(cfg + 24, c->capacity);
    put32(cfg + 32, c->pick_len);
    cfg[36] = c->allow_short;
    cfg[37] = (unsigned char)c->eviction;
    put64(cfg + 40, c->seed);
    put64(cfg + 48, (uint64_t)b->next_handle);
    put64(cfg + 56, (uint64_t)b->next_sel_handle);
    put64(cfg + 64, (uint64_t)(b->hand == EXR_NIL ? -1 : b->eps.slab[b->hand].handle));
    put64(cfg + 72, c->extra_bytes); /* version 2; 0 (reserved in version 1) without extras */
    if ((st = out_section(o, SEC_CONFIG, CONFIG_BYTES)) || (st = exr_out_write(o, cfg, CONFIG_BYTES)))
        return st;
    if ((st = out_section(o, SEC_META, meta_len)) || (st = exr_out_write(o, meta, meta_len)))
        return st;

    uint64_t eps_len = 8;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        eps_len += episode_bytes(b, &b->eps.slab[s]);
    if ((st = out_section(o, SEC_EPISODES, eps_len)) || (st = out_u64(o, b->eps.count)))
        return st;
    uint32_t ord = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next, ord++) {
        const exr_episode *e = &b->eps.slab[s];
        ordinal[s] = ord;
        unsigned char head[EPISODE_HEAD] = {0};
        put64(head, (uint64_t)e->handle);
        put64(head + 8, e->n);
        head[16] = e->ended;
        head[17] = e->terminated;
        head[18] = e->sampled;
        head[19] = e->body->final_state != NULL;
        if ((st = exr_out_write(o, head, EPISODE_HEAD)))
            return st;
        if (e->body->final_state && (st = exr_out_write(o, e->body->final_state, c->state_bytes)))
            return st;
        if ((st = out_rows(o, b, e)))
            return st;
        for (uint64_t p = e->m; p < e->n; p++)
            if ((st = exr_out_write(o, exr_aux_at(e, p), 4)))
                return st;
    }

    if ((st = out_section(o, SEC_PICKS, 8 + 8 * (uint64_t)b->picks.n)) ||
        (st = out_u64(o, b->picks.n)))
        return st;
    uint32_t run[2 * 1024];
    for (size_t i = 0; i < b->picks.n;) {
        size_t k = 0;
        for (; k < 1024 && i < b->picks.n; k++, i++) {
            run[2 * k] = ordinal[b->picks.v[i].slot];
            run[2 * k + 1] = b->picks.v[i].pos;
        }
        if ((st = exr_out_write(o, run, 8 * k)))
            return st;
    }

    uint64_t sels_len = 8;
    for (size_t i = 0; i < b->nsels; i++) {
        const exr_selector_vtable *vt = b->sels[i].sel->vt;
        sels_len += SELECTOR_HEAD + 8 * (uint64_t)vt->nparams + 8 + vt->state_size(b->sels[i].sel, b->picks.n);
    }
    if ((st = out_section(o, SEC_SELECTORS, sels_len)) || (st = out_u64(o, b->nsels)))
        return st;
    for (size_t i = 0; i < b->nsels; i++) {
        const exr_selector *s = b->sels[i].sel;
        const exr_selector_vtable *vt = s->vt;
        int kind = 0;
        while (kind < exr_selector_nkinds && exr_selector_kinds[kind] != vt)
            kind++;
        unsigned char head[SELECTOR_HEAD];
        put64(head, (uint64_t)b->sels[i].handle);
        put32(head + 8, (uint32_t)kind);
        put32(head + 12, (uint32_t)vt->nparams);
        memcpy(head + 16, s->rng.s, 32);
        memset(head + 48, 0, 8);
        if ((st = exr_out_write(o, head, SELECTOR_HEAD)))
            return st;
        for (int k = 0; k < vt->nparams; k++) {
            double v = vt->get_param(s, k);
            if ((st = exr_out_write(o, &v, 8)))
                return st;
        }
        if ((st = out_u64(o, vt->state_size(s, b->picks.n))) || (st = vt->save(s, b->picks.n, o)))
            return st;
    }
    return out_section(o, SEC_END, 0);
}

exr_status exr_codec_write_locked(const exr_buffer *b, const void *meta, size_t meta_len,
                                  int level, exr_sink_fn sink, void *ctx,
                                  exr_progress_fn progress, void *progress_ctx,
                                  unsigned char header[EXR_HEADER_BYTES])
{
    if (level < 0 || level > 9 || meta_len > EXR_META_MAX)
        return EXR_EINVAL;
    exr_out o;
    memset(&o, 0, sizeof o);
    o.level = level;
    o.progress = progress;
    o.progress_ctx = progress_ctx;
    o.total = progress ? exr_codec_raw_size_locked(b, meta_len) : 0;
    o.next_report = EXR_PROGRESS_EVERY;
    o.sink = sink;
    o.ctx = ctx;
    o.crc = (uint32_t)crc32(0, Z_NULL, 0);
    o.buf = malloc(CHUNK);
    uint32_t *ordinal = malloc(((size_t)b->eps.hwm + 1) * sizeof *ordinal);
    if (!o.buf || !ordinal) {
        free(o.buf);
        free(ordinal);
        return EXR_ENOMEM;
    }
    if (level > 0 && deflateInit(&o.z, level) != Z_OK) {
        free(o.buf);
        free(ordinal);
        return EXR_ENOMEM;
    }
    exr_status st = write_payload(&o, b, meta, meta_len, ordinal);
    if (st == EXR_OK && level > 0)
        st = deflate_some(&o, Z_FINISH);
    if (st == EXR_OK)
        st = out_flush(&o);
    if (level > 0)
        deflateEnd(&o.z);
    free(o.buf);
    free(ordinal);
    if (st != EXR_OK)
        return st;
    memcpy(header, MAGIC, 8);
    put32(header + 8, b->cfg.extra_bytes ? VERSION : VERSION_MIN);
    put32(header + 12, level > 0);
    put64(header + 16, o.raw);
    put64(header + 24, o.body);
    put32(header + 32, o.crc);
    put32(header + 36, crc_update((uint32_t)crc32(0, Z_NULL, 0), header, 36));
    return EXR_OK;
}

exr_status exr_mem_sink_write(void *ctx, const void *p, size_t n)
{
    exr_mem_sink *m = ctx;
    if (n > m->cap - m->used)
        return EXR_EOVERFLOW;
    memcpy(m->p + m->used, p, n);
    m->used += n;
    return EXR_OK;
}
