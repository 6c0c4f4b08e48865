/*
 * exr.h - status codes and small helpers shared by every core module.
 *
 * The core never prints, aborts or raises (except the lock assertions of
 * debug builds, buffer_impl.h): each fallible function returns an
 * exr_status and leaves its outputs untouched on failure. The binding turns a
 * status into a Python exception in one function (exr_raise_status,
 * src/py/errors.c).
 */
#ifndef EXR_H
#define EXR_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    EXR_OK = 0,
    EXR_ENOMEM,    /* an allocation failed; nothing was changed */
    EXR_EINVAL,    /* an argument is out of range */
    EXR_ENOTFOUND, /* unknown selector handle, episode handle or pick */
    EXR_EEMPTY,    /* nothing to draw from: no picks, or all priorities zero */
    EXR_EOVERFLOW, /* a size would not fit its type */
    EXR_ECORRUPT,  /* serialized input failed validation */
    EXR_EIO,       /* a file operation failed: the function's err output (file.h)
                      or errno (log.h) says why */
    EXR_EABORTED   /* a progress callback asked to stop (codec.h) */
} exr_status;

#define EXR_NIL UINT32_MAX

/* Starts a struct member on a cache line of its own: fields written by one
 * thread kept off the lines another thread reads (buffer_impl.h). A struct
 * with such a member is allocated with exr_line_calloc (mem.h). */
#define EXR_LINE_BYTES 64
#define EXR_LINE _Alignas(EXR_LINE_BYTES)

/* a * b into *out; returns 0 on overflow, 1 otherwise. */
static inline int exr_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static inline int exr_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* This thread's number (buffer.c): given at its first call, from 1 up, and
 * never to another thread, whereas a pthread_t (and a thread-local
 * variable's address) can come back in a thread started after this one
 * has exited. */
uint64_t exr_thread_id(void);

/* CLOCK_MONOTONIC in nanoseconds (buffer.c): the spins' deadlines, the
 * batch phases' timings, the cross-core probe. */
uint64_t exr_now_ns(void);

#endif
