/* lmc_cfg_json_syntax_ok must agree with jansson on what loads: when it
 * wrongly calls bad JSON well-formed, lmc_cfg_json_load reports an
 * operator's typo as "out of memory" (docs/testing.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "config/config_internal.h"

static const char *const texts[] = {
    "{}", "[]", " { } ", "{\"a\":1}", "{\"a\": [1, 2.5, -3e+2, 0, -0.0, 1E5]}",
    "{\"a\":{\"b\":{\"c\":[true,false,null]}}}", "\"s\"", "0", "-1", "true", "null",
    "[\"\\u00e9\\ud83d\\ude00\\n\\t\\\\\\/\\\"\"]", "[\"caf\xc3\xa9 \xf0\x9f\x98\x80\"]",
    "\t\r\n[1]\n",
    /* and what must not load */
    "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{\"a\":}", "[01]", "[1.]",
    "[.5]", "[1e]", "[+1]", "[-]", "[tru]", "[truex]", "[nul]", "[True]", "'s'", "[\"a\nb\"]",
    "[\"\\x\"]", "[\"\\u12\"]", "[\"\\u0000\"]", "[\"\\ud800\"]", "[\"\\udc00\"]",
    "[\"\\ud800\\u0041\"]", "[\"\xc3\"]", "[\"\xc0\xaf\"]", "[\"\xed\xa0\x80\"]",
    "[\"\xf5\x80\x80\x80\"]", "[1] [2]", "[1] x", "{\"a\":1}}", "[[]", "\"unterminated",
    "[1 2]", "{\"a\":1 \"b\":2}", "[,1]", "{,}", "[\"a\":1]", "{\"a\",1}", "-", "--1",
};

static void check_agrees(const char *text, size_t flags)
{
    json_error_t jerr;
    json_t *v = json_loads(text, flags, &jerr);
    bool ok = lmc_cfg_json_syntax_ok(text, flags);
    if ((v != NULL) != ok)
        fail_msg("'%s' (flags %zx): jansson %s, syntax check %s", text, flags,
                 v ? "loads it" : jerr.text, ok ? "accepts it" : "rejects it");
    json_decref(v);
}

static void test_agrees_with_jansson(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        check_agrees(texts[i], JSON_DECODE_ANY);
        check_agrees(texts[i], 0); /* top level must then be an object or array */
    }
}

static void test_nesting_limit(void **state)
{
    (void)state;
    static char deep[2 * 2049 + 1];
    for (int depth = 2047; depth <= 2049; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = '\0';
        check_agrees(deep, 0);
    }
}

/* Bad JSON is reported as bad JSON, with jansson's reason. */
static void test_load_reports_bad_json(void **state)
{
    (void)state;
    char why[160];
    bool oom = true;
    assert_null(lmc_cfg_json_load("{\"a\":}", JSON_DECODE_ANY, &oom, why, sizeof why));
    assert_false(oom);
    assert_non_null(strstr(why, "unexpected token"));
    assert_null(lmc_cfg_json_load("{\"a\":1,\"a\":2}", JSON_REJECT_DUPLICATES, &oom, why,
                                  sizeof why));
    assert_false(oom);
    json_t *v = lmc_cfg_json_load("{\"a\":1}", 0, &oom, why, sizeof why);
    assert_non_null(v);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agrees_with_jansson),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_load_reports_bad_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
