/*
 * buffer_impl.h - the layout of exr_buffer and the functions the buffer's
 * files (buffer*.c, batch_copy.c) share; codec*.c read and write it too.
 * Nothing outside the core includes this.
 */
#ifndef EXR_BUFFER_IMPL_H
#define EXR_BUFFER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "buffer.h"
#include "episode.h"
#include "evict.h"
#include "pick_table.h"
#include "store.h"

typedef struct {
    int64_t handle;
    exr_selector *sel;
} sel_entry;

/* Freed segments kept for the next episodes: at most this many, and at most
 * EXR_SPARE_BYTES. A buffer at capacity evicts about what it records, in
 * segments of the same sizes, so new segments come from here instead of
 * fresh pages (whose first touch, a page fault and a page clear, costs
 * about as much as the copy into them). */
#define EXR_SPARE_SEGS 32
#define EXR_SPARE_BYTES ((size_t)16 << 20)

/* The table sizes kept after the last moves (exr_buffer.low): 128 moves
 * cover, for example, 64 record calls that each evict an episode of 100
 * picks (two moves: a move removes at most 64). */
#define EXR_LOWS 128

/* Open episodes with steps that were evicted or removed while a log's hook
 * was set: end_episode on one of them still logs its end (buffer.h), at
 * its step count. At most this many are kept, the oldest forgotten first. */
#define EXR_GONE_OPEN 1024

/* A segment replaced while a copy may still read it (buffer_graveyard.c). */
typedef struct exr_dead {
    struct exr_dead *next;
    uint64_t epoch;
    unsigned char *seg;
} exr_dead;

typedef struct exr_reader {
    struct exr_reader *prev, *next;
    uint64_t epoch;
} exr_reader;

/* The locks (docs/design.md, "Locking"), in the order they are taken:
 *
 *   rw        the storage lock: everything below unless noted. Taken shared
 *             by get_batch and set_priority (they read the tables and change
 *             only their own selector) and by a record call publishing rows
 *             it copied unlocked (busy and writers: atomics), exclusive by
 *             everything else.
 *   res_mu    new_episode's reservations (res_* below, and next_handle
 *             while rw is not held exclusively): taken alone by
 *             new_episode, or with rw exclusive (buffer_reserve.c).
 *   sel->mu   one per selector: its state (sum tree, rng). Taken with rw
 *             shared; with rw exclusive no selector lock is needed.
 *   pin_mu    readers, epoch, graveyard and spare segments: a copy unpins
 *             with no other lock held.
 *   wait_mu   with `published`: waiting for a record call to publish.
 */
struct exr_locks; /* rw, pin_mu, wait_mu, published: buffer_locks.h */

/* The fields are grouped by who writes them, each group on cache lines of
 * its own (EXR_LINE): a sampler on one core reads the first group at every
 * call, and a record call on another core writes the counters below it at
 * every call; packed together, each record call took the sampler's lines
 * away from it (docs/design.md, "Cache lines"). The buffer is allocated
 * line-aligned (exr_buffer_new). */
