/* Fuzz target: the ObjectKey text forms (src/storage/object_key.c).  Only
 * what the printers produce is accepted, so every accepted text must print
 * back byte for byte, in both the canonical and the filename form. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/object_key.h"

static lmc_key_interner *interner;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (!interner)
        interner = lmc_key_interner_new();
    char *text = malloc(len + 1);
    if (!text)
        return 0;
    memcpy(text, data, len);
    text[len] = '\0';
    lmc_object_key k;
    /* text_cap is the buffer both printers need: print into exactly that. */
    if (strlen(text) == len && lmc_object_key_parse_string(interner, text, &k) == 0) {
        size_t cap = lmc_object_key_text_cap(&k);
        char *out = malloc(cap);
        CHECK(out != NULL);
        CHECK(lmc_object_key_to_string(&k, out, cap) == (int)len);
        CHECK(memcmp(out, text, len) == 0);
        free(out);
    }
    if (strlen(text) == len && lmc_object_key_parse_filename(interner, text, &k) == 0 &&
        !strstr(k.model_name, "-SEP-")) {
        size_t cap = lmc_object_key_text_cap(&k);
        char *out = malloc(cap);
        CHECK(out != NULL);
        CHECK(lmc_object_key_to_filename(&k, out, cap) == (int)len);
        CHECK(memcmp(out, text, len) == 0);
        free(out);
    }
    free(text);
    return 0;
}
