#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include "buffer.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer_impl.h"
#include "buffer_locks.h"
#include "mem.h"
#include "timing.h"

/* ---- lifecycle --------------------------------------------------------- */

/* The buffer's locks, initialized; NULL if memory or a pthread call failed. */
static struct exr_locks *locks_new(void)
{
    struct exr_locks *lk = exr_line_calloc(sizeof *lk);
    if (!lk)
        return NULL;
#ifdef EXR_DEBUG_LOCKS
    atomic_init(&lk->owner, 0);
    atomic_init(&lk->shared, 0);
#endif
    /* writers first: a stream of overlapping get_batch calls must not
     * keep a record call out */
    pthread_rwlockattr_t ra;
    int ok = pthread_rwlockattr_init(&ra) == 0;
    if (ok) {
        pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        ok = pthread_rwlock_init(&lk->rw, &ra) == 0;
        pthread_rwlockattr_destroy(&ra);
    }
    atomic_init(&lk->excl, false);
    lk->excl_wmu = false;
    atomic_init(&lk->rd_waiting, 0);
    atomic_init(&lk->pub_seq, 0);
    int wmu = ok && pthread_mutex_init(&lk->wmu, NULL) == 0;
    int res = wmu && pthread_mutex_init(&lk->res_mu, NULL) == 0;
    int mu = res && pthread_mutex_init(&lk->pin_mu, NULL) == 0;
    int wait = mu && pthread_mutex_init(&lk->wait_mu, NULL) == 0;
    if (wait && pthread_cond_init(&lk->published, NULL) == 0)
        return lk;
    if (wait)
        pthread_mutex_destroy(&lk->wait_mu);
    if (mu)
        pthread_mutex_destroy(&lk->pin_mu);
    if (res)
        pthread_mutex_destroy(&lk->res_mu);
    if (wmu)
        pthread_mutex_destroy(&lk->wmu);
    if (ok)
        pthread_rwlock_destroy(&lk->rw);
    free(lk);
    return NULL;
}

exr_status exr_buffer_new(const exr_config *cfg, exr_buffer **out)
{
    if (cfg->state_bytes == 0 || cfg->extra_bytes > ((size_t)1 << 40) || cfg->pick_len < 1 ||
        cfg->pick_len > EXR_MAX_PICK_LEN ||
        (cfg->eviction != EXR_EVICT_FIFO && cfg->eviction != EXR_EVICT_SECOND_CHANCE))
        return EXR_EINVAL;
    exr_buffer *b = exr_line_calloc(sizeof *b);
    if (!b)
        return EXR_ENOMEM;
    static _Atomic uint64_t serials; /* 0 is no buffer's */
    b->serial = atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) + 1;
    b->cfg = *cfg;
    exr_status st = exr_store_layout_init(&b->lay, cfg->state_bytes, cfg->action_bytes,
                                          cfg->reward_bytes, cfg->extra_bytes, cfg->pick_len);
    if (st == EXR_OK && !(b->lk = locks_new()))
        st = EXR_ENOMEM;
    if (st != EXR_OK) {
        free(b);
        return st;
    }
    exr_episodes_init(&b->eps);
    exr_pick_table_init(&b->picks);
    b->hand = EXR_NIL;
    atomic_init(&b->pow_h, -1);
    atomic_init(&b->pow_a, 0);
    atomic_init(&b->rec_pow_a, 0x7ff8000000000000ULL); /* NaN: no guess */
    *out = b;
    return EXR_OK;
}

