/*
 * timing.h - where a thread's time goes around the storage lock and in a
 * prioritized draw made without it, counted per thread when the core is
 * built with -DEXR_TIMING (build/bench-pair-timed, benchmarks/c/pair.c);
 * in every other build the macros are empty and exr_timing_take reads
 * zeros.
 */
#ifndef EXR_TIMING_H
#define EXR_TIMING_H

#include <stdbool.h>
#include <stdint.h>

#include "exr.h"

typedef enum {
    EXR_TM_RW_TAKING, /* taking rw, shared or exclusive: first try until held */
    EXR_TM_RW_SHARED, /* holding rw shared */
    EXR_TM_RW_EXCL,   /* holding rw exclusively */
    /* a draw without the storage lock (buffer_batch.c, draw_detached): */
    EXR_TM_DRAW_MU,     /* taking the selector's mu, rw held shared */
    EXR_TM_DRAW_SAMPLE, /* the selector's work with mu: notes, then draws */
    EXR_TM_DRAW_NOTES,  /* of it, the notes of the holds that ended, applied */
    EXR_TM_DRAW_RELOCK, /* taking rw shared again */
    EXR_TM_DRAW_CHECK,  /* checking the picks, drawing any gone again */
    /* a set_priority of a prioritized selector (buffer_priority.c): */
    EXR_TM_UPD_RESOLVE, /* finding the picks' table indices, rw held shared */
    EXR_TM_UPD_MU,      /* taking the selector's mu */
    EXR_TM_UPD_SETTLE,  /* the notes of the holds before, applied (rw let go if it could be) */
    EXR_TM_UPD_TREE,    /* the leaves written and the tree above them fixed */
    /* a record call's exclusive hold, and what follows it: */
    EXR_TM_REC_EVICT,  /* episodes evicted (their picks removed from the table, noted) */
    EXR_TM_REC_ENTER,  /* new picks entered into the table and noted */
    EXR_TM_REC_SETTLE, /* the hold's notes applied after rw is let go (exr_buffer_unlock) */
    /* notes applied, by whichever thread applies them: */
    EXR_TM_NOTES_REM, /* removals (an evicted episode's picks) */
    EXR_TM_NOTES_ADD, /* additions (new picks) */
    EXR_TM_NOTES_FLUSH, /* the tree above the leaves they wrote fixed, at each hold's end */
    EXR_TM_N
} exr_tm_part;

/* A thread's time in each part (ns) and how many times it was in it. */
typedef struct {
    uint64_t ns[EXR_TM_N];
    uint64_t count[EXR_TM_N];
} exr_timing;

/* The calling thread's counts since its last call (all zero without
 * EXR_TIMING), then zeroes them. */
void exr_timing_take(exr_timing *out);

#ifdef EXR_TIMING
void exr_tm_add(exr_tm_part p, uint64_t ns);
/* rw taken (now held by this thread), and let go of */
void exr_tm_held(void);
void exr_tm_released(bool exclusive);
#define EXR_TM_NOW(v) uint64_t v = exr_now_ns()
#define EXR_TM_SINCE(p, v) exr_tm_add((p), exr_now_ns() - (v))
#define EXR_TM_HELD() exr_tm_held()
#define EXR_TM_RELEASED(excl) exr_tm_released(excl)
#else
#define EXR_TM_NOW(v) ((void)0)
#define EXR_TM_SINCE(p, v) ((void)0)
#define EXR_TM_HELD() ((void)0)
#define EXR_TM_RELEASED(excl) ((void)0)
#endif

#endif
