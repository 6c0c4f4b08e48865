#define _DEFAULT_SOURCE
#include "rng.h"

#include <stdio.h>
#include <time.h>
#include <sys/random.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void exr_rng_seed(exr_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ULL);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    /* xoshiro's state must not be all zero; splitmix64 never yields four
     * zeros in a row, but be explicit. */
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3]))
        r->s[0] = 1;
}

exr_rng exr_rng_split(const exr_rng *r)
{
    exr_rng g;
    exr_rng_seed(&g, r->s[0] ^ exr_rng_rotl(r->s[2], 32), r->s[1] ^ exr_rng_rotl(r->s[3], 32));
    return g;
}

uint64_t exr_rng_entropy(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v)
        return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&v;
    return splitmix64(&x);
}