void exr_buffer_free(exr_buffer *b)
{
    if (!b)
        return;
    free_graveyard_upto(b, UINT64_MAX);
    reserve_free(b);
    for (size_t i = 0; i < b->nspare; i++)
        exr_seg_free(b->spare[i].seg);
    exr_episodes_free(&b->eps);
    exr_pick_table_free(&b->picks);
    free(b->holes);
    for (size_t i = 0; i < b->nsels; i++) {
        pthread_mutex_destroy(&b->sels[i].sel->mu);
        b->sels[i].sel->vt->destroy(b->sels[i].sel);
    }
    free(b->sels);
    pthread_cond_destroy(&b->lk->published);
    pthread_mutex_destroy(&b->lk->wait_mu);
    pthread_mutex_destroy(&b->lk->pin_mu);
    pthread_mutex_destroy(&b->lk->res_mu);
    pthread_mutex_destroy(&b->lk->wmu);
    pthread_rwlock_destroy(&b->lk->rw);
    free(b->lk);
    free(b);
}

const exr_config *exr_buffer_config(const exr_buffer *b) { return &b->cfg; }

/* The storage lock is held for microseconds at a time, less than a futex
 * sleep and wake-up cost (about 24 us one way on the VM the benchmarks run
 * on): a thread that finds it taken retries for a while before it sleeps,
 * so that a writer and a sampler taking turns do not hand the lock over
 * through the scheduler at every call. The retries are bounded by time, not
 * by count (a pause lasts from a few cycles to over a hundred, by CPU). An
 * exclusive taker retries longer: once it sleeps in the rwlock it is a
 * waiting writer, which rw prefers, so the lock then goes to a thread that
 * first has to be woken up, and a learner that arrives meanwhile waits for
 * that wake-up too; while it only retries, a learner's next shared hold
 * (get_batch, then set_priority) gets in between (docs/design.md, "Taking
 * the lock spins first"). */
#define SPIN_SHARED_NS 30000
#define SPIN_EXCL_NS 150000
#define SPIN_CLOCK_EVERY 16 /* tries between two looks at the clock */
/* A taker still retrying after SPIN_YIELD_NS gives its CPU away
 * (sched_yield) at every SPIN_YIELD_EVERY-th look at the clock (about 2 us
 * apart here): the holder it waits for may be a thread it preempted on
 * this CPU, which cannot let go while the taker spins in its place
 * (docs/design.md, "Taking the lock spins first"). With nothing else to run
 * on the CPU a yield returns at once (about 0.5 us here). An exclusive
 * taker does not yield while rw is held exclusively: the holder is then
 * another record call, which the one writer spinning (the others sleep on
 * wmu) rarely shares a CPU with, and two writers on two cores only paid
 * for the yields. */
#define SPIN_YIELD_NS 5000
#define SPIN_YIELD_EVERY 4

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

uint64_t exr_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* What spin_for retries: rw shared, rw exclusive, or a mutex. */
typedef enum { TRY_RD, TRY_WR, TRY_MUTEX } spin_try;

static inline bool try_once(spin_try kind, void *lock)
{
    if (kind == TRY_RD)
        return pthread_rwlock_tryrdlock(lock) == 0;
    if (kind == TRY_WR)
        return pthread_rwlock_trywrlock(lock) == 0;
    return pthread_mutex_trylock(lock) == 0;
}

/* Retries lock for up to limit ns, yielding the CPU now and then past
 * SPIN_YIELD_NS, but not while *no_yield is set (NULL: always may); true
 * if it got it. */
static bool spin_for(spin_try kind, void *lock, uint64_t limit, const _Atomic bool *no_yield)
{
    uint64_t start = 0;
    for (unsigned i = 1;; i++) {
        if (try_once(kind, lock))
            return true;
        cpu_relax();
        if (i % SPIN_CLOCK_EVERY)
            continue;
        uint64_t t = exr_now_ns();
        if (!start)
            start = t;
        else if (t - start >= limit)
            return false;
        else if (t - start >= SPIN_YIELD_NS && i % (SPIN_CLOCK_EVERY * SPIN_YIELD_EVERY) == 0 &&
                 !(no_yield && atomic_load_explicit(no_yield, memory_order_relaxed)))
            sched_yield();
    }
}

/* Retries lk->rw (shared or exclusive) for up to SPIN_SHARED_NS or
 * SPIN_EXCL_NS, yielding the CPU now and then past SPIN_YIELD_NS (an
 * exclusive taker only while rw is not held exclusively); true if it got
 * it. */
