/*
 * codec_read.c - reads the serialized form (docs/format.md), validating
 * every field before it allocates for it.
 */
#include "codec.h"
#include "zheap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "buffer_impl.h"
#include "codec_impl.h"
#include "seg_collapse.h"
#include "seg_heap.h"

struct exr_in {
    int compressed, stream_end;
    uint32_t version;
    z_stream z;
    unsigned char *buf; /* compressed input waiting in z */
    exr_source_fn src;
    void *ctx;
    uint64_t raw_left, body_left;
    uint32_t crc;
};

/* Up to cap body bytes from the source, never past the declared body. */
static exr_status in_fetch(exr_in *in, void *p, size_t cap, size_t *got)
{
    if (cap > in->body_left)
        cap = (size_t)in->body_left;
    *got = 0;
    if (!cap)
        return EXR_OK;
    exr_status st = in->src(in->ctx, p, cap, got);
    if (st != EXR_OK)
        return st;
    if (*got > cap)
        return EXR_ECORRUPT;
    in->body_left -= *got;
    return EXR_OK;
}

/* More compressed bytes for zlib; a body that runs out first is corrupt. */
static exr_status in_refill(exr_in *in)
{
    size_t got;
    exr_status st = in_fetch(in, in->buf, CHUNK, &got);
    if (st != EXR_OK)
        return st;
    if (!got)
        return EXR_ECORRUPT;
    in->z.next_in = in->buf;
    in->z.avail_in = (uInt)got;
    return EXR_OK;
}

exr_status exr_in_read(exr_in *in, void *p, size_t n)
{
    if (n > in->raw_left)
        return EXR_ECORRUPT;
    unsigned char *c = p;
    size_t want = n;
    if (!in->compressed) {
        while (want) {
            size_t got;
            exr_status st = in_fetch(in, c, want, &got);
            if (st != EXR_OK)
                return st;
            if (!got)
                return EXR_ECORRUPT;
            c += got;
            want -= got;
        }
    } else {
        while (want) {
            uInt part = want > (1u << 30) ? (1u << 30) : (uInt)want;
            in->z.next_out = c;
            in->z.avail_out = part;
            while (in->z.avail_out) {
                if (in->stream_end)
                    return EXR_ECORRUPT; /* the stream ended before the payload did */
                if (!in->z.avail_in) {
                    exr_status st = in_refill(in);
                    if (st != EXR_OK)
                        return st;
                }
                int r = inflate(&in->z, Z_NO_FLUSH);
                if (r == Z_STREAM_END)
                    in->stream_end = 1;
                else if (r == Z_MEM_ERROR)
                    return EXR_ENOMEM;
                else if (r != Z_OK && r != Z_BUF_ERROR)
                    return EXR_ECORRUPT;
            }
            c += part;
            want -= part;
        }
    }
    in->crc = crc_update(in->crc, p, n);
    in->raw_left -= n;
    return EXR_OK;
}

static exr_status in_u64(exr_in *in, uint64_t *v)
{
    unsigned char b[8];
    exr_status st = exr_in_read(in, b, 8);
    *v = get64(b);
    return st;
}

/* A section header with this tag; its length must fit what is left. */
static exr_status in_section(exr_in *in, uint32_t tag, uint64_t *len)
{
    unsigned char b[16];
    exr_status st = exr_in_read(in, b, 16);
    if (st != EXR_OK)
        return st;
    if (get32(b) != tag || get32(b + 4) != 0)
        return EXR_ECORRUPT;
    *len = get64(b + 8);
    return *len <= in->raw_left ? EXR_OK : EXR_ECORRUPT;
}

