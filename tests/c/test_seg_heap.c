/*
 * test_seg_heap.c - the segment heap (src/core/seg_heap.c): which segments
 * it takes, slots that do not overlap and sit in 2 MiB-aligned regions,
 * freeing by address (its own slots and malloc's blocks alike), regions
 * unmapped when empty but the last, and a buffer of large rows that records,
 * evicts and samples through it, and restores that read full segments into
 * slots from an uncompressed body. Built with ASan+UBSan by `make ctest`
 * (free slots are poisoned there, so a read of a freed slot is reported).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "check.h"
#include "codec_mem.h"
#include "seg_heap.h"
#include "store.h"

#define HUGE ((size_t)2 << 20)

static void test_takes(void)
{
    int before = g_failed_checks;
    CHECK(exr_seg_heap_takes(128, (size_t)1 << 20));
    CHECK(!exr_seg_heap_takes(100, (size_t)1 << 20));          /* not a power of two */
    CHECK(!exr_seg_heap_takes(16, EXR_SEG_HEAP_MIN - 64));     /* too small */
    CHECK(!exr_seg_heap_takes(1024, EXR_SEG_HEAP_MAX + 64));   /* too large */
    CHECK(!exr_seg_heap_takes(0, (size_t)1 << 20));
done:
    check_report(before, "seg_heap", "takes");
}

/* 40 slots of one size: distinct, writable end to end, in regions of
 * 2 MiB-aligned mappings; freed, the heap keeps one region mapped. */
