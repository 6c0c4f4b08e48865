/*
 * batch_copy.c - where rows are copied into a batch: the located picks' states,
 * actions, rewards and next states gathered into the caller's arrays,
 * prefetching the picks ahead.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"
#include "mem.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* A field of at least this many bytes is streamed when the batch is (a
 * shorter one would leave the write-combining buffers half-filled). */
#define STREAM_FIELD_MIN 1024

static inline void copy_field(unsigned char *d, const unsigned char *s, size_t n, bool stream)
{
    if (stream && n >= STREAM_FIELD_MIN)
        exr_copy_stream(d, s, n);
    else
        exr_copy_short(d, s, n);
}

/* One field (at byte `at` of each row, `w` bytes wide) of cnt rows from
 * src (rows `stride` apart) into dst (packed). The common widths get a
 * fixed-size move the compiler inlines. */
static inline void gather_field(unsigned char *dst, const unsigned char *src, size_t cnt,
                                size_t stride, size_t w)
{
#define GATHER(W)                                                                                  \
    for (size_t r_ = 0; r_ < cnt; r_++)                                                            \
        memcpy(dst + r_ * (W), src + r_ * stride, (W));                                            \
    return
    switch (w) {
    case 0:
        return;
    case 1:
        GATHER(1);
    case 2:
        GATHER(2);
    case 4:
        GATHER(4);
    case 8:
        GATHER(8);
    case 16:
        GATHER(16);
    case 32:
        GATHER(32);
    default:
        for (size_t r = 0; r < cnt; r++)
            exr_copy_short(dst + r * w, src + r * stride, w);
    }
#undef GATHER
}

/* Rows [0, cnt) of a pick, split between A and B. */
static void gather_rows(unsigned char *dst, const plan_t *pl, size_t cnt, size_t at,
                        const exr_store_layout *L, size_t w)
{
    size_t first = cnt < pl->na ? cnt : pl->na;
    gather_field(dst, pl->a + at, first, L->row_bytes, w);
    if (cnt > first)
        gather_field(dst + first * w, pl->b + at, cnt - first, L->row_bytes, w);
}

/* Rows [r0, r1) of a pick, starting at `row` (its row r0), each read once:
 * its state to st[r] and, when NX, to nx[r - 1] (the next state of the step
 * before), its action and reward; SB, AB, RB, ROW and NX constants of the
 * caller, so every move is one fixed-size load and store. */
#define FUSE_ROWS(row, r0, r1, SB, AB, RB, ROW, NX)                                               \
    do {                                                                                           \
        const unsigned char *q_ = (row);                                                           \
        for (size_t r_ = (r0); r_ < (r1); r_++, q_ += (ROW)) {                                     \
            memcpy(st + r_ * (SB), q_, (SB));                                                      \
            if ((NX) && r_)                                                                        \
                memcpy(nx + (r_ - 1) * (SB), q_, (SB));                                            \
            memcpy(ac + r_ * (AB), q_ + (SB), (AB));                                               \
            memcpy(rw + r_ * (RB), q_ + (SB) + (AB), (RB));                                        \
        }                                                                                          \
    } while (0)

/* The specialised width combinations of fuse_pick, numbered from 1:
 * states of 1 to 16 float32 (or 1 to 8 float64), actions int64 or int32,
 * rewards float32 or float64, no extras. */
#define FUSE_STATES(X, n, AB, RB)                                                                  \
    X(n + 1, 4, AB, RB) X(n + 2, 8, AB, RB) X(n + 3, 16, AB, RB) X(n + 4, 32, AB, RB)             \
    X(n + 5, 64, AB, RB)
#define FUSE_ALL(X)                                                                                \
    FUSE_STATES(X, 0, 8, 4) FUSE_STATES(X, 5, 4, 4) FUSE_STATES(X, 10, 8, 8)                       \
    FUSE_STATES(X, 15, 4, 8)

/* Which combination a layout is (0: none), found once per batch, which
 * then runs that combination's own loop (fuse_batch) rather than comparing
 * the layout's widths (reloaded after every store: the output is unsigned
 * char, which may alias them) against every combination at each pick. */