/* The end: the payload, the zlib stream and the body all end together. */
static exr_status in_finish(exr_in *in, uint32_t want_crc)
{
    if (in->raw_left || in->crc != want_crc)
        return EXR_ECORRUPT;
    if (in->compressed) {
        unsigned char extra;
        while (!in->stream_end) {
            if (!in->z.avail_in) {
                exr_status st = in_refill(in);
                if (st != EXR_OK)
                    return st;
            }
            in->z.next_out = &extra;
            in->z.avail_out = 1;
            int r = inflate(&in->z, Z_NO_FLUSH);
            if (in->z.avail_out == 0)
                return EXR_ECORRUPT; /* more payload than declared */
            if (r == Z_STREAM_END)
                in->stream_end = 1;
            else if (r != Z_OK && r != Z_BUF_ERROR)
                return EXR_ECORRUPT;
        }
        if (in->z.avail_in)
            return EXR_ECORRUPT; /* bytes after the zlib stream */
    }
    unsigned char probe;
    size_t got;
    exr_status st = in_fetch(in, &probe, 1, &got);
    if (st != EXR_OK)
        return st;
    if (got || in->body_left)
        return EXR_ECORRUPT;
    /* the source itself must be exhausted too */
    st = in->src(in->ctx, &probe, 1, &got);
    return st != EXR_OK ? st : got ? EXR_ECORRUPT : EXR_OK;
}

static int config_ok(const exr_config *c)
{
    return c->state_bytes >= 1 && c->state_bytes <= ((uint64_t)1 << 40) &&
           c->action_bytes <= ((uint64_t)1 << 40) &&
           (c->reward_bytes == 2 || c->reward_bytes == 4 || c->reward_bytes == 8) &&
           c->pick_len >= 1 && c->pick_len <= EXR_MAX_PICK_LEN &&
           (c->eviction == EXR_EVICT_FIFO || c->eviction == EXR_EVICT_SECOND_CHANCE);
}

/* Room for at least `need` aux entries, growing geometrically up to `total`. */
static exr_status aux_reserve(exr_body *body, uint64_t need, uint64_t total)
{
    if (need <= body->aux_cap)
        return EXR_OK;
    uint64_t cap = body->aux_cap * 2 > need ? body->aux_cap * 2 : need;
    if (cap > total)
        cap = total;
    uint32_t *aux = realloc(body->aux, (size_t)cap * sizeof *aux);
    if (!aux)
        return EXR_ENOMEM;
    body->aux = aux;
    body->aux_cap = cap;
    return EXR_OK;
}

#define READ_GROW_FIRST ((size_t)1 << 16)

/* A new 64-byte aligned array of `bytes` (rounded up to a line, as
 * exr_store_seg_alloc makes them) filled from the input. A zlib body may
 * declare far more than it holds, so there the array starts small and
 * doubles as the bytes arrive (each doubling copies what is there): what it
 * takes is at most about three times what has really been inflated. */
static exr_status read_alloc(exr_in *in, size_t bytes, unsigned char **out)
{
    if (bytes > in->raw_left)
        return EXR_ECORRUPT;
    size_t full = (bytes + 63) & ~(size_t)63; /* bytes <= raw_left: no overflow */
    if (!full)
        full = 64;
    size_t cap = in->compressed && full > READ_GROW_FIRST ? READ_GROW_FIRST : full, have = 0;
    unsigned char *p = aligned_alloc(64, cap);
    if (!p)
        return EXR_ENOMEM;
    for (;;) {
        size_t part = (bytes < cap ? bytes : cap) - have;
        exr_status st = exr_in_read(in, p + have, part);
        if (st != EXR_OK) {
            free(p);
            return st;
        }
        have += part;
        if (have == bytes)
            break;
        size_t ncap = cap * 2 < full ? cap * 2 : full;
        unsigned char *np = aligned_alloc(64, ncap);
        if (!np) {
            free(p);
            return EXR_ENOMEM;
        }
        memcpy(np, p, have);
        free(p);
        p = np;
        cap = ncap;
    }
    *out = p;
    return EXR_OK;
}

/* An episode's head, checked: handles rise, flags are 0 or 1, an episode
 * ends with a final state or terminated, and what it will allocate is in
 * the input first. */
