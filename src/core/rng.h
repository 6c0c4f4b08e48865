/*
 * rng.h - xoshiro256** seeded through splitmix64: a small, fast, seedable
 * generator. Each pick selector owns one, so selectors draw independently and
 * a buffer's batches are reproducible from its seed.
 *
 *   state s[4] (256 bits)  --next()-->  64 random bits, O(1)
 */
#ifndef EXR_RNG_H
#define EXR_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} exr_rng;

/* Seeds from (seed, stream): different streams give unrelated sequences. */
void exr_rng_seed(exr_rng *r, uint64_t seed, uint64_t stream);

/* A generator seeded from r's state, whose outputs are unrelated to r's;
 * r itself is not advanced. For draws that must leave r's sequence as it
 * is: a detached draw's extras (sel_prioritized.c), which only some paths
 * make. */
exr_rng exr_rng_split(const exr_rng *r);

/* A seed from the operating system's entropy (falls back to time and
 * addresses where none is available). */
uint64_t exr_rng_entropy(void);

static inline uint64_t exr_rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t exr_rng_next(exr_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = exr_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = exr_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double exr_rng_double(exr_rng *r)
{
    return (double)(exr_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n), n >= 1, by Lemire's multiply-shift; the bias is below
 * n / 2^64, far under anything a test of a replay buffer can see. */
static inline uint64_t exr_rng_below(exr_rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)exr_rng_next(r) * n) >> 64);
}

#endif
