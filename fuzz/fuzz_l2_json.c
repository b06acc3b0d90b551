/* Fuzz target: the --l2-adapter JSON check (src/config/config_l2.c) on
 * arbitrary text.  The check must answer every object with 0 or an error
 * message, never crash, and be deterministic.  Also: the allocation-free
 * JSON syntax check of src/config/config_json_load.c must agree with
 * jansson on what loads, or a typo would be reported as "out of memory". */
#include "check.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/config_l2.h"

static void syntax_check_agrees(const uint8_t *data, size_t len)
{
    char *text = malloc(len + 1);
    if (!text)
        return;
    memcpy(text, data, len);
    text[len] = '\0';
    const size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES;
    json_error_t jerr;
    json_t *v = json_loads(text, flags, &jerr);
    enum json_error_code code = json_error_code(&jerr);
    /* Duplicates and number ranges are beyond a syntax check. */
    if (v)
        CHECK(lmc_cfg_json_syntax_ok(text, flags));
    else if (code != json_error_duplicate_key && code != json_error_numeric_overflow)
        CHECK(!lmc_cfg_json_syntax_ok(text, flags));
    json_decref(v);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    syntax_check_agrees(data, len);
    json_error_t jerr;
    json_t *o = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return 0;
    char err1[512] = "", err2[512] = "";
    for (int strict = 0; strict < 2; strict++) {
        int a = lmc_config_l2_adapter_check(o, strict, err1, sizeof err1);
        int b = lmc_config_l2_adapter_check(o, strict, err2, sizeof err2);
        CHECK(a == b && strcmp(err1, err2) == 0);
        CHECK(a == 0 || (a < 0 && err1[0] != '\0'));
    }
    json_decref(o);
    return 0;
}