static exr_status read_episode_head(exr_in *in, const exr_buffer *b, int64_t *prev_handle,
                                    episode_head *h)
{
    unsigned char head[EPISODE_HEAD];
    exr_status st = exr_in_read(in, head, EPISODE_HEAD);
    if (st != EXR_OK)
        return st;
    int reserved_ok = episode_head_unpack(head, h);
    exr_counters k;
    exr_buffer_counters_locked(b, &k);
    if (h->handle <= *prev_handle || h->handle >= k.next_handle || h->ended > 1 ||
        h->terminated > 1 || h->sampled > 1 || h->has_final > 1 || !reserved_ok ||
        h->n > (uint64_t)UINT32_MAX - 1 || (!h->ended && (h->terminated || h->has_final)) ||
        (h->ended && !h->terminated && !h->has_final))
        return EXR_ECORRUPT;
    *prev_handle = h->handle;
    const exr_store_layout *L = &b->lay;
    uint64_t row = L->row_bytes;
    if (h->n > in->raw_left / (row + 4) || (h->has_final && L->state_bytes > in->raw_left))
        return EXR_ECORRUPT;
    return EXR_OK;
}

/* A segment of `rows` rows read from the input. Uncompressed input takes
 * all of an array's bytes at once anyway (read_alloc), so its segments come
 * from exr_store_seg_alloc as recorded ones do: a full segment of a nominal
 * size from the segment heap, on huge pages, anything else from malloc,
 * counted for a collapse (seg_collapse.c). A zlib body's come from
 * read_alloc, which grows them as the bytes arrive, and are counted the
 * same way. */
static exr_status read_seg(exr_in *in, const exr_store_layout *L, size_t rows,
                           unsigned char **out)
{
    size_t bytes = rows * L->row_bytes; /* rows <= n, checked against raw_left */
    if (in->compressed) {
        exr_status st = read_alloc(in, bytes, out);
        if (st == EXR_OK)
            exr_seg_track(*out, true);
        return st;
    }
    if (bytes > in->raw_left)
        return EXR_ECORRUPT;
    unsigned char *p = exr_store_seg_alloc(L, rows);
    if (!p)
        return EXR_ENOMEM;
    exr_status st = exr_in_read(in, p, bytes);
    if (st != EXR_OK) {
        exr_seg_free(p);
        return st;
    }
    *out = p;
    return EXR_OK;
}

/* An episode's final state and rows. From a zlib body, storage is
 * allocated as the rows arrive (read_alloc, aux grown with them): a
 * declared size, which a zlib body can inflate 1032-fold, never reserves
 * more than a small multiple of what has been read; an uncompressed body's
 * bytes are checked against what is left of it (read_seg). In the end
 * every segment is full but the last, which holds exactly the rest (it
 * grows again if the episode is recorded into). */
static exr_status read_rows(exr_in *in, const exr_store_layout *L, exr_episode *e, uint64_t n,
                            uint32_t nsegs, int has_final)
{
    exr_body *body = e->body;
    exr_status st;
    if (has_final && (st = read_alloc(in, L->state_bytes, &body->final_state)))
        return st;
    uint64_t placed = 0;
    for (uint32_t k = 0; k < nsegs; k++) {
        size_t cap = exr_store_seg_cap(L, k), rows = n - placed < cap ? (size_t)(n - placed) : cap;
        st = aux_reserve(body, placed + rows, n);
        exr_episode_sync(e);
        if (st)
            return st;
        if ((st = read_seg(in, L, rows, &body->segs[k])))
            return st;
        body->nsegs = k + 1;
        body->last_rows = (uint32_t)rows;
        exr_episode_sync(e);
        placed += rows;
        e->n = (uint32_t)placed; /* only what is there is counted, and freed on failure */
    }
    st = aux_reserve(body, n ? n : 1, n ? n : 1);
    exr_episode_sync(e);
    return st;
}