static bool spin_rw(struct exr_locks *lk, bool shared)
{
    return shared ? spin_for(TRY_RD, &lk->rw, SPIN_SHARED_NS, NULL)
                  : spin_for(TRY_WR, &lk->rw, SPIN_EXCL_NS, &lk->excl);
}

static _Atomic uint64_t thread_ids;
static _Thread_local uint64_t thread_id;

uint64_t exr_thread_id(void)
{
    if (!thread_id)
        thread_id = atomic_fetch_add_explicit(&thread_ids, 1, memory_order_relaxed) + 1;
    return thread_id;
}

/* Debug builds (EXR_DEBUG_LOCKS) note who holds the storage lock, so that
 * *_locked functions can assert it (EXR_ASSERT_LOCKED); release builds
 * compile all of this out. */
#ifdef EXR_DEBUG_LOCKS
static _Thread_local char this_thread; /* its address marks the thread */
#define ME ((uintptr_t)&this_thread)

static void debug_locked(exr_buffer *b, bool shared)
{
    if (shared)
        atomic_fetch_add_explicit(&b->lk->shared, 1, memory_order_relaxed);
    else
        atomic_store_explicit(&b->lk->owner, ME, memory_order_relaxed);
}

static void debug_unlocking(exr_buffer *b)
{
    if (atomic_load_explicit(&b->lk->owner, memory_order_relaxed) == ME)
        atomic_store_explicit(&b->lk->owner, 0, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&b->lk->shared, 1, memory_order_relaxed);
}

void exr_assert_locked(const exr_buffer *b, bool exclusive, const char *fn)
{
    bool mine = atomic_load_explicit(&b->lk->owner, memory_order_relaxed) == ME;
    if (mine || (!exclusive && atomic_load_explicit(&b->lk->shared, memory_order_relaxed) > 0))
        return;
    fprintf(stderr, "%s: the buffer's lock is not held%s\n", fn, exclusive ? " exclusively" : "");
    abort();
}
#else
#define debug_locked(b, shared) ((void)0)
#define debug_unlocking(b) ((void)0)
#endif

/* Every take of rw passes here once it holds rw, and every release just
 * before it lets go: the debug build's note of the holder (above) and the
 * timing build's hold times (timing.h). */
#define note_locked(b, shared) (EXR_TM_HELD(), debug_locked(b, shared))
#define note_unlocking(b, excl) (EXR_TM_RELEASED(excl), debug_unlocking(b))

/* The exclusive holder's bookkeeping once it has rw: whether it holds wmu
 * too, and the reservations made live. */
static void took_exclusive(exr_buffer *b, bool with_wmu)
{
    note_locked(b, false);
    atomic_store_explicit(&b->lk->excl, true, memory_order_relaxed);
    b->lk->excl_wmu = with_wmu;
    b->eps.seq++;
    /* written only when it changes: samplers read its line at every call */
    uint64_t self = exr_thread_id();
    if (b->excl_owner != self)
        b->excl_owner = self;
    reserve_close_locked(b);
}

/* A blocking take of rw that failed: this thread holds rw already
 * (EDEADLK) or the readers' count is full. Going on unlocked would let the
 * next unlock release a hold of someone else: stop instead. The binding's
 * guards keep every call that would take rw out of a thread that holds it
 * (save()'s progress callback, docs/api.md). */
static __attribute__((noinline, cold)) void rw_take_failed(int err)
{
    fprintf(stderr, "exreplay: taking the storage lock failed (error %d): a call into the "
                    "buffer from the thread that holds it; aborting\n", err);
    abort();
}

/* rw, shared or exclusive, once a first try failed: an exclusive taker
 * first queues for wmu, asleep; then rw is retried for a while (spin_rw)
 * before the taker sleeps. A shared taker counts itself in rd_waiting meanwhile. */
