/*
 * plan_simd.c - get_batch's plan for eight picks at a time (AVX-512), or
 * four (AVX2, below, for machines without AVX-512): what plan_pick_locked
 * (buffer_batch.c) does for one pick, in the lanes of 512-bit (256-bit)
 * vectors (buffer_batch.c's walk calls it for each chunk, after the
 * chunk's prefetch passes when the buffer is not in cache).
 *
 * In a buffer that stays in cache the one-pick plan is bound by its
 * instructions (about 95 a pick, at more than three a cycle), not by
 * misses: every link of a pick's chain (its table entry, its episode slot,
 * the segment pointer in the body) is a cache hit. Here the eight slots
 * are eight line loads and a transpose, the segment pointers the slots'
 * copies of segment 0's or a gather from the bodies of the lanes that need
 * them (rows past segment 0, or no next state stored), and
 * the arithmetic (how many rows, whether the next state is stored, which
 * segment and offset, whether the rows run into a second segment) is done
 * once for eight picks. Lanes take no branch; the rare cases are masks (a
 * pick whose next state is not stored reads its body's final state by a
 * masked gather), and the `sampled` marks are read and set one lane at a
 * time, atomically.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "buffer_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define PLAN8_FN __attribute__((target("avx512f,avx512cd,avx512dq,avx512bw")))

_Static_assert(sizeof(exr_pick) == 8, "a pick entry is one qword: slot | pos << 32");
_Static_assert(offsetof(exr_episode, terminated) == offsetof(exr_episode, ended) + 1,
               "ended, terminated: adjacent bytes of one qword");

/* The layout's constants, one per lane (both plans): field, value. B and
 * G are the segments' base shift and the number of growing segments; lo8
 * and hi8 pick ended and terminated out of the flags' qword, and i127 is a
 * float exponent's bias (the last three only used by the four-pick plan). */
#define PLAN_CONSTS(X)                                                                             \
    X(one, 1)                                                                                      \
    X(P, pick_len)                                                                                 \
    X(B, B)                                                                                        \
    X(G, G)                                                                                        \
    X(max, L->max_shift)                                                                           \
    X(grow_end, (((uint64_t)1 << G) - 1) << B)                                                     \
    X(max_mask, ((uint64_t)1 << L->max_shift) - 1)                                                 \
    X(row_bytes, L->row_bytes)                                                                     \
    X(lo8, 0xff)                                                                                   \
    X(hi8, 0xff00)                                                                                 \
    X(i127, 127)

/* The constants' struct (each a vector of PLAN_VEC) and the function
 * that fills it (each by PLAN_SET1), for both plans: PLAN_VEC and
 * PLAN_SET1 are defined around each use. */
#define PLAN_FIELD(f, v) PLAN_VEC f;
#define PLAN_SET(f, v) k.f = PLAN_SET1((long long)(v));
#define PLAN_CONSTS_FN(FN, consts, init)                                                           \
    typedef struct {                                                                               \
        PLAN_CONSTS(PLAN_FIELD)                                                                    \
        __m128i Bx, maxx;                                                                          \
    } consts;                                                                                      \
    FN static consts init(const exr_store_layout *L, uint64_t pick_len)                           \
    {                                                                                              \
        consts k;                                                                                  \
        unsigned B = L->base_shift, G = L->max_shift - L->base_shift;                              \
        PLAN_CONSTS(PLAN_SET)                                                                      \
        k.Bx = _mm_cvtsi32_si128((int)B);                                                          \
        k.maxx = _mm_cvtsi32_si128((int)L->max_shift);                                             \
        return k;                                                                                  \
    }

#define PLAN_VEC __m512i
#define PLAN_SET1 _mm512_set1_epi64
PLAN_CONSTS_FN(PLAN8_FN, plan8_consts, plan8_init)
#undef PLAN_VEC
#undef PLAN_SET1

