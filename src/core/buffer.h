/*
 * buffer.h - the experience replay: episodes, picks, selectors, eviction.
 *
 *   exr_buffer
 *   +-- rw (reader/writer lock): guards everything below; per-selector and
 *   |   other small locks in buffer_impl.h / docs/design.md ("Locking")
 *   +-- episodes (episode.h)  slot -> { handle, n, m, flags, body -> segments }
 *   +-- picks (pick_table.h)  [ {slot, pos, prio} ... ]   <-> aux[pos] in segments
 *   +-- sels[]                { handle, selector* } (selector.h vtables)
 *   +-- hand                  second-chance position (evict.h)
 *   +-- readers, graveyard    bodies evicted while a get_batch copies from them
 *
 * Locking: functions named *_locked need the lock held exclusively
 * (exr_buffer_lock); the rest take it themselves. get_batch and
 * set_priority take it shared (plus their selector's mutex); get_batch
 * holds it only to choose picks and pin their storage and copies without
 * it. exr_buffer_record reserves rows under it, copies a large rollout
 * without it, and publishes under it. An evicted episode's storage is freed
 * once no copy that could see it is running.
 *
 * Errors: every function returns an exr_status; on anything but EXR_OK the
 * buffer is as it was (one exception in exr_buffer_record, see buffer_record.c).
 */
#ifndef EXR_BUFFER_H
#define EXR_BUFFER_H

#include <stdbool.h>

#include "exr.h"
#include "evict.h"
#include "fields.h"
#include "selector.h"

typedef struct exr_buffer exr_buffer;

#define EXR_MAX_PICK_LEN (1u << 20)
/* Handles stop here (EXR_EOVERFLOW); no buffer gets near it by recording. */
#define EXR_MAX_HANDLE ((int64_t)1 << 62)

typedef struct {
    size_t state_bytes, action_bytes, reward_bytes; /* item sizes, state_bytes >= 1 */
    size_t extra_bytes;                             /* per-step extras, <= 2^40; 0: none */
    uint64_t capacity;                              /* records; 0 = unbounded */
    uint32_t pick_len;                              /* 1 .. EXR_MAX_PICK_LEN */
    bool allow_short;
    int eviction;                                   /* EXR_EVICT_* */
    uint64_t seed;
} exr_config;

/* T >= 1 steps to record: T contiguous rows of each column. priorities is
 * NULL for none, else T values (NaN: none for that step). The last step ends
 * the episode when end is set (with final_state, or with final_state NULL).
 * fields (nfields entries, fields.h): when not NULL, the state's and the
 * extras' bytes come from there, field by field, and states is unused; a
 * buffer with extra_bytes needs it. final_state is always state_bytes packed. */
typedef struct {
    const void *states, *actions, *rewards;
    const double *priorities;
    size_t T;
    const void *final_state;
    bool end, terminated;
    const exr_field_src *fields;
    size_t nfields;
} exr_steps;

/* What a draw knew of its picks' places (exr_batch_out.drawn): the picks
 * (v[2 * count + i], v[3 * count + i]), as (episode handle, position),
 * were at table indices v[i], their episodes in slots v[count + i], at a
 * moment when the buffer numbered serial had moved or removed table
 * entries `moves` times or more (a draw made across another thread's
 * changes knows its indices from a moment after the count it noted). While
 * the count stays, they are still there, so set_priority can go to them
 * without looking (its hint_gen); after a few more moves, to each one
 * whose episode is still in its slot and whose index is below every size
 * the table had after them (design.md, "A draw's notes"). serial 0:
 * nothing noted. */
typedef struct {
    uint64_t serial, moves, count;
    int64_t v[]; /* 4 * count: indices, slots, handles, positions */
} exr_drawn;

/* Where get_batch writes: arrays of count * pick_len rows (state, action,
 * reward, state_next) and count entries (the rest). */
typedef struct {
    void *state, *action, *reward, *state_next;
    int64_t *seq_len, *seq_len_next, *pick_epi, *pick_pos;
    float *weight;
    int64_t *pick_index; /* the picks' table indices when drawn; NULL: not wanted */
    /* when not NULL (fields.h): state, state_next and extras go field by
     * field to these nfields places instead; state and state_next unused */
    const exr_field_dst *fields;
    size_t nfields;
    /* NULL, or room for count picks: written under the lock, so that it
     * holds what the draw knew (exr_drawn) whatever threads do with the
     * arrays above */
    exr_drawn *drawn;
    /* true: state holds count * (pick_len + 1) rows, each pick's states
     * followed by its last next state (docs/semantics.md, "Shared next
     * states"), and state_next is unused; with fields, the state fields'
     * places are laid out so (exr_field_dst.seq) */
    bool shared_next;
} exr_batch_out;

