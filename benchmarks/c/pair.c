/*
 * pair.c - the suite's Ape-X thread pair in C: no interpreter, no GIL.
 * A C program linked against src/core: `make bench-pair`.
 *
 * The workloads of benchmarks/test_bench_threads.py's Ape-X pair, as the
 * binding calls the core:
 *
 *   writer   a new episode, then one exr_buffer_record of 100 (4,) float32
 *            steps with priorities (their stored forms prepared before the
 *            call, as the binding does); the buffer is full, so each call
 *            evicts an episode
 *   learner  a prioritized get_batch of 256 (with pick_index and the
 *            draw's notes), then exr_buffer_set_priority of the 256 drawn
 *            picks with the notes, as the binding's set_priority given
 *            the batch's own arrays
 *
 * on buffers of 200,000 records, each filled first. Each round measures,
 * for SECONDS each, with threads left to the scheduler:
 *
 *   alone     the writer alone (on each buffer); then the learner alone
 *   shared    the writer and the learner on one buffer (the suite's pair)
 *   separate  the writer on a second buffer of the same shape and fill:
 *             the two threads share nothing of exreplay (no lock, no line
 *             either writes), only the machine
 *
 * and prints calls per second and each side's share of its rate alone;
 * "sum" is the two shares added (2.0: both at full speed). The medians over
 * the rounds come last. Usage: pair [ROUNDS [SECONDS [ONLY]]] (default 5,
 * 1.0); ONLY (writer, learner, shared or separate) runs just that phase,
 * ROUNDS times, for a profiler.
 *
 * ONLY = writers4 runs instead the suite's 4 writers + 1 learner
 * (test_bench_threads.py's test_writers_and_learner, Ape-X shape): each
 * round, the learner alone, then beside 4 writer threads on its buffer,
 * each recording and then sleeping 7 times the writer's call alone (busy
 * 1/8 of the time when alone), and the learner's rate with them over its
 * rate alone (the suite's goal: >= 0.8); then beside the same 4 writers
 * on the second buffer (nothing of exreplay shared: what the machine's
 * cores and scheduler leave the learner). The writers sleep in nanosleep
 * with the thread's default timer slack, as Python's timed waits (the
 * suite's Event.wait) do; writers4-exact sets their slack to 1 ns, so
 * that they wake when asked rather than in the batches the slack makes.
 *
 * Each round first measures the machine's cross-core round trip of one
 * cache line (src/core/crosscore.h, 0.1 s) and prints it: the shared
 * pair's rates follow it (docs/benchmarks.md, "Two machines in one").
 * The learner's steps are timed by phase (get_batch's draw, plan and copy:
 * exr_buffer_get_batch_phases; then set_priority), and each round prints
 * their means alone and beside the writer (writers4: alone, beside the
 * writers and beside them on the second buffer): where the learner's step
 * grows.
 *
 * Built with -DEXR_TIMING (build/bench-pair-timed), the core counts each
 * thread's time around the storage lock and in the parts of a draw made
 * without it (src/core/timing.h), and each round prints them for the
 * shared phase (writers4: the learner beside the writers, the 4 writers'
 * counts summed): the share of each side's time spent taking rw and
 * holding it, and the learner's draws without the lock, part by part;
 * and per call of each side, a record call's evictions and new picks in
 * its holds, its settling of the hold's notes after them, and the notes
 * each side applied (removals, additions, the tree above them).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer.h"
#include "buffer_impl.h"
#include "batch_out.h"
#include "timing.h"
/* an A/B base tree from before the probe has none: the rounds then print 0 */
#if __has_include("crosscore.h")
#include "crosscore.h"
#define CROSSCORE_NS() exr_crosscore_ns(0.1)
#else
#define CROSSCORE_NS() 0.0
#endif

