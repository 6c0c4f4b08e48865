/*
 * test_log.c - the log writer (src/core/log.c) where the order of two
 * threads decides the outcome: a flush that fsyncs without the log's lock,
 * and a close in another thread meanwhile, which must not close the file
 * under the fsync. This program defines fsync itself (the core's call binds
 * to it when linked in), so that the fsync lasts long enough for the close
 * to come, and checks that the descriptor is still open when it ends.
 */
#define _DEFAULT_SOURCE /* syscall */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "log.h"

static atomic_int g_slow_syncs;   /* fsyncs still to slow down */
static atomic_int g_in_sync;      /* a slowed fsync has begun */
static atomic_int g_closed_under; /* a slowed fsync found its descriptor closed */

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int fsync(int fd)
{
    if (atomic_fetch_sub(&g_slow_syncs, 1) > 0) {
        atomic_store(&g_in_sync, 1);
        sleep_ms(200); /* a close from another thread has time to come */
        if (fcntl(fd, F_GETFD) == -1)
            atomic_store(&g_closed_under, 1);
    }
    return (int)syscall(SYS_fsync, fd);
}

typedef struct {
    exr_log *lg;
    exr_status st;
} flush_job;

static void *flush_sync(void *arg)
{
    flush_job *j = arg;
    j->st = exr_log_flush(j->lg, true);
    return NULL;
}

static void test_close_during_fsync(void)
{
    int before = g_failed_checks;
    char path[] = "/tmp/exr_test_log_XXXXXX";
    int tmp = mkstemp(path);
    CHECK_RET(tmp >= 0);
    close(tmp);
    exr_log_opts o = {.level = 0, .chunk_bytes = 1 << 20, .max_backlog = 1 << 24};
    exr_log *lg = NULL;
    CHECK(exr_log_open(path, &o, true, &lg) == EXR_OK);
    CHECK(exr_log_set_schema(lg, "{}", 2, 4, 8, 4, 0) == EXR_OK);
    float s[1] = {1.0f};
    int64_t a = 2;
    float r = 3.0f;
    CHECK(exr_log_append(lg, 7, 0, s, &a, &r, NULL, 0) == EXR_OK);
    atomic_store(&g_slow_syncs, 1);
    flush_job j = {lg, EXR_EIO};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, flush_sync, &j) == 0);
    while (!atomic_load(&g_in_sync))
        sleep_ms(1);
    CHECK(exr_log_close(lg) == EXR_OK); /* waits for the fsync before it closes the file */
    pthread_join(t, NULL);
    CHECK(j.st == EXR_OK);
    CHECK(!atomic_load(&g_closed_under));
done:
    atomic_store(&g_slow_syncs, 0);
    exr_log_free(lg);
    unlink(path);
    check_report(before, "log", "close_during_fsync");
}

int main(void)
{
    test_close_during_fsync();
    return check_summary();
}
