/*
 * test_seg_collapse.c - the chunk counts of malloc'd segments
 * (src/core/seg_collapse.c): bytes counted into the right 2 MiB chunks,
 * ranges across chunk boundaries split, counts that never go below 0, the
 * table's deletion (backward shift) checked against a plain array after
 * thousands of random adds and removals of made-up ranges, the queueing rule
 * (at least half full, and a segment counted in the next chunk), and real
 * segments of malloc collapsed or refused, their bytes unchanged. Built
 * with ASan+UBSan by `make ctest`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "seg_collapse.h"

#define CH EXR_CHUNK_BYTES
/* made-up addresses far from anything mapped: nothing here is dereferenced */
#define BASE ((uintptr_t)0x100000000000ull)

static void test_split(void)
{
    int before = g_failed_checks;
    exr_seg_collapse_stats st;
    exr_seg_collapse_get_stats(&st);
    size_t chunks0 = st.chunks;
    uintptr_t a = BASE + 3 * CH - 100; /* 100 bytes in chunk 2, 50 in chunk 3 */
    exr_seg_track_range(a, 150, true);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 2 * CH)) == 100);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 3 * CH)) == 50);
    exr_seg_collapse_get_stats(&st);
    CHECK(st.chunks == chunks0 + 2);
    /* taking out more than was counted stops at 0, and the chunk leaves */
    exr_seg_track_range(a + 100, 80, false);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 3 * CH)) == 0);
    exr_seg_track_range(a, 100, false);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 2 * CH)) == 0);
    exr_seg_collapse_get_stats(&st);
    CHECK(st.chunks == chunks0);
    /* a range over three chunks */
    exr_seg_track_range(BASE + 10 * CH + 1, 2 * CH, true);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 10 * CH)) == CH - 1);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 11 * CH)) == CH);
    CHECK(exr_seg_chunk_bytes((void *)(BASE + 12 * CH)) == 1);
    exr_seg_track_range(BASE + 10 * CH + 1, 2 * CH, false);
    exr_seg_collapse_get_stats(&st);
    CHECK(st.chunks == chunks0);
done:
    check_report(before, "seg_collapse", "split");
}

/* Random adds and removals over 3,000 chunks spaced so that many share a
 * probe run, against a plain array of the expected counts. */
static void test_table(void)
{
    int before = g_failed_checks;
    enum { NCH = 3000, OPS = 60000 };
    static uint32_t want[NCH];
    memset(want, 0, sizeof want);
    exr_rng r;
    exr_rng_seed(&r, 7, 0);
    bool was = exr_seg_collapse_enable(true);
    for (int op = 0; op < OPS; op++) {
        size_t k = (size_t)(exr_rng_next(&r) % NCH);
        uintptr_t chunk_addr = BASE + (uintptr_t)k * 977 * CH; /* odd spacing */
        size_t n = 1 + (size_t)(exr_rng_next(&r) % 4096);
        bool add = want[k] == 0 || exr_rng_next(&r) % 3 != 0;
        if (!add && exr_rng_next(&r) % 2) /* the chunk's last segment: it leaves the table */
            n = want[k];
        exr_seg_track_range(chunk_addr + 64, n, add);
        if (add)
            want[k] += (uint32_t)n;
        else
            want[k] = want[k] > n ? want[k] - (uint32_t)n : 0;
        if (op % 1000 == 999)
            for (size_t j = 0; j < NCH; j++)
                CHECK(exr_seg_chunk_bytes((void *)(BASE + (uintptr_t)j * 977 * CH)) == want[j]);
    }
    for (size_t j = 0; j < NCH; j++)
        exr_seg_track_range(BASE + (uintptr_t)j * 977 * CH + 64, want[j], false);
    for (size_t j = 0; j < NCH; j++)
        CHECK(exr_seg_chunk_bytes((void *)(BASE + (uintptr_t)j * 977 * CH)) == 0);
    exr_seg_collapse_enable(was);
    exr_seg_collapse_pending(); /* whatever got queued: made-up addresses, refused */
done:
    check_report(before, "seg_collapse", "table against a plain array");
}

/* A chunk half full is not queued until a segment is counted in the next
 * chunk; then once only. */
static void test_queue_rule(void)
{
    int before = g_failed_checks;
    exr_seg_collapse_pending();
    exr_seg_collapse_stats s0, s1;
    exr_seg_collapse_get_stats(&s0);
    uintptr_t c = BASE + 5000 * CH;
    exr_seg_track_range(c, CH / 2 - 64, true);
    exr_seg_track_range(c + CH, 64, true); /* next chunk, but c is under half */
    CHECK(!exr_seg_collapse_wanted());
    exr_seg_track_range(c + CH / 2 - 64, 64, true); /* c half full: still waits */
    CHECK(!exr_seg_collapse_wanted());
    exr_seg_track_range(c + CH + 64, 64, true); /* a segment after it: queued */
    CHECK(exr_seg_collapse_wanted());
    exr_seg_collapse_get_stats(&s1);
    CHECK(s1.queued == s0.queued + 1);
    exr_seg_track_range(c + CH + 128, 64, true); /* queued already: not again */
    exr_seg_collapse_get_stats(&s1);
    CHECK(s1.queued == s0.queued + 1);
    CHECK(exr_seg_collapse_pending() == 0); /* nothing is mapped there */
    CHECK(!exr_seg_collapse_wanted());
    exr_seg_collapse_get_stats(&s1);
    CHECK(s1.failed == s0.failed + 1);
    /* refused, it is tried again after the next segment past it, up to
     * three times in all */
    for (int k = 0; k < 4; k++) {
        exr_seg_track_range(c + CH + 256 + 64 * (uintptr_t)k, 64, true);
        exr_seg_collapse_pending();
    }
    exr_seg_collapse_get_stats(&s1);
    CHECK(s1.queued == s0.queued + 3 && s1.failed == s0.failed + 3);
    exr_seg_track_range(c, CH / 2, false);
    exr_seg_track_range(c + CH, CH, false);
    CHECK(exr_seg_chunk_bytes((void *)c) == 0 && exr_seg_chunk_bytes((void *)(c + CH)) == 0);
done:
    check_report(before, "seg_collapse", "queue rule");
}

/* Real segments: 8 MiB of 2 KiB blocks from malloc, each filled with its
 * own bytes, counted as exr_store_seg_alloc counts them; every queued chunk
 * is collapsed or refused, and no byte changes. */
static void test_real(void)
{
    int before = g_failed_checks;
    enum { NB = 4096, SZ = 2048 };
    unsigned char **p = calloc(NB, sizeof *p);
    CHECK(p);
    exr_seg_collapse_pending();
    exr_seg_collapse_stats s0, s1;
    exr_seg_collapse_get_stats(&s0);
    for (int i = 0; i < NB; i++) {
        p[i] = aligned_alloc(64, SZ);
        CHECK(p[i]);
        memset(p[i], i & 0xff, SZ);
        exr_seg_track(p[i], true);
    }
    exr_seg_collapse_pending();
    exr_seg_collapse_get_stats(&s1);
    CHECK(s1.collapsed + s1.failed == s0.collapsed + s0.failed + (s1.queued - s0.queued));
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < SZ; j += 97)
            CHECK(p[i][j] == (unsigned char)(i & 0xff));
done:
    for (int i = 0; p && i < NB; i++) {
        exr_seg_track(p[i], false);
        free(p[i]);
    }
    free(p);
    check_report(before, "seg_collapse", "real segments");
}

int main(void)
{
    test_split();
    test_table();
    test_queue_rule();
    test_real();
    return check_summary();
}
