/*
 * check.h - the C tests' harness: CHECK counts a failed condition and leaves
 * the test (goto done; CHECK_RET: return), check_report prints "ok  NAME" or
 * "FAIL NAME" for a test, check_summary prints "N passed, M failed" and
 * gives the exit status.
 */
#ifndef EXR_TEST_CHECK_H
#define EXR_TEST_CHECK_H

#include <stdio.h>

static int g_failed_checks, g_runs, g_runs_failed;

#define CHECK_OR(cond, leave)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
            g_failed_checks++;                                                                     \
            leave;                                                                                 \
        }                                                                                          \
    } while (0)
#define CHECK(cond) CHECK_OR(cond, goto done)
#define CHECK_RET(cond) CHECK_OR(cond, return)

/* After a test that started when g_failed_checks was `before`. */
static inline void check_report(int before, const char *group, const char *name)
{
    int ok = g_failed_checks == before;
    g_runs++;
    g_runs_failed += !ok;
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", group ? group : "", group ? "/" : "", name);
}

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", g_runs - g_runs_failed, g_runs_failed);
    return g_runs_failed ? 1 : 0;
}

typedef struct {
    const char *name;
    void (*fn)(void);
} check_test;

static inline int check_run_all(const check_test *tests, int n)
{
    for (int i = 0; i < n; i++) {
        int before = g_failed_checks;
        tests[i].fn();
        check_report(before, NULL, tests[i].name);
    }
    return check_summary();
}

#endif
