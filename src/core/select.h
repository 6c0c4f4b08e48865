/*
 * select.h - a choice between two values as a conditional move, not a
 * branch: for conditions that depend on a random draw (which segment a
 * pick's rows run into, and how many of them the first one holds), where a
 * branch mispredicts as often as the condition changes. GCC turns the
 * plain ternary into a branch inside get_batch's plan loop (buffer_batch.c,
 * the one user), so on x86-64 these are one cmp/test and one cmov
 * (docs/design.md, "Where the time goes"); elsewhere the ternary.
 */
#ifndef EXR_SELECT_H
#define EXR_SELECT_H

#include <stdint.h>
#include <stddef.h>

/* u < v ? x : y */
static inline uintptr_t exr_sel_below(size_t u, size_t v, uintptr_t x, uintptr_t y)
{
#if defined(__x86_64__)
    __asm__("cmp %2, %1\n\tcmovb %3, %0" : "+r"(y) : "r"(u), "r"(v), "r"(x) : "cc");
    return y;
#else
    return u < v ? x : y;
#endif
}

/* c ? x : y */
static inline uintptr_t exr_sel_set(uintptr_t c, uintptr_t x, uintptr_t y)
{
#if defined(__x86_64__)
    __asm__("test %1, %1\n\tcmovne %2, %0" : "+r"(y) : "r"(c), "r"(x) : "cc");
    return y;
#else
    return c ? x : y;
#endif
}
#endif
