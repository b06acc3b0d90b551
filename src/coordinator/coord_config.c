/* Configuration from LMCACHE_MP_COORDINATOR_* (docs/coordinator.md,
 * "Configuration").  Unlike upstream, which logs a value that does not
 * parse or is out of range and goes on with the default, every such value
 * is refused at start with the variable's name: a coordinator running on a
 * port or a ratio nobody asked for is worse than one that does not start.
 * A setting this build does not implement is refused too, rather than
 * accepted and ignored. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    snprintf(c->db_path, sizeof c->db_path, "./lmcached-coordinator.db");
}

typedef enum { POSITIVE, NONNEG, FRACTION, WATERMARK } range;

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

/* A value is echoed in a refusal up to this many bytes: enough to see the
 * typo, never a screenful. */
#define SHOWN 64

static int number(const char *name, double *out, range r, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x) || !in_range(x, r)) {
        static const char *const want[] = {"a number > 0", "a number >= 0",
                                           "a number in 0..1", "a number in (0, 1]"};
        return snprintf(err, errlen, "%s=%.*s is not %s", name, SHOWN, v, want[r]), -1;
    }
    *out = x;
    return 0;
}

static int integer(const char *name, long *out, long lo, long hi, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return snprintf(err, errlen, "%s=%.*s is not an integer in %ld..%ld", name, SHOWN, v, lo,
                        hi), -1;
    *out = x;
    return 0;
}

static int boolean(const char *name, bool *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v)
        return 0;
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off", ""};
    for (size_t i = 0; i < 4; i++)
        if (strcasecmp(v, yes[i]) == 0)
            return *out = true, 0;
    for (size_t i = 0; i < 5; i++)
        if (strcasecmp(v, no[i]) == 0)
            return *out = false, 0;
    return snprintf(err, errlen, "%s=%.*s is not a boolean (1/true/yes/on or 0/false/no/off)",
                    name, SHOWN, v), -1;
}

static int string(const char *name, char *out, size_t cap, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v)
        return 0;
    if (strlen(v) >= cap)
        return snprintf(err, errlen, "%s is longer than %zu bytes", name, cap - 1), -1;
    snprintf(out, cap, "%s", v);
    return 0;
}

static const char *const KNOWN[] = {
    "HOST", "PORT", "INSTANCE_TIMEOUT", "HEALTH_CHECK_INTERVAL", "EVICTION_CHECK_INTERVAL",
    "EVICTION_RATIO", "TRIGGER_WATERMARK", "CHUNK_SIZE", "HASH_ALGORITHM",
    "ENABLE_STARTUP_RESYNC", "RESYNC_POLL_INTERVAL", "RESYNC_MAX_WAIT", "RESYNC_PAGE_SIZE",
    "TIMEOUT_KEEP_ALIVE", "METRICS_ENABLED", "OTLP_ENDPOINT", "ENABLE_BLEND_LOOKUP",
    "DB_PATH", "AUTH_TOKEN", "SERVER_AUTH_TOKEN", "MAX_KEYS",
    "MAX_BUFFERED_MB",
};

/* What this build does not do is refused by name; so is any variable of
 * the family it does not know (a typo would otherwise go unnoticed). */
static int refusals(char *err, size_t errlen)
{
    bool blend = false;
    if (boolean(PREFIX "ENABLE_BLEND_LOOKUP", &blend, err, errlen) != 0)
        return -1;
    if (blend)
        return snprintf(err, errlen, PREFIX "ENABLE_BLEND_LOOKUP: the CacheBlend fragment "
                                     "index is not implemented (docs/coordinator.md)"), -1;
    const char *otlp = getenv(PREFIX "OTLP_ENDPOINT");
    if (otlp && *otlp)
        return snprintf(err, errlen, PREFIX "OTLP_ENDPOINT: OTLP export is not implemented; "
                                     "scrape GET /metrics instead (docs/coordinator.md)"), -1;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, PREFIX, strlen(PREFIX)) != 0)
            continue;
        const char *name = *e + strlen(PREFIX);
        size_t len = strcspn(name, "=");
        bool known = false;
        for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN && !known; i++)
            known = strlen(KNOWN[i]) == len && strncmp(KNOWN[i], name, len) == 0;
        if (!known)
            return snprintf(err, errlen, PREFIX "%.*s: not a setting of lmcached-coordinator "
                                         "(docs/coordinator.md lists them)", (int)len, name), -1;
    }
    return 0;
}

