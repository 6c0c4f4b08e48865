/*
 * codec_read.c - reads the serialized form (docs/format.md), validating
 * every field before it allocates for it.
 */
#include "codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "buffer_impl.h"
#include "codec_impl.h"

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

static exr_status read_episode(exr_in *in, exr_buffer *b, int64_t *prev_handle, uint32_t *slot)
{
    const exr_store_layout *L = &b->lay;
    unsigned char head[EPISODE_HEAD];
    exr_status st = exr_in_read(in, head, EPISODE_HEAD);
    if (st != EXR_OK)
        return st;
    int64_t handle = (int64_t)get64(head);
    uint64_t n = get64(head + 8);
    uint8_t ended = head[16], term = head[17], sampled = head[18], has_final = head[19];
    if (handle <= *prev_handle || handle >= b->next_handle || ended > 1 || term > 1 ||
        sampled > 1 || has_final > 1 || get32(head + 20) != 0 || n >= (uint64_t)UINT32_MAX - 1 ||
        (!ended && (term || has_final)) || (ended && !term && !has_final))
        return EXR_ECORRUPT; /* an episode ends with a final state, or terminated */
    *prev_handle = handle;
    /* everything this episode will allocate must be in the input first */
    uint64_t row = L->row_bytes;
    if (n > in->raw_left / (row + 4) || (has_final && L->state_bytes > in->raw_left))
        return EXR_ECORRUPT;
    if ((st = exr_episodes_reserve(&b->eps)) != EXR_OK)
        return st;
    size_t k_last = 0, off;
    if (n)
        exr_store_locate(L, n - 1, &k_last, &off);
    uint32_t nsegs = n ? (uint32_t)k_last + 1 : 0;
    exr_body *body = exr_body_new(nsegs > 4 ? nsegs : 4);
    if (!body)
        return EXR_ENOMEM;
    *slot = exr_episodes_insert(&b->eps, handle, body);
    exr_episode *e = &b->eps.slab[*slot];
    e->ended = ended;
    e->terminated = term;
    e->sampled = sampled;
    /* Storage is allocated as the rows arrive (read_alloc, aux grown with
     * them): a declared size, which a zlib body can inflate 1032-fold, never
     * reserves more than a small multiple of what has been read.  In the
     * end every segment is full but the last, which holds exactly the rest
     * (it grows again if the episode is recorded into). */
    if (has_final && (st = read_alloc(in, L->state_bytes, &body->final_state)))
        return st;
    uint64_t placed = 0;
    for (uint32_t k = 0; k < nsegs; k++) {
        size_t cap = exr_store_seg_cap(L, k), rows = n - placed < cap ? (size_t)(n - placed) : cap;
        if ((st = aux_reserve(body, placed + rows, n)))
            return st;
        if ((st = read_alloc(in, rows * L->row_bytes, &body->segs[k])))
            return st;
        body->nsegs = k + 1;
        body->last_rows = (uint32_t)rows;
        placed += rows;
        e->n = placed; /* only what is there is counted, and freed on failure */
    }
    if ((st = aux_reserve(body, n ? n : 1, n ? n : 1)))
        return st;
    e->m = exr_picks_target(b, e);
    b->n_records += n;
    for (uint64_t p = 0; p < e->m; p++)
        *exr_aux_at(e, p) = UINT32_MAX; /* "no pick yet": filled by PICKS */
    for (uint64_t p = e->m; p < n; p++) {
        float v;
        if ((st = exr_in_read(in, &v, 4)))
            return st;
        if (!isnan(v) && (!(v >= 0) || isinf(v)))
            return EXR_ECORRUPT;
        memcpy(exr_aux_at(e, p), &v, 4);
    }
    return EXR_OK;
}