static __attribute__((noinline)) void take_rw_slow(exr_buffer *b, bool shared)
{
    pthread_rwlock_t *rw = &b->lk->rw;
    if (shared)
        atomic_fetch_add_explicit(&b->lk->rd_waiting, 1, memory_order_relaxed);
    else
        pthread_mutex_lock(&b->lk->wmu);
    bool got = spin_rw(b->lk, shared);
    int err = got ? 0 : shared ? pthread_rwlock_rdlock(rw) : pthread_rwlock_wrlock(rw);
    if (err)
        rw_take_failed(err);
    if (shared)
        atomic_fetch_sub_explicit(&b->lk->rd_waiting, 1, memory_order_relaxed);
}

/* Takes rw shared or exclusive, retrying briefly before it sleeps. An
 * exclusive taker that finds rw free takes it at once (one atomic
 * operation, not three); otherwise it first queues for wmu, asleep
 * (take_rw_slow). true if it did not get rw at once. */
static bool take_rw(exr_buffer *b, bool shared)
{
    pthread_rwlock_t *rw = &b->lk->rw;
    EXR_TM_NOW(t0);
    bool waited = (shared ? pthread_rwlock_tryrdlock(rw) : pthread_rwlock_trywrlock(rw)) != 0;
    if (waited)
        take_rw_slow(b, shared);
    EXR_TM_SINCE(EXR_TM_RW_TAKING, t0);
    if (shared)
        note_locked(b, true);
    else
        took_exclusive(b, waited);
    return waited;
}

bool exr_buffer_lock_contended(exr_buffer *b)
{
    bool waited = take_rw(b, false);
    return waited || atomic_load_explicit(&b->lk->rd_waiting, memory_order_relaxed) > 0;
}

void exr_buffer_lock(exr_buffer *b) { take_rw(b, false); }

void lock_shared(exr_buffer *b) { take_rw(b, true); }

int try_lock_shared(exr_buffer *b)
{
    if (pthread_rwlock_tryrdlock(&b->lk->rw) != 0)
        return 0;
    note_locked(b, true);
    return 1;
}

int exr_buffer_trylock(exr_buffer *b)
{
    if (pthread_rwlock_trywrlock(&b->lk->rw) != 0)
        return 0;
    took_exclusive(b, false);
    return 1;
}

#ifdef EXR_DEBUG_LOCKS
_Atomic uint64_t exr_debug_notes_left;
uint64_t exr_reattach_holds = EXR_REATTACH_HOLDS;
_Atomic uint64_t exr_debug_reattached;
#define NOTES_LEFT() exr_debug_notes_left++
#define REATTACHED() exr_debug_reattached++
#else
#define NOTES_LEFT() ((void)0)
#define REATTACHED() ((void)0)
#endif

/* What add() and remove() left pending in the selectors is done before
 * the exclusive lock goes: a shared holder always finds every selector
 * complete, or, a selector drawn without the storage lock (selector.h,
 * sample_detached), complete once the notes of the holds before are
 * applied, which whoever takes its mu does first. took (NULL: not wanted)
 * gets up to TOOK such selectors whose mu was free, taken here:
 * exr_buffer_unlock applies their notes once rw is let go (docs/design.md,
 * "A draw without the storage lock"). Not while a shared taker waits for
 * rw: it would take mu next and wait for those notes anyway, so it applies
 * them itself, and this caller goes back to recording ("Notes left to a
 * waiting reader"). One that no draw or update has reached without the
 * storage lock for EXR_REATTACH_HOLDS holds is changed in place again
 * instead (selector.h, reattach; "Back to changes in place"). Returns how
 * many. */