static int strings(coordinator_config *c, char *err, size_t errlen)
{
    if (string(PREFIX "HOST", c->host, sizeof c->host, err, errlen) ||
        string(PREFIX "HASH_ALGORITHM", c->hash_algorithm, sizeof c->hash_algorithm, err,
               errlen) ||
        string(PREFIX "DB_PATH", c->db_path, sizeof c->db_path, err, errlen) ||
        string(PREFIX "AUTH_TOKEN", c->auth_token, sizeof c->auth_token, err, errlen) ||
        string(PREFIX "SERVER_AUTH_TOKEN", c->server_auth_token, sizeof c->server_auth_token,
               err, errlen))
        return -1;
    if (!c->db_path[0])
        return snprintf(err, errlen, PREFIX "DB_PATH must not be empty"), -1;
    return 0;
}

static int integers(coordinator_config *c, char *err, size_t errlen)
{
    long port = c->port, chunk = c->chunk_size, page = c->resync_page_size;
    long max_keys = c->max_keys, buffered = c->max_buffered_mb;
    if (integer(PREFIX "PORT", &port, 0, 65535, err, errlen) ||
        integer(PREFIX "CHUNK_SIZE", &chunk, 1, 1 << 20, err, errlen) ||
        integer(PREFIX "RESYNC_PAGE_SIZE", &page, 1, 5000, err, errlen) ||
        integer(PREFIX "MAX_KEYS", &max_keys, 1, LMC_COORD_MAX_MAX_KEYS, err, errlen) ||
        integer(PREFIX "MAX_BUFFERED_MB", &buffered, 1, 1L << 20, err, errlen))
        return -1;
    c->max_buffered_mb = (uint32_t)buffered;
    c->port = (int)port;
    c->max_keys = (uint32_t)max_keys;
    c->chunk_size = (uint32_t)chunk;
    c->resync_page_size = (uint32_t)page;
    return 0;
}

static int numbers_and_booleans(coordinator_config *c, char *err, size_t errlen)
{
    return number(PREFIX "INSTANCE_TIMEOUT", &c->instance_timeout_s, POSITIVE, err, errlen) ||
           number(PREFIX "HEALTH_CHECK_INTERVAL", &c->health_check_interval_s, NONNEG, err,
                  errlen) ||
           number(PREFIX "EVICTION_CHECK_INTERVAL", &c->eviction_check_interval_s, NONNEG, err,
                  errlen) ||
           number(PREFIX "EVICTION_RATIO", &c->eviction_ratio, FRACTION, err, errlen) ||
           number(PREFIX "TRIGGER_WATERMARK", &c->trigger_watermark, WATERMARK, err, errlen) ||
           number(PREFIX "RESYNC_POLL_INTERVAL", &c->resync_poll_interval_s, POSITIVE, err,
                  errlen) ||
           number(PREFIX "RESYNC_MAX_WAIT", &c->resync_max_wait_s, NONNEG, err, errlen) ||
           number(PREFIX "TIMEOUT_KEEP_ALIVE", &c->timeout_keep_alive_s, POSITIVE, err,
                  errlen) ||
           boolean(PREFIX "ENABLE_STARTUP_RESYNC", &c->enable_startup_resync, err, errlen) ||
           boolean(PREFIX "METRICS_ENABLED", &c->metrics_enabled, err, errlen)
               ? -1 : 0;
}

/* The algorithm as the hasher takes it, checked here so that a typo is
 * refused with the other settings.  A fixed seed: PYTHONHASHSEED is read
 * (and an unset one warned about) once, when the coordinator starts. */
static int hash_settings(const coordinator_config *c, char *err, size_t errlen)
{
    lmc_token_hasher *h = NULL;
    char why[256];
    if (lmc_token_hasher_new(c->hash_algorithm, c->chunk_size, "0", &h, why, sizeof why) != 0)
        return snprintf(err, errlen, PREFIX "HASH_ALGORITHM=%.*s: %s", SHOWN, c->hash_algorithm,
                        why), -1;
    lmc_token_hasher_free(h);
    return 0;
}

int coordinator_config_from_env(coordinator_config *c, char *err, size_t errlen)
{
    coordinator_config_defaults(c);
    if (refusals(err, errlen) != 0 || strings(c, err, errlen) != 0 ||
        integers(c, err, errlen) != 0 || numbers_and_booleans(c, err, errlen) != 0 ||
        hash_settings(c, err, errlen) != 0)
        return -1;
    return 0;
}