static exr_status read_payload(exr_in *in, exr_buffer **out, unsigned char *meta,
                               size_t *meta_len, uint32_t **slots)
{
    uint64_t len;
    unsigned char cfgb[CONFIG_BYTES];
    exr_status st = in_section(in, SEC_CONFIG, &len);
    if (st != EXR_OK)
        return st;
    if (len != CONFIG_BYTES || (st = exr_in_read(in, cfgb, CONFIG_BYTES)))
        return st ? st : EXR_ECORRUPT;
    exr_config c = {
        .state_bytes = get64(cfgb),
        .action_bytes = get64(cfgb + 8),
        .reward_bytes = get64(cfgb + 16),
        .capacity = get64(cfgb + 24),
        .pick_len = get32(cfgb + 32),
        .allow_short = cfgb[36] != 0,
        .eviction = cfgb[37],
        .seed = get64(cfgb + 40),
        .extra_bytes = get64(cfgb + 72), /* version 2; reserved (0) in version 1 */
    };
    int64_t next_handle = (int64_t)get64(cfgb + 48), next_sel = (int64_t)get64(cfgb + 56);
    int64_t hand = (int64_t)get64(cfgb + 64);
    for (int i = 38; i < 40; i++)
        if (cfgb[i])
            return EXR_ECORRUPT;
    /* handles are int64 counters; refusing absurd ones keeps them from ever
     * wrapping (2^62 episodes would take millennia to record). A counter
     * reaches EXR_MAX_HANDLE exactly once the last handle is given out, and
     * the writer writes it: the reader takes what the writer can write.
     * FIFO eviction never moves the hand, so a FIFO buffer has none. */
    if (cfgb[36] > 1 || !config_ok(&c) || next_handle < 0 || next_handle > EXR_MAX_HANDLE ||
        next_sel < 0 || next_sel > EXR_MAX_HANDLE || hand < -1 ||
        (in->version < 2 ? c.extra_bytes != 0 : c.extra_bytes > ((uint64_t)1 << 40)) ||
        (c.eviction == EXR_EVICT_FIFO && hand != -1))
        return EXR_ECORRUPT;
    if ((st = in_section(in, SEC_META, &len)))
        return st;
    if (len > EXR_META_MAX || (st = exr_in_read(in, meta, (size_t)len)))
        return st ? st : EXR_ECORRUPT;
    *meta_len = (size_t)len;

    exr_buffer *b;
    if ((st = exr_buffer_new(&c, &b)))
        return st == EXR_EINVAL || st == EXR_EOVERFLOW ? EXR_ECORRUPT : st;
    *out = b;
    b->next_handle = next_handle;
    b->next_sel_handle = next_sel;

    uint64_t count;
    if ((st = in_section(in, SEC_EPISODES, &len)) || (st = in_u64(in, &count)))
        return st;
    uint64_t eps_start = in->raw_left + 8;
    if (count > in->raw_left / EPISODE_HEAD)
        return EXR_ECORRUPT;
    /* grown as episodes arrive, like their storage (read_alloc) */
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
    if (eps_start - in->raw_left != len)
        return EXR_ECORRUPT;
    if (b->cfg.capacity && b->n_records > b->cfg.capacity)
        return EXR_ECORRUPT;
    if (hand >= 0 && (b->hand = exr_episodes_find(&b->eps, hand)) == EXR_NIL)
        return EXR_ECORRUPT;

    uint64_t npicks = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        npicks += b->eps.slab[s].m;
    if ((st = in_section(in, SEC_PICKS, &len)) || (st = in_u64(in, &count)))
        return st;
    if (count != npicks || len != 8 + 8 * count)
        return EXR_ECORRUPT;
    if ((st = exr_pick_table_reserve(&b->picks, (size_t)count ? (size_t)count : 1)))
        return st;
    uint32_t run[2 * 1024];
    for (uint64_t i = 0; i < count;) {
        size_t k = count - i < 1024 ? (size_t)(count - i) : 1024;
        if ((st = exr_in_read(in, run, 8 * k)))
            return st;
        for (size_t j = 0; j < k; j++, i++) {
            uint32_t ord = run[2 * j], pos = run[2 * j + 1];
            if (ord >= b->eps.count)
                return EXR_ECORRUPT;
            uint32_t slot = (*slots)[ord];
            exr_episode *e = &b->eps.slab[slot];
            if (pos >= e->m)
                return EXR_ECORRUPT;
            uint32_t *aux = exr_aux_at(e, pos);
            if (*aux != UINT32_MAX)
                return EXR_ECORRUPT; /* the same pick twice */
            *aux = (uint32_t)i;
            b->picks.v[i] = (exr_pick){slot, pos};
            b->picks.n = (size_t)i + 1;
        }
    }

    if ((st = in_section(in, SEC_SELECTORS, &len)) || (st = in_u64(in, &count)))
        return st;
    uint64_t sels_start = in->raw_left + 8;
    if (count > in->raw_left / SELECTOR_HEAD)
        return EXR_ECORRUPT;
    int64_t prev_sel = -1;
    for (uint64_t i = 0; i < count; i++) {
        unsigned char head[SELECTOR_HEAD];
        if ((st = exr_in_read(in, head, SELECTOR_HEAD)))
            return st;
        int64_t h = (int64_t)get64(head);
        uint32_t kind = get32(head + 8), np = get32(head + 12);
        if (h <= prev_sel || h >= b->next_sel_handle || kind >= (uint32_t)exr_selector_nkinds ||
            get64(head + 48) != 0)
            return EXR_ECORRUPT;
        prev_sel = h;
        const exr_selector_vtable *vt = exr_selector_kinds[kind];
        if (np != (uint32_t)vt->nparams)
            return EXR_ECORRUPT;
        double params[EXR_SEL_MAXPARAMS];
        for (uint32_t k = 0; k < np; k++) {
            if ((st = exr_in_read(in, &params[k], 8)))
                return st;
            if (!vt->param_ok((int)k, params[k]))
                return EXR_ECORRUPT;
        }
        uint64_t slen;
        if ((st = in_u64(in, &slen)))
            return st;
        if (slen != vt->state_size(NULL, b->picks.n) || slen > in->raw_left)
            return EXR_ECORRUPT;
        if ((st = exr_buffer_reserve_selector_locked(b)))
            return st;
        exr_selector *s;
        if ((st = vt->create(&s, params, b->picks.n)))
            return st == EXR_EINVAL ? EXR_ECORRUPT : st;
        if (pthread_mutex_init(&s->mu, NULL) != 0) {
            vt->destroy(s);
            return EXR_ENOMEM;
        }
        b->sels[b->nsels++] = (sel_entry){h, s};
        memcpy(s->rng.s, head + 16, 32);
        if (!(s->rng.s[0] | s->rng.s[1] | s->rng.s[2] | s->rng.s[3]))
            return EXR_ECORRUPT;
        if ((st = vt->load(s, b->picks.n, in)))
            return st;
    }
    if (sels_start - in->raw_left != len)
        return EXR_ECORRUPT;
    if ((st = in_section(in, SEC_END, &len)))
        return st;
    return len == 0 ? EXR_OK : EXR_ECORRUPT;
}

exr_status exr_codec_read(const unsigned char header[EXR_HEADER_BYTES], exr_source_fn src,
                          void *ctx, exr_buffer **out, unsigned char *meta, size_t *meta_len)
{
    uint64_t body_len;
    exr_status st = exr_codec_check_header(header, UINT64_MAX, &body_len);
    if (st != EXR_OK)
        return st;
    exr_in in;
    memset(&in, 0, sizeof in);
    in.compressed = get32(header + 12) == 1;
    in.version = get32(header + 8);
    in.src = src;
    in.ctx = ctx;
    in.raw_left = get64(header + 16);
    in.body_left = body_len;
    in.crc = (uint32_t)crc32(0, Z_NULL, 0);
    if (in.compressed) {
        in.buf = malloc(CHUNK);
        if (!in.buf)
            return EXR_ENOMEM;
        if (inflateInit(&in.z) != Z_OK) {
            free(in.buf);
            return EXR_ENOMEM;
        }
    }
    exr_buffer *b = NULL;
    uint32_t *slots = NULL;
    st = read_payload(&in, &b, meta, meta_len, &slots);
    if (st == EXR_OK)
        st = in_finish(&in, get32(header + 32));
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
