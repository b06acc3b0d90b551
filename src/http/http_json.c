#include "http/http_json.h"

#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- UTF-8 -------------------------------------------------------------- */

/* Bytes of the valid UTF-8 sequence at s (n bytes left), or 0.  Overlong
 * forms, surrogates and code points above U+10FFFF are invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char b = s[0];
    size_t len;
    uint32_t cp, min;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        len = 2, cp = b & 0x1f, min = 0x80;
    else if (b >= 0xe0 && b <= 0xef)
        len = 3, cp = b & 0x0f, min = 0x800;
    else if (b >= 0xf0 && b <= 0xf4)
        len = 4, cp = b & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

size_t lmc_http_utf8_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, len;
    while (i < n && (len = utf8_sequence(u + i, n - i)) != 0)
        i += len;
    return i;
}

void lmc_http_utf8_scrub(char *s)
{
    unsigned char *u = (unsigned char *)s;
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t len = utf8_sequence(u + i, n - i);
        if (len == 0)
            u[i++] = '?';
        else
            i += len;
    }
}

/* ---- error shapes ------------------------------------------------------ */

json_t *lmc_http_detail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lmc_http_utf8_scrub(msg);
    return json_pack("{s:s}", "detail", msg);
}

json_t *lmc_http_error(const char *message)
{
    char *msg = strdup(message);
    if (!msg)
        return NULL;
    lmc_http_utf8_scrub(msg);
    json_t *body = json_pack("{s:s}", "error", msg);
    free(msg);
    return body;
}

json_t *lmc_http_validation_error(const char *type, json_t *loc, const char *msg, json_t *input)
{
    if (!input)
        input = json_object();
    return json_pack("{s:[{s:s, s:o, s:s, s:o}]}", "detail", "type", type, "loc", loc, "msg",
                     msg, "input", input);
}

/* ---- memory pressure (docs/http.md, "Memory pressure") ---------------- */

typedef struct {
    const char *tier;
    json_t *adapter_id;       /* stolen */
    const json_t *backend_type, *used, *capacity, *watermark, *policy, *healthy;
    bool ignore_watermark;    /* IsolatedLRU: reported, not classified */
} tier_source;

static const int LEVEL_RANK_UNKNOWN = -1;

static int level_rank(const char *level)
{
    if (strcmp(level, "critical") == 0)
        return 2;
    if (strcmp(level, "high") == 0)
        return 1;
    if (strcmp(level, "normal") == 0)
        return 0;
    return LEVEL_RANK_UNKNOWN;
}

const char *lmc_http_pressure_level(bool has_ratio, double ratio, bool has_watermark,
                                    double watermark)
{
    if (!has_ratio)
        return "unknown";
    if (ratio >= 1.0)
        return "critical";
    if (has_watermark && ratio >= watermark)
        return "high";
    return "normal";
}

/* A byte count: a non-negative JSON integer (or integral real), else null. */
static json_t *bytes_or_null(const json_t *v)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        return json_integer(json_integer_value(v));
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) < 9.2e18)
        return json_integer((json_int_t)json_real_value(v));
    return json_null();
}

static json_t *copy_or_null(const json_t *v, bool (*ok)(const json_t *))
{
    return v && ok(v) ? json_deep_copy(v) : json_null();
}

static bool is_number(const json_t *v) { return json_is_number(v); }
static bool is_string(const json_t *v) { return json_is_string(v); }

static const char *health_of(const json_t *healthy)
{
    return json_is_true(healthy) ? "ok" : json_is_false(healthy) ? "unhealthy" : "unknown";
}

static json_t *tier_entry(const tier_source *t)
{
    json_t *used = bytes_or_null(t->used), *cap = bytes_or_null(t->capacity);
    json_t *errors = json_array();
    bool has_ratio = json_is_integer(used) && json_is_integer(cap) && json_integer_value(cap) > 0;
    double ratio = has_ratio ? (double)json_integer_value(used) / (double)json_integer_value(cap)
                             : 0.0;
    bool has_wm = json_is_number(t->watermark) && !t->ignore_watermark;
    const char *level = lmc_http_pressure_level(has_ratio, ratio, has_wm,
                                                has_wm ? json_number_value(t->watermark) : 0);
    if (!has_ratio)
        json_array_append_new(errors, json_string("usage or capacity not reported"));
    return json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s, s:s, s:o}", "tier", t->tier,
                     "adapter_id", t->adapter_id, "backend_type",
                     copy_or_null(t->backend_type, is_string), "used_bytes", used,
                     "capacity_bytes", cap, "used_ratio",
                     has_ratio ? json_real(ratio) : json_null(), "trigger_watermark",
                     copy_or_null(t->watermark, is_number), "eviction_policy",
                     copy_or_null(t->policy, is_string), "health", health_of(t->healthy),
                     "level", level, "collection_errors", errors);
}