/* The recorded priorities of the steps that are no pick yet. */
static exr_status read_pending(exr_in *in, exr_episode *e)
{
    for (uint64_t p = e->m; p < e->n; p++) {
        float v;
        exr_status st = exr_in_read(in, &v, 4);
        if (st != EXR_OK)
            return st;
        if (!isnan(v) && (!(v >= 0) || isinf(v)))
            return EXR_ECORRUPT;
        memcpy(exr_aux_at(e, p), &v, 4);
    }
    return EXR_OK;
}

static exr_status read_episode(exr_in *in, exr_buffer *b, int64_t *prev_handle, uint32_t *slot)
{
    const exr_store_layout *L = &b->lay;
    episode_head h;
    exr_status st = read_episode_head(in, b, prev_handle, &h);
    if (st != EXR_OK)
        return st;
    size_t k_last = 0, off;
    if (h.n)
        exr_store_locate(L, h.n - 1, &k_last, &off);
    uint32_t nsegs = h.n ? (uint32_t)k_last + 1 : 0;
    exr_episode *e;
    if ((st = exr_buffer_restore_new_episode_locked(b, h.handle, nsegs, h.ended, h.terminated,
                                                    h.sampled, slot, &e)))
        return st;
    if ((st = read_rows(in, L, e, h.n, nsegs, h.has_final)))
        return st;
    exr_buffer_restore_episode_locked(b, *slot);
    return read_pending(in, e);
}

/* CONFIG: the configuration, and the counters read into *k. Handles are
 * int64 counters; refusing absurd ones keeps them from ever wrapping (2^62
 * episodes would take millennia to record). A counter reaches
 * EXR_MAX_HANDLE exactly once the last handle is given out, and the writer
 * writes it: the reader takes what the writer can write. FIFO eviction
 * never moves the hand, so a FIFO buffer has none. */
static exr_status read_config(exr_in *in, exr_config *c, exr_counters *k)
{
    uint64_t len, v[CF_N];
    unsigned char cfgb[CONFIG_BYTES];
    exr_status st = in_section(in, SEC_CONFIG, &len);
    if (st != EXR_OK)
        return st;
    if (len != CONFIG_BYTES || (st = exr_in_read(in, cfgb, CONFIG_BYTES)))
        return st ? st : EXR_ECORRUPT;
    int reserved_ok = config_unpack(cfgb, v);
    *c = (exr_config){
        .state_bytes = v[CF_STATE_BYTES],
        .action_bytes = v[CF_ACTION_BYTES],
        .reward_bytes = v[CF_REWARD_BYTES],
        .capacity = v[CF_CAPACITY],
        .pick_len = (uint32_t)v[CF_PICK_LEN],
        .allow_short = v[CF_ALLOW_SHORT] != 0,
        .eviction = (int)v[CF_EVICTION],
        .seed = v[CF_SEED],
        .extra_bytes = v[CF_EXTRA_BYTES], /* version 2; reserved (0) in version 1 */
    };
    *k = (exr_counters){(int64_t)v[CF_NEXT_HANDLE], (int64_t)v[CF_NEXT_SEL], (int64_t)v[CF_HAND]};
    if (!reserved_ok || v[CF_ALLOW_SHORT] > 1 || !config_ok(c) || k->next_handle < 0 ||
        k->next_handle > EXR_MAX_HANDLE || k->next_sel_handle < 0 ||
        k->next_sel_handle > EXR_MAX_HANDLE || k->hand < -1 ||
        (in->version < 2 ? c->extra_bytes != 0 : c->extra_bytes > ((uint64_t)1 << 40)) ||
        (c->eviction == EXR_EVICT_FIFO && k->hand != -1))
        return EXR_ECORRUPT;
    return EXR_OK;
}