static int fuse_kind(const exr_store_layout *L)
{
#define FUSE_KIND(id, SB, AB, RB)                                                                  \
    if (L->state_bytes == (SB) && L->action_bytes == (AB) && L->reward_bytes == (RB) &&          \
        !L->extra_bytes)                                                                           \
        return (id);
    FUSE_ALL(FUSE_KIND)
#undef FUSE_KIND
    return 0;
}

/* A pick of any widths (fuse_pick, below, for the common ones). nx NULL:
 * shared next states (st has pick_len + 1 rows, the last next state in row
 * l). */
static void copy_pick(const exr_store_layout *L, const plan_t *pl, size_t pick_len,
                      unsigned char *st, unsigned char *ac, unsigned char *rw, unsigned char *nx)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes, l = pl->len;
    gather_rows(st, pl, l, 0, L, sb);
    gather_rows(ac, pl, l, sb, L, ab);
    gather_rows(rw, pl, l, sb + ab, L, rb);
    /* Next states 0..l-2 are states 1..l-1: take them from the output
     * just written, so each stored state is read once (docs/design.md). */
    if (nx && l > 1)
        exr_copy_short(nx, st + sb, (l - 1) * sb);
    unsigned char *last = nx ? nx + (l - 1) * sb : st + l * sb;
    if (pl->next_stored)
        exr_copy_short(last, l < pl->na ? pl->a + l * L->row_bytes : pl->b + (l - pl->na) * L->row_bytes,
                   sb);
    else if (pl->final)
        exr_copy_short(last, pl->final, sb);
    else
        memset(last, 0, sb);
    if (l < pick_len) {
        size_t pad = pick_len - l;
        memset(st + (l + !nx) * sb, 0, pad * sb);
        if (nx)
            memset(nx + l * sb, 0, pad * sb);
        memset(ac + l * ab, 0, pad * ab);
        memset(rw + l * rb, 0, pad * rb);
    }
}
/* The prefetch helpers are always inlined: GCC treats a function that
 * only prefetches as having no effect (pure-const) and deletes its calls,
 * which left this copy without any prefetch in -O1 and above builds. */
#define PREFETCH_FN static inline __attribute__((always_inline)) void

PREFETCH_FN prefetch_range(const unsigned char *p, size_t n)
{
    if (!p)
        return;
    for (size_t off = 0; off < n; off += 64)
        __builtin_prefetch(p + off);
    __builtin_prefetch(p + n - 1);
}

/* Every line pick pl will read, so that the misses of the picks ahead
 * overlap with the copying of this one. */
PREFETCH_FN prefetch_pick(const exr_store_layout *L, const plan_t *pl)
{
    size_t rows = pl->len + pl->next_stored;
    size_t a = rows < pl->na ? rows : pl->na;
    prefetch_range(pl->a, a * L->row_bytes);
    if (rows > a)
        prefetch_range(pl->b, (rows - a) * L->row_bytes);
}

/* Row r of a pick (rows [0, na) in A, the rest in B). */
static inline const unsigned char *pick_row(const exr_store_layout *L, const plan_t *pl, size_t r)
{
    return r < pl->na ? pl->a + r * L->row_bytes : pl->b + (r - pl->na) * L->row_bytes;
}

/* The first item of a pick in field fd's dst (its items: pick_len, and one
 * more for a shared next state). */
static inline size_t field_pick_at(const exr_field_dst *fd, size_t pick_len, size_t i)
{
    return i * (pick_len + fd->seq) * fd->bytes;
}

/* The end of copy_pick_fields for pick i of length l: each state field's
 * last next state (`last`: row l, the final state, or NULL for zeros) and
 * every field's zeros past the pick. */
static void finish_pick_fields(const exr_field_dst *fields, size_t nfields, size_t pick_len,
                               size_t i, size_t l, const unsigned char *last, bool stream)
{
    for (size_t f = 0; f < nfields; f++) {
        const exr_field_dst *fd = &fields[f];
        size_t w = fd->bytes, at = field_pick_at(fd, pick_len, i);
        unsigned char *to = fd->next ? fd->next + at + (l - 1) * w
                            : fd->seq ? fd->dst + at + l * w
                                      : NULL;
        if (to && last)
            copy_field(to, last + fd->off, w, stream);
        else if (to)
            memset(to, 0, w);
        size_t used = l + fd->seq, items = pick_len + fd->seq;
        if (used < items)
            memset(fd->dst + at + used * w, 0, (items - used) * w);
        if (fd->next && l < pick_len)
            memset(fd->next + at + l * w, 0, (pick_len - l) * w);
    }
}

