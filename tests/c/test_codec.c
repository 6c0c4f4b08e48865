/*
 * test_codec.c - the serialized form (codec) and the file layer, from C:
 * round trips at every level keep everything observable and the next draws,
 * serializing again gives the same bytes, every truncation and every single
 * flipped byte of the body is refused with a status (never a crash), and
 * save/load through a file agree with serialize. Built and run under
 * ASan+UBSan by `make ctest`.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buffer.h"
#include "codec.h"
#include "file.h"

#include "check.h"
#include "codec_mem.h"

/* ---- a buffer with a bit of everything ---------------------------------- */

static exr_buffer *filled(int64_t *uni, int64_t *per, int64_t *rank)
{
    exr_config cfg = {.state_bytes = 8, .action_bytes = 8, .reward_bytes = 4, .capacity = 50,
                      .pick_len = 3, .allow_short = true,
                      .eviction = EXR_EVICT_SECOND_CHANCE, .seed = 11};
    exr_buffer *b = NULL;
    if (exr_buffer_new(&cfg, &b) != EXR_OK)
        return NULL;
    double params[2] = {0.6, 0.4};
    exr_buffer_lock(b);
    exr_status st = exr_buffer_add_selector_locked(b, 0, params, uni);
    if (st == EXR_OK)
        st = exr_buffer_add_selector_locked(b, 1, params, per);
    if (st == EXR_OK)
        st = exr_buffer_add_selector_locked(b, 2, params, rank);
    int64_t h = -1;
    for (int e = 0; st == EXR_OK && e < 9; e++) {
        enum { T = 8 };
        float s[T][2], fin[2] = {-1, -(float)e};
        int64_t a[T];
        float r[T];
        double pr[T];
        for (int t = 0; t < T; t++) {
            s[t][0] = (float)e;
            s[t][1] = (float)t;
            a[t] = 100 * e + t;
            r[t] = 0.25f * (float)t;
            pr[t] = t % 3 == 0 ? NAN : 0.5 + t;
        }
        /* ended with a final state, ended terminal without one, or open */
        bool term = e % 2 == 0, has_fin = e % 3 == 1;
        exr_steps in = {s, a, r, pr, T, has_fin ? fin : NULL, has_fin || term, term, NULL, 0};
        st = exr_buffer_record_locked(b, e % 4 ? -1 : h, &in, &h);
    }
    exr_buffer_unlock(b);
    if (st != EXR_OK) {
        exr_buffer_free(b);
        return NULL;
    }
    return b;
}

enum { BATCH = 16, L = 3 };

typedef struct {
    float state[BATCH][L][2], next[BATCH][L][2], reward[BATCH][L], weight[BATCH];
    int64_t action[BATCH][L], len[BATCH], len_next[BATCH], epi[BATCH], pos[BATCH];
} batch;

static exr_status draw(exr_buffer *b, int64_t h, batch *o)
{
    memset(o, 0, sizeof *o);
    exr_batch_out out = {o->state, o->action, o->reward, o->next,  o->len,
                         o->len_next, o->epi, o->pos, o->weight, NULL, NULL, 0, NULL, false};
    return exr_buffer_get_batch(b, h, BATCH, &out);
}

/* ---- tests --------------------------------------------------------------- */

static void round_trip_every_level(void)
{
    int64_t uni, per, rank;
    exr_buffer *b = filled(&uni, &per, &rank), *c = NULL;
    mem m = {0}, m2 = {0};
    batch *x = malloc(sizeof *x), *y = malloc(sizeof *y);
    char msg[256];
    exr_status st;
    CHECK(b && x && y);
    for (int level = 0; level <= 9; level += 3) {
        CHECK(serialize(b, level, &m) == EXR_OK);
        st = unserialize(m.p, m.n, &c);
        if (st != EXR_OK)
            fprintf(stderr, "level %d: status %d\n", level, (int)st);
        CHECK(st == EXR_OK);
        exr_buffer_lock(c);
        CHECK(exr_buffer_check_locked(c, msg, sizeof msg) == 0);
        exr_buffer_unlock(c);
        CHECK(serialize(c, level, &m2) == EXR_OK);
        CHECK(m2.n == m.n && memcmp(m2.p, m.p, m.n) == 0); /* same bytes again */
        for (int k = 0; k < 6; k++) {
            int64_t h = k % 3 == 0 ? uni : k % 3 == 1 ? per : rank;
            CHECK(draw(b, h, x) == EXR_OK && draw(c, h, y) == EXR_OK);
            CHECK(memcmp(x, y, sizeof *x) == 0); /* the same next draws */
        }
        exr_buffer_free(c);
        c = NULL;
        free(m.p);
        free(m2.p);
        m.p = m2.p = NULL;
    }
done:
    exr_buffer_free(c);
    exr_buffer_free(b);
    free(m.p);
    free(m2.p);
    free(x);
    free(y);
}