/* exr_store_locate for eight positions p: segment *k, offset returned. */
PLAN8_FN static inline __m512i locate8(const plan8_consts *c, __m512i p, __m512i *k)
{
    __mmask8 grow = _mm512_cmplt_epu64_mask(p, c->grow_end);
    __m512i q = _mm512_add_epi64(_mm512_srl_epi64(p, c->Bx), c->one);
    __m512i kg = _mm512_sub_epi64(_mm512_set1_epi64(63), _mm512_lzcnt_epi64(q));
    __m512i start = _mm512_sll_epi64(_mm512_sub_epi64(_mm512_sllv_epi64(c->one, kg), c->one), c->Bx);
    __m512i r = _mm512_sub_epi64(p, c->grow_end);
    __m512i kf = _mm512_add_epi64(c->G, _mm512_srl_epi64(r, c->maxx));
    *k = _mm512_mask_blend_epi64(grow, kf, kg);
    return _mm512_mask_blend_epi64(grow, _mm512_and_si512(r, c->max_mask),
                                   _mm512_sub_epi64(p, start));
}

/* n, the flags' qword (ended, terminated, ...), segment 0's pointer and
 * the body pointer of the episode slots of ent[0..8), one vector each: each slot is
 * one 64-byte line (the slab is line-aligned), so eight loads and a
 * transpose of the four qwords wanted (twelve permutes). The loads leave
 * out the `sampled` byte (a byte-masked load does not read its masked-off
 * bytes): other samplers set it under the shared lock, atomically, so it is
 * read atomically (mark_sampled), as plan_pick_locked does. They leave out
 * `busy` too, which a publishing record call clears under the shared lock
 * (the plan does not use it), and m, which shares n's qword, so that the
 * qword is n. */
#define SLOT_BYTES                                                                                 \
    (~((uint64_t)1 << offsetof(exr_episode, sampled) | (uint64_t)1 << offsetof(exr_episode, busy) | \
       (uint64_t)0xf << offsetof(exr_episode, m)))
typedef struct {
    __m512i n, fl, seg0, body;
} slot8;

_Static_assert(sizeof(exr_episode) == 64 && offsetof(exr_episode, n) == 8 &&
                   offsetof(exr_episode, m) == 12 && sizeof(((exr_episode *)0)->m) == 4 &&
                   offsetof(exr_episode, ended) == 24 && offsetof(exr_episode, seg0) == 32 &&
                   offsetof(exr_episode, body) == 48,
               "an episode slot: one line, its qwords 1, 3, 4 and 6 read by slot_fields");

PLAN8_FN static inline slot8 slot_fields(const exr_episode *slab, const exr_pick *ent)
{
    const __m512i pick = _mm512_setr_epi64(1, 3, 4, 6, 9, 11, 12, 14);
    const __m512i lo = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
    const __m512i hi = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
    __m512i x[4], y[4];
    for (int j = 0; j < 4; j++)
        x[j] = _mm512_permutex2var_epi64(
            _mm512_maskz_loadu_epi8(SLOT_BYTES, (const void *)&slab[ent[2 * j].slot]), pick,
            _mm512_maskz_loadu_epi8(SLOT_BYTES, (const void *)&slab[ent[2 * j + 1].slot]));
    for (int j = 0; j < 2; j++) {
        y[2 * j] = _mm512_permutex2var_epi64(x[2 * j], lo, x[2 * j + 1]);
        y[2 * j + 1] = _mm512_permutex2var_epi64(x[2 * j], hi, x[2 * j + 1]);
    }
    slot8 f;
    f.n = _mm512_shuffle_i64x2(y[0], y[2], 0x44);
    f.fl = _mm512_shuffle_i64x2(y[0], y[2], 0xee);
    f.seg0 = _mm512_shuffle_i64x2(y[1], y[3], 0x44);
    f.body = _mm512_shuffle_i64x2(y[1], y[3], 0xee);
    return f;
}

/* Marks the episodes of ent[0..8) sampled, as plan_pick_locked does: an
 * atomic read of each mark, and a store only where it changes (the line
 * stays clean), which a branch on all eight skips in the common case. */