#define TOOK 4
static size_t flush_selectors(exr_buffer *b, exr_selector **took)
{
    size_t n = 0;
    if (b->holes_n) /* a record call's places, left over */
        close_holes_locked(b);
    if (!b->sel_dirty)
        return 0;
    bool waited = atomic_load_explicit(&b->lk->rd_waiting, memory_order_relaxed) != 0;
    for (size_t i = 0; i < b->nsels; i++) {
        exr_selector *s = b->sels[i].sel;
        if (s->vt->flush)
            s->vt->flush(s);
        if (!took || n == TOOK || !atomic_load_explicit(&s->detached, memory_order_relaxed))
            continue;
        if (waited)
            NOTES_LEFT();
        else if (pthread_mutex_trylock(&s->mu) != 0)
            continue;
        else if (b->eps.seq - atomic_load_explicit(&s->detached_seq, memory_order_relaxed) <
                     EXR_REATTACH_AFTER ||
                 !s->vt->reattach)
            took[n++] = s;
        else { /* no draw without the lock for a while: in place again */
            s->vt->reattach(s);
            pthread_mutex_unlock(&s->mu);
            REATTACHED();
        }
    }
    b->sel_dirty = false;
    return n;
}

/* Lets go of rw, and of wmu if the exclusive holder took it. */
static void release_rw(exr_buffer *b)
{
    bool excl = atomic_load_explicit(&b->lk->excl, memory_order_relaxed);
    bool wmu = excl && b->lk->excl_wmu;
    if (excl) {
        reserve_open_locked(b);
        atomic_store_explicit(&b->lk->excl, false, memory_order_relaxed);
        b->lk->excl_wmu = false;
    }
    note_unlocking(b, excl);
    pthread_rwlock_unlock(&b->lk->rw);
    if (wmu)
        pthread_mutex_unlock(&b->lk->wmu);
}

void exr_buffer_unlock(exr_buffer *b)
{
    exr_selector *took[TOOK];
    size_t n = flush_selectors(b, took);
    release_rw(b);
    EXR_TM_NOW(t0);
    for (size_t i = 0; i < n; i++) {
        took[i]->vt->settle(took[i], EXR_SETTLE_LOG);
        pthread_mutex_unlock(&took[i]->mu);
    }
    if (n)
        EXR_TM_SINCE(EXR_TM_REC_SETTLE, t0);
}

void exr_sel_take(exr_selector *s)
{
    if (!spin_for(TRY_MUTEX, &s->mu, SPIN_SHARED_NS, NULL))
        pthread_mutex_lock(&s->mu);
}

uint64_t publish_seq(const exr_buffer *b)
{
    return atomic_load_explicit(&b->lk->pub_seq, memory_order_acquire);
}

/* Waits until a publish after `seq` (publish_seq) with the storage lock
 * released meanwhile, and takes it again as it was (exclusive or shared).
 * wait_mu is taken before rw is let go, and a publisher bumps pub_seq under
 * wait_mu after it has published, so none can slip in between, also one
 * that published under the shared lock while this caller held it too. */
void wait_publish_since(exr_buffer *b, bool shared, uint64_t seq)
{
    flush_selectors(b, NULL);
    pthread_mutex_lock(&b->lk->wait_mu);
    release_rw(b);
    while (atomic_load_explicit(&b->lk->pub_seq, memory_order_relaxed) == seq)
        pthread_cond_wait(&b->lk->published, &b->lk->wait_mu);
    pthread_mutex_unlock(&b->lk->wait_mu);
    if (shared)
        lock_shared(b);
    else
        exr_buffer_lock(b);
}

/* The same from now: for an exclusive holder, whom no publisher can pass
 * (one needs rw, shared or exclusive, to publish). */
void wait_publish(exr_buffer *b, bool shared) { wait_publish_since(b, shared, publish_seq(b)); }

void signal_publish(exr_buffer *b)
{
    pthread_mutex_lock(&b->lk->wait_mu);
    atomic_fetch_add_explicit(&b->lk->pub_seq, 1, memory_order_release);
    pthread_cond_broadcast(&b->lk->published);
    pthread_mutex_unlock(&b->lk->wait_mu);
}

uint64_t exr_buffer_len_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    return b->n_records;
}

uint64_t exr_buffer_num_episodes_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    return b->eps.count;
}

uint64_t exr_buffer_num_picks_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    return b->picks.n;
}
