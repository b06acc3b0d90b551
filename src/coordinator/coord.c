/* Start and stop of the coordinator (coordinator.h). */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "coordinator/coord_blend.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

double coordinator_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double coordinator_now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

bool coordinator_wait(lmc_coord *co, double seconds)
{
    if (co->stopping)
        return true;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(seconds);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&co->wake, &co->mu, &ts);
    return co->stopping;
}

int coordinator_port(const lmc_coord *co)
{
    return co->port;
}

/* The directory of a default database, made (0700: the database holds
 * the tenants' salts and keys) with the missing ones above it. */
static int make_state_dir(const char *db_path, char *err, size_t errlen)
{
    char dir[sizeof ((coordinator_config *)0)->db_path];
    snprintf(dir, sizeof dir, "%s", db_path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last)
            continue;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return snprintf(err, errlen, "cannot make %s for the default database (%s); set "
                                         "LMCACHE_MP_COORDINATOR_DB_PATH", dir,
                            strerror(errno)), -1;
        if (last)
            return 0;
        *p = '/';
    }
}

static int open_state(lmc_coord *co, char *err, size_t errlen)
{
    char why[256];
    if (lmc_token_hasher_new(co->cfg.hash_algorithm, co->cfg.chunk_size, getenv("PYTHONHASHSEED"),
                             &co->hasher, why, sizeof why) != 0)
        return snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_HASH_ALGORITHM: %s", why), -1;
    co->members = calloc(COORD_MAX_MEMBERS, sizeof *co->members);
    if (!co->members || coordinator_state_init(&co->st) != 0)
        return snprintf(err, errlen, "out of memory"), -1;
    if (co->cfg.db_dir_create && make_state_dir(co->cfg.db_path, err, errlen) != 0)
        return -1;
    if (coordinator_db_open(co->cfg.db_path, &co->db, err, errlen) != 0)
        return -1;
    if (coordinator_db_load(co->db, &co->st, why, sizeof why) != 0)
        return snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_DB_PATH %s: %s", co->cfg.db_path,
                        why), -1;
    LMC_INFO("coordinator: loaded %llu L2 keys (%llu bytes), %u salts, %u instance cursors "
             "from %s", (unsigned long long)co->st.l2_entries,
             (unsigned long long)co->st.l2_bytes, co->st.salts.n, co->st.instances.n,
             co->cfg.db_path);
    /* Set after the load: what the database holds is kept whatever the bound. */
    co->st.keys.max_live = co->cfg.max_keys;
    if (co->st.keys.n_live >= co->cfg.max_keys)
        LMC_WARN("coordinator: the database holds %u keys, LMCACHE_MP_COORDINATOR_MAX_KEYS is "
                 "%u: no new key is recorded until deletes make room", co->st.keys.n_live,
                 co->cfg.max_keys);
    return 0;
}

/* A loop every interval_s seconds (to the millisecond); none for 0. */
static int start_periodic(lmc_coord *co, lmc_core_periodic **out, double interval_s,
                          lmc_core_periodic_fn fn, char *err, size_t errlen)
{
    if (!(interval_s > 0))
        return 0;
    *out = lmc_core_periodic_start(NULL, (int64_t)(interval_s * 1000 + 0.5), fn, co);
    return *out ? 0 : (snprintf(err, errlen, "cannot start a thread"), -1);
}

static int start_loop(lmc_coord *co, pthread_t *t, bool *running, void *(*fn)(void *),
                      char *err, size_t errlen)
{
    if (pthread_create(t, NULL, fn, co) != 0)
        return snprintf(err, errlen, "cannot start a thread"), -1;
    *running = true;
    return 0;
}

int coordinator_start(const coordinator_config *c, lmc_coord **out, char *err, size_t errlen)
{
    lmc_coord *co = calloc(1, sizeof *co);
    if (!co)
        return snprintf(err, errlen, "out of memory"), -1;
    co->cfg = *c;
    co->rng = (uint64_t)coordinator_now_wall() * 2654435761u ^ (uint64_t)(uintptr_t)co;
    pthread_mutex_init(&co->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&co->wake, &ca);
    pthread_condattr_destroy(&ca);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (c->metrics_enabled && coordinator_metrics_new(co) != 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (c->enable_blend_lookup &&
        !(co->blend = coordinator_blend_new(&(coordinator_blend_opts){
              .chunk_size = c->chunk_size, .probe_stride = c->blend_probe_stride,
              .max_chunks = c->max_blend_chunks}))) {
        snprintf(err, errlen, "LMCACHE_MP_COORDINATOR_MAX_BLEND_CHUNKS: out of memory for "
                              "the blend index's tables");
        goto fail;
    }
    if (open_state(co, err, errlen) != 0 || coordinator_http_start(co, err, errlen) != 0)
        goto fail;
    if (start_periodic(co, &co->sweep, c->health_check_interval_s, coordinator_sweep_once,
                       err, errlen) != 0 ||
        start_periodic(co, &co->evict, c->eviction_check_interval_s, coordinator_evict_once,
                       err, errlen) != 0 ||
        (c->enable_startup_resync &&
         start_loop(co, &co->resync_thread, &co->resync_running, coordinator_resync_loop, err, errlen)))
        goto fail;
    *out = co;
    return 0;
fail:
    coordinator_stop(co);
    return -1;
}

void coordinator_stop(lmc_coord *co)
{
    if (!co)
        return;
    coordinator_http_stop(co);
    pthread_mutex_lock(&co->mu);
    co->stopping = true;
    pthread_cond_broadcast(&co->wake);
    pthread_mutex_unlock(&co->mu);
    lmc_core_periodic_stop(co->sweep);
    lmc_core_periodic_stop(co->evict);
    if (co->resync_running)
        pthread_join(co->resync_thread, NULL);
    coordinator_db_close(co->db);
    if (co->members)
        coordinator_members_free(co);
    coordinator_state_free(&co->st);
    lmc_token_hasher_free(co->hasher);
    coordinator_blend_free(co->blend);
    coordinator_metrics_free(co->metrics);
    pthread_cond_destroy(&co->wake);
    pthread_mutex_destroy(&co->mu);
    curl_global_cleanup();
    free(co);
}