static inline __attribute__((always_inline)) void mark_sampled(exr_episode *slab,
                                                               const exr_pick *ent)
{
    unsigned todo = 0;
    for (unsigned j = 0; j < 8; j++)
        todo |= (unsigned)!__atomic_load_n(&slab[ent[j].slot].sampled, __ATOMIC_RELAXED) << j;
    for (unsigned j = 0; todo && j < 8; j++)
        if (todo >> j & 1)
            __atomic_store_n(&slab[ent[j].slot].sampled, 1, __ATOMIC_RELAXED);
}

/* The eight plans from their fields, one vector each, into plans[0..8):
 * 40 qwords (a, b, final, na | len << 32, next_stored of each plan) in
 * five 64-byte stores. Store v holds qwords 8v..8v+7, qword t being field
 * t % 5 of plan t / 5: a and b come by one two-source permute, final and
 * na | len by another, blended, and next_stored by a masked permute. */
_Static_assert(sizeof(plan_t) == 40 && offsetof(plan_t, a) == 0 && offsetof(plan_t, b) == 8 &&
                   offsetof(plan_t, final) == 16 && offsetof(plan_t, na) == 24 &&
                   offsetof(plan_t, len) == 28 && offsetof(plan_t, next_stored) == 32,
               "plan_t: five qwords, as store_plans writes them");
static const int64_t PERM_AB[5][8] = {{0, 8, 0, 0, 0, 1, 9, 0},   {0, 0, 2, 10, 0, 0, 0, 3},
                                      {11, 0, 0, 0, 4, 12, 0, 0}, {0, 5, 13, 0, 0, 0, 6, 14},
                                      {0, 0, 0, 7, 15, 0, 0, 0}};
static const int64_t PERM_FN[5][8] = {{0, 0, 0, 8, 0, 0, 0, 1},   {9, 0, 0, 0, 2, 10, 0, 0},
                                      {0, 3, 11, 0, 0, 0, 4, 12}, {0, 0, 0, 5, 13, 0, 0, 0},
                                      {6, 14, 0, 0, 0, 7, 15, 0}};
static const int64_t PERM_X[5][8] = {{0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0, 2, 0},
                                     {0, 0, 0, 3, 0, 0, 0, 0}, {4, 0, 0, 0, 0, 5, 0, 0},
                                     {0, 0, 6, 0, 0, 0, 0, 7}};
static const uint8_t MASK_FN[5] = {0x8c, 0x31, 0xc6, 0x18, 0x63};
static const uint8_t MASK_X[5] = {0x10, 0x42, 0x08, 0x21, 0x84};

PLAN8_FN static inline void store_plans(plan_t *plans, __m512i a, __m512i b, __m512i fin,
                                        __m512i nalen, __m512i next)
{
    for (int v = 0; v < 5; v++) {
        __m512i ab = _mm512_permutex2var_epi64(a, _mm512_loadu_si512(PERM_AB[v]), b);
        __m512i fn = _mm512_permutex2var_epi64(fin, _mm512_loadu_si512(PERM_FN[v]), nalen);
        __m512i r = _mm512_mask_blend_epi64(MASK_FN[v], ab, fn);
        r = _mm512_mask_permutexvar_epi64(r, MASK_X[v], _mm512_loadu_si512(PERM_X[v]), next);
        _mm512_storeu_si512((void *)((unsigned char *)plans + 64 * v), r);
    }
}

/* Picks ent[0..8) into plans[0..8) and the metadata arrays' first eight
 * entries: plan_pick_locked's steps, lane by lane. */