struct exr_buffer {
    /* set when the buffer is made, or rarely (selectors added or removed,
     * the log's hook set, the powers' guesses changed): read by every call */
    struct exr_locks *lk;
    uint64_t serial; /* no other buffer of the process has it (exr_drawn) */
    exr_config cfg;
    exr_store_layout lay;
    sel_entry *sels;
    size_t nsels, sels_cap;
    /* the experience log's hook (buffer.h) */
    exr_step_hook hook;
    void *hook_ctx;
    /* the selector set_priority last found with a stored power (selector.h)
     * and that power (the bits of a double): a guess, written by whoever
     * finds it stale under the lock (shared), that lets set_priority compute
     * p ** a before it takes the lock (buffer_priority.c); -1: none */
    _Atomic int64_t pow_h;
    _Atomic uint64_t pow_a;
    /* the stored power of the first prioritized selector a record call
     * found under the lock (the bits of a double; NaN: none): the guess
     * exr_leaves_prepare computes a record call's leaves with, before the
     * lock is taken (buffer_record.c); written under the exclusive lock,
     * only when it changes */
    _Atomic uint64_t rec_pow_a;
    /* The thread of the last exclusive hold, as its exr_thread_id (exr.h;
     * 0: none yet), written under it, only when another thread than the
     * last one takes it: a draw or an update lets go of the storage lock
     * for its selector work only when another thread has been changing the
     * buffer (buffer_batch.c, buffer_priority.c: selector.h,
     * sample_detached). A thread started after the writer exited is
     * another thread, even where it gets the writer's pthread_t. */
    EXR_LINE uint64_t excl_owner;
    /* record calls copying without the lock: changed with atomics, since
     * one that publishes under the shared lock (buffer_record.c) takes
     * itself off while samplers read it */
    uint64_t writers;
    /* the episode table and the pick table: their arrays' pointers and
     * sizes on the first line, which only growth writes; the counters that
     * every record call changes on lines of their own (episode.h) */
    exr_episodes eps;
    EXR_LINE exr_pick_table picks;
    /* the rest: record calls' bookkeeping, under the exclusive lock.
     * sel_dirty: a record call or an eviction added or removed picks since
     * the exclusive lock was taken: the selectors' flush is due before it
     * is let go (exr_buffer_unlock). Read and written only under the lock. */
    EXR_LINE bool sel_dirty;
    /* how many times table entries have been moved or removed (exr_drawn):
     * written under the exclusive lock, read under the shared one */
    uint64_t moves;
    /* the table's size after each of the last EXR_LOWS of them, at
     * low[moves % EXR_LOWS] (remove_chunk): an index below the smallest
     * since a draw has not been moved since, only emptied when its pick
     * left with its episode (buffer_priority.c, resolve_noted). Same lock */
    uint64_t low[EXR_LOWS];
    /* places (buffer_picks.c): the table indices of the picks a record
     * call evicted, in the order they left, for the picks it enters after;
     * holes[holes_first, holes_n) are still free. keep_holes: the record
     * call under way keeps them (else an eviction frees its picks' places
     * at once). Under the exclusive lock; empty whenever it is let go. */
    uint32_t *holes;
    size_t holes_first, holes_n, holes_cap;
    bool keep_holes;
    int64_t next_handle, next_sel_handle;
    uint64_t n_records;
    uint32_t hand;
    exr_body *grave_head, *grave_tail;
    exr_dead *dead_head, *dead_tail;
    /* segments of evicted episodes kept for reuse (buffer_graveyard.c) */
    struct {
        unsigned char *seg;
        size_t rows;
    } spare[EXR_SPARE_SEGS];
    size_t nspare, spare_bytes;
    /* copies running without the lock, and what they may still read
     * (pinned and unpinned by samplers too) */
    EXR_LINE exr_reader *readers;
    uint64_t epoch;
    /* new_episode's reservations (buffer_reserve.c): the bodies of episodes
     * next_handle - res_pending .. next_handle - 1, oldest first (linked by
     * next_dead), made live by the next exclusive holder of rw. res_budget:
     * how many more may be reserved; the episode table always has room for
     * res_pending + res_budget more. res_closed: rw is held exclusively
     * (reservations wait for it). Under res_mu; the two atomics are also
     * read without it (the take of rw exclusive and new_episode check each
     * other through them). */
    EXR_LINE exr_body *res_head, *res_tail;
    _Atomic uint64_t res_pending;
    _Atomic int res_closed;
    uint64_t res_budget;
    /* the EXR_GONE_OPEN ring, under the exclusive lock: the last gone_count
     * episodes noted, the next one at gone[gone_next]; a handle of -1 was
     * taken back (buffer_evict.c). Last, away from the lines every record
     * call uses: only an eviction or removal under a log writes it. */
    EXR_LINE uint32_t gone_next, gone_count;
    struct {
        int64_t h;
        uint64_t n;
    } gone[EXR_GONE_OPEN];
};

/* *_locked functions assert that the storage lock is held (exclusively:
 * they change the tables) in debug builds: -DEXR_DEBUG_LOCKS, which the C
 * tests, the ThreadSanitizer stress test and the ASan build of the
 * extension use. Release builds compile the checks out. */
#ifdef EXR_DEBUG_LOCKS
void exr_assert_locked(const exr_buffer *b, bool exclusive, const char *fn);
#define EXR_ASSERT_LOCKED(b) exr_assert_locked((b), false, __func__)
#define EXR_ASSERT_EXCLUSIVE(b) exr_assert_locked((b), true, __func__)
#else
#define EXR_ASSERT_LOCKED(b) ((void)(b))
#define EXR_ASSERT_EXCLUSIVE(b) ((void)(b))
#endif

