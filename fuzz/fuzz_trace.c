/* Fuzz target: the storage trace's frame decoders (src/storage/
 * storage_trace_reader.c, docs/trace.md "Reading a trace"): the input is
 * one frame body, given to both the header and the record decoder.  What
 * either accepts keeps the bounds the reader promises; a refusal has a
 * reason. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "storage/storage_trace_reader.h"

static lmc_key_interner *interner;
static lmc_trace_scratch *scratch;

static void check_record(const lmc_trace_record *rec, const uint8_t *data, size_t len)
{
    CHECK(rec->frame == data && rec->frame_len == len);
    CHECK(rec->op <= LMC_STORAGE_TRACE_UNKNOWN && rec->qualname != NULL);
    CHECK(rec->n_keys <= LMC_TRACE_KEYS_MAX);
    CHECK(rec->op == LMC_STORAGE_TRACE_RESERVE_WRITE || rec->object_size == 0);
    CHECK(rec->op != LMC_STORAGE_TRACE_UNKNOWN || rec->n_keys == 0);
    for (size_t i = 0; i < rec->n_keys; i++) {
        const lmc_object_key *k = &rec->keys[i];
        CHECK(k->chunk_hash_len >= 1 && k->chunk_hash_len <= LMC_CHUNK_HASH_MAX);
        CHECK(lmc_model_name_valid(k->model_name, strlen(k->model_name)));
        CHECK(lmc_cache_salt_valid(k->cache_salt, strlen(k->cache_salt)));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (!interner) {
        interner = lmc_key_interner_new();
        scratch = lmc_trace_scratch_new(interner);
        CHECK(scratch != NULL);
    }
    char err[256] = "";
    lmc_trace_header h;
    if (lmc_trace_decode_header(data, len, &h, err, sizeof err) == 0) {
        CHECK(h.format_version == 1 && (h.schema_version == 1 || h.schema_version == 2));
        CHECK(memchr(h.level, 0, sizeof h.level) && strlen(h.sm_config_digest) <= 64);
        CHECK(h.sm_config_json != NULL);
        lmc_trace_header_clear(&h);
    } else {
        CHECK(err[0] != '\0' && h.sm_config_json == NULL);
    }
    lmc_trace_record rec = {.offset = 7};
    err[0] = '\0';
    if (lmc_trace_decode_record(scratch, data, len, &rec, err, sizeof err) == 0)
        check_record(&rec, data, len);
    else
        CHECK(err[0] != '\0');
    CHECK(rec.offset == 7);
    return 0;
}