/* The same for a buffer with named fields (fields.h), row by row: each of
 * the pick's rows is read once, while it is in cache, and every field of it
 * written where it goes: its state array and, for a state field, the next
 * states of the step before, copied from the same row while it is still in
 * L1 (as the floor takes next states from its source, not from its output).
 * A pass per field would walk the pick's rows once per field, and a long
 * pick of large rows (R2D2: 81 rows of 9 KB) does not stay in cache between
 * passes; copying next states back from the output would read the pick's
 * output a second time from beyond L2. */
static void copy_pick_fields(const exr_store_layout *L, const plan_t *pl, size_t pick_len,
                             size_t i, unsigned char *ac, unsigned char *rw,
                             const exr_field_dst *fields, size_t nfields, bool stream)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes, l = pl->len;
    for (size_t r = 0; r < l; r++) {
        const unsigned char *row = pick_row(L, pl, r);
        exr_copy_short(ac + r * ab, row + sb, ab);
        exr_copy_short(rw + r * rb, row + sb + ab, rb);
        for (size_t f = 0; f < nfields; f++) {
            const exr_field_dst *fd = &fields[f];
            size_t w = fd->bytes, at = field_pick_at(fd, pick_len, i);
            copy_field(fd->dst + at + r * w, row + fd->off, w, stream);
            if (fd->next && r > 0)
                copy_field(fd->next + at + (r - 1) * w, row + fd->off, w, stream);
        }
    }
    /* the last next state: row l, the final state, or zeros (state fields
     * sit at the same offsets in both) */
    finish_pick_fields(fields, nfields, pick_len, i, l,
                       pl->next_stored ? pick_row(L, pl, l) : pl->final, stream);
    if (l < pick_len) {
        memset(ac + l * ab, 0, (pick_len - l) * ab);
        memset(rw + l * rb, 0, (pick_len - l) * rb);
    }
}

/* The first line of each row of a pick, and the line its action starts
 * in: the misses that the first touches of a row would wait for. The
 * hardware's stream prefetcher fetches the rest of a row as it is copied;
 * asking for every line of a pick's rows (prefetch_pick) fills the miss
 * queue with lines that are not needed yet. */
PREFETCH_FN prefetch_heads(const exr_store_layout *L, const plan_t *pl)
{
    size_t rows = pl->len + pl->next_stored;
    for (size_t r = 0; r < rows; r++) {
        const unsigned char *row = pick_row(L, pl, r);
        __builtin_prefetch(row);
        __builtin_prefetch(row + L->state_bytes);
    }
}

/* How many picks ahead copy_batch_fields prefetches. */
#define FIELDS_AHEAD 4

static void copy_batch_fields(const exr_buffer *b, size_t count, const plan_t *plans,
                              exr_batch_out *out)
{
    const exr_store_layout *L = &b->lay;
    size_t P = b->cfg.pick_len;
    size_t as = P * L->action_bytes, rs = P * L->reward_bytes;
    /* the batch's bytes (its arrays exist, so the sum fits) */
    size_t item = L->action_bytes + L->reward_bytes, seq = 0;
    for (size_t f = 0; f < out->nfields; f++) {
        item += out->fields[f].bytes * (out->fields[f].next ? 2 : 1);
        seq += out->fields[f].seq ? out->fields[f].bytes : 0; /* a shared next state's */
    }
    bool stream = count * (P * item + seq) >= exr_stream_min();
    for (size_t i = 0; i < count && i < FIELDS_AHEAD; i++)
        prefetch_heads(L, &plans[i]);
    for (size_t i = 0; i < count; i++) {
        if (i + FIELDS_AHEAD < count)
            prefetch_heads(L, &plans[i + FIELDS_AHEAD]);
        copy_pick_fields(L, &plans[i], P, i, out->action + i * as, out->reward + i * rs,
                         out->fields, out->nfields, stream);
    }
    if (stream)
        exr_stream_fence(); /* the streamed stores are visible before the batch is returned */
}