PLAN8_FN static inline void plan8_group(const plan8_consts *c, exr_episode *slab,
                                        const exr_pick *ent, plan_t *plans, int64_t *epi,
                                        int64_t *pos, int64_t *len, int64_t *len_next)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i e = _mm512_loadu_si512((const void *)ent);
    __m512i p = _mm512_srli_epi64(e, 32);
    slot8 sf = slot_fields(slab, ent);
    __m512i n = sf.n, fl = sf.fl, body = sf.body;
    mark_sampled(slab, ent);
    __mmask8 ended = _mm512_test_epi64_mask(fl, _mm512_set1_epi64(0xff));
    __mmask8 term = _mm512_test_epi64_mask(fl, _mm512_set1_epi64(0xff00));
    /* complete steps: n if ended, else n - 1 (0 when n is 0) */
    __m512i cst = _mm512_mask_sub_epi64(n, (__mmask8)~ended & _mm512_test_epi64_mask(n, n), n, c->one);
    __m512i l = _mm512_min_epu64(_mm512_sub_epi64(cst, p), c->P);
    __m512i pe = _mm512_add_epi64(p, l);
    __mmask8 next = _mm512_cmplt_epu64_mask(pe, n);
    __m512i k, off = locate8(c, p, &k);
    __m512i sh = _mm512_min_epu64(_mm512_add_epi64(k, c->B), c->max);
    __m512i room = _mm512_sub_epi64(_mm512_sllv_epi64(c->one, sh), off);
    /* segment B is read only where the rows read run past A (they are
     * stored, so it exists); the final state only where row l is not */
    __mmask8 more = _mm512_cmplt_epu64_mask(room, _mm512_mask_add_epi64(l, next, l, c->one));
    /* segment 0's pointer from the slots; the body's lines read only in
     * the lanes that read past segment 0 or have no next state stored */
    __m512i sa = sf.seg0;
    __mmask8 past = _mm512_test_epi64_mask(k, k);
    __m512i sb = zero, fin = zero;
    if (past | more | (__mmask8)~next) {
        __m512i sp = _mm512_add_epi64(body, _mm512_slli_epi64(k, 3));
        const char *segs = (const char *)(uintptr_t)offsetof(exr_body, segs);
        sa = _mm512_mask_i64gather_epi64(sa, past, sp, segs, 1);
        sb = _mm512_mask_i64gather_epi64(zero, more, sp, segs + sizeof(void *), 1);
        fin = _mm512_mask_i64gather_epi64(zero, (__mmask8)~next, body,
                                          (const char *)(uintptr_t)offsetof(exr_body, final_state), 1);
    }
    __m512i a = _mm512_add_epi64(sa, _mm512_mullo_epi64(off, c->row_bytes));
    __m512i na = _mm512_min_epu64(room, _mm512_add_epi64(l, c->one));
    __mmask8 last = term & _mm512_cmpeq_epi64_mask(pe, n);
    /* the handles only go out: read from the slots' lines (in cache) */
    for (int j = 0; j < 8; j++)
        epi[j] = slab[ent[j].slot].handle;
    _mm512_storeu_si512((void *)pos, p);
    _mm512_storeu_si512((void *)len, l);
    _mm512_storeu_si512((void *)len_next, _mm512_mask_sub_epi64(l, last, l, c->one));
    store_plans(plans, a, sb, fin, _mm512_or_si512(na, _mm512_slli_epi64(l, 32)),
                _mm512_maskz_mov_epi64(next, c->one));
}

/* The plan of ent[from..) in groups of W picks (both plans): where it
 * stopped, the rest being fewer than W. */
#define PLAN_RUN(FN, name, consts, init, group, W)                                                 \
    FN static size_t name(exr_buffer *b, size_t from, size_t to, const exr_pick *ent,               \
                          plan_t *plans, exr_batch_out *out, bool rows)                            \
    {                                                                                              \
        const exr_store_layout *L = &b->lay;                                                       \
        const consts c = init(L, b->cfg.pick_len);                                                 \
        exr_episode *slab = b->eps.slab;                                                           \
        size_t end = from + ((to - from) / (W) * (W));                                             \
        for (size_t i = from; i < end; i += (W)) {                                                 \
            group(&c, slab, ent + i, plans + i, out->pick_epi + i, out->pick_pos + i,              \
                  out->seq_len + i, out->seq_len_next + i);                                        \
            for (size_t j = i; rows && j < i + (W); j++)                                           \
                prefetch_plan(L, &plans[j]);                                                       \
        }                                                                                          \
        return end;                                                                                \
    }

PLAN_RUN(PLAN8_FN, plan8_run, plan8_consts, plan8_init, plan8_group, 8)