static void damaged_input_is_refused(void)
{
    int64_t uni, per, rank;
    exr_buffer *b = filled(&uni, &per, &rank), *c = NULL;
    mem m = {0};
    CHECK(b);
    CHECK(serialize(b, 0, &m) == EXR_OK);
    /* every truncation */
    for (size_t n = 0; n < m.n; n += 1 + n / 64) {
        CHECK(unserialize(m.p, n, &c) != EXR_OK);
        CHECK(c == NULL);
    }
    /* every single flipped byte: refused (the CRCs), never a crash */
    unsigned char *d = malloc(m.n);
    CHECK(d);
    for (size_t i = 0; i < m.n; i++) {
        memcpy(d, m.p, m.n);
        d[i] ^= 0x5a;
        exr_status st = unserialize(d, m.n, &c);
        if (st == EXR_OK) {
            exr_buffer_free(c);
            c = NULL;
        }
        if (st != EXR_ECORRUPT) {
            free(d);
            CHECK(st == EXR_ECORRUPT);
        }
    }
    free(d);
done:
    exr_buffer_free(b);
    free(m.p);
}

static void file_save_and_load(void)
{
    int64_t uni, per, rank;
    exr_buffer *b = filled(&uni, &per, &rank), *c = NULL;
    mem m = {0}, m2 = {0};
    char path[] = "/tmp/exr_test_codec_XXXXXX";
    int fd = mkstemp(path);
    CHECK(b && fd >= 0);
    close(fd);
    int err = 0;
    exr_buffer_lock(b);
    exr_status st = exr_file_save_locked(b, "m", 1, 1, path, NULL, NULL, &err);
    exr_buffer_unlock(b);
    CHECK(st == EXR_OK);
    unsigned char meta[EXR_META_MAX];
    size_t meta_len = 0;
    CHECK(exr_file_load(path, &c, meta, &meta_len, &err) == EXR_OK);
    CHECK(meta_len == 1 && meta[0] == 'm');
    CHECK(serialize(b, 0, &m) == EXR_OK && serialize(c, 0, &m2) == EXR_OK);
    /* the loaded buffer serializes to the same bytes as the saved one */
    CHECK(m.n == m2.n && memcmp(m.p, m2.p, m.n) == 0);
    exr_buffer_free(c);
    c = NULL;
    /* a missing file is EXR_EIO with errno, not a crash */
    unlink(path);
    CHECK(exr_file_load(path, &c, meta, &meta_len, &err) == EXR_EIO && c == NULL && err != 0);
done:
    exr_buffer_free(c);
    exr_buffer_free(b);
    free(m.p);
    free(m2.p);
}

/* A progress callback that asks to stop ends the write with EXR_EABORTED
 * (its own status, not EXR_EINVAL), called once per EXR_PROGRESS_EVERY
 * payload bytes. */
static int stop_at_first(void *ctx, uint64_t done, uint64_t total)
{
    int *calls = ctx;
    ++*calls;
    return done > 0 && done <= total;
}

static exr_status discard(void *ctx, const void *p, size_t n)
{
    (void)ctx;
    (void)p;
    (void)n;
    return EXR_OK;
}

static void progress_abort(void)
{
    enum { ROW = 1 << 20, T = 70 }; /* 70 MiB of states: past one progress report */
    exr_config cfg = {.state_bytes = ROW, .action_bytes = 8, .reward_bytes = 4, .pick_len = 1,
                      .eviction = EXR_EVICT_FIFO, .seed = 1};
    exr_buffer *b = NULL;
    unsigned char *states = calloc(T, ROW);
    int64_t actions[T] = {0};
    float rewards[T] = {0};
    CHECK(states && exr_buffer_new(&cfg, &b) == EXR_OK);
    exr_steps in = {.states = states, .actions = actions, .rewards = rewards, .T = T};
    int64_t h;
    CHECK(exr_buffer_record(b, -1, &in, NULL, &h) == EXR_OK);
    unsigned char header[EXR_HEADER_BYTES];
    int calls = 0;
    exr_buffer_lock(b);
    exr_status st = exr_codec_write_locked(b, NULL, 0, 0, discard, NULL, stop_at_first, &calls,
                                           header);
    exr_buffer_unlock(b);
    CHECK(st == EXR_EABORTED && calls == 1);
done:
    exr_buffer_free(b);
    free(states);
}

int main(void)
{
    static const check_test tests[] = {
        {"round_trip_every_level", round_trip_every_level},
        {"damaged_input_is_refused", damaged_input_is_refused},
        {"file_save_and_load", file_save_and_load},
        {"progress_abort", progress_abort},
    };
    return check_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
}