/* A whole pick for fixed widths SB, AB, RB (constants of the caller: every
 * move, the last next state's and the padding's too, is a fixed-size one):
 * what copy_pick does, each row read once. SEQ (a constant too): shared
 * next states, nx unused. */
static inline __attribute__((always_inline)) void
fuse_pick(const plan_t *pl, size_t P, unsigned char *st, unsigned char *ac, unsigned char *rw,
          unsigned char *nx, const size_t SB, const size_t AB, const size_t RB, const bool SEQ)
{
    const size_t ROW = SB + AB + RB;
    size_t l = pl->len, first = l < pl->na ? l : pl->na;
    FUSE_ROWS(pl->a, 0, first, SB, AB, RB, ROW, !SEQ);
    if (l > first)
        FUSE_ROWS(pl->b, first, l, SB, AB, RB, ROW, !SEQ);
    unsigned char *last = SEQ ? st + l * SB : nx + (l - 1) * SB;
    if (pl->next_stored)
        memcpy(last, l < pl->na ? pl->a + l * ROW : pl->b + (l - pl->na) * ROW, SB);
    else if (pl->final)
        memcpy(last, pl->final, SB);
    else
        memset(last, 0, SB);
    for (size_t r = l; r < P; r++) {
        memset(st + (r + SEQ) * SB, 0, SB);
        if (!SEQ)
            memset(nx + r * SB, 0, SB);
        memset(ac + r * AB, 0, AB);
        memset(rw + r * RB, 0, RB);
    }
}

/* ---- the commonest row, four rows at a time (AVX-512) ----
 *
 * A (4,) float32 state, an int64 action and a float32 reward make a 28-byte
 * row: 7 dwords. Four rows and the next row's state are 32 dwords, two
 * 64-byte loads; a two-source dword permute of them gives the four states
 * (one 64-byte store), another the four next states (one store), a third
 * the four actions and rewards (one 32-byte and one 16-byte store): 2 loads
 * and 4 stores for 4 rows, where the fused copy makes 12 loads and 16
 * stores. A pick that runs into a second segment is loaded from both
 * with masks (rows [0, na) from A, the rest from B), so it takes the same
 * path; a short pick (its padding, its final state) takes fuse_pick. Used
 * when the machine has AVX-512 and pick_len is a multiple of 4. */
#if defined(__x86_64__) && defined(__GNUC__)
#define SIMD_COPY 1
#include <immintrin.h>
#define AVX512_FN __attribute__((target("avx512f")))

/* 0: off (exr_set_copy_simd), 1: on if the machine has AVX-512F. */
static _Atomic int copy_simd = 1;

/* The three permutes' dword indices into the 32 dwords of two loads. */
typedef struct {
    __m512i st, nx, ar, iota;
} rows4_idx;

AVX512_FN static rows4_idx rows4_indices(void)
{
    rows4_idx x;
    x.st = _mm512_setr_epi32(0, 1, 2, 3, 7, 8, 9, 10, 14, 15, 16, 17, 21, 22, 23, 24);
    x.nx = _mm512_setr_epi32(7, 8, 9, 10, 14, 15, 16, 17, 21, 22, 23, 24, 28, 29, 30, 31);
    x.ar = _mm512_setr_epi32(4, 5, 11, 12, 18, 19, 25, 26, 6, 13, 20, 27, 0, 0, 0, 0);
    x.iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return x;
}

/* 16 dwords from dword d of a pick: those below `in_a` (the dwords in
 * segment A) from a, the rest from bb (B's start, less in_a dwords). The
 * masked-off lanes are not read (no fault). */
AVX512_FN static inline __m512i pick_dwords(const unsigned char *a, uintptr_t bb, __m512i iota,
                                            int in_a, int d)
{
    __mmask16 k = _mm512_cmplt_epi32_mask(iota, _mm512_set1_epi32(in_a - d));
    __m512i w = _mm512_maskz_loadu_epi32(k, a + 4 * d);
    return _mm512_mask_loadu_epi32(w, (__mmask16)~k, (const void *)(bb + 4 * (size_t)d));
}

/* Four rows from the 32 dwords w0 | w1 into the batch's arrays (nx NULL:
 * shared next states, nothing to store there). */
