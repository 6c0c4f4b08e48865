/*
 * test_fields.c - named fields and extras in the core (fields.h): records
 * copied field by field from separate arrays land in their rows, batches
 * gather each field into its own array (next states of state fields, zero
 * padding of short picks, extras without next), a bad plan is refused
 * before anything changes, and a buffer with extras round-trips through the
 * codec as format version 2 (a buffer without as version 1). Built and run
 * under ASan+UBSan by `make ctest`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "codec.h"

static int g_failed_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
            g_failed_checks++;                                                                     \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* state: a (3 bytes) | b (8 bytes: a double); extras: x (4 bytes: a float) */
enum { SA = 3, SB = 8, SBYTES = SA + SB, AB = 8, RB = 4, XB = 4, XOFF = SBYTES + AB + RB };
enum { L = 3 };

typedef struct {
    unsigned char a[64][SA];
    double b[64];
    float x[64];
    int64_t act[64];
    float rew[64];
} steps_t;

static void fill(steps_t *s, int t0, int T)
{
    for (int t = 0; t < T; t++) {
        memset(s->a[t], t0 + t, SA);
        s->b[t] = 1000.0 + t0 + t;
        s->x[t] = -(float)(t0 + t);
        s->act[t] = t0 + t;
        s->rew[t] = 0.5f * (float)(t0 + t);
    }
}

static exr_status record(exr_buffer *buf, int64_t h, steps_t *s, int T, const void *fin,
                         int64_t *out_h)
{
    exr_field_src plan[3] = {
        {0, SA, s->a[0], SA},
        {SA, SB, (const unsigned char *)s->b, SB},
        {XOFF, XB, (const unsigned char *)s->x, XB},
    };
    exr_steps in = {.actions = s->act, .rewards = s->rew, .T = (size_t)T, .final_state = fin,
                    .end = fin != NULL, .fields = plan, .nfields = 3};
    return exr_buffer_record(buf, h, &in, NULL, out_h);
}

static exr_status mem_sink(void *ctx, const void *p, size_t n)
{
    exr_mem_sink *m = ctx;
    return exr_mem_sink_write(m, p, n);
}

typedef struct {
    const unsigned char *p;
    size_t n, at;
} src_t;

static exr_status mem_source(void *ctx, void *p, size_t cap, size_t *got)
{
    src_t *m = ctx;
    size_t k = m->n - m->at < cap ? m->n - m->at : cap;
    memcpy(p, m->p + m->at, k);
    m->at += k;
    *got = k;
    return EXR_OK;
}

