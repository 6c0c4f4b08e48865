#define _GNU_SOURCE /* getrandom */
#include "episode.h"
#include "seg_heap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The map's hash is keyed with per-process random tables: handles come
 * from serialized input as well as from the counter, and an input may
 * choose them freely (increasing, below 2^62). With a fixed hash it could
 * put them all in one probe chain and make loading, record and
 * set_priority quadratic; without the tables it cannot aim. The hash is
 * simple tabulation (each byte of the handle picks a random word from its
 * own table; the words are XORed), which keeps linear probing O(1)
 * expected whatever the keys (Patrascu and Thorup, "The power of simple
 * tabulation hashing"), for a few loads from 16 KiB of tables: SipHash-1-3,
 * used before, took about 50 dependent instructions a lookup, and
 * set_priority(ps, pick_epi, pick_pos, p) makes one per pick. */
static uint64_t hash_tab[8][256];
static uint64_t hash_hi0; /* the words of bytes 4..7 of a handle below 2^32 */
static pthread_once_t hash_key_once = PTHREAD_ONCE_INIT;

/* splitmix64: spreads the random key over the tables */
static uint64_t mix_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

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
    uint64_t x = k[0] ^ mix_next(&k[1]);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 256; j++)
            hash_tab[i][j] = mix_next(&x);
    hash_hi0 = hash_tab[4][0] ^ hash_tab[5][0] ^ hash_tab[6][0] ^ hash_tab[7][0];
}

static inline __attribute__((always_inline)) size_t hash_slot(int64_t h, size_t cap)
{
    uint64_t m = (uint64_t)h;
    uint64_t v = hash_tab[0][m & 0xff] ^ hash_tab[1][(m >> 8) & 0xff] ^
                 hash_tab[2][(m >> 16) & 0xff] ^ hash_tab[3][(m >> 24) & 0xff];
    if (m >> 32)
        v ^= hash_tab[4][(m >> 32) & 0xff] ^ hash_tab[5][(m >> 40) & 0xff] ^
             hash_tab[6][(m >> 48) & 0xff] ^ hash_tab[7][m >> 56];
    else
        v ^= hash_hi0;
    return (size_t)v & (cap - 1);
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
    free(t->map);
    free(t->direct);
    exr_episodes_init(t);
}

void exr_episodes_probe_stats(const exr_episodes *t, double *mean, uint64_t *max)
{
    uint64_t sum = 0, n = 0;
    *max = 0;
    for (size_t i = 0; i < t->map_cap; i++) {
        if (t->map[i].key < 0)
            continue;
        uint64_t d = (i - hash_slot(t->map[i].key, t->map_cap)) & (t->map_cap - 1);
        sum += d;
        n++;
        if (d > *max)
            *max = d;
    }
    *mean = n ? (double)sum / (double)n : 0.0;
}

/* The map's answer for a handle >= 0 (map_cap > 0). */
static uint32_t map_find(const exr_episodes *t, int64_t handle)
{
    size_t i = hash_slot(handle, t->map_cap);
    for (;;) {
        int64_t k = t->map[i].key;
        if (k == handle)
            return t->map[i].val;
        if (k < 0)
            return EXR_NIL;
        i = (i + 1) & (t->map_cap - 1);
    }
}

/* The direct table's slot for a handle if it holds it, else EXR_NIL. */
static inline uint32_t direct_find(const exr_episodes *t, int64_t handle)
{
    uint32_t s = t->direct[(uint64_t)handle & (t->map_cap - 1)];
    return s != EXR_NIL && t->slab[s].handle == handle ? s : EXR_NIL;
}

uint32_t exr_episodes_find(const exr_episodes *t, int64_t handle)
{
    if (handle < 0 || !t->map_cap)
        return EXR_NIL;
    if (t->hint < t->hwm && t->slab[t->hint].handle == handle)
        return t->hint;
    uint32_t s = direct_find(t, handle);
    return s != EXR_NIL ? s : map_find(t, handle);
}

/* exr_episodes_find for many handles at once, in passes over all of them
 * so that each pass's loads are independent and their misses overlap:
 * the direct table's slots are read and their slab lines prefetched, then
 * each is taken where its slab line holds the handle and the map is asked
 * for the others (which leaves the slab lines in cache for the caller). */
void exr_episodes_find_many(const exr_episodes *t, size_t n, const int64_t *handles,
                            size_t *slots)
{
    if (!t->map_cap) {
        for (size_t i = 0; i < n; i++)
            slots[i] = EXR_NIL;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        slots[i] = t->direct[(uint64_t)handles[i] & (t->map_cap - 1)];
        if (slots[i] != EXR_NIL)
            __builtin_prefetch(&t->slab[slots[i]]);
    }
    for (size_t i = 0; i < n; i++) {
        int64_t handle = handles[i];
        if (handle < 0)
            slots[i] = EXR_NIL;
        else if (slots[i] == EXR_NIL || t->slab[slots[i]].handle != handle)
            slots[i] = map_find(t, handle);
    }
}

/* Enters a handle in the map and the direct table (where it replaces an
 * older handle with the same low bits: handles only grow). */
static void map_put(exr_map_cell *map, uint32_t *direct, size_t cap, int64_t handle,
                    uint32_t slot)
{
    size_t i = hash_slot(handle, cap);
    while (map[i].key >= 0)
        i = (i + 1) & (cap - 1);
    map[i].key = handle;
    map[i].val = slot;
    direct[(uint64_t)handle & (cap - 1)] = slot;
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
    exr_map_cell *map;
    if (ncap > SIZE_MAX / sizeof *map || posix_memalign((void **)&map, 64, ncap * sizeof *map))
        return EXR_ENOMEM;
    uint32_t *direct = malloc(ncap * sizeof *direct);
    if (!direct) {
        free(map);
        return EXR_ENOMEM;
    }
    memset(map, 0xff, ncap * sizeof *map); /* every key -1 */
    memset(direct, 0xff, ncap * sizeof *direct); /* every slot EXR_NIL */
    for (uint32_t s = t->head; s != EXR_NIL; s = t->slab[s].next) /* in handle order */
        map_put(map, direct, ncap, t->slab[s].handle, s);
    free(t->map);
    free(t->direct);
    t->map = map;
    t->direct = direct;
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
    e->fill = t->seq;
    exr_episode_sync(e);
    e->prev = t->tail;
    e->next = EXR_NIL;
    if (t->tail != EXR_NIL)
        t->slab[t->tail].next = s;
    else
        t->head = s;
    t->tail = s;
    t->count++;
    map_put(t->map, t->direct, t->map_cap, handle, s);
    t->map_used++;
    t->hint = s;
    return s;
}

void exr_episodes_remove(exr_episodes *t, uint32_t s)
{
    exr_episode *e = &t->slab[s];
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t cap = t->map_cap, i = hash_slot(e->handle, cap);
    while (t->map[i].key != e->handle)
        i = (i + 1) & (cap - 1);
    size_t j = i;
    for (;;) {
        j = (j + 1) & (cap - 1);
        if (t->map[j].key < 0)
            break;
        size_t home = hash_slot(t->map[j].key, cap);
        /* move j back to i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            t->map[i] = t->map[j];
            i = j;
        }
    }
    t->map[i].key = -1;
    t->map_used--;
    if (t->direct[(uint64_t)e->handle & (cap - 1)] == s)
        t->direct[(uint64_t)e->handle & (cap - 1)] = EXR_NIL;

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
    e->seg0 = NULL;
    e->aux = NULL;
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
    b->n_pub = b->m_pub = 0;
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
