/* Allocation failures in ObjectKey interning and text parsing
 * (src/storage/object_key.c): an interner growing past its first table,
 * and key strings and filenames parsed back into keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "storage/object_key.h"

#define N_STRINGS 100   /* the table starts at 64 slots, half full at most: two grows */

static int scenario_interner(void *arg)
{
    (void)arg;
    lmc_key_interner *in = lmc_key_interner_new();
    if (!in)
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("interner_new failed with memory left");
    const char *got[N_STRINGS];
    char s[32];
    int rc = LMC_FAULT_OK;
    size_t n = 0;
    for (; n < N_STRINGS; n++) {
        snprintf(s, sizeof s, "model-%zu", n);
        /* Every third string is asked for twice: the second answer is the
         * first pointer, and costs nothing. */
        if (!(got[n] = lmc_intern(in, s, strlen(s))))
            break;
        if (n % 3 == 0 && lmc_intern(in, s, strlen(s)) != got[n]) {
            rc = lmc_fault_violation("string %zu interned twice gave two pointers", n);
            break;
        }
        if (strcmp(got[n], s) != 0) {
            rc = lmc_fault_violation("interned copy of %s reads %s", s, got[n]);
            break;
        }
    }
    if (rc == LMC_FAULT_OK && n < N_STRINGS) {
        if (!lmc_fault_fired())
            rc = lmc_fault_violation("lmc_intern failed with memory left");
        else
            rc = LMC_FAULT_ERROR;
        /* A failed intern leaves every earlier string where it was. */
        for (size_t i = 0; i < n && rc == LMC_FAULT_ERROR; i++) {
            snprintf(s, sizeof s, "model-%zu", i);
            if (lmc_intern(in, s, strlen(s)) != got[i])
                rc = lmc_fault_violation("after a failed intern, string %zu moved or vanished", i);
        }
    }
    lmc_key_interner_free(in);
    return rc;
}

/* ---- parsing --------------------------------------------------------------- */

typedef struct {
    const char *text;
    bool filename;
} key_text;

static const key_text texts[] = {
#define HASH64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
    {"org/llama-3@0401000a@1@" HASH64 "@salt", false},
    {"org-SEP-llama-3@0x0401000a@1f@" HASH64 ".data", true},
    {"m@00000000@0@ab", false},
};
#define N_TEXTS (sizeof texts / sizeof texts[0])

static int scenario_parse(void *arg)
{
    (void)arg;
    lmc_key_interner *in = lmc_key_interner_new();
    if (!in)
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("interner_new failed with memory left");
    int rc = LMC_FAULT_OK;
    for (size_t i = 0; i < N_TEXTS && rc == LMC_FAULT_OK; i++) {
        lmc_object_key k, untouched;
        memset(&k, 0x5a, sizeof k);
        memcpy(&untouched, &k, sizeof k);
        int prc = texts[i].filename ? lmc_object_key_parse_filename(in, texts[i].text, &k)
                                    : lmc_object_key_parse_string(in, texts[i].text, &k);
        if (prc != 0) {
            if (!lmc_fault_fired())
                rc = lmc_fault_violation("text %zu did not parse with memory left", i);
            else if (memcmp(&k, &untouched, sizeof k) != 0)
                rc = lmc_fault_violation("a failed parse of text %zu wrote the key", i);
            else
                rc = LMC_FAULT_ERROR;
            break;
        }
        char buf[512];
        int n = texts[i].filename ? lmc_object_key_to_filename(&k, buf, sizeof buf)
                                  : lmc_object_key_to_string(&k, buf, sizeof buf);
        if (n < 0 || strcmp(buf, texts[i].text) != 0)
            rc = lmc_fault_violation("text %zu printed back as %s", i, n < 0 ? "(error)" : buf);
    }
    lmc_key_interner_free(in);
    return rc;
}

/* ---- cmocka ----------------------------------------------------------------- */

static void test_interner(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("object_key.interner", scenario_interner, NULL, NULL, 0), 0);
}

static void test_parse(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("object_key.parse", scenario_parse, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interner),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