/* ---- shared between the buffer's files (the map: docs/design.md) ---- */

/* buffer.c: the storage lock taken shared (spinning briefly first), or
 * only if it can be at once (1; 0: a writer holds it or waits for it);
 * taken exclusively, true if the caller had to wait for it or a shared
 * taker waits for it now; the count of publishes so far; waiting with the
 * lock released meanwhile for a publish after that count, or (an exclusive
 * holder) for the next; signalling one. */
void lock_shared(exr_buffer *b);
int try_lock_shared(exr_buffer *b);
bool exr_buffer_lock_contended(exr_buffer *b);
uint64_t publish_seq(const exr_buffer *b);
void wait_publish_since(exr_buffer *b, bool shared, uint64_t seq);
void wait_publish(exr_buffer *b, bool shared);
void signal_publish(exr_buffer *b);

/* buffer_reserve.c: rw taken exclusively (reservations made live first) or
 * about to be let go; a new live episode (its handle larger than any
 * before), the reservations' room kept; reservations' room grown. */
void reserve_close_locked(exr_buffer *b);
void reserve_open_locked(exr_buffer *b);
uint32_t insert_episode_locked(exr_buffer *b, int64_t h, exr_body *body);
void reserve_grow_locked(exr_buffer *b);
void reserve_free(exr_buffer *b);

/* buffer_evict.c: takes episode h back from the EXR_GONE_OPEN ring: true,
 * with *n its step count, if it was evicted or removed open with steps while
 * a log's hook was set (and not taken back since). */
bool take_gone_open_locked(exr_buffer *b, int64_t h, uint64_t *n);

/* buffer_selectors.c: the entry of selector h, or NULL. */
sel_entry *find_sel(const exr_buffer *b, int64_t h);

/* buffer_picks.c */
/* The picks its table holds once the buffer is full: its capacity in records. */
size_t full_picks(const exr_buffer *b);
exr_status reserve_picks(exr_buffer *b, size_t extra);
/* The stored forms a record call brought for the picks of one episode at
 * positions [first, end): v[p - first] for pick p (NaN: none), for the
 * selectors whose stored power is `power` (exr_leaves, buffer.h). */
typedef struct {
    const float *v;
    uint64_t first, end;
    double power;
} exr_pick_leaves;
/* Enters the picks that episode slot has gained, with the stored forms of
 * pl, when a selector takes them (its power is pl's): ENTER_CHUNK at a
 * time, to each selector in turn (add_stored or add), then to the table.
 * false (nothing done) when no selector takes them: the caller enters the
 * picks one by one (enter_picks_locked, buffer_record.c). Needs
 * reserve_picks. */
bool enter_picks_stored_locked(exr_buffer *b, uint32_t slot, const exr_pick_leaves *pl);
/* Every pick of episode slot leaves the table and the selectors; its aux
 * is left as it was. Within a record call that keeps places (keep_holes),
 * their indices become places for the call's new picks (buffer_picks.c);
 * else each leaves at once, in position order, by swap-removal. */
void remove_picks_locked(exr_buffer *b, uint32_t slot);
/* The places no new pick took leave, from the highest index down, each by
 * swap-removal. */
void close_holes_locked(exr_buffer *b);
/* Where the next of `want` (>= 1) new picks go: the oldest places kept, as
 * many as are consecutive indices (*rep true), or, with none kept, the
 * end of the table, whose size grows by want (*rep false). Returns how many
 * go there, at *i0, *i0 + 1, ...; the table has room (reserve_picks). */
static inline size_t take_places_locked(exr_buffer *b, size_t want, size_t *i0, bool *rep)
{
    size_t f = b->holes_first, n = b->holes_n;
    if (f == n) {
        *i0 = b->picks.n;
        *rep = false;
        b->picks.n += want;
        return want;
    }
    uint32_t h = b->holes[f];
    size_t m = 1;
    while (m < want && f + m < n && b->holes[f + m] == h + m)
        m++;
    b->holes_first = f + m;
    *i0 = h;
    *rep = true;
    return m;
}
/* Tells the selectors that keep the pick each leaf stands for (selector.h,
 * idents) that the picks at table indices i0 .. i0 + n - 1 are the table's
 * entries there now: positions p, p + 1, ... of one episode (a record call
 * enters an episode's picks in position order). */
