/* Configuration from LMCACHE_MP_COORDINATOR_* and an optional JSON file
 * (docs/coordinator.md, "Configuration").  Unlike upstream, which logs a
 * value that does not parse or is out of range and goes on with the
 * default, every such value is refused at start with the variable's (or
 * the file's key's) name: a coordinator running on a port or a ratio nobody
 * asked for is worse than one that does not start.  A setting this build
 * does not implement is refused too, rather than accepted and ignored.
 * One table of settings serves the environment, the file and
 * --print-config, so that the three cannot drift apart. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coordinator/coord_blend.h"
#include "coordinator/coordinator.h"
#include "hash/token_hash.h"

#define PREFIX "LMCACHE_MP_COORDINATOR_"

extern char **environ;

void coordinator_config_defaults(coordinator_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "0.0.0.0");
    c->port = 9300;
    c->instance_timeout_s = 30;
    c->health_check_interval_s = 10;
    c->eviction_check_interval_s = 5;
    c->eviction_ratio = 0.2;
    c->trigger_watermark = 1.0;
    c->chunk_size = 256;
    snprintf(c->hash_algorithm, sizeof c->hash_algorithm, "blake3");
    c->enable_startup_resync = true;
    c->resync_poll_interval_s = 1;
    c->resync_max_wait_s = 60;
    c->resync_page_size = 1000;
    c->timeout_keep_alive_s = 10;
    c->metrics_enabled = true;
    c->max_keys = LMC_COORD_DEFAULT_MAX_KEYS;
    c->max_buffered_mb = LMC_COORD_DEFAULT_MAX_BUFFERED_MB;
    c->blend_probe_stride = 1;
    c->max_blend_chunks = COORD_BLEND_DEFAULT_MAX_CHUNKS;
}

typedef enum { POSITIVE, NONNEG, FRACTION, WATERMARK } range;
typedef enum { K_STR, K_INT, K_U32, K_NUM, K_BOOL } kind;

/* One setting: the variable after PREFIX (its file key is the same in
 * lower case), where it goes, its bounds and any check of its own. */
typedef struct {
    const char *name;
    kind k;
    size_t off, cap; /* cap: K_STR's buffer */
    long lo, hi;     /* K_INT, K_U32 */
    range r;         /* K_NUM */
    int (*check)(const coordinator_config *c, const char *label, const char *value, char *err,
                 size_t errlen);
    bool secret;     /* --print-config shows "***" */
} setting;

static int refuse_otlp(const coordinator_config *c, const char *label, const char *v, char *err,
                       size_t errlen);
static int check_hash(const coordinator_config *c, const char *label, const char *v, char *err,
                      size_t errlen);
static int check_not_empty(const coordinator_config *c, const char *label, const char *v,
                           char *err, size_t errlen);

#define STR(n, f, chk, sec) {n, K_STR, offsetof(coordinator_config, f), \
                             sizeof ((coordinator_config *)0)->f, 0, 0, 0, chk, sec}
#define INT(n, f, lo, hi) {n, K_INT, offsetof(coordinator_config, f), 0, lo, hi, 0, NULL, false}
#define U32(n, f, lo, hi) {n, K_U32, offsetof(coordinator_config, f), 0, lo, hi, 0, NULL, false}
#define NUM(n, f, r) {n, K_NUM, offsetof(coordinator_config, f), 0, 0, 0, r, NULL, false}
#define BOOL(n, f, chk) {n, K_BOOL, offsetof(coordinator_config, f), 0, 0, 0, 0, chk, false}

