/* Startup resync (docs/coordinator.md, "Startup resync"): once a server
 * is registered, page through its GET /cache/objects and backfill the L2
 * keys the event stream has not reported, as least recent.  One shot:
 * the first server that answers every page ends it. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

/* Backfills one page's entries; the number of keys added. */
static size_t backfill(lmc_coord *co, const json_t *entries)
{
    size_t added = 0;
    pthread_mutex_lock(&co->mu);
    coordinator_state *s = &co->st;
    uint32_t backend = coordinator_names_intern(&s->backends, "");
    coordinator_db_begin(co->db);
    for (size_t i = 0; i < json_array_size(entries); i++) {
        const json_t *en = json_array_get(entries, i);
        coordinator_wire_key w;
        coordinator_key k;
        char why[160];
        json_t *size = json_object_get(en, "size_bytes");
        if (coordinator_wire_key_parse(json_object_get(en, "key"), &w, why, sizeof why) != 0 ||
            !json_is_integer(size) || json_integer_value(size) < 0 ||
            !coordinator_wire_key_resolve(s, &w, true, &k))
            continue;
        uint32_t idx = coordinator_keys_get(&s->keys, &k);
        if (idx == COORD_NONE || (s->keys.e[idx].flags & COORD_IN_L2))
            continue;
        if (coordinator_usage_l2_insert_at(s, idx, (uint64_t)json_integer_value(size), backend, 0) == 0) {
            coordinator_db_put_l2(co->db, s, idx);
            added++;
        } else {
            coordinator_keys_release(&s->keys, idx);
        }
    }
    if (coordinator_db_commit(co->db) != 0)
        coordinator_db_mark_diverged(co->db); /* the backfilled keys stay: the log catches up */
    pthread_mutex_unlock(&co->mu);
    return added;
}

/* Why a page did not come, in the words of the server's own reply where it
 * gave one ({"detail": ...}), bounded, for the warning. */
static void describe_failure(long status, const char *reply, const char *err, char *out,
                             size_t cap)
{
    if (!status) {
        snprintf(out, cap, "%s", err);
        return;
    }
    json_t *body = reply ? json_loads(reply, 0, NULL) : NULL;
    const char *detail = json_string_value(json_object_get(body, "detail"));
    if (status == 200)
        snprintf(out, cap, "its answer is not a page of objects (a JSON object)");
    else
        snprintf(out, cap, "HTTP %ld%s%.160s", status, detail ? ": " : "", detail ? detail : "");
    json_decref(body);
}

/* A server with no L2 adapter answers 503 "no L2 adapters": it has nothing
 * to resync, which is not a failure (docs/coordinator.md, "Start-up
 * resync"). */
static bool has_no_l2(long status, const char *reply)
{
    return status == 503 && reply && strstr(reply, "\"no L2 adapters\"") != NULL;
}

/* Pages through one server; 0 when every page came. */
static int resync_from(lmc_coord *co, const char *ip, int port)
{
    char *token = NULL;
    size_t total = 0;
    do {
        char path[1024], err[256] = "", *reply = NULL;
        char *esc = token ? curl_easy_escape(NULL, token, 0) : NULL;
        snprintf(path, sizeof path, "/cache/objects?tier=l2&page_size=%u%s%s",
                 co->cfg.resync_page_size, esc ? "&page_token=" : "", esc ? esc : "");
        curl_free(esc);
        free(token);
        token = NULL;
        long st = coordinator_call(co, "GET", ip, port, path, NULL, &reply, err, sizeof err);
        json_t *page = st == 200 ? json_loads(reply, 0, NULL) : NULL;
        if (!page && has_no_l2(st, reply)) {
            LMC_INFO("coordinator: %s:%d has no L2 adapter: nothing to resync", ip, port);
            free(reply);
            return 0;
        }
        if (!json_is_object(page)) {
            char why[256];
            describe_failure(st, reply, err, why, sizeof why);
            LMC_WARN("coordinator: resync from %s:%d failed: %s", ip, port, why);
            json_decref(page);
            free(reply);
            return -1;
        }
        free(reply);
        total += backfill(co, json_object_get(page, "entries"));
        atomic_fetch_add(&co->ctr.resync_pages, 1);
        const char *next = json_string_value(json_object_get(page, "next_page_token"));
        token = next && *next ? strdup(next) : NULL;
        json_decref(page);
    } while (token);
    atomic_fetch_add(&co->ctr.resync_keys, total);
    LMC_INFO("coordinator: resync from %s:%d backfilled %zu L2 keys", ip, port, total);
    return 0;
}

void *coordinator_resync_loop(void *arg)
{
    lmc_coord *co = arg;
    double deadline = coordinator_now_mono() + co->cfg.resync_max_wait_s;
    pthread_mutex_lock(&co->mu);
    while (!co->stopping) {
        char ip[256];
        int port;
        if (coordinator_member_pick(co, ip, sizeof ip, &port)) {
            pthread_mutex_unlock(&co->mu);
            int rc = resync_from(co, ip, port);
            pthread_mutex_lock(&co->mu);
            if (rc == 0)
                break;
        }
        if (coordinator_now_mono() >= deadline) {
            LMC_WARN("coordinator: no server could be resynced from within "
                     "LMCACHE_MP_COORDINATOR_RESYNC_MAX_WAIT (%.0f s)", co->cfg.resync_max_wait_s);
            break;
        }
        coordinator_wait(co, co->cfg.resync_poll_interval_s);
    }
    pthread_mutex_unlock(&co->mu);
    return NULL;
}