exr_status exr_buffer_new(const exr_config *cfg, exr_buffer **out);
/* Frees everything. No other thread may be using the buffer. */
void exr_buffer_free(exr_buffer *b);
const exr_config *exr_buffer_config(const exr_buffer *b);

void exr_buffer_lock(exr_buffer *b);
int exr_buffer_trylock(exr_buffer *b); /* 1 if taken */
void exr_buffer_unlock(exr_buffer *b);

uint64_t exr_buffer_len_locked(const exr_buffer *b);
uint64_t exr_buffer_num_episodes_locked(const exr_buffer *b);
uint64_t exr_buffer_num_picks_locked(const exr_buffer *b);

/* A new empty episode. O(1) amortised. */
exr_status exr_buffer_new_episode_locked(exr_buffer *b, int64_t *h);
/* The same without the storage lock when it can (buffer_reserve.c): *done
 * and *h its handle, or !*done: the caller takes the lock and calls
 * exr_buffer_new_episode_locked. EXR_ENOMEM (*done) if memory ran out. */
exr_status exr_buffer_new_episode(exr_buffer *b, int64_t *h, bool *done);

/* A record call's priorities in the stored form a prioritized selector
 * keeps (powa.h), computed before the call takes the lock: v[t] is
 * exr_pow_leaf((float)priorities[t], power), NaN for a step without a
 * priority. Under the lock they are used for each selector whose stored
 * power is `power` (the others, and calls given none, compute theirs there
 * as before): the same bits either way. */
#define EXR_LEAVES_SMALL 256
typedef struct {
    const float *v; /* T values, or NULL: none */
    double power;
    float *heap;    /* v when T > EXR_LEAVES_SMALL */
    float small[EXR_LEAVES_SMALL];
} exr_leaves;

/* Fills lv for the steps of in, with the power the buffer's first
 * prioritized selector had at the last record call (a guess: it is checked
 * under the lock). None (lv->v NULL) when in has no priorities, no record
 * call has seen a prioritized selector yet, or memory runs out. Takes no
 * lock; release lv with exr_leaves_release after the record call. */
void exr_leaves_prepare(const exr_buffer *b, const exr_steps *in, exr_leaves *lv);
void exr_leaves_release(exr_leaves *lv);

/* Appends the steps to episode h (a new one if h is unknown or ended), as T
 * single records would, evicting after each while over capacity. *out_h is
 * the handle recorded into last. EXR_EINVAL if T == 0. O(T) amortised. */
exr_status exr_buffer_record_locked(exr_buffer *b, int64_t h, const exr_steps *in,
                                    int64_t *out_h);

/* The same, taking the lock itself: the rows are reserved under the lock,
 * their bytes copied with no lock held when they are EXR_COPY_UNLOCKED
 * bytes or more (EXR_COPY_UNLOCKED_CONTENDED when another thread waits for
 * the lock), then published under the shared lock. A record call into an
 * episode another call is copying into waits for it. On failure the buffer
 * is as it was (but see buffer_record.c: an episode evicted by its own call).
 * lv: the priorities' stored forms from exr_leaves_prepare, or NULL. */
#define EXR_COPY_UNLOCKED ((size_t)8 << 10)
#define EXR_COPY_UNLOCKED_CONTENDED ((size_t)1 << 10)
exr_status exr_buffer_record(exr_buffer *b, int64_t h, const exr_steps *in, const exr_leaves *lv,
                             int64_t *out_h);
/* The same for a small call (under EXR_COPY_UNLOCKED bytes of rows, no log
 * attached) when it needs no waiting: the writers' mutex and the storage
 * lock free, episode h not being copied into. *done and the status, or
 * !*done: nothing was done and the caller calls exr_buffer_record. Never
 * blocks, so the binding calls it with the GIL held. */
exr_status exr_buffer_record_nowait(exr_buffer *b, int64_t h, const exr_steps *in,
                                    const exr_leaves *lv, int64_t *out_h, bool *done);

/* What exr_buffer_end_episode_locked found episode h to be. */
typedef enum {
    EXR_END_DONE,    /* open, with at least one step: ended by the call */
    EXR_END_GONE,    /* not held, but a handle of this buffer (evicted, removed):
                     * nothing to end */
    EXR_END_UNKNOWN, /* no episode of this buffer ever had this handle */
    EXR_END_ENDED,   /* held, and ended already */
    EXR_END_EMPTY,   /* held and open, but with no step whose next state final_state would be */
    EXR_END_NO_END   /* neither final_state nor terminated: an end needs one (h not looked at) */
} exr_end_outcome;

