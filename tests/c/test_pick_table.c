/*
 * test_pick_table.c - the pick table's storage (src/core/pick_table.c): its
 * entries kept in order while it grows from realloc'd memory to 2 MiB-aligned
 * memory advised for huge pages and on, and how much of it is advised for a
 * buffer of a given capacity. Built with ASan+UBSan by `make ctest`.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "pick_table.h"

#define MIB ((size_t)1 << 20)

/* Grown one pick at a time to past 2^20 picks (8 MiB, then 16 MiB of
 * table), every entry is where it was put; from EXR_PICK_TABLE_HUGE on the
 * array is 2 MiB-aligned (exr_huge_prefix_alloc), below it is not asked to. */
static void test_grow(size_t full)
{
    int before = g_failed_checks;
    exr_pick_table t;
    exr_pick_table_init(&t);
    size_t n = ((size_t)1 << 20) + 5, grown = 0;
    for (size_t i = 0; i < n; i++) {
        size_t cap = t.cap;
        CHECK(exr_pick_table_reserve(&t, i + 1, full) == EXR_OK);
        CHECK(t.cap >= i + 1);
        if (t.cap != cap) {
            grown++;
            for (size_t j = 0; j < i; j++)
                CHECK(t.v[j].slot == (uint32_t)(j * 7) && t.v[j].pos == (uint32_t)(j ^ 0x5a5a));
            if (t.cap * sizeof(exr_pick) >= EXR_PICK_TABLE_HUGE)
                CHECK((uintptr_t)t.v % (2 * MIB) == 0);
        }
        t.v[i] = (exr_pick){(uint32_t)(i * 7), (uint32_t)(i ^ 0x5a5a)};
        t.n = i + 1;
    }
    CHECK(grown == 14); /* 256, doubled 12 times to 2^20, then 2^21 */
    CHECK(exr_pick_table_reserve(&t, 10, full) == EXR_OK && t.cap == (size_t)1 << 21);
done:
    exr_pick_table_free(&t);
    check_report(before, "pick_table", full == SIZE_MAX ? "grow, unbounded" : "grow, capacity 1M");
}

static void test_huge_bytes(void)
{
    int before = g_failed_checks;
    /* capacity 1M in an 8 MiB table: 8,000,000 bytes used, 8 MiB advised
     * (388,608 unused, under an eighth) */
    CHECK(exr_pick_table_huge_bytes(8 * MIB, 1000000) == 8 * MIB);
    /* capacity 300,000 in a 4 MiB table: 2.4 MB used; rounding up would leave
     * 1.79 MB unused, so 2 MiB */
    CHECK(exr_pick_table_huge_bytes(4 * MIB, 300000) == 2 * MIB);
    /* capacity past the table: all of it */
    CHECK(exr_pick_table_huge_bytes(4 * MIB, 1000000) == 4 * MIB);
    CHECK(exr_pick_table_huge_bytes(16 * MIB, SIZE_MAX) == 16 * MIB);
    /* a capacity under one huge page: none */
    CHECK(exr_pick_table_huge_bytes(4 * MIB, 100) == 0);
    /* exactly whole pages: those */
    CHECK(exr_pick_table_huge_bytes(8 * MIB, 4 * MIB / 8) == 4 * MIB);
    /* 3 MiB used: 4 would leave a third of them unused, so 2 */
    CHECK(exr_pick_table_huge_bytes(8 * MIB, 3 * MIB / 8) == 2 * MIB);
done:
    check_report(before, "pick_table", "huge bytes");
}

int main(void)
{
    test_huge_bytes();
    test_grow(SIZE_MAX);
    test_grow(1000000);
    return check_summary();
}