/* ---- four picks at a time (AVX2) ----
 *
 * The same steps in the four 64-bit lanes of 256-bit vectors, for machines
 * with AVX2 and not AVX-512. What AVX2 lacks is done another way:
 * - the slots: each slot's first 16 bytes (handle, n | m) and its bytes
 *   32..63 (seg0, prev | next, body, fill) by plain loads, which leave out
 *   the `sampled` and `busy` bytes that other threads write under the
 *   shared lock, then transposed; `ended` and `terminated` by a 16-bit load
 *   of each slot;
 * - the segment number, 63 - lzcnt(q), from the exponent of q as a float:
 *   exact, as q <= 2^G < 2^24 where it is used (plan4_fits);
 * - unsigned compares and minima by signed ones (every value is below
 *   2^63), the row offset's product by a 32 x 32-bit multiply (plan4_fits:
 *   offsets below 2^24, rows below 2^32 bytes). */
#define PLAN4_FN __attribute__((target("avx2")))

#define PLAN_VEC __m256i
#define PLAN_SET1 _mm256_set1_epi64x
PLAN_CONSTS_FN(PLAN4_FN, plan4_consts, plan4_init)
#undef PLAN_VEC
#undef PLAN_SET1

/* Whether the four-pick plan can plan this layout: segment numbers by the
 * float exponent and offsets by a 32-bit multiply (plan4_consts). */
static bool plan4_fits(const exr_store_layout *L)
{
    return L->max_shift < 24 && L->row_bytes < ((size_t)1 << 32);
}

PLAN4_FN static inline __m256i min4(__m256i x, __m256i y)
{
    return _mm256_blendv_epi8(x, y, _mm256_cmpgt_epi64(x, y));
}

/* exr_store_locate for four positions p: segment *k, offset returned. */
PLAN4_FN static inline __m256i locate4(const plan4_consts *c, __m256i p, __m256i *k)
{
    __m256i grow = _mm256_cmpgt_epi64(c->grow_end, p);
    __m256i q = _mm256_add_epi64(_mm256_srl_epi64(p, c->Bx), c->one);
    /* q's low dword as a float: its exponent is bits 23..30 of the lane
     * (what the high dword converts to is masked off); in a lane past the
     * growing segments q may not fit a dword, and kg is garbage there,
     * which the blends below leave out */
    __m256i f = _mm256_castps_si256(_mm256_cvtepi32_ps(q));
    __m256i kg = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(f, 23), c->lo8), c->i127);
    __m256i start = _mm256_sll_epi64(_mm256_sub_epi64(_mm256_sllv_epi64(c->one, kg), c->one), c->Bx);
    __m256i r = _mm256_sub_epi64(p, c->grow_end);
    __m256i kf = _mm256_add_epi64(c->G, _mm256_srl_epi64(r, c->maxx));
    *k = _mm256_blendv_epi8(kf, kg, grow);
    return _mm256_blendv_epi8(_mm256_and_si256(r, c->max_mask), _mm256_sub_epi64(p, start), grow);
}

/* The slots' fields of ent[0..4), one vector each (lane j: pick j). */
typedef struct {
    __m256i handle, n, fl, seg0, body;
} slot4;

_Static_assert(offsetof(exr_episode, handle) == 0 && offsetof(exr_episode, prev) == 40 &&
                   offsetof(exr_episode, fill) == 56 && offsetof(exr_episode, sampled) == 26 &&
                   offsetof(exr_episode, busy) == 27,
               "an episode slot: bytes 0..15 and 32..63 hold no byte that samplers write");