/* Ends open episode h without a new step: exactly what its last record call
 * would have done had it carried final_state (state_bytes packed, NULL for
 * none) and terminated, one of which an end needs (as a record call's end
 * does). The last step becomes complete, and the picks that needed its next
 * state are entered with the priorities recorded for them. A record call
 * copying into h finishes first (the lock released meanwhile). The log's
 * hook is called once, with no row; also for an episode not held that was
 * evicted or removed open, with steps, while a hook was set (the last
 * EXR_GONE_OPEN such: buffer_impl.h), once, at the step count it had then,
 * with final_state as given (the hook copies it). *out says what h was:
 * EXR_OK with EXR_END_DONE or EXR_END_GONE (the buffer does not change),
 * EXR_ENOTFOUND with EXR_END_UNKNOWN, EXR_EINVAL with EXR_END_ENDED,
 * EXR_END_EMPTY or EXR_END_NO_END; on any status but EXR_OK (EXR_ENOMEM
 * too) nothing changes. O(S log N) for each new pick, at most pick_len of them. */
exr_status exr_buffer_end_episode_locked(exr_buffer *b, int64_t h, const void *final_state,
                                         bool terminated, exr_end_outcome *out);

/* Evicts episode h now, as capacity would: its picks leave the table and
 * every selector, its records the count. A record call copying into h
 * finishes first (the lock released meanwhile). EXR_ENOTFOUND if h is not
 * held (nothing changes). O(n + m * S * log N) for n records, m picks. */
exr_status exr_buffer_remove_episode_locked(exr_buffer *b, int64_t h);

/* Waits (the lock released meanwhile) until no record call is copying:
 * every row is then published. serialize and save call it first. */
void exr_buffer_quiesce_locked(exr_buffer *b);

/* Selectors: kind indexes exr_selector_kinds; params has the kind's nparams
 * values (validated: EXR_EINVAL). Handles grow from 0, never reused. A
 * buffer holds at most EXR_MAX_SELECTORS at once (one more: EXR_EINVAL; a
 * serialized buffer with more is refused): each costs a fixed ~24 KiB and
 * every record call's work, so that no input of a few bytes a selector can
 * make a reader allocate far beyond its length. */
#define EXR_MAX_SELECTORS 1024
exr_status exr_buffer_add_selector_locked(exr_buffer *b, int kind, const double *params,
                                          int64_t *h);
exr_status exr_buffer_remove_selector_locked(exr_buffer *b, int64_t h);
exr_selector *exr_buffer_selector_locked(exr_buffer *b, int64_t h);
/* The selectors held, by ascending handle: each one's handle and kind (its
 * index in exr_selector_kinds) into handles and kinds, which have room for
 * EXR_MAX_SELECTORS entries. Returns how many there are. O(selectors). */
size_t exr_buffer_selectors_locked(const exr_buffer *b, int64_t *handles, int *kinds);
/* Sets a settable parameter (EXR_EINVAL if not settable or out of range). */
exr_status exr_buffer_set_param_locked(exr_buffer *b, int64_t h, int k, double v);

/* Test hook: whether get_batch may copy the commonest small row with
 * AVX-512, and plan its picks eight at a time with AVX-512 or four with
 * AVX2 (batch_copy.c, plan_simd.c; on by default, used only where the
 * machine has it). Returns the setting before. */
int exr_set_copy_simd(int on);

/* count picks drawn by selector h into out. Takes the lock itself.
 * EXR_ENOTFOUND (selector), EXR_EEMPTY (nothing to draw). O(count * pick_len
 * + count log N). */
exr_status exr_buffer_get_batch(exr_buffer *b, int64_t h, size_t count, exr_batch_out *out);
/* The same for a small batch (at most 64 picks of at most 16 KiB of rows)
 * when it needs no waiting: the lock and the selector's mutex free, the
 * picks drawn published. *done and the status, or !*done: nothing was
 * copied (a draw may have been made and dropped) and the caller calls
 * exr_buffer_get_batch. Never blocks, so the binding calls it with the
 * GIL held. */
exr_status exr_buffer_get_batch_nowait(exr_buffer *b, int64_t h, size_t count,
                                       exr_batch_out *out, bool *done);
/* The batch for the given picks, weighted by selector h (test hook).
 * EXR_ENOTFOUND if a pick or the selector does not exist. */
exr_status exr_buffer_gather(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                             const int64_t *pos, exr_batch_out *out);

/* The index of the first of p[0..n) that is not a valid priority (finite
 * and >= 0; -0.0 is valid), or n if all are. Needs no buffer: the binding
 * checks its arguments with it too. Two at a time with SSE2, eight to a
 * branch, so that checking a batch's priorities costs a few cycles each. */
size_t exr_first_bad_priority(const double *p, size_t n);