static const setting SETTINGS[] = {
    STR("HOST", host, NULL, false),
    INT("PORT", port, 0, 65535),
    NUM("INSTANCE_TIMEOUT", instance_timeout_s, POSITIVE),
    NUM("HEALTH_CHECK_INTERVAL", health_check_interval_s, NONNEG),
    NUM("EVICTION_CHECK_INTERVAL", eviction_check_interval_s, NONNEG),
    NUM("EVICTION_RATIO", eviction_ratio, FRACTION),
    NUM("TRIGGER_WATERMARK", trigger_watermark, WATERMARK),
    U32("CHUNK_SIZE", chunk_size, 1, 1 << 20),
    STR("HASH_ALGORITHM", hash_algorithm, check_hash, false),
    BOOL("ENABLE_STARTUP_RESYNC", enable_startup_resync, NULL),
    NUM("RESYNC_POLL_INTERVAL", resync_poll_interval_s, POSITIVE),
    NUM("RESYNC_MAX_WAIT", resync_max_wait_s, NONNEG),
    U32("RESYNC_PAGE_SIZE", resync_page_size, 1, 5000),
    NUM("TIMEOUT_KEEP_ALIVE", timeout_keep_alive_s, POSITIVE),
    BOOL("METRICS_ENABLED", metrics_enabled, NULL),
    STR("OTLP_ENDPOINT", otlp_endpoint, refuse_otlp, false),
    BOOL("ENABLE_BLEND_LOOKUP", enable_blend_lookup, NULL),
    U32("BLEND_PROBE_STRIDE", blend_probe_stride, 1, 1 << 20),
    U32("MAX_BLEND_CHUNKS", max_blend_chunks, 1, COORD_BLEND_MAX_MAX_CHUNKS),
    STR("DB_PATH", db_path, check_not_empty, false),
    STR("AUTH_TOKEN", auth_token, NULL, true),
    STR("SERVER_AUTH_TOKEN", server_auth_token, NULL, true),
    U32("MAX_KEYS", max_keys, 1, LMC_COORD_MAX_MAX_KEYS),
    U32("MAX_BUFFERED_MB", max_buffered_mb, 1, 1L << 20),
};
#define N_SETTINGS (sizeof SETTINGS / sizeof *SETTINGS)

/* A value is echoed in a refusal up to this many bytes: enough to see the
 * typo, never a screenful. */
#define SHOWN 64

static bool in_range(double v, range r)
{
    switch (r) {
    case POSITIVE: return v > 0;
    case NONNEG: return v >= 0;
    case FRACTION: return v >= 0 && v <= 1;
    case WATERMARK: return v > 0 && v <= 1;
    }
    return false;
}

static int set_number(const setting *s, const char *label, const char *v, void *at, char *err,
                      size_t errlen)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x) || !in_range(x, s->r)) {
        static const char *const want[] = {"a number > 0", "a number >= 0",
                                           "a number in 0..1", "a number in (0, 1]"};
        return snprintf(err, errlen, "%s=%.*s is not %s", label, SHOWN, v, want[s->r]), -1;
    }
    *(double *)at = x;
    return 0;
}

static int set_integer(const setting *s, const char *label, const char *v, void *at, char *err,
                       size_t errlen)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < s->lo || x > s->hi)
        return snprintf(err, errlen, "%s=%.*s is not an integer in %ld..%ld", label, SHOWN, v,
                        s->lo, s->hi), -1;
    if (s->k == K_INT)
        *(int *)at = (int)x;
    else
        *(uint32_t *)at = (uint32_t)x;
    return 0;
}

static int set_boolean(const char *label, const char *v, void *at, char *err, size_t errlen)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off", ""};
    for (size_t i = 0; i < 4; i++)
        if (strcasecmp(v, yes[i]) == 0)
            return *(bool *)at = true, 0;
    for (size_t i = 0; i < 5; i++)
        if (strcasecmp(v, no[i]) == 0)
            return *(bool *)at = false, 0;
    return snprintf(err, errlen, "%s=%.*s is not a boolean (1/true/yes/on or 0/false/no/off)",
                    label, SHOWN, v), -1;
}

/* Sets s from its text v; label names where v came from in a refusal. */
static int set_value(coordinator_config *c, const setting *s, const char *label, const char *v,
                     char *err, size_t errlen)
{
    void *at = (char *)c + s->off;
    int rc = 0;
    switch (s->k) {
    case K_STR:
        if (strlen(v) >= s->cap)
            return snprintf(err, errlen, "%s is longer than %zu bytes", label, s->cap - 1), -1;
        snprintf(at, s->cap, "%s", v);
        break;
    case K_INT:
    case K_U32: rc = set_integer(s, label, v, at, err, errlen); break;
    case K_NUM: rc = set_number(s, label, v, at, err, errlen); break;
    case K_BOOL: rc = set_boolean(label, v, at, err, errlen); break;
    }
    return rc == 0 && s->check ? s->check(c, label, v, err, errlen) : rc;
}

static int refuse_otlp(const coordinator_config *c, const char *label, const char *v, char *err,
                       size_t errlen)
{
    (void)c;
    if (!*v)
        return 0;
    return snprintf(err, errlen, "%s: OTLP export is not implemented; scrape GET /metrics "
                                 "instead (docs/coordinator.md)", label), -1;
}

