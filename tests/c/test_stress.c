/*
 * test_stress.c - src/core driven from many pthreads at once, built with
 * -fsanitize=thread by `make ctest-tsan` (part of `make test`, a short run;
 * `STRESS_SECONDS=60 ./build/tsan/test_stress` for a soak; STRESS_SEED=k
 * gives every thread and the buffer other random streams, so that soaks
 * under several seeds see other interleavings; 0, the default, is the
 * run `make test` makes).
 *
 * One small buffer (eviction all the time, second-chance so that the hand
 * also reaches episodes being recorded into), and at the same time:
 *
 *   writers    record_many rollouts of 1..80 steps, into episodes of their
 *              own and into one episode they share; large rollouts take the
 *              copy-without-the-lock path, small ones copy under the lock;
 *              after a call they collapse the 2 MiB chunks that segments
 *              filled onto huge pages, as the binding does (seg_collapse.c);
 *              half of their own episodes come from new_episode (reserved
 *              without the storage lock when it can, made live by the next
 *              exclusive holder), its handles increasing; some episodes
 *              are ended afterwards without a step (end_episode): their
 *              own, and the shared one while other writers may be copying
 *              into it (the end waits for that copy)
 *   samplers   get_batch (8, 32 or 75 picks) from a uniform and a prioritized
 *              selector, and check every row of every pick against what a
 *              writer recorded: a row is whole (all its words agree), the next
 *              row of a pick is the next step of the same rollout or the first
 *              step of another
 *   updaters   get_batch + set_priority through the batch's table indices
 *              (exr_buffer_set_priority with hints) and through the handles
 *   churn      adds and removes a prioritized selector, which the prioritized
 *              sampler also draws from (a draw may race with its removal)
 *   snapshot   serializes the buffer, reads it back, and checks every episode
 *              of the copy (rollouts contiguous and in order) and its invariants
 *   chunks     fills 2 MiB chunks with blocks counted as segments, collapses
 *              them and checks their bytes, beside the writers' own
 *   remover    removes one of the newest episodes now and then (remove_episode:
 *              one being copied into waits for its copy)
 *   logger     attaches an experience log for a few milliseconds at a time and
 *              detaches it: meanwhile record calls copy under the lock and log
 *              each step, the log's chunks pin the rows they point into, and an
 *              episode that goes open (evicted or removed) is ended in the log
 *              by the next record into its handle or end_episode on it
 *
 * then the invariant check and the same episode check on the buffer itself.
 * Exit status 0 with "stress: ok" when every check held.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "buffer_impl.h"
#include "codec.h"
#include "seg_collapse.h"
#include "log.h"
#include "powa.h"

/* a state: W words; word 0 the rollout id, 1 the step, 2 the rollout's
 * length, the rest a function of the three (a torn row shows) */
enum { W = 64, MAX_T = 80, PICK_LEN = 4, NWRITERS = 3, NSAMPLERS = 2, NUPDATERS = 1 };

static atomic_int g_bad;
static atomic_int g_stop;
static atomic_uint_fast32_t g_next_rollout = 1;
static exr_buffer *g_buf;
static int64_t g_sel_uniform, g_sel_prio;
/* the churn thread's selector of the moment (-1: none), which the
 * prioritized sampler also draws from while it is being removed */
static atomic_long g_sel_churn = -1;
static atomic_long g_batches, g_records, g_nowait, g_rec_nowait, g_collapsed, g_ends;
static atomic_long g_removed, g_logged;

/* the shared episode's handle (recording may move it to a new episode) */
static pthread_mutex_t g_shared_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_shared = -1;

#define BAD(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        atomic_fetch_add(&g_bad, 1);                                                               \
    } while (0)

static uint32_t word(uint32_t rollout, uint32_t step, uint32_t T, int i)
{
    uint32_t x = rollout * 2654435761u ^ step * 40503u ^ T * 97u ^ (uint32_t)i * 2246822519u;
    return x ^ (x >> 13);
}

