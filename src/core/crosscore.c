/*
 * crosscore.c - the cross-core round trip of one cache line (crosscore.h).
 */
#include "crosscore.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "exr.h"
#include "mem.h"

enum { TRIPS = 256, MAXBATCH = 1 << 16 };

/* The ball alone on its line; the stop flag on another. */
typedef struct {
    EXR_LINE _Atomic uint64_t ball;
    EXR_LINE _Atomic int stop;
} court;

static double now_s(void) { return 1e-9 * (double)exr_now_ns(); }

/* The second thread: answers each odd value with the next one. */
static void *answer(void *p)
{
    court *c = p;
    uint64_t want = 1;
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) {
        if (atomic_load_explicit(&c->ball, memory_order_acquire) == want) {
            atomic_store_explicit(&c->ball, want + 1, memory_order_release);
            want += 2;
        }
    }
    return NULL;
}

/* TRIPS round trips from *v on; false if `until` passed first (the other
 * thread is not running beside this one). */
static bool serve(court *c, uint64_t *v, double until)
{
    for (int k = 0; k < TRIPS; k++) {
        atomic_store_explicit(&c->ball, *v + 1, memory_order_release);
        for (uint32_t spins = 1; atomic_load_explicit(&c->ball, memory_order_acquire) != *v + 2;
             spins++)
            if (!(spins & 0xffff) && now_s() > until)
                return false;
        *v += 2;
    }
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double exr_crosscore_ns(double secs)
{
    court *c = exr_line_calloc(sizeof *c);
    double *ns = malloc(MAXBATCH * sizeof *ns);
    pthread_t th;
    if (!c || !ns || pthread_create(&th, NULL, answer, c) != 0) {
        free(c);
        free(ns);
        return -1;
    }
    uint64_t v = 0;
    size_t n = 0;
    double t0 = now_s(), until = t0 + secs + 1.0;
    bool ok = serve(c, &v, until); /* the first batch warms up, untimed */
    while (ok && n < MAXBATCH && now_s() - t0 < secs) {
        double b0 = now_s();
        ok = serve(c, &v, until);
        ns[n++] = (now_s() - b0) * 1e9 / TRIPS;
    }
    atomic_store_explicit(&c->stop, 1, memory_order_relaxed);
    pthread_join(th, NULL);
    /* no full batch timed: the mean of the trips made (one, if none) */
    double r = (now_s() - t0) * 1e9 / (double)(v / 2 ? v / 2 : 1);
    if (n) {
        qsort(ns, n, sizeof *ns, cmp_double);
        r = ns[n / 2];
    }
    free(c);
    free(ns);
    return r;
}