void note_idents_locked(exr_buffer *b, size_t i0, size_t n);
/* s->mu, retried for a while (as the storage lock: buffer.c, spin_rw)
 * before sleeping: its holder is usually applying a record call's notes,
 * which takes microseconds, and a sampler that takes it holds the storage
 * lock shared meanwhile. */
void exr_sel_take(exr_selector *s);
#ifdef EXR_DEBUG_LOCKS
/* Tests only: called (when set) by a draw without the storage lock
 * (buffer_batch.c, draw_detached) right after the selector has drawn,
 * mu still held (phase 0), and once mu is let go, before the storage lock
 * is taken again (phase 1); and by an update without the storage lock
 * (buffer_priority.c) once it has let go of it, mu held, before it applies
 * the notes (phase 2): to make holds come in between. */
extern void (*exr_debug_detached)(exr_buffer *b, int phase);
/* Tests only: drawn picks found gone and replaced by an extra draw
 * (buffer_batch.c, check_drawn_locked). */
extern _Atomic uint64_t exr_debug_extras_used;
/* Tests only: picks that set_priority took at a draw's noted index after
 * moves, without reading the table (buffer_priority.c, resolve_noted). */
extern _Atomic uint64_t exr_debug_since_kept;
/* Tests only: selectors whose notes an ending hold left to a shared taker
 * waiting for the storage lock (buffer.c, flush_selectors). */
extern _Atomic uint64_t exr_debug_notes_left;
/* Tests only: detached selectors that went back to changes in place
 * (buffer.c, flush_selectors; selector.h, reattach). */
extern _Atomic uint64_t exr_debug_reattached;
#endif
uint32_t *pick_aux_locked(const exr_buffer *b, int64_t epi, int64_t pos);
size_t pick_index_locked(const exr_buffer *b, int64_t epi, int64_t pos);
void pick_aux_many_locked(const exr_buffer *b, size_t count, const int64_t *epi,
                          const int64_t *pos, size_t *slots, uint32_t **aux);

/* buffer_evict.c */
void evict_over_capacity_locked(exr_buffer *b);

/* buffer_graveyard.c */
unsigned char *seg_alloc_locked(exr_buffer *b, size_t rows);
void free_graveyard_upto(exr_buffer *b, uint64_t epoch);
void bury_or_free(exr_buffer *b, exr_body *body);
void bury_segment(exr_buffer *b, unsigned char *seg, exr_dead *node);
void pin_locked(exr_buffer *b, exr_reader *r);
void unpin(exr_buffer *b, exr_reader *r);

/* Where one pick's rows live, resolved under the lock. Rows [0, na) are in
 * segment A from the pick's offset, the rest in segment B from its start. */
typedef struct {
    const unsigned char *a, *b; /* row 0 of the pick in A; row 0 of B (NULL if unused) */
    const unsigned char *final; /* final state, if row len is not stored */
    uint32_t na, len;
    uint32_t next_stored;       /* row len (the last next state) is a record */
} plan_t;

/* Every line of the rows plan pl will read (its rows and the next), into
 * L2 (get_batch's plan, buffer_batch.c and plan_simd.c). Always inlined:
 * GCC deletes calls of a function that only prefetches (it finds it
 * pure-const), see batch_copy.c. */
static inline __attribute__((always_inline)) void prefetch_plan(const exr_store_layout *L,
                                                                const plan_t *pl)
{
    size_t rows = pl->len + pl->next_stored, a = rows < pl->na ? rows : pl->na;
    for (size_t off = 0; off < a * L->row_bytes; off += 64)
        __builtin_prefetch(pl->a + off, 0, 2);
    __builtin_prefetch(pl->a + a * L->row_bytes - 1, 0, 2);
    if (rows > a)
        __builtin_prefetch(pl->b, 0, 2);
}

/* get_batch in its phases, each timed (the benchmark harness benchmarks/c/
 * reads them): draw (scratch, lock, selector), plan (resolve the picks,
 * pin, unlock), copy (and unpin; a small batch: copy, then unlock).
 * Nanoseconds. */
typedef struct {
    uint64_t draw_ns, plan_ns, copy_ns;
} exr_batch_phases;
exr_status exr_buffer_get_batch_phases(exr_buffer *b, int64_t h, size_t count,
                                       exr_batch_out *out, exr_batch_phases *ph);