static exr_status read_meta(exr_in *in, unsigned char *meta, size_t *meta_len)
{
    uint64_t len;
    exr_status st = in_section(in, SEC_META, &len);
    if (st != EXR_OK)
        return st;
    if (len > EXR_META_MAX || (st = exr_in_read(in, meta, (size_t)len)))
        return st ? st : EXR_ECORRUPT;
    *meta_len = (size_t)len;
    return EXR_OK;
}

/* EPISODES; (*slots)[i] is the slot of the i-th, grown as episodes arrive
 * (like their storage, read_alloc). */
static exr_status read_episodes(exr_in *in, exr_buffer *b, uint32_t **slots)
{
    uint64_t len, count;
    exr_status st;
    if ((st = in_section(in, SEC_EPISODES, &len)) || (st = in_u64(in, &count)))
        return st;
    uint64_t start = in->raw_left + 8;
    if (count > in->raw_left / EPISODE_HEAD)
        return EXR_ECORRUPT;
    uint64_t slots_cap = 0;
    int64_t prev = -1;
    for (uint64_t i = 0; i < count; i++) {
        if (i == slots_cap) {
            slots_cap = slots_cap ? (slots_cap * 2 < count ? slots_cap * 2 : count) : 64;
            uint32_t *ns = realloc(*slots, (size_t)slots_cap * sizeof **slots);
            if (!ns)
                return EXR_ENOMEM;
            *slots = ns;
        }
        if ((st = read_episode(in, b, &prev, &(*slots)[i])))
            return st;
    }
    if (start - in->raw_left != len)
        return EXR_ECORRUPT;
    if (exr_buffer_restore_over_capacity_locked(b))
        return EXR_ECORRUPT;
    return EXR_OK;
}

static exr_status read_picks(exr_in *in, exr_buffer *b, const uint32_t *slots)
{
    uint64_t len, count, npicks = exr_buffer_restore_picks_declared_locked(b);
    exr_status st;
    if ((st = in_section(in, SEC_PICKS, &len)) || (st = in_u64(in, &count)))
        return st;
    if (count != npicks || len != picks_len(count))
        return EXR_ECORRUPT;
    if ((st = exr_buffer_restore_reserve_picks_locked(b, (size_t)count)))
        return st;
    uint32_t run[2 * 1024];
    for (uint64_t i = 0; i < count;) {
        size_t k = count - i < 1024 ? (size_t)(count - i) : 1024;
        if ((st = exr_in_read(in, run, 8 * k)))
            return st;
        for (size_t j = 0; j < k; j++, i++) {
            uint32_t ord = run[2 * j], pos = run[2 * j + 1];
            if (ord >= exr_buffer_num_episodes_locked(b))
                return EXR_ECORRUPT;
            if ((st = exr_buffer_restore_pick_locked(b, slots[ord], pos)))
                return st;
        }
    }
    return EXR_OK;
}

/* One selector: head, parameters, state. */
static exr_status read_selector(exr_in *in, exr_buffer *b, int64_t *prev_sel)
{
    unsigned char head[SELECTOR_HEAD];
    selector_head h;
    exr_status st = exr_in_read(in, head, SELECTOR_HEAD);
    if (st != EXR_OK)
        return st;
    exr_counters k;
    exr_buffer_counters_locked(b, &k);
    if (!selector_head_unpack(head, &h) || h.handle <= *prev_sel ||
        h.handle >= k.next_sel_handle || h.kind >= (uint32_t)exr_selector_nkinds)
        return EXR_ECORRUPT;
    *prev_sel = h.handle;
    const exr_selector_vtable *vt = exr_selector_kinds[h.kind];
    if (h.nparams != (uint32_t)vt->nparams)
        return EXR_ECORRUPT;
    double params[EXR_SEL_MAXPARAMS];
    for (uint32_t p = 0; p < h.nparams; p++) {
        if ((st = exr_in_read(in, &params[p], 8)))
            return st;
        if (!vt->param_ok((int)p, params[p]))
            return EXR_ECORRUPT;
    }
    uint64_t slen;
    if ((st = in_u64(in, &slen)))
        return st;
    size_t npicks = (size_t)exr_buffer_num_picks_locked(b);
    if (slen != vt->state_size(NULL, npicks) || slen > in->raw_left)
        return EXR_ECORRUPT;
    exr_selector *s;
    if ((st = exr_buffer_restore_selector_locked(b, h.handle, vt, params, &s)))
        return st == EXR_EINVAL ? EXR_ECORRUPT : st;
    memcpy(s->rng.s, h.rng, 32);
    if (!(s->rng.s[0] | s->rng.s[1] | s->rng.s[2] | s->rng.s[3]))
        return EXR_ECORRUPT;
    return vt->load(s, npicks, in);
}