static void fill_state(uint32_t *s, uint32_t rollout, uint32_t step, uint32_t T)
{
    s[0] = rollout;
    s[1] = step;
    s[2] = T;
    for (int i = 3; i < W; i++)
        s[i] = word(rollout, step, T, i);
}

/* 1 if s is a whole row a writer recorded (or all zeros when zero_ok) */
static int state_ok(const uint32_t *s, int zero_ok)
{
    if (zero_ok) {
        int zero = 1;
        for (int i = 0; i < W && zero; i++)
            zero = s[i] == 0;
        if (zero)
            return 1;
    }
    if (s[0] == 0 || s[2] == 0 || s[2] > MAX_T || s[1] >= s[2])
        return 0;
    for (int i = 3; i < W; i++)
        if (s[i] != word(s[0], s[1], s[2], i))
            return 0;
    return 1;
}

/* b may follow a in an episode: the next step of a's rollout, or a new
 * rollout's first step after a's last one (or after a's rollout was cut by
 * its episode's eviction: b starts an episode, which the caller knows) */
static int follows(const uint32_t *a, const uint32_t *b)
{
    if (b[0] == a[0])
        return b[1] == a[1] + 1;
    return b[1] == 0 && a[1] + 1 == a[2];
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* STRESS_SEED, mixed into every random stream by seeded() */
static uint64_t g_seed;

/* A thread's random stream from its fixed base and STRESS_SEED (never 0:
 * xorshift's state must not be). */
static uint64_t seeded(uint64_t base)
{
    uint64_t s = base ^ (g_seed * 0xd1b54a32d192ed03ull);
    return s ? s : 1;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- writers ------------------------------------------------------------- */

/* new_episode as the binding does it: a reservation, else under the lock */
static int64_t new_episode(int64_t after)
{
    int64_t h = -1;
    bool done;
    exr_status s = exr_buffer_new_episode(g_buf, &h, &done);
    if (s == EXR_OK && !done) {
        exr_buffer_lock(g_buf);
        s = exr_buffer_new_episode_locked(g_buf, &h);
        exr_buffer_unlock(g_buf);
    }
    if (s != EXR_OK)
        BAD("new_episode: status %d", (int)s);
    else if (h <= after)
        BAD("new_episode: handle %lld after %lld", (long long)h, (long long)after);
    return s == EXR_OK ? h : -1;
}

/* Ends episode h without a step (final state fin or none, then terminated),
 * as the binding does: the lock taken, waiting for a record call copying
 * into h. ok_other: outcomes besides EXR_END_DONE and EXR_END_GONE that may
 * come (the shared episode: ended by another writer, not made yet). */
static void end_episode(int64_t h, const uint32_t *fin, bool terminated, bool ok_other)
{
    exr_end_outcome o;
    exr_buffer_lock(g_buf);
    exr_status s = exr_buffer_end_episode_locked(g_buf, h, fin, terminated || !fin, &o);
    exr_buffer_unlock(g_buf);
    if (s == EXR_OK && o == EXR_END_DONE)
        atomic_fetch_add(&g_ends, 1);
    else if (!(s == EXR_OK && o == EXR_END_GONE) &&
             !(ok_other && (o == EXR_END_ENDED || o == EXR_END_UNKNOWN) && s != EXR_ENOMEM))
        BAD("end_episode %lld: status %d, outcome %d", (long long)h, (int)s, (int)o);
}

static void *writer(void *arg)
{
    uint64_t rng = seeded(0x9e3779b97f4a7c15ull * (uintptr_t)arg + 1);
    static _Thread_local uint32_t st[MAX_T][W];
    int64_t ac[MAX_T], own = -1, last_new = -1;
    float rw[MAX_T];
    double pr[MAX_T];
    uint32_t fin[W];
    while (!atomic_load(&g_stop)) {
        size_t T = 1 + xorshift(&rng) % MAX_T;
        uint32_t id = (uint32_t)atomic_fetch_add(&g_next_rollout, 1);
        for (size_t t = 0; t < T; t++) {
            fill_state(st[t], id, (uint32_t)t, (uint32_t)T);
            ac[t] = (int64_t)id << 20 | (int64_t)t;
            rw[t] = (float)t;
            pr[t] = (double)(xorshift(&rng) % 1000) / 100.0;
        }
        fill_state(fin, id, (uint32_t)T - 1, (uint32_t)T);
        int shared = xorshift(&rng) % 3 == 0;
        bool end = !shared && xorshift(&rng) % 4 == 0;
        exr_steps in = {st, ac, rw, xorshift(&rng) % 2 ? pr : NULL, T, end ? fin : NULL, end, false, NULL, 0};
        if (!shared && own < 0 && xorshift(&rng) % 2) {
            own = new_episode(last_new);
            last_new = own;
        }
        int64_t h = own, out;
        if (shared) {
            pthread_mutex_lock(&g_shared_mu);
            h = g_shared;
            pthread_mutex_unlock(&g_shared_mu);
        }
        /* every other call as the binding makes a small one: the no-wait
         * path first (trylocks; rollouts under 8 KiB only), then the
         * waiting call if it gives up */
        bool done = false;
        exr_status s = EXR_OK;
        exr_leaves lv; /* as the binding: the stored forms before any lock */
        exr_leaves_prepare(g_buf, &in, &lv);
        if (xorshift(&rng) % 2)
            s = exr_buffer_record_nowait(g_buf, h, &in, &lv, &out, &done);
        if (done)
            atomic_fetch_add(&g_rec_nowait, 1);
        else
            s = exr_buffer_record(g_buf, h, &in, &lv, &out);
        exr_leaves_release(&lv);
        if (s != EXR_OK) {
            BAD("record: status %d", (int)s);
            break;
        }
        if (exr_seg_collapse_wanted()) /* as the binding, after the call */
            atomic_fetch_add(&g_collapsed, (long)exr_seg_collapse_pending());
        atomic_fetch_add(&g_records, (long)T);
        if (shared) {
            pthread_mutex_lock(&g_shared_mu);
            if (g_shared == h)
                g_shared = out;
            pthread_mutex_unlock(&g_shared_mu);
            if (xorshift(&rng) % 8 == 0) /* others may be copying into it: the end waits */
                end_episode(out, xorshift(&rng) % 2 ? fin : NULL, xorshift(&rng) % 2, true);
        } else {
            if (out < h)
                BAD("record into %lld went to %lld", (long long)h, (long long)out);
            own = end ? -1 : out;
            if (!end && xorshift(&rng) % 4 == 0) { /* its end known only now */
                end_episode(out, xorshift(&rng) % 2 ? fin : NULL, xorshift(&rng) % 2, false);
                own = -1;
            }
        }
    }
    return NULL;
}

/* ---- samplers ------------------------------------------------------------ */

/* BIG_B: a batch of more than 64 picks, its entries gathered first and
 * planned eight at a time where the machine has AVX-512, four where it
 * has AVX2 (plan_simd.c), the last three one at a time; 75 picks of 5 rows of 268 bytes, more
 * than the 64 KiB whose rows the plan prefetches itself. */
enum { B = 32, BIG_B = 75 };

typedef struct {
    uint32_t st[BIG_B * PICK_LEN][W], nx[BIG_B * PICK_LEN][W];
    int64_t ac[BIG_B * PICK_LEN];
    float rw[BIG_B * PICK_LEN];
    int64_t len[BIG_B], lnx[BIG_B], epi[BIG_B], pos[BIG_B], idx[BIG_B];
    float w[BIG_B];
    int64_t drawn[3 + 4 * BIG_B]; /* an exr_drawn (bt is malloc'd) */
    exr_batch_out o;
} batch_t;

static void batch_init(batch_t *bt)
{
    bt->o = (exr_batch_out){bt->st, bt->ac, bt->rw, bt->nx, bt->len, bt->lnx,
                            bt->epi, bt->pos, bt->w, bt->idx, NULL, 0, (exr_drawn *)bt->drawn,
                            false};
}

/* The first n picks of a batch; what the draw noted of them (exr_drawn)
 * is the batch's picks and indices. */
static void check_batch(const batch_t *bt, int n)
{
    const exr_drawn *d = bt->o.drawn;
    if (d->count != (uint64_t)n) {
        BAD("batch: %d picks, the draw noted %llu", n, (unsigned long long)d->count);
        return;
    }
    for (int i = 0; i < n; i++)
        if (d->v[i] != bt->idx[i] || d->v[2 * n + i] != bt->epi[i] || d->v[3 * n + i] != bt->pos[i]) {
            BAD("batch: pick %d is not what the draw noted", i);
            return;
        }
    for (int i = 0; i < n; i++) {
        int64_t l = bt->len[i];
        if (l < 1 || l > PICK_LEN || bt->pos[i] < 0 || bt->epi[i] < 0) {
            BAD("batch: pick %d has seq_len %lld at (%lld, %lld)", i, (long long)l,
                (long long)bt->epi[i], (long long)bt->pos[i]);
            return;
        }
        for (int t = 0; t < l; t++) {
            const uint32_t *s = bt->st[i * PICK_LEN + t];
            if (!state_ok(s, 0)) {
                BAD("batch: pick %d row %d is torn or unpublished (rollout %u step %u)", i, t, s[0],
                    s[1]);
                return;
            }
            if (bt->ac[i * PICK_LEN + t] != ((int64_t)s[0] << 20 | s[1]) ||
                bt->rw[i * PICK_LEN + t] != (float)s[1]) {
                BAD("batch: pick %d row %d: action/reward of another row", i, t);
                return;
            }
            if (t > 0 && !follows(bt->st[i * PICK_LEN + t - 1], s)) {
                BAD("batch: pick %d rows %d, %d: rollout %u step %u then rollout %u step %u", i,
                    t - 1, t, bt->st[i * PICK_LEN + t - 1][0], bt->st[i * PICK_LEN + t - 1][1],
                    s[0], s[1]);
                return;
            }
            const uint32_t *nx = bt->nx[i * PICK_LEN + t];
            if (!state_ok(nx, 1)) {
                BAD("batch: pick %d next state %d is torn", i, t);
                return;
            }
            if (t + 1 < l && memcmp(nx, bt->st[i * PICK_LEN + t + 1], sizeof(uint32_t) * W) != 0) {
                BAD("batch: pick %d next state %d is not state %d", i, t, t + 1);
                return;
            }
        }
        if (!(bt->w[i] >= 0 && bt->w[i] <= 1.0f + 1e-6f)) {
            BAD("batch: weight %g", (double)bt->w[i]);
            return;
        }
    }
}

/* A batch of B picks (copied without the lock, pinned; every fourth call
 * BIG_B), or every other call one of SMALL_B made as the binding makes a
 * small one: the no-wait path (trylocks, copied under the shared hold), the
 * waiting call (copied under the hold too) if it gives up. *n: the picks
 * drawn. */
enum { SMALL_B = 8 }; /* 8 picks of 5 rows of 268 bytes: <= 16 KiB */
static exr_status sample_once(int64_t sel, unsigned it, exr_batch_out *o, int *n)
{
    *n = it % 2 ? SMALL_B : it % 4 == 2 ? BIG_B : B;
    if (it % 2) {
        bool done;
        exr_status s = exr_buffer_get_batch_nowait(g_buf, sel, SMALL_B, o, &done);
        if (done) {
            atomic_fetch_add(&g_nowait, 1);
            return s;
        }
    }
    return exr_buffer_get_batch(g_buf, sel, (size_t)*n, o);
}

static void *sampler(void *arg)
{
    int64_t sel = (intptr_t)arg ? g_sel_prio : g_sel_uniform;
    batch_t *bt = malloc(sizeof *bt);
    if (!bt) {
        BAD("sampler: out of memory");
        return NULL;
    }
    batch_init(bt);
    for (unsigned it = 0; !atomic_load(&g_stop); it++) {
        long churned = atomic_load(&g_sel_churn);
        int other = (intptr_t)arg && it % 4 == 3 && churned >= 0;
        int n;
        exr_status s = sample_once(other ? churned : sel, it, &bt->o, &n);
        if (s == EXR_EEMPTY || (other && s == EXR_ENOTFOUND))
            continue;
        if (s != EXR_OK) {
            BAD("get_batch: status %d", (int)s);
            break;
        }
        check_batch(bt, n);
        atomic_fetch_add(&g_batches, 1);
    }
    free(bt);
    return NULL;
}

static void *updater(void *arg)
{
    (void)arg;
    uint64_t rng = seeded(77);
    batch_t *bt = malloc(sizeof *bt);
    if (!bt) {
        BAD("updater: out of memory");
        return NULL;
    }
    batch_init(bt);
    double p[B];
    while (!atomic_load(&g_stop)) {
        exr_status s = exr_buffer_get_batch(g_buf, g_sel_prio, B, &bt->o);
        if (s == EXR_EEMPTY)
            continue;
        if (s != EXR_OK) {
            BAD("updater get_batch: status %d", (int)s);
            break;
        }
        check_batch(bt, B);
        for (int i = 0; i < B; i++)
            p[i] = (double)(xorshift(&rng) % 500) / 50.0;
        /* some hints stale on purpose: they must fall back, never misapply */
        if (xorshift(&rng) % 4 == 0)
            bt->idx[xorshift(&rng) % B] += 1;
        size_t applied;
        /* 0: by handle; 1: the batch's (maybe stale) hints; 2: the draw's
         * notes, taken unchecked while nothing has moved since */
        int hinted = (int)(xorshift(&rng) % 3);
        const exr_drawn *d = bt->o.drawn;
        if (hinted == 2)
            s = exr_buffer_set_priority(g_buf, g_sel_prio, B, d->v + 2 * B, d->v + 3 * B, d->v, d, p, 1,
                                        &applied);
        else
            s = exr_buffer_set_priority(g_buf, g_sel_prio, B, bt->epi, bt->pos,
                                        hinted ? bt->idx : NULL, NULL, p, 1, &applied);
        if (s != EXR_OK || applied > B) {
            BAD("set_priority: status %d, %zu applied", (int)s, applied);
            break;
        }
        /* an applied priority reads back (the pick may be gone since) */
        double stored[B];
        exr_buffer_lock(g_buf);
        s = exr_buffer_stored_priority_locked(g_buf, g_sel_prio, B, bt->epi, bt->pos, stored);
        exr_buffer_unlock(g_buf);
        if (s != EXR_OK)
            BAD("stored priority: status %d", (int)s);
        /* nobody else updates this selector, and a pick never comes back:
         * a pick still there holds the last priority this call gave it */
        for (int i = 0; i < B && s == EXR_OK; i++) {
            int j = B - 1;
            while (bt->epi[j] != bt->epi[i] || bt->pos[j] != bt->pos[i])
                j--;
            if (!isnan(stored[i]) && stored[i] != (double)exr_pow_leaf(p[j], 0.6)) {
                BAD("set_priority (%s): pick (%lld, %lld) holds %g, not %g ** 0.6",
                    hinted == 2 ? "drawn" : hinted ? "batch form" : "handles", (long long)bt->epi[i],
                    (long long)bt->pos[i], stored[i], p[j]);
                break;
            }
        }
    }
    free(bt);
    return NULL;
}

static void *churn(void *arg)
{
    (void)arg;
    double params[2] = {0.6, 0.4};
    while (!atomic_load(&g_stop)) {
        int64_t h;
        /* the binding's idiom (exr_lock_with_gil): try, and wait only if
         * that fails; both take the writers' mutex before rw */
        if (!exr_buffer_trylock(g_buf))
            exr_buffer_lock(g_buf);
        exr_status s = exr_buffer_add_selector_locked(g_buf, 1, params, &h);
        exr_buffer_unlock(g_buf);
        if (s != EXR_OK) {
            BAD("add selector: status %d", (int)s);
            break;
        }
        atomic_store(&g_sel_churn, (long)h);
        batch_t *bt = malloc(sizeof *bt);
        if (bt) {
            batch_init(bt);
            s = exr_buffer_get_batch(g_buf, h, B, &bt->o);
            if (s == EXR_OK)
                check_batch(bt, B);
            else if (s != EXR_EEMPTY)
                BAD("churn get_batch: status %d", (int)s);
            free(bt);
        }
        exr_buffer_lock(g_buf);
        s = exr_buffer_remove_selector_locked(g_buf, h);
        exr_buffer_unlock(g_buf);
        atomic_store(&g_sel_churn, -1); /* (after: draws race with the removal) */
        if (s != EXR_OK)
            BAD("remove selector: status %d", (int)s);
    }
    return NULL;
}

/* ---- whole-buffer checks ------------------------------------------------- */

/* Every episode: whole rows, rollouts contiguous and in order. Lock held. */
static void check_episodes_locked(exr_buffer *b, const char *what)
{
    char msg[256];
    if (exr_buffer_check_locked(b, msg, sizeof msg)) {
        BAD("%s: invariant: %s", what, msg);
        return;
    }
    uint64_t ne = exr_buffer_num_episodes_locked(b);
    int64_t *hs = malloc((ne ? ne : 1) * sizeof *hs);
    if (!hs) {
        BAD("%s: out of memory", what);
        return;
    }
    exr_buffer_handles_locked(b, hs);
    for (uint64_t i = 0; i < ne; i++) {
        uint64_t n;
        bool ended, term, has_final;
        if (exr_buffer_episode_info_locked(b, hs[i], &n, &ended, &term, &has_final) != EXR_OK) {
            BAD("%s: episode %lld not found", what, (long long)hs[i]);
            break;
        }
        uint32_t(*st)[W] = malloc((n ? n : 1) * sizeof *st);
        int64_t *ac = malloc((n ? n : 1) * sizeof *ac);
        float *rw = malloc((n ? n : 1) * sizeof *rw);
        if (!st || !ac || !rw) {
            BAD("%s: out of memory", what);
        } else {
            exr_buffer_episode_copy_locked(b, hs[i], st, ac, rw, NULL);
            for (uint64_t t = 0; t < n; t++) {
                if (!state_ok(st[t], 0)) {
                    BAD("%s: episode %lld row %llu is torn", what, (long long)hs[i],
                        (unsigned long long)t);
                    break;
                }
                if (t > 0 && !follows(st[t - 1], st[t])) {
                    BAD("%s: episode %lld rows %llu, %llu: rollout %u step %u then rollout %u step %u",
                        what, (long long)hs[i], (unsigned long long)t - 1, (unsigned long long)t,
                        st[t - 1][0], st[t - 1][1], st[t][0], st[t][1]);
                    break;
                }
            }
        }
        free(st);
        free(ac);
        free(rw);
    }
    free(hs);
}

/* reads back what an exr_mem_sink holds: cap is its length, used the position */
static exr_status source(void *ctx, void *p, size_t cap, size_t *got)
{
    exr_mem_sink *m = ctx;
    size_t n = m->cap - m->used < cap ? m->cap - m->used : cap;
    memcpy(p, m->p + m->used, n);
    m->used += n;
    *got = n;
    return EXR_OK;
}

/* Fills chunks with blocks of its own, counted as segments are, so that
 * chunks are queued and collapsed while the writers count and collapse
 * theirs; each block keeps its bytes. */
static void *chunks(void *arg)
{
    (void)arg;
    enum { NB = 1100, SZ = 2048 };
    static unsigned char *p[NB];
    while (!atomic_load(&g_stop)) {
        int n = 0;
        for (; n < NB && (p[n] = malloc(SZ)) != NULL; n++) {
            memset(p[n], n & 0xff, SZ);
            exr_seg_track(p[n], true);
        }
        if (exr_seg_collapse_wanted())
            atomic_fetch_add(&g_collapsed, (long)exr_seg_collapse_pending());
        for (int i = 0; i < n; i++) {
            if (p[i][SZ - 1] != (unsigned char)(i & 0xff))
                BAD("a counted block changed");
            exr_seg_track(p[i], false);
            free(p[i]);
        }
    }
    return NULL;
}

static void *snapshot(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        unsigned char header[EXR_HEADER_BYTES];
        exr_buffer_lock(g_buf);
        exr_buffer_quiesce_locked(g_buf);
        uint64_t bound = exr_codec_bound(exr_codec_raw_size_locked(g_buf, 0), 0);
        exr_mem_sink m = {malloc(bound), bound, 0};
        exr_status s = m.p ? exr_codec_write_locked(g_buf, NULL, 0, 0, exr_mem_sink_write, &m, NULL, NULL, header)
                           : EXR_ENOMEM;
        exr_buffer_unlock(g_buf);
        if (s != EXR_OK) {
            BAD("serialize: status %d", (int)s);
            free(m.p);
            break;
        }
        exr_mem_sink in = {m.p, m.used, 0};
        exr_buffer *copy = NULL;
        unsigned char meta[EXR_META_MAX];
        size_t meta_len;
        exr_codec_header h;
        s = exr_codec_check_header(header, EXR_HEADER_BYTES + m.used, &h);
        if (s == EXR_OK)
            s = exr_codec_read(&h, source, &in, &copy, meta, &meta_len);
        free(m.p);
        if (s != EXR_OK) {
            BAD("unserialize: status %d", (int)s);
            break;
        }
        exr_buffer_lock(copy);
        check_episodes_locked(copy, "snapshot");
        exr_buffer_unlock(copy);
        exr_buffer_free(copy);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---- removals and an experience log, beside the rest --------------------- */

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* One of the 8 newest handles removed, every 200 us: open, ended, busy
 * (the removal waits for the copy), already gone (not found). */
static void *remover(void *arg)
{
    uint64_t rng = seeded(0x51ed270b27ull + (uintptr_t)arg);
    while (!atomic_load(&g_stop)) {
        exr_buffer_lock(g_buf);
        int64_t h = g_buf->next_handle - 1 - (int64_t)(xorshift(&rng) % 8);
        exr_status s = exr_buffer_remove_episode_locked(g_buf, h);
        exr_buffer_unlock(g_buf);
        if (s == EXR_OK)
            atomic_fetch_add(&g_removed, 1);
        else if (s != EXR_ENOTFOUND)
            BAD("remove_episode %lld: status %d", (long long)h, (int)s);
        sleep_us(200);
    }
    return NULL;
}

/* A log on path attached for 5 ms, then detached and closed. */
static int log_once(const char *path)
{
    exr_log_opts o = {.level = 0, .chunk_bytes = 1 << 14, .flush_ns = 1000000};
    exr_log *lg = NULL;
    exr_status s = exr_log_open(path, &o, true, &lg);
    if (s == EXR_OK)
        s = exr_log_set_schema(lg, "{}", 2, W * sizeof(uint32_t), sizeof(int64_t),
                               sizeof(float), 0);
    if (s == EXR_OK) {
        exr_buffer_lock(g_buf);
        s = exr_log_attach_locked(lg, g_buf);
        exr_buffer_unlock(g_buf);
    }
    if (s == EXR_OK) {
        sleep_us(5000);
        exr_log_detach_begin(lg);
        exr_log_detach(lg, g_buf);
        s = exr_log_close(lg);
    }
    exr_log_free(lg);
    if (s != EXR_OK)
        BAD("log: status %d", (int)s);
    return s == EXR_OK;
}

static void *logger(void *arg)
{
    (void)arg;
    char path[] = "/tmp/exr_stress_log_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        BAD("log: no temp file");
        return NULL;
    }
    close(fd);
    while (!atomic_load(&g_stop) && log_once(path)) {
        atomic_fetch_add(&g_logged, 1);
        sleep_us(5000);
    }
    unlink(path);
    return NULL;
}

int main(void)
{
    const char *env = getenv("STRESS_SECONDS");
    double seconds = env ? atof(env) : 3.0;
    const char *seed_env = getenv("STRESS_SEED");
    g_seed = seed_env ? strtoull(seed_env, NULL, 10) : 0;
    exr_config cfg = {
        .state_bytes = W * sizeof(uint32_t),
        .action_bytes = sizeof(int64_t),
        .reward_bytes = sizeof(float),
        .capacity = 600, /* a few rollouts: eviction all the time */
        .pick_len = PICK_LEN,
        .allow_short = true,
        .eviction = EXR_EVICT_SECOND_CHANCE,
        .seed = 5 + g_seed,
    };
    if (exr_buffer_new(&cfg, &g_buf) != EXR_OK)
        return 2;
    /* the prioritized selector goes back to changes in place after a few
     * holds without a draw that lets go of the storage lock, and starts
     * again at the next: both, many times, among the other threads */
    exr_reattach_holds = 4;
    double prio_params[2] = {0.6, 0.4};
    exr_buffer_lock(g_buf);
    if (exr_buffer_add_selector_locked(g_buf, 0, NULL, &g_sel_uniform) != EXR_OK ||
        exr_buffer_add_selector_locked(g_buf, 1, prio_params, &g_sel_prio) != EXR_OK)
        return 2;
    exr_buffer_unlock(g_buf);

    enum { NT = NWRITERS + NSAMPLERS + NUPDATERS + 5 };
    pthread_t th[NT];
    int nt = 0;
    for (int i = 0; i < NWRITERS; i++)
        pthread_create(&th[nt++], NULL, writer, (void *)(intptr_t)(i + 1));
    for (int i = 0; i < NSAMPLERS; i++)
        pthread_create(&th[nt++], NULL, sampler, (void *)(intptr_t)i);
    for (int i = 0; i < NUPDATERS; i++)
        pthread_create(&th[nt++], NULL, updater, NULL);
    pthread_create(&th[nt++], NULL, churn, NULL);
    pthread_create(&th[nt++], NULL, snapshot, NULL);
    pthread_create(&th[nt++], NULL, chunks, NULL);
    pthread_create(&th[nt++], NULL, remover, NULL);
    pthread_create(&th[nt++], NULL, logger, NULL);

    double t0 = now();
    while (now() - t0 < seconds && !atomic_load(&g_bad)) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        exr_buffer_lock(g_buf);
        char msg[256];
        if (exr_buffer_check_locked(g_buf, msg, sizeof msg))
            BAD("invariant during the run: %s", msg);
        exr_buffer_unlock(g_buf);
    }
    atomic_store(&g_stop, 1);
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);

    exr_buffer_lock(g_buf);
    exr_buffer_quiesce_locked(g_buf);
    check_episodes_locked(g_buf, "final");
    exr_buffer_unlock(g_buf);
    exr_buffer_free(g_buf);
    printf("stress: %ld records (%ld calls without waiting), %ld episodes ended without a step, "
           "%ld removed, %ld logs attached and closed, %ld batches checked (%ld without "
           "waiting), %ld chunks collapsed, %llu selectors back in place, in %.1f s (seed %llu): "
           "%s\n",
           atomic_load(&g_records), atomic_load(&g_rec_nowait), atomic_load(&g_ends),
           atomic_load(&g_removed), atomic_load(&g_logged), atomic_load(&g_batches),
           atomic_load(&g_nowait), atomic_load(&g_collapsed),
           (unsigned long long)atomic_load(&exr_debug_reattached), seconds,
           (unsigned long long)g_seed, atomic_load(&g_bad) ? "FAILED" : "ok");
    return atomic_load(&g_bad) ? 1 : 0;
}