static const json_t *first_of(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);
    return v ? v : json_object_get(obj, b);
}

static json_t *l1_tier(const json_t *sm)
{
    const json_t *l1 = json_object_get(sm, "l1_manager");
    const json_t *ev = json_object_get(sm, "l1_eviction_controller");
    tier_source t = {
        .tier = "l1",
        .adapter_id = json_null(),
        .used = first_of(l1, "used", "memory_used_bytes"),
        .capacity = first_of(l1, "capacity", "memory_total_bytes"),
        .watermark = json_object_get(ev, "trigger_watermark"),
        .policy = json_object_get(ev, "eviction_policy"),
        .healthy = json_object_get(l1, "is_healthy"),
    };
    json_t *entry = tier_entry(&t);
    const json_t *by = json_object_get(l1, "capacity_bytes_by_backend");
    void *it = json_object_iter((json_t *)by);
    if (it && entry)
        json_object_set_new(entry, "backend_type", json_string(json_object_iter_key(it)));
    return entry;
}

static json_t *l2_tier(const json_t *adapter, size_t index)
{
    const json_t *policy = json_object_get(adapter, "eviction_policy");
    const char *p = json_string_value(policy);
    tier_source t = {
        .tier = "l2",
        .adapter_id = json_integer((json_int_t)index),
        .backend_type = first_of(adapter, "type_name", "type"),
        .used = json_object_get(adapter, "used_bytes"),
        .capacity = json_object_get(adapter, "capacity_bytes"),
        .watermark = json_object_get(adapter, "trigger_watermark"),
        .policy = policy,
        .healthy = json_object_get(adapter, "is_healthy"),
        .ignore_watermark = p && strcmp(p, "IsolatedLRU") == 0,
    };
    return tier_entry(&t);
}

json_t *lmc_http_memory_pressure(const json_t *status, int64_t now_ms)
{
    const json_t *sm = json_object_get(status, "storage_manager");
    json_t *tiers = json_array();
    json_array_append_new(tiers, l1_tier(sm));
    const json_t *l2 = json_object_get(sm, "l2_adapters");
    for (size_t i = 0; i < json_array_size(l2); i++)
        json_array_append_new(tiers, l2_tier(json_array_get(l2, i), i));
    int worst = LEVEL_RANK_UNKNOWN;
    bool complete = true;
    size_t i;
    json_t *t;
    json_array_foreach(tiers, i, t) {
        int rank = level_rank(json_string_value(json_object_get(t, "level")));
        complete = complete && rank != LEVEL_RANK_UNKNOWN;
        worst = rank > worst ? rank : worst;
    }
    static const char *const names[] = {"normal", "high", "critical"};
    const char *id = json_string_value(json_object_get(status, "instance_id"));
    return json_pack("{s:s, s:I, s:s, s:b, s:o}", "instance_id", id ? id : "", "timestamp_ms",
                     (json_int_t)now_ms, "overall_level",
                     worst == LEVEL_RANK_UNKNOWN ? "unknown" : names[worst], "complete", complete,
                     "tiers", tiers);
}

/* ---- /config ----------------------------------------------------------- */

json_t *lmc_http_config_view(const json_t *grouped)
{
    static const char *const renames[][2] = {
        {"mp_config", "mp"},
        {"storage_manager_config", "storage_manager"},
        {"obs_config", "observability"},
        {"http_config", "http"},
        {"coordinator_config", "coordinator"},
        {"p2p_config", "p2p"},
        {"runtime_plugin_config", "runtime_plugin"},
    };
    json_t *view = json_object();
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)grouped, key, value) {
        const char *name = key;
        for (size_t i = 0; i < sizeof renames / sizeof renames[0]; i++) {
            if (strcmp(key, renames[i][0]) == 0)
                name = renames[i][1];
        }
        json_object_set(view, name, value);
    }
    return view;
}

/* ---- POST /cache/clear body ------------------------------------------ */

static bool blank(const char *body, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (!isspace((unsigned char)body[i]))
            return false;
    }
    return true;
}

static unsigned invalid_json(const json_error_t *jerr, json_t **error_body)
{
    json_t *loc = json_pack("[s,i]", "body", jerr->position);
    *error_body = lmc_http_validation_error("json_invalid", loc, "JSON decode error", NULL);
    json_t *item = json_array_get(json_object_get(*error_body, "detail"), 0);
    json_object_set_new(item, "ctx", json_pack("{s:s}", "error", jerr->text));
    return 422;
}