int main(void)
{
    exr_buffer *buf = NULL, *back = NULL;
    unsigned char *ser = NULL;
    steps_t s;
    exr_config cfg = {.state_bytes = SBYTES, .action_bytes = AB, .reward_bytes = RB,
                      .extra_bytes = XB, .capacity = 0, .pick_len = L, .allow_short = true,
                      .eviction = EXR_EVICT_FIFO, .seed = 1};
    CHECK(exr_buffer_new(&cfg, &buf) == EXR_OK);
    int64_t h;
    /* episode 0: 5 steps, ended with a final state (a = 77, b = 7777) */
    unsigned char fin[SBYTES];
    memset(fin, 77, SA);
    double fb = 7777.0;
    memcpy(fin + SA, &fb, SB);
    fill(&s, 0, 5);
    CHECK(record(buf, -1, &s, 5, fin, &h) == EXR_OK);
    CHECK(h == 0);

    /* a bad plan: a field past the state part, a record without a plan */
    {
        exr_field_src bad[1] = {{SBYTES - 2, 4, s.a[0], 4}};
        exr_steps in = {.actions = s.act, .rewards = s.rew, .T = 1, .fields = bad, .nfields = 1};
        int64_t h2;
        CHECK(exr_buffer_record(buf, -1, &in, NULL, &h2) == EXR_EINVAL);
        exr_steps plain = {.states = s.a, .actions = s.act, .rewards = s.rew, .T = 1};
        CHECK(exr_buffer_record(buf, -1, &plain, NULL, &h2) == EXR_EINVAL);
        exr_buffer_lock(buf);
        CHECK(exr_buffer_len_locked(buf) == 5 && exr_buffer_num_episodes_locked(buf) == 1);
        exr_buffer_unlock(buf);
    }

    int64_t sel;
    exr_buffer_lock(buf);
    CHECK(exr_buffer_add_selector_locked(buf, 0, NULL, &sel) == EXR_OK);
    exr_buffer_unlock(buf);

    /* gather picks 0 (full), 3 (short: steps 3, 4, then the final state) */
    {
        enum { B = 2 };
        int64_t epi[B] = {0, 0}, pos[B] = {0, 3};
        unsigned char oa[B][L][SA], na[B][L][SA];
        double ob[B][L], nb[B][L];
        float ox[B][L];
        int64_t act[B][L], len[B], lenn[B], pe[B], pp[B];
        float rew[B][L], w[B];
        exr_field_dst plan[3] = {
            {0, SA, &oa[0][0][0], &na[0][0][0], false},
            {SA, SB, (unsigned char *)ob, (unsigned char *)nb, false},
            {XOFF, XB, (unsigned char *)ox, NULL, false},
        };
        memset(ox, 0x55, sizeof ox);
        exr_batch_out out = {.action = act, .reward = rew, .seq_len = len, .seq_len_next = lenn,
                             .pick_epi = pe, .pick_pos = pp, .weight = w, .fields = plan,
                             .nfields = 3};
        CHECK(exr_buffer_gather(buf, sel, B, epi, pos, &out) == EXR_OK);
        CHECK(len[0] == 3 && len[1] == 2);
        for (int t = 0; t < 3; t++) {
            CHECK(oa[0][t][2] == t && ob[0][t] == 1000.0 + t && ox[0][t] == -(float)t);
            CHECK(na[0][t][0] == t + 1 && nb[0][t] == 1001.0 + t);
            CHECK(act[0][t] == t && rew[0][t] == 0.5f * (float)t);
        }
        CHECK(oa[1][0][0] == 3 && oa[1][1][1] == 4 && ob[1][1] == 1004.0 && ox[1][1] == -4.0f);
        CHECK(na[1][0][0] == 4 && na[1][1][0] == 77 && nb[1][1] == 7777.0);
        /* padding past seq_len: zeros in every field */
        CHECK(oa[1][2][0] == 0 && ob[1][2] == 0.0 && ox[1][2] == 0.0f && na[1][2][1] == 0 &&
              nb[1][2] == 0.0 && act[1][2] == 0);
        /* a next on an extras field, and a plan missing on a buffer with extras */
        plan[2].next = (unsigned char *)nb;
        CHECK(exr_buffer_gather(buf, sel, B, epi, pos, &out) == EXR_EINVAL);
        out.fields = NULL;
        CHECK(exr_buffer_get_batch(buf, sel, B, &out) == EXR_EINVAL);
    }

    /* episode rows: state|action|reward|extras, and the packed final state */
    {
        unsigned char rows[5][SBYTES + AB + RB + XB], f2[SBYTES];
        exr_buffer_lock(buf);
        CHECK(exr_buffer_episode_rows_locked(buf, 0, rows, f2) == EXR_OK);
        exr_buffer_unlock(buf);
        float x;
        memcpy(&x, rows[4] + XOFF, 4);
        CHECK(rows[4][0] == 4 && x == -4.0f && memcmp(f2, fin, SBYTES) == 0);
    }

    /* the codec: version 2 with extras, rows and extras back as they were */
    {
        uint64_t raw;
        exr_buffer_lock(buf);
        raw = exr_codec_raw_size_locked(buf, 0);
        size_t cap = (size_t)exr_codec_bound(raw, 0);
        ser = malloc(cap);
        CHECK(ser != NULL);
        exr_mem_sink m = {ser + EXR_HEADER_BYTES, cap - EXR_HEADER_BYTES, 0};
        exr_status st = exr_codec_write_locked(buf, NULL, 0, 0, mem_sink, &m, NULL, NULL, ser);
        exr_buffer_unlock(buf);
        CHECK(st == EXR_OK);
        uint32_t version;
        memcpy(&version, ser + 8, 4);
        CHECK(version == 2);
        src_t in = {ser + EXR_HEADER_BYTES, m.used, 0};
        unsigned char meta[EXR_META_MAX];
        size_t meta_len;
        exr_codec_header h;
        CHECK(exr_codec_check_header(ser, EXR_HEADER_BYTES + m.used, &h) == EXR_OK);
        CHECK(exr_codec_read(&h, mem_source, &in, &back, meta, &meta_len) == EXR_OK);
        CHECK(exr_buffer_config(back)->extra_bytes == XB);
        unsigned char rows[5][SBYTES + AB + RB + XB], f2[SBYTES];
        exr_buffer_lock(back);
        CHECK(exr_buffer_episode_rows_locked(back, 0, rows, f2) == EXR_OK);
        char msg[200];
        CHECK(exr_buffer_check_locked(back, msg, sizeof msg) == 0);
        exr_buffer_unlock(back);
        float x;
        memcpy(&x, rows[2] + XOFF, 4);
        CHECK(x == -2.0f && memcmp(f2, fin, SBYTES) == 0);
    }

done:
    free(ser);
    exr_buffer_free(buf);
    exr_buffer_free(back);
    if (g_failed_checks) {
        fprintf(stderr, "test_fields: %d check(s) failed\n", g_failed_checks);
        return 1;
    }
    printf("test_fields: ok\n");
    return 0;
}
