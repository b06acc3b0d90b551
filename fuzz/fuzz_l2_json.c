/* Fuzz target: the --l2-adapter JSON check (src/config/config_l2.c) on
 * arbitrary text.  The check must answer every object with 0 or an error
 * message, never crash, and be deterministic. */
#include "check.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config/config_l2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    json_error_t jerr;
    json_t *o = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return 0;
    char err1[512] = "", err2[512] = "";
    for (int strict = 0; strict < 2; strict++) {
        int a = lmc_l2_adapter_json_check(o, strict, err1, sizeof err1);
        int b = lmc_l2_adapter_json_check(o, strict, err2, sizeof err2);
        CHECK(a == b && strcmp(err1, err2) == 0);
        CHECK(a == 0 || (a < 0 && err1[0] != '\0'));
    }
    json_decref(o);
    return 0;
}