/* batch_copy.c: copies the planned picks into out (no lock needed: pinned),
 * prefetching the rows of the picks ahead when `prefetch` (the buffer's
 * rows do not stay in cache: batch_heat_locked, buffer_batch.c). */
void copy_batch(const exr_buffer *b, size_t count, const plan_t *plans, exr_batch_out *out,
                bool prefetch);

/* batch_copy.c: whether the AVX-512 paths of get_batch are switched on
 * (exr_set_copy_simd; each also needs the machine to have AVX-512). */
bool batch_simd_on(void);

/* plan_simd.c: whether get_batch's plan may run several picks at a time:
 * the switch above is on and the machine has AVX-512 F, CD, DQ and BW
 * (eight picks) or AVX2 (four). */
bool plan_lanes_usable(void);
/* The plan of ent[from..to) (the drawn picks' table entries, in draw
 * order) eight picks at a time with AVX-512, or four with AVX2 where the
 * layout allows it, into plans and out's metadata at the same indices,
 * prefetching each pick's rows if `rows`; returns where it stopped (from
 * plus a multiple of the lanes; the rest is for plan_pick_locked,
 * buffer_batch.c). Only where plan_lanes_usable(). Lock held. */
size_t plan_lanes_locked(exr_buffer *b, size_t from, size_t to, const exr_pick *ent,
                         plan_t *plans, exr_batch_out *out, bool rows);

static inline uint64_t complete_steps(const exr_episode *e)
{
    return e->ended ? e->n : (e->n ? e->n - 1 : 0);
}

/* ---- buffer_restore.c: for the codec (it never writes these fields) ---- */

/* The counters the serialized form carries (docs/format.md, CONFIG). */
typedef struct {
    int64_t next_handle, next_sel_handle;
    int64_t hand; /* the episode the second-chance hand is on; -1: none */
} exr_counters;
void exr_buffer_counters_locked(const exr_buffer *b, exr_counters *c);
/* A buffer being read: its handle counters, before its episodes arrive. */
void exr_buffer_restore_handles_locked(exr_buffer *b, int64_t next_handle, int64_t next_sel);
/* After its episodes: the hand onto episode `hand` (-1: none); EXR_ENOTFOUND
 * if that episode is not live. */
exr_status exr_buffer_restore_hand_locked(exr_buffer *b, int64_t hand);
/* After an episode's rows are in place: its records counted, its picks
 * marked "not entered yet" (entered by exr_buffer_restore_pick_locked). */
void exr_buffer_restore_episode_locked(exr_buffer *b, uint32_t slot);
/* A new live episode for the reader: handle, flags and room for nsegs
 * segment pointers (its rows are the reader's to fill); *e points at it
 * until the next insert. */
exr_status exr_buffer_restore_new_episode_locked(exr_buffer *b, int64_t handle, uint32_t nsegs,
                                                 bool ended, bool terminated, bool sampled,
                                                 uint32_t *slot, exr_episode **e);
/* The picks the restored episodes declare (their m), and room for them. */
uint64_t exr_buffer_restore_picks_declared_locked(const exr_buffer *b);
exr_status exr_buffer_restore_reserve_picks_locked(exr_buffer *b, size_t count);
/* Whether the restored records exceed the capacity. */
bool exr_buffer_restore_over_capacity_locked(const exr_buffer *b);
/* The next entry of the pick table (room reserved): position pos of
 * episode slot. EXR_ECORRUPT if that is no pick or it was entered before. */
exr_status exr_buffer_restore_pick_locked(exr_buffer *b, uint32_t slot, uint32_t pos);
/* A selector of kind vt with handle h appended (vt->create's status). */
exr_status exr_buffer_restore_selector_locked(exr_buffer *b, int64_t h,
                                              const exr_selector_vtable *vt, const double *params,
                                              exr_selector **out);

/* Room for one more entry in b->sels. */
exr_status exr_buffer_reserve_selector_locked(exr_buffer *b);

/* Picks episode e should have: positions [0, target). */
uint64_t exr_picks_target(const exr_buffer *b, const exr_episode *e);
/* aux[p] of episode e: its pending priority (float) or its pick's index.
 * Lives in the episode's body, not in its segments, and is only touched
 * with the lock held. */
static inline uint32_t *exr_aux_at(const exr_episode *e, uint64_t p)
{
    return &e->aux[p];
}

#endif