/* New priorities (finite, >= 0; else EXR_EINVAL before any change) for the
 * picks named; prio_stride 0 broadcasts prio[0]. Missing picks are skipped;
 * *applied counts the rest. O(count log N). */
exr_status exr_buffer_set_priority_locked(exr_buffer *b, int64_t h, size_t count,
                                          const int64_t *epi, const int64_t *pos,
                                          const double *prio, size_t prio_stride,
                                          size_t *applied);

/* The same, taking the lock itself. hint (NULL: none) holds each pick's
 * table index as a batch gave it (exr_batch_out.pick_index): used where it
 * still names the pick, skipping the handle lookup; where it no longer
 * does (the pick moved or left since), the pick is looked up as above.
 * hint_gen (NULL: none) is the exr_drawn the hints came from (hint its
 * indices, count of them): a pick given that is the one it noted at its
 * place (the same handle and position) goes to its noted index without
 * the table being read, while this buffer is the one numbered
 * hint_gen->serial and has moved or removed no table entry since; and
 * after at most EXR_LOWS (buffer_impl.h) moves since, where its episode
 * still holds the noted slot and the index is below the table's sizes
 * after those moves. Any other pick is checked as a hint. */
exr_status exr_buffer_set_priority(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                   const int64_t *pos, const int64_t *hint,
                                   const exr_drawn *hint_gen, const double *prio,
                                   size_t prio_stride, size_t *applied);

/* Selector h's draw weights over all picks: their sum, the smallest positive
 * one, and the number of picks (for combining shards). O(1). */
exr_status exr_buffer_priority_stats_locked(const exr_buffer *b, int64_t h, double *total,
                                            double *min_pos, uint64_t *n);

/* Episode h: its size and flags (EXR_ENOTFOUND if not live). */
exr_status exr_buffer_episode_info_locked(const exr_buffer *b, int64_t h, uint64_t *n,
                                          bool *ended, bool *terminated, bool *has_final);
/* Copies episode h's columns (n rows each) and final state (if any, and if
 * final is not NULL). */
exr_status exr_buffer_episode_copy_locked(const exr_buffer *b, int64_t h, void *state,
                                          void *action, void *reward, void *final);
/* The same as whole rows (n * row bytes: state|action|reward|extras) and
 * the packed final state (state_bytes), for buffers with named fields. */
exr_status exr_buffer_episode_rows_locked(const exr_buffer *b, int64_t h, void *rows, void *final);

/* The experience log's hook (log.h): called under the lock once for every
 * step that exr_buffer_record_locked commits, before the eviction it may
 * cause, with the step's episode handle and position, its row
 * (state|action|reward in the buffer's storage), its final state (NULL if
 * none), whether it ends the episode, and whether it is the first step of
 * its record call; and once for every episode that
 * exr_buffer_end_episode_locked ends, with row NULL (no step), pos the
 * episode's number of records, end true and first_of_call true (fin then
 * may be the caller's, valid only during the call). fn NULL removes the
 * hook. */
typedef void (*exr_step_hook)(void *ctx, exr_buffer *b, int64_t h, uint64_t pos,
                              const unsigned char *row, const unsigned char *final_state,
                              bool end, bool terminated, bool first_of_call);
void exr_buffer_set_hook_locked(exr_buffer *b, exr_step_hook fn, void *ctx);
/* Removes the hook if its context is ctx (another one, set since, stays). */
void exr_buffer_unset_hook_locked(exr_buffer *b, void *ctx);
/* Pins the storage of every row now in the buffer, as get_batch does:
 * nothing it holds is freed (evicted or regrown) until the unpin. */
typedef struct exr_reader exr_reader;
void exr_buffer_pin_locked(exr_buffer *b, exr_reader *r);
void exr_buffer_unpin_locked(exr_buffer *b, exr_reader *r);

/* Test hooks. handles: num_episodes entries, ascending. picks: num_picks
 * entries in table order. */
void exr_buffer_handles_locked(const exr_buffer *b, int64_t *out);
void exr_buffer_picks_locked(const exr_buffer *b, int64_t *epi, int64_t *pos);
/* The episode map's probe distances (episode.h). */
void exr_buffer_map_probes_locked(const exr_buffer *b, double *mean, uint64_t *max);
/* Stored p^alpha of each pick (NaN for a missing pick or a uniform selector). */
exr_status exr_buffer_stored_priority_locked(const exr_buffer *b, int64_t h, size_t count,
                                             const int64_t *epi, const int64_t *pos, double *out);
/* 0 if every invariant holds, else 1 with the first broken one in msg. */
int exr_buffer_check_locked(const exr_buffer *b, char *msg, size_t msglen);

#endif