static unsigned wrong_type(const char *field, const char *type, const char *msg,
                           const json_t *input, json_t **error_body)
{
    json_t *loc = field ? json_pack("[s,s]", "body", field) : json_pack("[s]", "body");
    *error_body = lmc_http_validation_error(type, loc, msg, json_deep_copy(input));
    return 422;
}

static unsigned check_clear_fields(const json_t *doc, bool *force, json_t **error_body)
{
    const json_t *tier = json_object_get(doc, "tier");
    const json_t *f = json_object_get(doc, "force");
    if (tier && !json_is_string(tier))
        return wrong_type("tier", "string_type", "Input should be a valid string", tier,
                          error_body);
    if (f && !json_is_boolean(f))
        return wrong_type("force", "bool_type", "Input should be a valid boolean", f,
                          error_body);
    if (tier && strcmp(json_string_value(tier), "l1") != 0) {
        *error_body = lmc_http_detail("tier '%s' not supported; only 'l1'",
                                      json_string_value(tier));
        return 400;
    }
    *force = f ? json_is_true(f) : true;
    return 0;
}

unsigned lmc_http_parse_clear_body(const char *body, size_t len, bool *force,
                                   json_t **error_body)
{
    *force = true;
    *error_body = NULL;
    if (!body || blank(body, len))
        return 0;
    json_error_t jerr;
    json_t *doc = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (!doc)
        return invalid_json(&jerr, error_body);
    unsigned rc = json_is_object(doc)
                      ? check_clear_fields(doc, force, error_body)
                      : wrong_type(NULL, "model_attributes_type",
                                   "Input should be a valid dictionary or object to extract "
                                   "fields from",
                                   doc, error_body);
    json_decref(doc);
    return rc;
}

/* ---- GET /threads ------------------------------------------------------ */

static bool read_small_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0;
}

/* utime + stime of one thread, in seconds (proc(5) fields 14 and 15). */
static double thread_cpu_seconds(long long tid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%lld/stat", tid);
    if (!read_small_file(path, buf, sizeof buf))
        return 0;
    char *p = strrchr(buf, ')');
    unsigned long long ticks[2] = {0, 0};
    for (int field = 3; p && field <= 15; field++) {
        p = strchr(p + 1, ' ');
        if (p && field >= 14)
            ticks[field - 14] = strtoull(p + 1, NULL, 10);
    }
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ticks[0] + ticks[1]) / (double)hz : 0;
}

static bool name_matches(const char *name, const char *filter)
{
    if (!filter)
        return true;
    size_t n = strlen(name), m = strlen(filter);
    for (size_t i = 0; i + m <= n; i++) {
        if (strncasecmp(name + i, filter, m) == 0)
            return true;
    }
    return false;
}

static json_t *thread_entry(long long tid, const char *name, double cpu)
{
    return json_pack("{s:I, s:s, s:s, s:s, s:f, s:i}", "thread_id", (json_int_t)tid, "name",
                     name, "state", "running", "function_name", "<native>", "cpu_time", cpu,
                     "memory_usage", 0);
}

static int by_thread_id(const void *a, const void *b)
{
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "thread_id"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "thread_id"));
    return (x > y) - (x < y);
}

static json_t *sorted(json_t *list)
{
    size_t n = json_array_size(list);
    json_t **items = calloc(n ? n : 1, sizeof *items);
    json_t *out = json_array();
    for (size_t i = 0; items && i < n; i++)
        items[i] = json_array_get(list, i);
    if (items)
        qsort(items, n, sizeof *items, by_thread_id);
    for (size_t i = 0; items && i < n; i++)
        json_array_append(out, items[i]);
    free(items);
    json_decref(list);
    return out;
}

json_t *lmc_http_threads(const char *name_filter, bool has_tid, long long tid)
{
    json_t *list = json_array();
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        long long id = strtoll(e->d_name, NULL, 10);
        char path[64], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%lld/comm", id);
        if (read_small_file(path, name, sizeof name))
            name[strcspn(name, "\n")] = '\0';
        if ((has_tid && id != tid) || !name_matches(name, name_filter))
            continue;
        json_array_append_new(list, thread_entry(id, name, thread_cpu_seconds(id)));
    }
    if (d)
        closedir(d);
    if (json_array_size(list) == 0)
        json_array_append_new(list, thread_entry((long long)getpid(), "MainThread", 0));
    return sorted(list);
}
