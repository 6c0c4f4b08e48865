/*
 * codec_write.c - writes the serialized form (docs/format.md): the payload
 * streamed through zlib into a sink.
 */
#include "codec.h"
#include "zheap.h"

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
                return EXR_EABORTED;
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

static exr_status write_config(exr_out *o, const exr_buffer *b)
{
    const exr_config *c = &b->cfg;
    exr_counters k;
    exr_buffer_counters_locked(b, &k);
    uint64_t v[CF_N] = {
        [CF_STATE_BYTES] = c->state_bytes,
        [CF_ACTION_BYTES] = c->action_bytes,
        [CF_REWARD_BYTES] = c->reward_bytes,
        [CF_CAPACITY] = c->capacity,
        [CF_PICK_LEN] = c->pick_len,
        [CF_ALLOW_SHORT] = c->allow_short,
        [CF_EVICTION] = (unsigned char)c->eviction,
        [CF_SEED] = c->seed,
        [CF_NEXT_HANDLE] = (uint64_t)k.next_handle,
        [CF_NEXT_SEL] = (uint64_t)k.next_sel_handle,
        [CF_HAND] = (uint64_t)k.hand,
        [CF_EXTRA_BYTES] = c->extra_bytes, /* version 2; 0 (reserved in version 1) without extras */
    };
    unsigned char cfg[CONFIG_BYTES];
    config_pack(v, cfg);
    exr_status st = out_section(o, SEC_CONFIG, CONFIG_BYTES);
    return st ? st : exr_out_write(o, cfg, CONFIG_BYTES);
}

static exr_status write_meta(exr_out *o, const void *meta, size_t meta_len)
{
    exr_status st = out_section(o, SEC_META, meta_len);
    return st ? st : exr_out_write(o, meta, meta_len);
}

/* One episode: head, final state, rows, the priorities of its steps that
 * are no pick yet. */
static exr_status write_episode(exr_out *o, const exr_buffer *b, const exr_episode *e)
{
    exr_status st;
    episode_head h = {e->handle, e->n, e->ended, e->terminated, e->sampled,
                      e->body->final_state != NULL};
    unsigned char head[EPISODE_HEAD];
    episode_head_pack(&h, head);
    if ((st = exr_out_write(o, head, EPISODE_HEAD)))
        return st;
    if (e->body->final_state && (st = exr_out_write(o, e->body->final_state, b->cfg.state_bytes)))
        return st;
    if ((st = out_rows(o, b, e)))
        return st;
    for (uint64_t p = e->m; p < e->n; p++)
        if ((st = exr_out_write(o, exr_aux_at(e, p), 4)))
            return st;
    return EXR_OK;
}

/* ordinal[slot]: the episode's index in the section, for PICKS. */
static exr_status write_episodes(exr_out *o, const exr_buffer *b, uint32_t *ordinal)
{
    exr_status st;
    if ((st = out_section(o, SEC_EPISODES, episodes_len(b))) || (st = out_u64(o, b->eps.count)))
        return st;
    uint32_t ord = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next, ord++) {
        ordinal[s] = ord;
        if ((st = write_episode(o, b, &b->eps.slab[s])))
            return st;
    }
    return EXR_OK;
}

static exr_status write_picks(exr_out *o, const exr_buffer *b, const uint32_t *ordinal)
{
    exr_status st;
    if ((st = out_section(o, SEC_PICKS, picks_len(b->picks.n))) || (st = out_u64(o, b->picks.n)))
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
    return EXR_OK;
}

static exr_status write_selector(exr_out *o, const exr_buffer *b, const sel_entry *se)
{
    const exr_selector *s = se->sel;
    const exr_selector_vtable *vt = s->vt;
    selector_head h = {se->handle, (uint32_t)exr_selector_kind(s), (uint32_t)vt->nparams, {0}};
    memcpy(h.rng, s->rng.s, 32);
    unsigned char head[SELECTOR_HEAD];
    selector_head_pack(&h, head);
    exr_status st = exr_out_write(o, head, SELECTOR_HEAD);
    for (int k = 0; st == EXR_OK && k < vt->nparams; k++) {
        double v = vt->get_param(s, k);
        st = exr_out_write(o, &v, 8);
    }
    if (st == EXR_OK)
        st = out_u64(o, vt->state_size(s, b->picks.n));
    return st ? st : vt->save(s, b->picks.n, o);
}

static exr_status write_selectors(exr_out *o, const exr_buffer *b)
{
    exr_status st;
    if ((st = out_section(o, SEC_SELECTORS, selectors_len(b))) || (st = out_u64(o, b->nsels)))
        return st;
    for (size_t i = 0; i < b->nsels; i++) {
        /* A draw without the storage lock, or a record call applying its
         * notes, may be in it (its rng, its tree): once it has let go of
         * mu, nobody takes mu again until this hold ends (selector.h,
         * sample_detached), so the write, which may call back into Python
         * (save's progress), runs without mu. */
        exr_selector *s = b->sels[i].sel;
        exr_sel_lock(s);
        if (s->vt->settle)
            s->vt->settle(s, EXR_SETTLE_ALL);
        exr_sel_unlock(s);
        if ((st = write_selector(o, b, &b->sels[i])))
            return st;
    }
    return EXR_OK;
}

/* The sections in order (docs/format.md). */
static exr_status write_payload(exr_out *o, const exr_buffer *b, const void *meta,
                                size_t meta_len, uint32_t *ordinal)
{
    exr_status st;
    if ((st = write_config(o, b)) || (st = write_meta(o, meta, meta_len)) ||
        (st = write_episodes(o, b, ordinal)) || (st = write_picks(o, b, ordinal)) ||
        (st = write_selectors(o, b)))
        return st;
    return out_section(o, SEC_END, 0);
}

exr_status exr_codec_write_locked(const exr_buffer *b, const void *meta, size_t meta_len,
                                  int level, exr_sink_fn sink, void *ctx,
                                  exr_progress_fn progress, void *progress_ctx,
                                  unsigned char header[EXR_HEADER_BYTES])
{
    EXR_ASSERT_LOCKED(b);
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
    exr_zstream_init(&o.z);
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
