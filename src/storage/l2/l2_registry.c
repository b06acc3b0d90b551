/* Adapter registry (docs/l2.md, "Flags"): type name -> backend factory. */
#include <stdio.h>
#include <string.h>

#include "config/config_l2.h"
#include "obs/log.h"
#include "storage/l2/l2_adapter.h"
#include "storage/l2/adapters/l2_resp.h"
#include "storage/l2/adapters/l2_s3.h"

static uint64_t capacity_of(const json_t *o)
{
    double gb = json_number_value(json_object_get(o, "max_capacity_gb"));
    return gb > 0 ? (uint64_t)(gb * (double)(1ull << 30)) : 0;
}

static bool bool_or(const json_t *o, const char *name, bool def)
{
    json_t *v = json_object_get(o, name);
    return v ? json_is_true(v) : def;
}

static size_t workers_or(const json_t *o, size_t def)
{
    json_int_t n = json_integer_value(json_object_get(o, "num_workers"));
    return n > 0 ? (size_t)n : def;
}

/* `evicted`: the adapter (or one wrapping it) has an "eviction" object, so
 * the objects a backend finds at start are kept for the L2 eviction. */
static lmc_l2_backend *make(const json_t *o, bool evicted, size_t *num_workers, char *err,
                            size_t errlen);

static lmc_l2_backend *make_fs(const json_t *o, size_t *num_workers, char *err, size_t errlen)
{
    lmc_l2_fs_options fo = {
        .base_path = json_string_value(json_object_get(o, "base_path")),
        .relative_tmp_dir = json_string_value(json_object_get(o, "relative_tmp_dir")),
        .capacity_bytes = capacity_of(o),
        .read_ahead_size = (uint64_t)json_integer_value(json_object_get(o, "read_ahead_size")),
        .use_odirect = bool_or(o, "use_odirect", false),
        .recover_on_start = bool_or(o, "recover_on_start", true),
        .verify_checksum = bool_or(o, "verify_checksum", true),
        .hash_threads = workers_or(o, 4),   /* one per worker: none waits for another's */
    };
    *num_workers = workers_or(o, 4);
    return lmc_l2_fs_new(&fo, err, errlen);
}

static lmc_l2_backend *make_fault(const json_t *o, bool evicted, size_t *num_workers,
                                  char *err, size_t errlen)
{
    lmc_l2_backend *inner = make(json_object_get(o, "inner"), evicted, num_workers, err, errlen);
    if (!inner)
        return NULL;
    lmc_l2_fault_options fo = {
        .fail_rate = json_number_value(json_object_get(o, "fail_rate")),
        .delay_rate = json_number_value(json_object_get(o, "delay_rate")),
        .delay_ms = (uint32_t)json_integer_value(json_object_get(o, "delay_ms")),
        .seed = (uint64_t)json_integer_value(json_object_get(o, "seed")),
    };
    lmc_l2_backend *b = lmc_l2_fault_new(inner, &fo);
    if (!b)
        snprintf(err, errlen, "out of memory");
    return b;
}

static lmc_l2_backend *make_resp(const json_t *o, bool evicted, size_t *num_workers,
                                 char *err, size_t errlen)
{
    *num_workers = workers_or(o, 8);
    lmc_l2_resp_options ro = {
        .host = json_string_value(json_object_get(o, "host")),
        .port = (int)json_integer_value(json_object_get(o, "port")),
        .username = json_string_value(json_object_get(o, "username")),
        .password = json_string_value(json_object_get(o, "password")),
        .num_connections = *num_workers,
        .capacity_bytes = capacity_of(o),
        .timeout_ms = (int)json_integer_value(json_object_get(o, "timeout_ms")),
        .keep_found = evicted,
    };
    return lmc_l2_resp_new(&ro, err, errlen);
}

/* s3_endpoint is virtual-hosted, as upstream: [s3://]<bucket>.<host[:port]>;
 * lmcached addresses it path-style (<scheme>://<host>/<bucket>/<key>). */