PLAN4_FN static inline slot4 slot_fields4(const exr_episode *slab, const exr_pick *ent)
{
    const unsigned char *s[4];
    uint64_t fl = 0;
    for (int j = 0; j < 4; j++) {
        s[j] = (const unsigned char *)&slab[ent[j].slot];
        uint16_t f;
        memcpy(&f, s[j] + offsetof(exr_episode, ended), sizeof f);
        fl |= (uint64_t)f << (16 * j);
    }
#define HEAD(j) _mm_loadu_si128((const __m128i *)s[j])
#define TAIL(j) _mm256_loadu_si256((const __m256i *)(s[j] + offsetof(exr_episode, seg0)))
    __m256i h01 = _mm256_inserti128_si256(_mm256_castsi128_si256(HEAD(0)), HEAD(1), 1);
    __m256i h23 = _mm256_inserti128_si256(_mm256_castsi128_si256(HEAD(2)), HEAD(3), 1);
    __m256i t0 = TAIL(0), t1 = TAIL(1), t2 = TAIL(2), t3 = TAIL(3);
#undef HEAD
#undef TAIL
    slot4 f;
    /* [x0 x2 | x1 x3] -> [x0 x1 x2 x3] */
    f.handle = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(h01, h23), 0xd8);
    f.n = _mm256_and_si256(_mm256_permute4x64_epi64(_mm256_unpackhi_epi64(h01, h23), 0xd8),
                           _mm256_set1_epi64x(0xffffffff));
    __m256i s01 = _mm256_unpacklo_epi64(t0, t1), s23 = _mm256_unpacklo_epi64(t2, t3);
    f.seg0 = _mm256_permute2x128_si256(s01, s23, 0x20);
    f.body = _mm256_permute2x128_si256(s01, s23, 0x31);
    f.fl = _mm256_cvtepu16_epi64(_mm_cvtsi64_si128((long long)fl));
    return f;
}

/* The four plans (a, b, final, na | len << 32, next_stored): a 4 x 4
 * transpose of the first four qwords, one 32-byte store and one qword each. */
PLAN4_FN static inline void store_plans4(plan_t *plans, __m256i a, __m256i b, __m256i fin,
                                         __m256i nalen, __m256i next)
{
    __m256i ab0 = _mm256_unpacklo_epi64(a, b), ab1 = _mm256_unpackhi_epi64(a, b);
    __m256i fn0 = _mm256_unpacklo_epi64(fin, nalen), fn1 = _mm256_unpackhi_epi64(fin, nalen);
    __m256i v[4] = {_mm256_permute2x128_si256(ab0, fn0, 0x20), _mm256_permute2x128_si256(ab1, fn1, 0x20),
                    _mm256_permute2x128_si256(ab0, fn0, 0x31), _mm256_permute2x128_si256(ab1, fn1, 0x31)};
    uint64_t nx[4];
    _mm256_storeu_si256((__m256i *)nx, next);
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_si256((__m256i *)(void *)&plans[j], v[j]);
        memcpy(&plans[j].next_stored, &nx[j], sizeof(uint64_t)); /* its padding too */
    }
}
_Static_assert(offsetof(plan_t, next_stored) + sizeof(uint64_t) == sizeof(plan_t),
               "next_stored and its padding: the last qword of a plan");

/* Picks ent[0..4) into plans[0..4) and the metadata arrays' first four
 * entries: plan8_group's steps in four lanes. */