/* The algorithm as the hasher takes it, checked here so that a typo is
 * refused with the other settings.  A fixed seed: PYTHONHASHSEED is read
 * (and an unset one warned about) once, when the coordinator starts. */
static int check_hash(const coordinator_config *c, const char *label, const char *v, char *err,
                      size_t errlen)
{
    (void)c;
    lmc_token_hasher *h = NULL;
    char why[256];
    if (lmc_token_hasher_new(v, 256, "0", &h, why, sizeof why) != 0)
        return snprintf(err, errlen, "%s=%.*s: %s", label, SHOWN, v, why), -1;
    lmc_token_hasher_free(h);
    return 0;
}

static int check_not_empty(const coordinator_config *c, const char *label, const char *v,
                           char *err, size_t errlen)
{
    (void)c;
    return *v ? 0 : (snprintf(err, errlen, "%s must not be empty", label), -1);
}

/* ---- the environment -------------------------------------------------------------- */

/* Any variable of the family that is not a setting is refused by name (a
 * typo would otherwise go unnoticed). */
static int unknown_variables(char *err, size_t errlen)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, PREFIX, strlen(PREFIX)) != 0)
            continue;
        const char *name = *e + strlen(PREFIX);
        size_t len = strcspn(name, "=");
        bool known = false;
        for (size_t i = 0; i < N_SETTINGS && !known; i++)
            known = strlen(SETTINGS[i].name) == len && strncmp(SETTINGS[i].name, name, len) == 0;
        if (!known)
            return snprintf(err, errlen, PREFIX "%.*s: not a setting of lmcached-coordinator "
                                         "(docs/coordinator.md lists them)", (int)len, name), -1;
    }
    return 0;
}

static int from_env(coordinator_config *c, bool *db_path_set, char *err, size_t errlen)
{
    if (unknown_variables(err, errlen) != 0)
        return -1;
    for (size_t i = 0; i < N_SETTINGS; i++) {
        char label[64];
        snprintf(label, sizeof label, PREFIX "%s", SETTINGS[i].name);
        const char *v = getenv(label);
        if (!v)
            continue;
        if (set_value(c, &SETTINGS[i], label, v, err, errlen) != 0)
            return -1;
        if (SETTINGS[i].off == offsetof(coordinator_config, db_path)) {
            *db_path_set = true;
            snprintf(c->db_path_origin, sizeof c->db_path_origin, "%s", label);
        }
    }
    return 0;
}

/* ---- the file ------------------------------------------------------------------- */

static const setting *by_key(const char *key)
{
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strcasecmp(SETTINGS[i].name, key) == 0) {
            for (const char *p = key; *p; p++)
                if (isupper((unsigned char)*p))
                    return NULL; /* the keys are lower case */
            return &SETTINGS[i];
        }
    return NULL;
}

/* The text of a file value of s's type, into buf; NULL when the type is
 * wrong. */
static const char *file_text(const setting *s, const json_t *v, char *buf, size_t cap)
{
    switch (s->k) {
    case K_STR:
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return NULL;
        return json_string_value(v);
    case K_INT:
    case K_U32:
        if (!json_is_integer(v))
            return NULL;
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        return buf;
    case K_NUM:
        if (!json_is_number(v))
            return NULL;
        snprintf(buf, cap, "%.17g", json_number_value(v));
        return buf;
    case K_BOOL:
        return json_is_boolean(v) ? (json_is_true(v) ? "true" : "false") : NULL;
    }
    return NULL;
}