AVX512_FN static inline void rows4_store(__m512i w0, __m512i w1, const rows4_idx *x,
                                         unsigned char *st, unsigned char *ac, unsigned char *rw,
                                         unsigned char *nx)
{
    _mm512_storeu_si512((void *)st, _mm512_permutex2var_epi32(w0, x->st, w1));
    if (nx)
        _mm512_storeu_si512((void *)nx, _mm512_permutex2var_epi32(w0, x->nx, w1));
    __m512i ar = _mm512_permutex2var_epi32(w0, x->ar, w1);
    _mm256_storeu_si256((__m256i *)ac, _mm512_castsi512_si256(ar));
    _mm_storeu_si128((__m128i *)rw, _mm512_extracti32x4_epi32(ar, 2));
}

/* A pick of P rows (P a multiple of 4) with its next state stored: from
 * one segment with plain loads (a masked load is slower, even when it
 * reads everything), from two with masked ones. nx NULL: shared next
 * states, the next state (row P's state) stored as st's row P. */
AVX512_FN static inline void rows4_pick(const plan_t *pl, size_t P, const rows4_idx *x,
                                        unsigned char *st, unsigned char *ac, unsigned char *rw,
                                        unsigned char *nx)
{
    const unsigned char *a = pl->a;
    if (!nx)
        memcpy(st + 16 * P, P < pl->na ? a + 28 * P : pl->b + 28 * (P - pl->na), 16);
    if (!pl->b) {
        for (size_t g = 0; g < P; g += 4, a += 112)
            rows4_store(_mm512_loadu_si512((const void *)a),
                        _mm512_loadu_si512((const void *)(a + 64)), x, st + 16 * g, ac + 8 * g,
                        rw + 4 * g, nx ? nx + 16 * g : NULL);
        return;
    }
    int in_a = (int)pl->na * 7;
    uintptr_t bb = (uintptr_t)pl->b - (uintptr_t)in_a * 4;
    for (size_t g = 0; g < P; g += 4) {
        __m512i w0 = pick_dwords(a, bb, x->iota, in_a, (int)(7 * g));
        __m512i w1 = pick_dwords(a, bb, x->iota, in_a, (int)(7 * g + 16));
        rows4_store(w0, w1, x, st + 16 * g, ac + 8 * g, rw + 4 * g, nx ? nx + 16 * g : NULL);
    }
}

/* fuse_batch for the 28-byte row: rows4_pick for every pick of P rows with
 * its next state stored, fuse_pick for the rest. */
AVX512_FN static void rows4_batch(const exr_store_layout *L, size_t count, const plan_t *plans,
                                  size_t P, size_t ahead, const exr_batch_out *out)
{
    const rows4_idx x = rows4_indices();
    unsigned char *st = out->state, *ac = out->action, *rw = out->reward, *nx = out->state_next;
    bool seq = out->shared_next;
    for (size_t i = 0; i < count; i++) {
        if (i + ahead < count)
            prefetch_pick(L, &plans[i + ahead]);
        const plan_t *pl = &plans[i];
        size_t o = i * P;
        unsigned char *s = st + 16 * (o + (seq ? i : 0)), *n = seq ? NULL : nx + 16 * o;
        if (pl->len == P && pl->next_stored)
            rows4_pick(pl, P, &x, s, ac + 8 * o, rw + 4 * o, n);
        else if (seq)
            fuse_pick(pl, P, s, ac + 8 * o, rw + 4 * o, NULL, 16, 8, 4, true);
        else
            fuse_pick(pl, P, s, ac + 8 * o, rw + 4 * o, n, 16, 8, 4, false);
    }
}

/* Whether rows4_batch copies this batch. */
static bool rows4_fits(const exr_store_layout *L, size_t P)
{
    return L->state_bytes == 16 && L->action_bytes == 8 && L->reward_bytes == 4 &&
           !L->extra_bytes && P % 4 == 0 && P <= ((size_t)1 << 26) &&
           atomic_load_explicit(&copy_simd, memory_order_relaxed) &&
           __builtin_cpu_supports("avx512f");
}
#endif

bool batch_simd_on(void)
{
#ifdef SIMD_COPY
    return atomic_load_explicit(&copy_simd, memory_order_relaxed) != 0;
#else
    return false;
#endif
}