static exr_status read_selectors(exr_in *in, exr_buffer *b)
{
    uint64_t len, count;
    exr_status st;
    if ((st = in_section(in, SEC_SELECTORS, &len)) || (st = in_u64(in, &count)))
        return st;
    uint64_t start = in->raw_left + 8;
    if (count > EXR_MAX_SELECTORS || count > in->raw_left / SELECTOR_HEAD)
        return EXR_ECORRUPT;
    int64_t prev_sel = -1;
    for (uint64_t i = 0; i < count; i++)
        if ((st = read_selector(in, b, &prev_sel)))
            return st;
    return start - in->raw_left == len ? EXR_OK : EXR_ECORRUPT;
}

/* The sections in order (docs/format.md) into a new *out. */
static exr_status read_payload(exr_in *in, exr_buffer **out, unsigned char *meta,
                               size_t *meta_len, uint32_t **slots)
{
    exr_config c;
    exr_counters k;
    exr_status st;
    if ((st = read_config(in, &c, &k)) || (st = read_meta(in, meta, meta_len)))
        return st;
    exr_buffer *b;
    if ((st = exr_buffer_new(&c, &b)))
        return st == EXR_EINVAL || st == EXR_EOVERFLOW ? EXR_ECORRUPT : st;
    exr_buffer_lock(b); /* nobody else has it yet: for the *_locked operations */
    *out = b;
    exr_buffer_restore_handles_locked(b, k.next_handle, k.next_sel_handle);
    if ((st = read_episodes(in, b, slots)))
        return st;
    if (exr_buffer_restore_hand_locked(b, k.hand) != EXR_OK)
        return EXR_ECORRUPT;
    if ((st = read_picks(in, b, *slots)) || (st = read_selectors(in, b)))
        return st;
    uint64_t len;
    if ((st = in_section(in, SEC_END, &len)))
        return st;
    return len == 0 ? EXR_OK : EXR_ECORRUPT;
}

exr_status exr_codec_read(const exr_codec_header *h, exr_source_fn src, void *ctx,
                          exr_buffer **out, unsigned char *meta, size_t *meta_len)
{
    exr_status st;
    exr_in in;
    memset(&in, 0, sizeof in);
    in.compressed = h->codec == 1;
    in.version = h->version;
    in.src = src;
    in.ctx = ctx;
    in.raw_left = h->raw_len;
    in.body_left = h->body_len;
    in.crc = (uint32_t)crc32(0, Z_NULL, 0);
    if (in.compressed) {
        in.buf = malloc(CHUNK);
        if (!in.buf)
            return EXR_ENOMEM;
        exr_zstream_init(&in.z);
        if (inflateInit(&in.z) != Z_OK) {
            free(in.buf);
            return EXR_ENOMEM;
        }
    }
    exr_buffer *b = NULL;
    uint32_t *slots = NULL;
    st = read_payload(&in, &b, meta, meta_len, &slots);
    if (b)
        exr_buffer_unlock(b);
    if (st == EXR_OK)
        st = in_finish(&in, h->payload_crc);
    free(slots);
    if (in.compressed) {
        inflateEnd(&in.z);
        free(in.buf);
    }
    if (st != EXR_OK) {
        exr_buffer_free(b);
        return st;
    }
    *out = b;
    return EXR_OK;
}