static int from_file(coordinator_config *c, const char *path, bool *db_path_set, char *err,
                     size_t errlen)
{
    static const char *const type_of[] = {"a string", "an integer", "an integer", "a number",
                                          "a boolean"};
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!doc)
        return snprintf(err, errlen, "--config %s: %s (line %d, column %d)", path, je.text,
                        je.line, je.column), -1;
    int rc = json_is_object(doc) ? 0 : -1;
    if (rc != 0)
        snprintf(err, errlen, "--config %s: must be a JSON object of settings", path);
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v) {
        const setting *s = by_key(key);
        char label[4200], buf[64];
        snprintf(label, sizeof label, "%s: %s", path, key);
        const char *text = s ? file_text(s, v, buf, sizeof buf) : NULL;
        if (!s)
            snprintf(err, errlen, "--config %s: unknown key \"%.*s\" (the keys are the "
                                  PREFIX "* settings' names in lower case, docs/coordinator.md)",
                     path, SHOWN, key);
        else if (!text)
            snprintf(err, errlen, "--config %s: \"%s\" must be %s", path, key, type_of[s->k]);
        if (!s || !text || set_value(c, s, label, text, err, errlen) != 0) {
            rc = -1;
            break;
        }
        if (s->off == offsetof(coordinator_config, db_path)) {
            *db_path_set = true;
            snprintf(c->db_path_origin, sizeof c->db_path_origin, "db_path in --config");
        }
    }
    json_decref(doc);
    return rc;
}

/* ---- the database's default place ------------------------------------------------- */

/* Where the database goes when nothing names it (docs/coordinator.md,
 * "Configuration"): systemd's StateDirectory=, else the XDG state
 * directory, never the working directory, where a stray file is found in
 * whatever checkout the command was run from. */
static int default_db_path(coordinator_config *c, char *err, size_t errlen)
{
    const char *state = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (state && *state) { /* systemd passes a ':'-separated list; the first is ours */
        n = snprintf(c->db_path, sizeof c->db_path, "%.*s/coordinator.db",
                     (int)strcspn(state, ":"), state);
        snprintf(c->db_path_origin, sizeof c->db_path_origin, "$STATE_DIRECTORY");
    } else if (xdg && xdg[0] == '/') { /* a relative one is to be ignored (XDG) */
        n = snprintf(c->db_path, sizeof c->db_path, "%s/lmcached/coordinator.db", xdg);
        snprintf(c->db_path_origin, sizeof c->db_path_origin, "$XDG_STATE_HOME");
        c->db_dir_create = true;
    } else if (home && *home) {
        n = snprintf(c->db_path, sizeof c->db_path, "%s/.local/state/lmcached/coordinator.db",
                     home);
        snprintf(c->db_path_origin, sizeof c->db_path_origin, "$HOME/.local/state");
        c->db_dir_create = true;
    } else {
        return snprintf(err, errlen, PREFIX "DB_PATH is not set, and neither STATE_DIRECTORY, "
                                     "XDG_STATE_HOME nor HOME says where the default database "
                                     "goes: set " PREFIX "DB_PATH"), -1;
    }
    if (n < 0 || (size_t)n >= sizeof c->db_path)
        return snprintf(err, errlen, PREFIX "DB_PATH is not set, and the default under %s is "
                                     "longer than %zu bytes: set " PREFIX "DB_PATH",
                        c->db_path_origin, sizeof c->db_path - 1), -1;
    return 0;
}

int coordinator_config_load(coordinator_config *c, const char *file, char *err, size_t errlen)
{
    coordinator_config_defaults(c);
    bool db_path_set = false;
    if (file && from_file(c, file, &db_path_set, err, errlen) != 0)
        return -1;
    if (from_env(c, &db_path_set, err, errlen) != 0)
        return -1;
    return db_path_set ? 0 : default_db_path(c, err, errlen);
}

int coordinator_config_from_env(coordinator_config *c, char *err, size_t errlen)
{
    return coordinator_config_load(c, NULL, err, errlen);
}

char *coordinator_config_print(const coordinator_config *c)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < N_SETTINGS; i++) {
        const setting *s = &SETTINGS[i];
        const void *at = (const char *)c + s->off;
        char key[64];
        size_t n = 0;
        for (; s->name[n] && n < sizeof key - 1; n++)
            key[n] = (char)tolower((unsigned char)s->name[n]);
        key[n] = '\0';
        json_t *v = NULL;
        switch (s->k) {
        case K_STR: /* a value that is not UTF-8 shows as null */
            v = json_string(s->secret && *(const char *)at ? "***" : at);
            v = v ? v : json_null();
            break;
        case K_INT: v = json_integer(*(const int *)at); break;
        case K_U32: v = json_integer(*(const uint32_t *)at); break;
        case K_NUM: v = json_real(*(const double *)at); break;
        case K_BOOL: v = json_boolean(*(const bool *)at); break;
        }
        if (json_object_set_new(o, key, v) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15);
    char *text = o ? json_dumps(o, flags) : NULL;
    json_decref(o);
    return text;
}