PLAN4_FN static inline void plan4_group(const plan4_consts *c, exr_episode *slab,
                                        const exr_pick *ent, plan_t *plans, int64_t *epi,
                                        int64_t *pos, int64_t *len, int64_t *len_next)
{
    const __m256i zero = _mm256_setzero_si256(), one = c->one;
    __m256i p = _mm256_srli_epi64(_mm256_loadu_si256((const __m256i *)(const void *)ent), 32);
    slot4 sf = slot_fields4(slab, ent);
    for (unsigned j = 0; j < 4; j++)
        if (!__atomic_load_n(&slab[ent[j].slot].sampled, __ATOMIC_RELAXED))
            __atomic_store_n(&slab[ent[j].slot].sampled, 1, __ATOMIC_RELAXED);
    __m256i n = sf.n;
    __m256i not_ended = _mm256_cmpeq_epi64(_mm256_and_si256(sf.fl, c->lo8), zero);
    __m256i term = _mm256_andnot_si256(_mm256_cmpeq_epi64(_mm256_and_si256(sf.fl, c->hi8), zero),
                                       _mm256_set1_epi64x(-1));
    /* complete steps: n if ended, else n - 1 (0 when n is 0) */
    __m256i dec = _mm256_andnot_si256(_mm256_cmpeq_epi64(n, zero), not_ended);
    __m256i cst = _mm256_add_epi64(n, dec); /* dec is -1 or 0 */
    __m256i l = min4(_mm256_sub_epi64(cst, p), c->P);
    __m256i pe = _mm256_add_epi64(p, l);
    __m256i next = _mm256_cmpgt_epi64(n, pe); /* -1 where row l is stored */
    __m256i k, off = locate4(c, p, &k);
    __m256i sh = min4(_mm256_add_epi64(k, c->B), c->max);
    __m256i room = _mm256_sub_epi64(_mm256_sllv_epi64(one, sh), off);
    __m256i more = _mm256_cmpgt_epi64(_mm256_sub_epi64(l, next), room);
    __m256i past = _mm256_andnot_si256(_mm256_cmpeq_epi64(k, zero), _mm256_set1_epi64x(-1));
    __m256i sa = sf.seg0, sb = zero, fin = zero;
    __m256i need = _mm256_or_si256(_mm256_or_si256(past, more), _mm256_xor_si256(next, _mm256_set1_epi64x(-1)));
    if (!_mm256_testz_si256(need, need)) {
        __m256i sp = _mm256_add_epi64(sf.body, _mm256_slli_epi64(k, 3));
        const long long *segs = (const long long *)(uintptr_t)offsetof(exr_body, segs);
        sa = _mm256_mask_i64gather_epi64(sa, segs, sp, past, 1);
        sb = _mm256_mask_i64gather_epi64(zero, segs + 1, sp, more, 1);
        fin = _mm256_mask_i64gather_epi64(
            zero, (const long long *)(uintptr_t)offsetof(exr_body, final_state), sf.body,
            _mm256_xor_si256(next, _mm256_set1_epi64x(-1)), 1);
    }
    __m256i a = _mm256_add_epi64(sa, _mm256_mul_epu32(off, c->row_bytes));
    __m256i na = min4(room, _mm256_add_epi64(l, one));
    __m256i last = _mm256_and_si256(term, _mm256_cmpeq_epi64(pe, n));
    _mm256_storeu_si256((__m256i *)(void *)epi, sf.handle);
    _mm256_storeu_si256((__m256i *)(void *)pos, p);
    _mm256_storeu_si256((__m256i *)(void *)len, l);
    _mm256_storeu_si256((__m256i *)(void *)len_next, _mm256_add_epi64(l, last));
    store_plans4(plans, a, sb, fin, _mm256_or_si256(na, _mm256_slli_epi64(l, 32)),
                 _mm256_and_si256(next, one));
}

PLAN_RUN(PLAN4_FN, plan4_run, plan4_consts, plan4_init, plan4_group, 4)

/* The picks a plan step takes on this machine: 8 (AVX-512 F, CD, DQ and
 * BW), 4 (AVX2) or 0. Asked of the CPU once: the walk plans a batch in
 * chunks, and each chunk asks. */
static int lanes(void)
{
    static _Atomic int known = -1;
    int w = atomic_load_explicit(&known, memory_order_relaxed);
    if (w < 0) {
        bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
        w = avx512 ? 8 : __builtin_cpu_supports("avx2") ? 4 : 0;
        atomic_store_explicit(&known, w, memory_order_relaxed);
    }
    return w;
}

bool plan_lanes_usable(void) { return batch_simd_on() && lanes() != 0; }

size_t plan_lanes_locked(exr_buffer *b, size_t from, size_t to, const exr_pick *ent,
                         plan_t *plans, exr_batch_out *out, bool rows)
{
    EXR_ASSERT_LOCKED(b);
    int w = lanes();
    if (w == 8)
        return plan8_run(b, from, to, ent, plans, out, rows);
    if (w == 4 && plan4_fits(&b->lay))
        return plan4_run(b, from, to, ent, plans, out, rows);
    return from;
}
#else
bool plan_lanes_usable(void) { return false; }

size_t plan_lanes_locked(exr_buffer *b, size_t from, size_t to, const exr_pick *ent,
                         plan_t *plans, exr_batch_out *out, bool rows)
{
    (void)b, (void)to, (void)ent, (void)plans, (void)out, (void)rows;
    return from;
}
#endif