static void test_slots(void)
{
    int before = g_failed_checks;
    enum { N = 40 };
    size_t slot = 907264; /* 128 rows of 7088 bytes */
    unsigned char *p[N] = {0};
    size_t mapped0 = exr_seg_heap_mapped();
    for (int i = 0; i < N; i++) {
        p[i] = exr_seg_heap_alloc(slot);
        CHECK(p[i]);
        memset(p[i], i + 1, slot);
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            CHECK(p[i] + slot <= p[j] || p[j] + slot <= p[i]);
    for (int i = 0; i < N; i++)
        CHECK(p[i][0] == (unsigned char)(i + 1) && p[i][slot - 1] == (unsigned char)(i + 1));
    CHECK(exr_seg_heap_mapped() >= mapped0 + N * slot);
    CHECK(exr_seg_heap_mapped() % HUGE == 0);
    /* a slot handed back is handed out again before a fresh one */
    unsigned char *more[64];
    int nmore = 0;
    size_t mapped = exr_seg_heap_mapped();
    while (nmore < 64 && (more[nmore] = exr_seg_heap_alloc(slot)) && exr_seg_heap_mapped() == mapped)
        nmore++;
    CHECK(nmore < 64 && more[nmore]); /* this one mapped a new region: it has fresh slots */
    nmore++;
    mapped = exr_seg_heap_mapped();
    unsigned char *keep = p[7];
    exr_seg_free(p[7]);
    p[7] = exr_seg_heap_alloc(slot);
    CHECK(p[7] == keep && exr_seg_heap_mapped() == mapped);
    for (int i = 0; i < nmore; i++)
        exr_seg_free(more[i]);
    for (int i = 0; i < N; i++)
        exr_seg_free(p[i]);
    /* all free: one region (of at least 16 MiB) stays mapped */
    CHECK(exr_seg_heap_mapped() <= mapped0 + ((slot * 16 > ((size_t)16 << 20) ? slot * 16 : ((size_t)16 << 20)) + HUGE - 1) / HUGE * HUGE);
    /* malloc's blocks go back to free() */
    void *m = aligned_alloc(64, 4096);
    CHECK(m);
    exr_seg_free(m);
    exr_seg_free(NULL);
done:
    check_report(before, "seg_heap", "slots");
}

/* A buffer of 7088-byte rows recorded far past its capacity: its segments
 * of 128 rows come from the heap, eviction frees them, and every batch
 * holds the rows that were recorded (state bytes = action % 251). */
enum { SB = 7076, EP = 500, B = 64, PL = 4 };

static int batch_holds_its_rows(exr_buffer *b, int64_t sel)
{
    static unsigned char st[B * PL * SB], nx[B * PL * SB];
    int64_t ac[B * PL], sl[B], sln[B], epi[B], pos[B];
    float rw[B * PL], w[B];
    exr_batch_out out = {st, ac, rw, nx, sl, sln, epi, pos, w, NULL, NULL, 0, NULL, false};
    if (exr_buffer_get_batch(b, sel, B, &out) != EXR_OK)
        return 0;
    for (size_t i = 0; i < B * PL; i++) {
        size_t r = i / PL * PL + i % PL;
        if ((int64_t)(i % PL) < sl[i / PL] &&
            (st[r * SB] != (unsigned char)(ac[r] % 251) || st[r * SB + SB - 1] != st[r * SB]))
            return 0;
    }
    return 1;
}

/* A buffer of SB-byte states (capacity 3000 records) with a uniform
 * selector *sel, or NULL. */
static exr_buffer *big_buffer(int64_t *sel)
{
    exr_config cfg = {.state_bytes = SB, .action_bytes = 8, .reward_bytes = 4, .capacity = 3000,
                      .pick_len = PL, .seed = 1};
    exr_buffer *b = NULL;
    if (exr_buffer_new(&cfg, &b) != EXR_OK)
        return NULL;
    exr_buffer_lock(b);
    exr_status st = exr_buffer_add_selector_locked(b, 0, NULL, sel);
    exr_buffer_unlock(b);
    if (st != EXR_OK) {
        exr_buffer_free(b);
        return NULL;
    }
    return b;
}

/* Episode e of EP steps, each state filled with its action's byte. */
static exr_status record_episode(exr_buffer *b, int e)
{
    static unsigned char st[(size_t)SB * EP];
    int64_t ac[EP], h;
    float rw[EP] = {0};
    for (int t = 0; t < EP; t++) {
        ac[t] = (int64_t)e * EP + t;
        memset(st + (size_t)t * SB, (int)(ac[t] % 251), SB);
    }
    exr_steps in = {st, ac, rw, NULL, EP, NULL, true, true, NULL, 0};
    return exr_buffer_record(b, -1, &in, NULL, &h);
}

/* Whether b's invariants hold. */
static int holds(exr_buffer *b)
{
    char msg[256];
    exr_buffer_lock(b);
    int ok = exr_buffer_check_locked(b, msg, sizeof msg) == 0;
    exr_buffer_unlock(b);
    return ok;
}

static void test_buffer(void)
{
    int before = g_failed_checks;
    int64_t sel;
    exr_buffer *b = big_buffer(&sel);
    CHECK(b);
    for (int e = 0; e < 20; e++) {
        CHECK(record_episode(b, e) == EXR_OK);
        CHECK(exr_seg_heap_mapped() > 0);
        CHECK(batch_holds_its_rows(b, sel));
    }
    CHECK(holds(b));
done:
    exr_buffer_free(b);
    check_report(before, "seg_heap", "buffer");
}

/* Restored from an uncompressed body, a buffer's full segments of the
 * heap's sizes are read into heap slots, as recorded ones are; from a zlib
 * body they are grown as the bytes arrive, from malloc. Either way the
 * restored buffer holds the same rows. */
static void test_restore(int level)
{
    int before = g_failed_checks;
    int64_t sel;
    exr_buffer *b = big_buffer(&sel), *c = NULL;
    mem data = {0};
    CHECK(b);
    for (int e = 0; e < 4; e++)
        CHECK(record_episode(b, e) == EXR_OK);
    CHECK(serialize(b, level, &data) == EXR_OK);
    size_t used = exr_seg_heap_used();
    CHECK(unserialize(data.p, data.n, &c) == EXR_OK);
    /* each episode of EP rows has full segments of the heap's sizes */
    if (level == 0)
        CHECK(exr_seg_heap_used() > used);
    else
        CHECK(exr_seg_heap_used() == used);
    CHECK(holds(c));
    CHECK(batch_holds_its_rows(c, sel));
    exr_buffer_free(c);
    c = NULL;
    CHECK(exr_seg_heap_used() == used); /* and handed back when it is freed */
done:
    exr_buffer_free(c);
    exr_buffer_free(b);
    free(data.p);
    check_report(before, "seg_heap", level == 0 ? "restore, uncompressed" : "restore, zlib");
}

int main(void)
{
    test_takes();
    test_slots();
    test_buffer();
    test_restore(0);
    test_restore(1);
    return check_summary();
}