int exr_set_copy_simd(int on)
{
#ifdef SIMD_COPY
    return atomic_exchange_explicit(&copy_simd, on ? 1 : 0, memory_order_relaxed);
#else
    (void)on;
    return 0;
#endif
}

/* The batch's picks for combination `kind` (fuse_kind), one loop per
 * combination and layout (SEQ: shared next states), so that a pick neither
 * dispatches on the kind nor reads the layout's widths: returns 0 if kind
 * is none of them. Prefetches `ahead` picks ahead (none when ahead >=
 * count). */
static int fuse_batch(int kind, const exr_store_layout *L, size_t count, const plan_t *plans,
                      size_t P, size_t ahead, const exr_batch_out *out)
{
    unsigned char *st = out->state, *ac = out->action, *rw = out->reward, *nx = out->state_next;
#define FUSE_PICKS(SB, AB, RB, SEQ)                                                                \
    for (size_t i = 0; i < count; i++) {                                                           \
        if (i + ahead < count)                                                                     \
            prefetch_pick(L, &plans[i + ahead]);                                                   \
        fuse_pick(&plans[i], P, st + i * (P + (SEQ)) * (SB), ac + i * P * (AB),                    \
                  rw + i * P * (RB), (SEQ) ? NULL : nx + i * P * (SB), (SB), (AB), (RB), (SEQ));   \
    }
#define FUSE_LOOP(id, SB, AB, RB)                                                                  \
    case (id):                                                                                     \
        if (out->shared_next)                                                                      \
            FUSE_PICKS(SB, AB, RB, true)                                                           \
        else                                                                                       \
            FUSE_PICKS(SB, AB, RB, false)                                                          \
        return 1;
    switch (kind) {
        FUSE_ALL(FUSE_LOOP)
    default:
        return 0;
    }
#undef FUSE_LOOP
#undef FUSE_PICKS
}

void copy_batch(const exr_buffer *b, size_t count, const plan_t *plans, exr_batch_out *out,
                bool prefetch)
{
    if (out->fields) {
        copy_batch_fields(b, count, plans, out);
        return;
    }
    const exr_store_layout *L = &b->lay;
    size_t P = b->cfg.pick_len;
    bool seq = out->shared_next;
    size_t ss = P * L->state_bytes, as = P * L->action_bytes, rs = P * L->reward_bytes;
    /* a pick's states (and next states) in the output */
    size_t sts = seq ? ss + L->state_bytes : 2 * ss;
    if (count * (sts + as + rs) >= exr_stream_min()) {
        /* large: streamed, as the one field of a plan (next states from the
         * rows, since the output just written is not in cache) */
        exr_field_dst one = {0, L->state_bytes, out->state, seq ? NULL : out->state_next, seq};
        exr_batch_out o = *out;
        o.fields = &one;
        o.nfields = 1;
        copy_batch_fields(b, count, plans, &o);
        return;
    }
    unsigned char *st = out->state, *ac = out->action, *rw = out->reward, *nx = out->state_next;
    /* how many picks ahead to prefetch: enough lines in flight to cover a
     * DRAM miss (the core tracks a few dozen). A pick of more than 48 lines
     * is a long sequential stream, which the hardware prefetcher follows by
     * itself; prefetching all of the next one would push this pick's rows
     * and its output out of L2 (R2D2's 572 KB picks: 1.27x slower). */
    size_t lines = (P + 1) * L->row_bytes / 64 + 2;
    if (lines > 48)
        prefetch = false;
    size_t ahead = !prefetch ? count : 48 / lines;
    for (size_t i = 0; prefetch && i < count && i < ahead; i++)
        prefetch_pick(L, &plans[i]);
#ifdef SIMD_COPY
    if (rows4_fits(L, P)) {
        rows4_batch(L, count, plans, P, ahead, out);
        return;
    }
#endif
    if (fuse_batch(fuse_kind(L), L, count, plans, P, ahead, out))
        return;
    for (size_t i = 0; i < count; i++) {
        if (i + ahead < count)
            prefetch_pick(L, &plans[i + ahead]);
        copy_pick(L, &plans[i], P, st + i * (seq ? ss + L->state_bytes : ss), ac + i * as,
                  rw + i * rs, seq ? NULL : nx + i * ss);
    }
}
