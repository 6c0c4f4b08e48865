/*
 * allocfail.c - the failing allocator of the allocation-failure test build
 * (tests/test_allocfail.py, `make allocfail`); never part of the product.
 *
 * The test build links the extension with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=posix_memalign
 * so that every call the extension's own code (src/core and src/py) makes to
 * one of these lands here; CPython's, NumPy's and zlib's allocations are in
 * other shared objects and are not affected. Armed with N, the Nth call
 * from then on returns NULL (once), as SQLite's test harness does it; the
 * test runs each public operation for N = 1, 2, ... until one completes
 * without reaching its Nth allocation.
 *
 * The controls are exported for ctypes.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);

static atomic_long countdown; /* 0: disarmed; k: the kth call from now fails */
static atomic_long calls, failed;

/* 1 if this call is to fail. */
static int should_fail(void)
{
    atomic_fetch_add(&calls, 1);
    long c = atomic_load(&countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&countdown, &c, c - 1)) {
            if (c == 1) {
                atomic_fetch_add(&failed, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

EXPORT void exr_allocfail_arm(long n)
{
    atomic_store(&calls, 0);
    atomic_store(&failed, 0);
    atomic_store(&countdown, n);
}

/* Disarms; returns how many calls failed since arming (0 or 1). */
EXPORT long exr_allocfail_disarm(void)
{
    atomic_store(&countdown, 0);
    return atomic_load(&failed);
}

/* Calls counted since arming. */
EXPORT long exr_allocfail_calls(void) { return atomic_load(&calls); }

void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }

void *__wrap_calloc(size_t k, size_t n) { return should_fail() ? NULL : __real_calloc(k, n); }

void *__wrap_realloc(void *p, size_t n) { return should_fail() ? NULL : __real_realloc(p, n); }

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return should_fail() ? NULL : __real_aligned_alloc(a, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    return should_fail() ? 12 /* ENOMEM */ : __real_posix_memalign(p, a, n);
}