enum { CAP = 200000, EP = 100, B = 256, SB = 16 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* secs as a timespec, for nanosleep. */
static struct timespec ts_of(double secs)
{
    return (struct timespec){(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
}

static void check(exr_status st, const char *what)
{
    if (st != EXR_OK) {
        fprintf(stderr, "%s failed: %d\n", what, (int)st);
        exit(1);
    }
}

typedef struct {
    exr_buffer *b;
    int64_t sel;
} side_buf;

/* One episode's arrays, shared read-only by every writer. */
static unsigned char st[EP * SB], fin[SB];
static int64_t ac[EP];
static float rw[EP];
static double pri[EP];

static void record_episode(exr_buffer *b)
{
    exr_steps in = {.states = st, .actions = ac, .rewards = rw, .T = EP,
                    .priorities = pri, .final_state = fin, .end = true};
    int64_t h;
    bool done;
    check(exr_buffer_new_episode(b, &h, &done), "new_episode");
    if (!done) {
        exr_buffer_lock(b);
        check(exr_buffer_new_episode_locked(b, &h), "new_episode_locked");
        exr_buffer_unlock(b);
    }
    exr_leaves lv;
    exr_leaves_prepare(b, &in, &lv);
    check(exr_buffer_record(b, h, &in, &lv, &h), "record");
    exr_leaves_release(&lv);
}

static void fill(side_buf *s)
{
    exr_config cfg = {.state_bytes = SB, .action_bytes = 8, .reward_bytes = 4,
                      .capacity = CAP, .pick_len = 1, .seed = 1};
    check(exr_buffer_new(&cfg, &s->b), "buffer_new");
    exr_buffer_lock(s->b);
    const double params[2] = {0.6, 0.4};
    check(exr_buffer_add_selector_locked(s->b, 1, params, &s->sel), "add_selector");
    exr_buffer_unlock(s->b);
    for (size_t done = 0; done < CAP; done += EP)
        record_episode(s->b);
}

/* The learner's time by phase, summed over its steps (ns): get_batch's
 * draw, plan and copy (exr_batch_phases), then set_priority. */
enum { PH_DRAW, PH_PLAN, PH_COPY, PH_SETP, NPH };
typedef struct {
    double ns[NPH];
    uint64_t steps;
} learner_phases;

typedef struct {
    side_buf *s;
    exr_batch_out o;
    int64_t drawn[3 + 4 * B]; /* an exr_drawn: what the draw noted */
    double prio[B];
    learner_phases ph;
} learner_state;

static void learner_step(learner_state *l)
{
    exr_batch_phases ph;
    check(exr_buffer_get_batch_phases(l->s->b, l->s->sel, B, &l->o, &ph), "get_batch");
    double t0 = now_s();
    size_t applied;
    /* as the binding's set_priority(ps, b.pick_epi, b.pick_pos, p): the
     * batch's picks with the indices and slots its draw noted */
    const exr_drawn *d = l->o.drawn;
    check(exr_buffer_set_priority(l->s->b, l->s->sel, B, l->o.pick_epi, l->o.pick_pos, d->v, d,
                                  l->prio, 1, &applied),
          "set_priority");
    l->ph.ns[PH_SETP] += (now_s() - t0) * 1e9;
    l->ph.ns[PH_DRAW] += (double)ph.draw_ns;
    l->ph.ns[PH_PLAN] += (double)ph.plan_ns;
    l->ph.ns[PH_COPY] += (double)ph.copy_ns;
    l->ph.steps++;
}

/* The phases' means since the last call, in us a step, into text; reset. */
static const char *phases_text(learner_state *l, char *buf, size_t len)
{
    double n = l->ph.steps ? (double)l->ph.steps : 1;
    const double *v = l->ph.ns;
    snprintf(buf, len, "draw %.1f + plan %.1f + copy %.1f + set_priority %.1f = %.1f us",
             v[PH_DRAW] / n * 1e-3, v[PH_PLAN] / n * 1e-3, v[PH_COPY] / n * 1e-3,
             v[PH_SETP] / n * 1e-3, (v[PH_DRAW] + v[PH_PLAN] + v[PH_COPY] + v[PH_SETP]) / n * 1e-3);
    l->ph = (learner_phases){0};
    return buf;
}

typedef struct {
    int is_learner;
    side_buf *s;
    learner_state *l;
    atomic_bool *stop;
    uint64_t calls;
    double secs;
    exr_timing tm; /* the thread's timing.h counts (a -DEXR_TIMING build) */
} thread_arg;

static void *run(void *p)
{
    thread_arg *a = p;
    /* named, so that a profile splits by thread (perf report --comm learner) */
    prctl(PR_SET_NAME, a->is_learner ? "learner" : "writer", 0UL, 0UL, 0UL);
    double t0 = now_s();
    uint64_t n = 0;
    while (!atomic_load_explicit(a->stop, memory_order_relaxed)) {
        if (a->is_learner)
            learner_step(a->l);
        else
            record_episode(a->s->b);
        n++;
    }
    a->calls = n;
    a->secs = now_s() - t0;
    exr_timing_take(&a->tm);
    return NULL;
}

/* A side's timing.h counts in the last measure, over its seconds and
 * calls: printed by a -DEXR_TIMING build (timing_text). */
typedef struct {
    exr_timing tm;
    double secs;
    uint64_t calls;
} timed_side;
static timed_side timed[2]; /* the writer, the learner */

/* Where each side's time went in the last measure (a -DEXR_TIMING build,
 * build/bench-pair-timed): its share of the time taking rw and holding it,
 * the learner's draws without the storage lock by part, in us a step
 * (over the steps that made one), and its set_priority calls by part.
 * Empty in other builds. */
static const char *timing_text(char *buf, size_t len)
{
    buf[0] = 0;
#ifdef EXR_TIMING
    size_t used = 0;
    for (int i = 0; i < 2 && used < len; i++) {
        const timed_side *t = &timed[i];
        double pct = t->secs > 0 ? 1e-7 / t->secs : 0;
        used += (size_t)snprintf(buf + used, len - used,
                                 "  %s: taking rw %.1f%% of its time (%.2f takes a call), holding it "
                                 "shared %.1f%%, exclusively %.1f%%\n",
                                 i ? "learner" : "writer", (double)t->tm.ns[EXR_TM_RW_TAKING] * pct,
                                 t->calls ? (double)t->tm.count[EXR_TM_RW_TAKING] / (double)t->calls : 0,
                                 (double)t->tm.ns[EXR_TM_RW_SHARED] * pct,
                                 (double)t->tm.ns[EXR_TM_RW_EXCL] * pct);
    }
    for (int i = 0; i < 2 && used < len; i++) {
        const exr_timing *w = &timed[i].tm;
        double c = timed[i].calls ? 1e-3 / (double)timed[i].calls : 0;
        used += (size_t)snprintf(
            buf + used, len - used,
            "  %s, us a call: evict %.2f + enter %.2f (in its holds), settle after them %.2f; "
            "notes applied: removals %.2f + additions %.2f + tree %.2f\n",
            i ? "learner" : "writer", (double)w->ns[EXR_TM_REC_EVICT] * c,
            (double)w->ns[EXR_TM_REC_ENTER] * c, (double)w->ns[EXR_TM_REC_SETTLE] * c,
            (double)w->ns[EXR_TM_NOTES_REM] * c, (double)w->ns[EXR_TM_NOTES_ADD] * c,
            (double)w->ns[EXR_TM_NOTES_FLUSH] * c);
    }
    const exr_timing *m = &timed[1].tm;
    double n = (double)m->count[EXR_TM_DRAW_SAMPLE], us = n > 0 ? 1e-3 / n : 0;
    if (n > 0 && used < len)
        used += (size_t)snprintf(
            buf + used, len - used,
            "  learner's draws without the lock (%.0f of %llu steps), us each: mu %.2f + notes "
            "%.2f + draws %.2f + rw again %.2f + check %.2f\n",
            n, (unsigned long long)timed[1].calls, (double)m->ns[EXR_TM_DRAW_MU] * us,
            (double)m->ns[EXR_TM_DRAW_NOTES] * us,
            (double)(m->ns[EXR_TM_DRAW_SAMPLE] - m->ns[EXR_TM_DRAW_NOTES]) * us,
            (double)m->ns[EXR_TM_DRAW_RELOCK] * us, (double)m->ns[EXR_TM_DRAW_CHECK] * us);
    double k = (double)m->count[EXR_TM_UPD_TREE], ku = k > 0 ? 1e-3 / k : 0;
    if (k > 0 && used < len)
        snprintf(buf + used, len - used,
                 "  learner's set_priority (%.0f), us each: resolve %.2f + mu %.2f + notes %.2f + "
                 "tree %.2f\n",
                 k, (double)m->ns[EXR_TM_UPD_RESOLVE] * ku, (double)m->ns[EXR_TM_UPD_MU] * ku,
                 (double)m->ns[EXR_TM_UPD_SETTLE] * ku, (double)m->ns[EXR_TM_UPD_TREE] * ku);
#else
    (void)len;
#endif
    return buf;
}

/* Calls per second of the writer (on w; NULL: none) and of the learner
 * (l; NULL: none), run together for secs. */
static void measure(side_buf *w, learner_state *l, double secs, double *wr, double *lr)
{
    atomic_bool stop = false;
    thread_arg ta[2] = {{.is_learner = 0, .s = w, .stop = &stop},
                        {.is_learner = 1, .s = l ? l->s : NULL, .l = l, .stop = &stop}};
    pthread_t t[2];
    int on[2] = {w != NULL, l != NULL};
    for (int i = 0; i < 2; i++)
        if (on[i] && pthread_create(&t[i], NULL, run, &ta[i]) != 0)
            exit(1);
    struct timespec d = ts_of(secs);
    nanosleep(&d, NULL);
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++)
        if (on[i])
            pthread_join(t[i], NULL);
    *wr = on[0] ? (double)ta[0].calls / ta[0].secs : 0;
    *lr = on[1] ? (double)ta[1].calls / ta[1].secs : 0;
    timed[0] = (timed_side){ta[0].tm, ta[0].secs, ta[0].calls};
    timed[1] = (timed_side){ta[1].tm, ta[1].secs, ta[1].calls};
}

typedef struct {
    side_buf *s;
    atomic_bool *stop;
    double pause; /* seconds asleep after each record call */
    bool exact;   /* timer slack 1 ns */
    uint64_t calls;
    exr_timing tm;
} duty_arg;

static void *run_duty(void *p)
{
    duty_arg *a = p;
    if (a->exact)
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    struct timespec d = ts_of(a->pause);
    uint64_t n = 0;
    while (!atomic_load_explicit(a->stop, memory_order_relaxed)) {
        record_episode(a->s->b);
        n++;
        nanosleep(&d, NULL);
    }
    a->calls = n;
    exr_timing_take(&a->tm);
    return NULL;
}

enum { NW = 4 };

/* The learner's steps per second beside NW writers on buffer w (the
 * learner's own, or the second), each asleep `pause` seconds after each
 * call, run together for secs; *recs: the writers' records per second. */
static double with_writers(learner_state *l, side_buf *w, double secs, double pause, bool exact,
                           double *recs)
{
    atomic_bool stop = false;
    thread_arg ta = {.is_learner = 1, .s = l->s, .l = l, .stop = &stop};
    duty_arg da[NW];
    pthread_t t[NW + 1];
    if (pthread_create(&t[NW], NULL, run, &ta) != 0)
        exit(1);
    for (int i = 0; i < NW; i++) {
        da[i] = (duty_arg){.s = w, .stop = &stop, .pause = pause, .exact = exact};
        if (pthread_create(&t[i], NULL, run_duty, &da[i]) != 0)
            exit(1);
    }
    struct timespec d = ts_of(secs);
    nanosleep(&d, NULL);
    atomic_store(&stop, true);
    uint64_t calls = 0;
    for (int i = 0; i <= NW; i++)
        pthread_join(t[i], NULL);
    timed[0] = (timed_side){.secs = ta.secs}; /* the writers' counts summed */
    for (int i = 0; i < NW; i++) {
        calls += da[i].calls;
        for (int p = 0; p < EXR_TM_N; p++) {
            timed[0].tm.ns[p] += da[i].tm.ns[p];
            timed[0].tm.count[p] += da[i].tm.count[p];
        }
    }
    timed[0].calls = calls;
    timed[1] = (timed_side){ta.tm, ta.secs, ta.calls};
    *recs = (double)calls * EP / ta.secs;
    return (double)ta.calls / ta.secs;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ONLY = writers4 or writers4-exact: ROUNDS rounds of the learner alone,
 * beside NW writers on its buffer (one) and beside them on the second
 * (two), then the medians. */
static void writers_rounds(side_buf *one, side_buf *two, learner_state *l, size_t rounds, double secs,
                           bool exact)
{
    double wr, dummy;
    measure(one, NULL, 0.5, &wr, &dummy);
    double pause = 7.0 / wr; /* 7 calls' time: busy 1/8 of the time alone */
    printf("writer alone %.2f us a call; each of %d writers sleeps %.1f us after a call%s\n",
           1e6 / wr, NW, pause * 1e6, exact ? " (timer slack 1 ns)" : "");
    /* per round: the learner beside the writers on one and on two, over
     * its rate alone, and the writers' records per second on one and two */
    double *v[4];
    for (int c = 0; c < 4; c++)
        v[c] = bench_zalloc(rounds * sizeof(double));
    for (size_t r = 0; r < rounds; r++) {
        double alone, tog, sep, xc = CROSSCORE_NS();
        char ph[3][160];
        l->ph = (learner_phases){0};
        measure(NULL, l, secs, &dummy, &alone);
        phases_text(l, ph[0], sizeof ph[0]);
        tog = with_writers(l, one, secs, pause, exact, &v[2][r]);
        phases_text(l, ph[1], sizeof ph[1]);
        char tm[1024];
        timing_text(tm, sizeof tm);
        sep = with_writers(l, two, secs, pause, exact, &v[3][r]);
        phases_text(l, ph[2], sizeof ph[2]);
        v[0][r] = tog / alone;
        v[1][r] = sep / alone;
        printf("round %zu: learner alone %.0f/s, beside the writers %.0f/s (%.2fx), beside them on "
               "a second buffer %.0f/s (%.2fx); writers %.0f and %.0f records/s; cross-core %.0f ns\n",
               r, alone, tog, v[0][r], sep, v[1][r], v[2][r], v[3][r], xc);
        printf("  learner's step alone: %s\n  beside the writers: %s\n%s  beside them on a second "
               "buffer: %s\n", ph[0], ph[1], tm, ph[2]);
        fflush(stdout);
    }
    printf("medians: learner beside the writers %.2fx its rate alone (writers %.0f records/s); "
           "beside them on a second buffer %.2fx (writers %.0f records/s)\n",
           median(v[0], rounds), median(v[2], rounds), median(v[1], rounds), median(v[3], rounds));
    for (int c = 0; c < 4; c++)
        free(v[c]);
}

int main(int argc, char **argv)
{
    size_t rounds = argc > 1 ? (size_t)atol(argv[1]) : 5;
    double secs = argc > 2 ? atof(argv[2]) : 1.0;
    const char *only = argc > 3 ? argv[3] : NULL;
    /* ONLY: which sides run, and the writer on the second buffer */
    bool w_on = only && strcmp(only, "learner"), l_on = only && strcmp(only, "writer");
    bool writers4 = only && (!strcmp(only, "writers4") || !strcmp(only, "writers4-exact"));
    bool known = !only || writers4 || !strcmp(only, "writer") || !strcmp(only, "learner") ||
                 !strcmp(only, "shared") || !strcmp(only, "separate");
    if (rounds < 1 || rounds > 1000 || !(secs > 0 && secs < 3600) || !known || argc > 4) {
        fprintf(stderr, "usage: pair [ROUNDS (1-1000) [SECONDS "
                        "[writer|learner|shared|separate|writers4|writers4-exact]]]\n");
        return 2;
    }
    for (size_t i = 0; i < EP * SB; i++)
        st[i] = (unsigned char)i;
    for (size_t i = 0; i < EP; i++) {
        ac[i] = (int64_t)i;
        rw[i] = 0.5f;
        pri[i] = 0.05 + (double)((i * 7919) % 1000) / 1000.0;
    }
    side_buf one, two;
    fill(&one);
    fill(&two);
    learner_state l = {.s = &one};
    batch_out_alloc(&l.o, B, 1, SB, bench_zalloc);
    l.o.drawn = (exr_drawn *)l.drawn;
    for (size_t i = 0; i < B; i++)
        l.prio[i] = 0.05 + (double)((i * 104729) % 1000) / 1000.0;
    /* column: 0 writer alone, 1 learner alone, 2-3 shared (w, l), 4-5 separate (w, l),
     * 6 the writer alone on the second buffer */
    double *v[7];
    for (int c = 0; c < 7; c++)
        v[c] = bench_zalloc(rounds * sizeof(double));
    double *sh = bench_zalloc(rounds * sizeof(double)), *se = bench_zalloc(rounds * sizeof(double));
    double dummy;
    /* warm-up: the learner's selector drawn while a writer records (the
     * state a learner's selector is in once writers run beside it), and the
     * second buffer's the same. A writer alone puts it back to changes in
     * place after EXR_REATTACH_HOLDS calls (docs/design.md, "Back to
     * changes in place"), so the rates alone are those of a program that
     * never shared the buffer, as the suite's sequential runs are */
    measure(&one, &l, 0.3, &dummy, &dummy);
    l.s = &two;
    measure(&two, &l, 0.3, &dummy, &dummy);
    l.s = &one;
    side_buf *w_buf = only && !strcmp(only, "separate") ? &two : &one;
    if (writers4)
        writers_rounds(&one, &two, &l, rounds, secs, !strcmp(only, "writers4-exact"));
    for (size_t r = 0; only && !writers4 && r < rounds; r++) {
        double wr, lr, xc = CROSSCORE_NS();
        measure(w_on ? w_buf : NULL, l_on ? &l : NULL, secs, &wr, &lr);
        printf("%s: writer %.0f/s learner %.0f/s | cross-core %.0f ns\n", only, wr, lr, xc);
    }
    char ph_alone[128], ph_shared[128], tm_shared[1024];
    for (size_t r = 0; !only && r < rounds; r++) {
        double xc = CROSSCORE_NS();
        measure(&one, NULL, secs, &v[0][r], &dummy);
        measure(&two, NULL, secs, &v[6][r], &dummy);
        l.ph = (learner_phases){0};
        measure(NULL, &l, secs, &dummy, &v[1][r]);
        phases_text(&l, ph_alone, sizeof ph_alone);
        measure(&one, &l, secs, &v[2][r], &v[3][r]);
        phases_text(&l, ph_shared, sizeof ph_shared);
        timing_text(tm_shared, sizeof tm_shared);
        measure(&two, &l, secs, &v[4][r], &v[5][r]);
        sh[r] = v[2][r] / v[0][r] + v[3][r] / v[1][r];
        se[r] = v[4][r] / v[6][r] + v[5][r] / v[1][r];
        printf("round %zu: alone writer %.0f/s learner %.0f/s | shared %.2f + %.2f = %.2f | "
               "separate %.2f + %.2f = %.2f | cross-core %.0f ns\n",
               r, v[0][r], v[1][r], v[2][r] / v[0][r], v[3][r] / v[1][r], sh[r],
               v[4][r] / v[6][r], v[5][r] / v[1][r], se[r], xc);
        printf("  learner a step alone: %s\n  beside the writer:    %s\n%s", ph_alone, ph_shared,
               tm_shared);
        fflush(stdout);
    }
    if (!only) {
        double m[7];
        for (int c = 0; c < 7; c++)
            m[c] = median(v[c], rounds);
        printf("medians: alone writer %.0f/s learner %.0f/s | shared writer %.0f/s learner %.0f/s, "
               "sum of shares %.2f | separate writer %.0f/s learner %.0f/s, sum of shares %.2f\n",
               m[0], m[1], m[2], m[3], median(sh, rounds), m[4], m[5], median(se, rounds));
    }
    exr_buffer_free(one.b);
    exr_buffer_free(two.b);
    return 0;
}
