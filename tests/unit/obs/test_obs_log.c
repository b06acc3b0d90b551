/* Log records (docs/observability.md, "Logging"): what a client chose to
 * put in a string never reaches the log raw, and a call site that a client
 * can trigger at will writes a bounded number of lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "obs/log.h"

/* Runs fn with stderr sent to a temporary file; returns what was written
 * (malloc'd). */
static char *capture(void (*fn)(void))
{
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long len = ftell(tmp);
    char *out = calloc(1, (size_t)len + 1);
    assert_non_null(out);
    rewind(tmp);
    assert_int_equal(fread(out, 1, (size_t)len, tmp), (size_t)len);
    fclose(tmp);
    return out;
}

static void write_hostile(void)
{
    /* A model name with a newline, an ANSI escape, a NUL-free invalid
     * UTF-8 byte, a truncated sequence, an overlong '/', and valid UTF-8. */
    LMC_WARN("model '%s'", "evil\n[2026] ERROR forged\x1b[31m\xff\xfe" "caf\xc3\xa9 \xe2\x82 \xc0\xaf");
}

static void test_records_are_escaped(void **state)
{
    (void)state;
    lmc_log_set_level(LMC_LOG_INFO);
    char *out = capture(write_hostile);
    assert_non_null(strstr(out, "model 'evil\\x0a[2026] ERROR forged\\x1b[31m\\xff\\xfe"
                                "caf\xc3\xa9 \\xe2\\x82 \\xc0\\xaf'\n"));
    /* One record, one line. */
    assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out));
    free(out);
}

static void flood(void)
{
    for (int i = 0; i < 1000; i++)
        LMC_WARN_LIMITED("bad request %d", i);
}

static void test_a_flood_writes_a_burst(void **state)
{
    (void)state;
    lmc_log_set_level(LMC_LOG_INFO);
    char *out = capture(flood);
    int lines = 0;
    for (char *p = out; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, LMC_LOG_LIMIT_BURST);
    char last[32], first_dropped[32];
    snprintf(last, sizeof last, "bad request %u\n", LMC_LOG_LIMIT_BURST - 1);
    snprintf(first_dropped, sizeof first_dropped, "bad request %u\n", LMC_LOG_LIMIT_BURST);
    assert_non_null(strstr(out, "bad request 0\n"));
    assert_non_null(strstr(out, last));
    assert_null(strstr(out, first_dropped));
    free(out);
}

static void test_the_next_window_reports_what_was_suppressed(void **state)
{
    (void)state;
    lmc_log_limit l = {0};
    unsigned long long dropped;
    for (unsigned i = 0; i < LMC_LOG_LIMIT_BURST; i++)
        assert_true(lmc_log_limit_pass(&l, &dropped));
    for (int i = 0; i < 7; i++)
        assert_false(lmc_log_limit_pass(&l, &dropped));
    l.window_ms -= LMC_LOG_LIMIT_WINDOW_MS;   /* the window is over */
    assert_true(lmc_log_limit_pass(&l, &dropped));
    assert_int_equal(dropped, 7);
    assert_true(lmc_log_limit_pass(&l, &dropped));
    assert_int_equal(dropped, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_are_escaped),
        cmocka_unit_test(test_a_flood_writes_a_burst),
        cmocka_unit_test(test_the_next_window_reports_what_was_suppressed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