static lmc_l2_backend *make_s3(const json_t *o, bool evicted, size_t *num_workers, char *err,
                               size_t errlen)
{
    const char *ep = json_string_value(json_object_get(o, "s3_endpoint"));
    if (strncmp(ep, "s3://", 5) == 0)
        ep += 5;
    const char *dot = strchr(ep, '.');
    if (!dot || dot == ep || !dot[1]) {
        snprintf(err, errlen, "s3: \"s3_endpoint\" must be <bucket>.<host>, got '%s'", ep);
        return NULL;
    }
    char bucket[256], endpoint[600];
    snprintf(bucket, sizeof bucket, "%.*s", (int)(dot - ep), ep);
    snprintf(endpoint, sizeof endpoint, "%s://%s",
             bool_or(o, "disable_tls", false) ? "http" : "https", dot + 1);
    json_int_t io = json_integer_value(json_object_get(o, "s3_num_io_threads"));
    *num_workers = workers_or(o, 4);
    lmc_l2_s3_options so = {
        .endpoint = endpoint,
        .bucket = bucket,
        .region = json_string_value(json_object_get(o, "s3_region")),
        .access_key = json_string_value(json_object_get(o, "aws_access_key_id")),
        .secret_key = json_string_value(json_object_get(o, "aws_secret_access_key")),
        .create_bucket = bool_or(o, "s3_create_bucket", false),
        .num_connections = io > 0 && (size_t)io < *num_workers ? (size_t)io : *num_workers,
        .capacity_bytes = capacity_of(o),
        .keep_found = evicted,
    };
    return lmc_l2_s3_new(&so, err, errlen);
}

static double seconds_or(const json_t *o, const char *k, double def)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : def;
}

static lmc_l2_backend *make_p2p(const json_t *o, size_t *num_workers, char *err, size_t errlen)
{
    const char *chan = json_string_value(json_object_get(o, "peer_transfer_channel_server_url"));
    if (!chan || !*chan) {
        snprintf(err, errlen, "p2p: peer_transfer_channel_server_url is required");
        return NULL;
    }
    *num_workers = workers_or(o, 2);
    lmc_l2_p2p_options po = {
        .peer_mq_server_url = json_string_value(json_object_get(o, "peer_mq_server_url")),
        .peer_transfer_channel_server_url = chan,
        .lookup_timeout_s = seconds_or(o, "lookup_timeout", 30.0),
        .load_timeout_s = seconds_or(o, "load_timeout", 30.0),
        .auth_token = json_string_value(json_object_get(o, "auth_token")),
    };
    const char *engine = json_string_value(json_object_get(o, "transfer_engine"));
    if (engine && strcmp(engine, "tcp") != 0 && strcmp(engine, "ucx") != 0) {
        snprintf(err, errlen, "p2p: transfer_engine must be tcp or ucx, got '%s'", engine);
        return NULL;
    }
    po.ucx = engine && strcmp(engine, "ucx") == 0;
    return lmc_l2_p2p_new(&po, err, errlen);
}

static lmc_l2_backend *make(const json_t *o, bool evicted, size_t *num_workers, char *err,
                            size_t errlen)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    lmc_l2_backend *b = NULL;
    evicted = evicted || json_object_get(o, "eviction");
    if (strcmp(type, "fs") == 0)
        return make_fs(o, num_workers, err, errlen);
    if (strcmp(type, "fault_inject") == 0)
        return make_fault(o, evicted, num_workers, err, errlen);
    if (strcmp(type, "resp") == 0)
        return make_resp(o, evicted, num_workers, err, errlen);
    if (strcmp(type, "s3") == 0)
        return make_s3(o, evicted, num_workers, err, errlen);
    if (strcmp(type, "p2p") == 0)
        return make_p2p(o, num_workers, err, errlen);
    if (strcmp(type, "mock") == 0) {
        *num_workers = workers_or(o, 2);
        b = lmc_l2_mock_new(capacity_of(o));
        if (!b)
            snprintf(err, errlen, "out of memory");
        return b;
    }
    snprintf(err, errlen, "unknown L2 adapter type '%s'", type);
    return NULL;
}

lmc_l2_backend *lmc_l2_backend_from_json(const json_t *o, size_t *num_workers, char *err,
                                         size_t errlen)
{
    if (lmc_config_l2_adapter_check(o, true, err, errlen) != 0)
        return NULL;
    return make(o, false, num_workers, err, errlen);
}
