#define _GNU_SOURCE /* getrandom */
#include "episode.h"
#include "seg_heap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The map's hash is keyed with a per-process random key: handles come from
 * serialized input as well as from the counter, and an input may choose them
 * freely (increasing, below 2^62). With a fixed hash it could put them all
 * in one probe chain and make loading, record and set_priority quadratic;
 * without the key it cannot aim. SipHash-1-3 of the one 8-byte word. */
static uint64_t hash_key[2];
static pthread_once_t hash_key_once = PTHREAD_ONCE_INIT;

static void hash_key_init(void)
{
    uint64_t k[2] = {0, 0};
    ssize_t got = getrandom(k, sizeof k, GRND_NONBLOCK);
    if (got != (ssize_t)sizeof k) {
        /* no entropy from the kernel yet: the clock, the pid and an address
         * are still not something a file can aim at in advance */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        k[0] ^= (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_sec;
        k[1] ^= ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&got;
    }
    hash_key[0] = k[0];
    hash_key[1] = k[1];
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                              \
    do {                                                                                      \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                             \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                             \
    } while (0)

static size_t hash_slot(int64_t h, size_t cap)
{
    uint64_t m = (uint64_t)h, k0 = hash_key[0], k1 = hash_key[1];
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    uint64_t last = (uint64_t)8 << 56;
    v3 ^= m;
    SIPROUND;
    v0 ^= m;
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return (size_t)(v0 ^ v1 ^ v2 ^ v3) & (cap - 1);
}

void exr_episodes_init(exr_episodes *t)
{
    pthread_once(&hash_key_once, hash_key_init);
    memset(t, 0, sizeof *t);
    t->free_head = t->head = t->tail = EXR_NIL;
}

void exr_episodes_free(exr_episodes *t)
{
    for (uint32_t s = t->head; s != EXR_NIL; s = t->slab[s].next)
        exr_body_free(t->slab[s].body);
    free(t->slab);
    free(t->keys);
    free(t->vals);
    exr_episodes_init(t);
}

void exr_episodes_probe_stats(const exr_episodes *t, double *mean, uint64_t *max)
{
    uint64_t sum = 0, n = 0;
    *max = 0;
    for (size_t i = 0; i < t->map_cap; i++) {
        if (t->keys[i] < 0)
            continue;
        uint64_t d = (i - hash_slot(t->keys[i], t->map_cap)) & (t->map_cap - 1);
        sum += d;
        n++;
        if (d > *max)
            *max = d;
    }
    *mean = n ? (double)sum / (double)n : 0.0;
}

uint32_t exr_episodes_find(const exr_episodes *t, int64_t handle)
{
    if (handle < 0 || !t->map_cap)
        return EXR_NIL;
    if (t->hint < t->hwm && t->slab[t->hint].handle == handle)
        return t->hint;
    size_t i = hash_slot(handle, t->map_cap);
    for (;;) {
        int64_t k = t->keys[i];
        if (k == handle)
            return t->vals[i];
        if (k < 0)
            return EXR_NIL;
        i = (i + 1) & (t->map_cap - 1);
    }
}

static void map_put(int64_t *keys, uint32_t *vals, size_t cap, int64_t handle, uint32_t slot)
{
    size_t i = hash_slot(handle, cap);
    while (keys[i] >= 0)
        i = (i + 1) & (cap - 1);
    keys[i] = handle;
    vals[i] = slot;
}

uint64_t exr_episodes_room(const exr_episodes *t)
{
    uint64_t slab = t->cap - t->count, half = t->map_cap / 2;
    uint64_t map = half > t->map_used ? half - t->map_used : 0;
    return slab < map ? slab : map;
}

/* The map rebuilt with ncap entries (a power of two). */
static exr_status map_grow(exr_episodes *t, size_t ncap)
{
    int64_t *keys = malloc(ncap * sizeof *keys);
    uint32_t *vals = malloc(ncap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return EXR_ENOMEM;
    }
    memset(keys, 0xff, ncap * sizeof *keys);
    for (size_t i = 0; i < t->map_cap; i++)
        if (t->keys[i] >= 0)
            map_put(keys, vals, ncap, t->keys[i], t->vals[i]);
    free(t->keys);
    free(t->vals);
    t->keys = keys;
    t->vals = vals;
    t->map_cap = ncap;
    return EXR_OK;
}

/* The slab grown to ncap slots on 64-byte lines (NULL: out of memory, the
 * old one intact). An exr_episode is 64 bytes on 64-bit platforms, so each
 * slot is then one line: get_batch's plan reads a slot's handle, lengths,
 * flags and body pointer for every pick, and realloc's 16-byte alignment
 * split most slots over two lines (the body pointer in the second). */
static exr_episode *slab_grow(exr_episode *old, size_t used, size_t ncap)
{
    void *p;
    if (posix_memalign(&p, 64, ncap * sizeof *old) != 0)
        return NULL;
    if (used)
        memcpy(p, old, used * sizeof *old);
    free(old);
    return p;
}

exr_status exr_episodes_reserve_n(exr_episodes *t, uint64_t n)
{
    if (n > EXR_NIL / 4)
        return EXR_EOVERFLOW;
    if (t->cap - t->count < n) {
        uint64_t ncap = t->cap ? t->cap : 64;
        while (ncap - t->count < n)
            ncap *= 2;
        if (ncap > (uint64_t)EXR_NIL / 2 + 1) /* as many slots as a uint32_t index allows */
            return EXR_EOVERFLOW;
        exr_episode *ns = slab_grow(t->slab, t->hwm, (size_t)ncap);
        if (!ns)
            return EXR_ENOMEM;
        t->slab = ns;
        t->cap = (uint32_t)ncap;
    }
    /* keep the map at most half full */
    if ((t->map_used + n) * 2 <= t->map_cap)
        return EXR_OK;
    size_t ncap = t->map_cap ? t->map_cap : 128;
    while ((t->map_used + n) * 2 > ncap)
        ncap *= 2;
    return map_grow(t, ncap);
}

exr_status exr_episodes_reserve(exr_episodes *t) { return exr_episodes_reserve_n(t, 1); }

uint32_t exr_episodes_insert(exr_episodes *t, int64_t handle, exr_body *body)
{
    uint32_t s;
    if (t->free_head != EXR_NIL) {
        s = t->free_head;
        t->free_head = t->slab[s].next;
    } else {
        s = t->hwm++;
    }
    exr_episode *e = &t->slab[s];
    memset(e, 0, sizeof *e);
    e->handle = handle;
    e->body = body;
    e->prev = t->tail;
    e->next = EXR_NIL;
    if (t->tail != EXR_NIL)
        t->slab[t->tail].next = s;
    else
        t->head = s;
    t->tail = s;
    t->count++;
    map_put(t->keys, t->vals, t->map_cap, handle, s);
    t->map_used++;
    t->hint = s;
    return s;
}

void exr_episodes_remove(exr_episodes *t, uint32_t s)
{
    exr_episode *e = &t->slab[s];
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t cap = t->map_cap, i = hash_slot(e->handle, cap);
    while (t->keys[i] != e->handle)
        i = (i + 1) & (cap - 1);
    size_t j = i;
    for (;;) {
        j = (j + 1) & (cap - 1);
        if (t->keys[j] < 0)
            break;
        size_t home = hash_slot(t->keys[j], cap);
        /* move j back to i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            t->keys[i] = t->keys[j];
            t->vals[i] = t->vals[j];
            i = j;
        }
    }
    t->keys[i] = -1;
    t->map_used--;

    if (e->prev != EXR_NIL)
        t->slab[e->prev].next = e->next;
    else
        t->head = e->next;
    if (e->next != EXR_NIL)
        t->slab[e->next].prev = e->prev;
    else
        t->tail = e->prev;
    t->count--;
    e->body = NULL;
    e->handle = -1;
    e->next = t->free_head;
    t->free_head = s;
}

exr_body *exr_body_new(uint32_t cap)
{
    exr_body *b = malloc(sizeof *b + (size_t)cap * sizeof b->segs[0]);
    if (!b)
        return NULL;
    b->next_dead = NULL;
    b->epoch = 0;
    b->final_state = NULL;
    b->aux = NULL;
    b->aux_cap = 0;
    b->last_rows = 0;
    b->nsegs = 0;
    b->cap = cap;
    return b;
}

exr_body *exr_body_grow(exr_body *b, uint32_t cap)
{
    if (cap <= b->cap)
        return b;
    exr_body *nb = realloc(b, sizeof *b + (size_t)cap * sizeof b->segs[0]);
    if (!nb)
        return NULL;
    nb->cap = cap;
    return nb;
}

void exr_body_free(exr_body *b)
{
    if (!b)
        return;
    for (uint32_t k = 0; k < b->nsegs; k++)
        exr_seg_free(b->segs[k]);
    free(b->final_state);
    free(b->aux);
    free(b);
}
