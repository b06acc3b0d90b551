/* The EncodedObjectKey JSON codec: one parser and one renderer for the
 * HTTP frontend, the L2 listings, the fleet and the coordinator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "storage/object_key_json.h"

static lmc_object_key_json_error parse_text(const char *text, lmc_object_key_json_fields *f)
{
    json_t *o = json_loads(text, JSON_DECODE_ANY, NULL);
    assert_non_null(o);
    lmc_object_key_json_error e = lmc_object_key_json_parse(o, f);
    json_decref(o);
    return e;
}

static void renders_and_parses_back(void **state)
{
    (void)state;
    const uint8_t hash[] = {0x01, 0xab, 0xff};
    json_t *o = lmc_object_key_json_of_parts(hash, sizeof hash, "m", 0x10203, 2, "s");
    char *text = json_dumps(o, JSON_SORT_KEYS);
    assert_string_equal(text, "{\"cache_salt\": \"s\", \"chunk_hash_hex\": \"01abff\", "
                              "\"kv_rank\": 66051, \"model_name\": \"m\", "
                              "\"object_group_id\": 2}");
    lmc_object_key_json_fields f;
    assert_int_equal(lmc_object_key_json_parse(o, &f), LMC_OBJECT_KEY_JSON_OK);
    assert_int_equal(f.chunk_hash_len, 3);
    assert_memory_equal(f.chunk_hash, hash, 3);
    assert_string_equal(f.model_name, "m");
    assert_string_equal(f.cache_salt, "s");
    assert_int_equal(f.kv_rank, 0x10203);
    assert_int_equal(f.object_group_id, 2);
    free(text);
    json_decref(o);
}

static void defaults_and_refusals_in_order(void **state)
{
    (void)state;
    lmc_object_key_json_fields f;
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"00\",\"model_name\":\"m\",\"kv_rank\":1}", &f),
                     LMC_OBJECT_KEY_JSON_OK);
    assert_string_equal(f.cache_salt, "");
    assert_int_equal(f.object_group_id, 0);
    assert_int_equal(parse_text("[]", &f), LMC_OBJECT_KEY_JSON_NOT_OBJECT);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0\"}", &f), LMC_OBJECT_KEY_JSON_HASH_LENGTH);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0A\"}", &f), LMC_OBJECT_KEY_JSON_HASH_DIGIT);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0a\",\"model_name\":\"a@b\"}", &f),
                     LMC_OBJECT_KEY_JSON_MODEL);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0a\",\"model_name\":\"m\","
                                "\"cache_salt\":\"x/y\"}", &f), LMC_OBJECT_KEY_JSON_SALT);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0a\",\"model_name\":\"m\",\"kv_rank\":-1}",
                                &f), LMC_OBJECT_KEY_JSON_RANK_OR_GROUP);
    assert_int_equal(parse_text("{\"chunk_hash_hex\":\"0a\",\"model_name\":\"m\",\"kv_rank\":1,"
                                "\"object_group_id\":4294967296}", &f),
                     LMC_OBJECT_KEY_JSON_RANK_OR_GROUP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(renders_and_parses_back),
        cmocka_unit_test(defaults_and_refusals_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
