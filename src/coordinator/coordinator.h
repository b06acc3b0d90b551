/* lmcached-coordinator: the fleet coordinator of a group of lmcached
 * servers sharing an L2 (docs/coordinator.md).  Membership, the cache-event
 * stream, the per-salt usage view, quotas and the fleet eviction loop, pins,
 * the key directory, and cache-control proxies, over HTTP. */
#ifndef LMC_COORDINATOR_COORDINATOR_H
#define LMC_COORDINATOR_COORDINATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The key directory's bound by default: at most some 1.3 GB of key records
 * and index (113 to 129 bytes a key, docs/coordinator.md "Memory"), some
 * 80 TB of L2 at 8 MB an object.  At most 10^9: the key index addresses
 * 2^31 slots. */
#define LMC_COORD_DEFAULT_MAX_KEYS 10000000L
#define LMC_COORD_MAX_MAX_KEYS 1000000000L
/* Request bodies held at once by default, MiB: sixteen bodies of the
 * largest kind (16 MiB), where 512 connections could otherwise hold 8 GiB. */
#define LMC_COORD_DEFAULT_MAX_BUFFERED_MB 256L

/* Settings, from the environment over an optional JSON file
 * (docs/coordinator.md, "Configuration"). */
typedef struct {
    char host[256];
    int port;
    double instance_timeout_s;
    double health_check_interval_s;   /* 0 disables the sweep */
    double eviction_check_interval_s; /* 0 disables the eviction loop */
    double eviction_ratio;
    double trigger_watermark;
    uint32_t chunk_size;
    char hash_algorithm[32];
    bool enable_startup_resync;
    double resync_poll_interval_s;
    double resync_max_wait_s;
    uint32_t resync_page_size;
    double timeout_keep_alive_s;
    bool metrics_enabled;
    uint32_t max_keys;            /* the key directory's bound */
    uint32_t max_buffered_mb;     /* request bodies buffered at once, all connections */
    char db_path[4096];
    char db_path_origin[64];      /* what chose db_path, for the start-up log */
    bool db_dir_create;           /* a default under XDG/HOME: its directory is made, 0700 */
    char auth_token[1024];        /* "" = no token */
    char server_auth_token[1024]; /* sent to lmcached servers; "" = none */
    char otlp_endpoint[1024];     /* refused when not empty */
    bool enable_blend_lookup;     /* the fleet fragment index (docs/coordinator.md) */
    uint32_t blend_probe_stride;  /* query positions between its probes */
    uint32_t max_blend_chunks;    /* its bound, in (namespace, chunk hash) claims */
} coordinator_config;

/* Fills `c` from the LMCACHE_MP_COORDINATOR_* variables of the process
 * environment.  A value that does not parse, is out of its range or too
 * long, a setting this build refuses, and any unknown variable of the
 * family return -1 with one line in err naming the variable. */
int coordinator_config_from_env(coordinator_config *c, char *err, size_t errlen);
/* The same over the settings of `file` (NULL: none), a JSON object whose
 * keys are the variables' names after the prefix in lower case: an
 * unreadable file, an unknown key, a value of the wrong JSON type or one
 * the variable would refuse return -1 naming the file and the key.  The
 * environment overrides the file.  Without DB_PATH from either, db_path is
 * the default place (docs/coordinator.md, "Configuration"). */
int coordinator_config_load(coordinator_config *c, const char *file, char *err, size_t errlen);
/* Every setting as a JSON object text (malloc'd; NULL out of memory), the
 * tokens shown as "***" when set: what --print-config prints. */
char *coordinator_config_print(const coordinator_config *c);
/* The built-in defaults; db_path is left empty. */
void coordinator_config_defaults(coordinator_config *c);

typedef struct coordinator lmc_coord;

/* Opens the database at c->db_path, loads the persisted state, binds the
 * HTTP port and starts the background loops.  -1 with err on failure. */
int coordinator_start(const coordinator_config *c, lmc_coord **out, char *err, size_t errlen);
/* The bound HTTP port. */
int coordinator_port(const lmc_coord *co);
/* Stops the HTTP server and the loops, checkpoints and closes the
 * database, frees.  NULL is a no-op. */
void coordinator_stop(lmc_coord *co);

#endif
