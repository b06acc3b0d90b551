/* The fleet eviction loop (docs/coordinator.md, "Usage and eviction"):
 * every EVICTION_CHECK_INTERVAL, each salt at or over watermark x limit
 * has eviction_ratio of its least-recent unpinned L2 keys deleted through
 * one random live server.  Keys leave the LRU only when the server's
 * delete event comes back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "core/grow.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

typedef struct {
    char **bodies;
    size_t n, cap;
    size_t keys;
} delete_plan;

static bool plan_add(delete_plan *p, json_t *keys)
{
    json_t *body = json_pack("{s:o, s:s}", "keys", keys, "tier", "l2");
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return false;
    if (lmc_grow_array(&p->bodies, &p->cap, p->n + 1, sizeof *p->bodies, 4) != 0)
        return free(text), false;
    p->bodies[p->n++] = text;
    return true;
}

/* The DELETE bodies for one salt's chosen keys, <= 10,000 keys each. */
static void plan_salt(const coordinator_state *s, uint32_t salt, double ratio, delete_plan *p)
{
    size_t max = s->salt[salt].l2_count;
    uint32_t *chosen = malloc((max + 1) * sizeof *chosen);
    if (!chosen)
        return;
    size_t n = coordinator_evict_choose(s, salt, ratio, chosen, max);
    json_t *keys = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!keys && !(keys = json_array()))
            break;
        json_array_append_new(keys, coordinator_entry_json(s, &s->keys.e[chosen[i]]));
        if (json_array_size(keys) == COORD_MAX_DELETE_KEYS || i + 1 == n) {
            p->keys += json_array_size(keys);
            plan_add(p, keys);
            keys = NULL;
        }
    }
    json_decref(keys);
    free(chosen);
}

void coordinator_evict_pass(lmc_coord *co)
{
    delete_plan plan = {0};
    char ip[256];
    int port = 0;
    pthread_mutex_lock(&co->mu);
    const coordinator_state *s = &co->st;
    for (uint32_t salt = 0; salt < s->salts.n && salt < s->salt_cap; salt++)
        if (coordinator_quota_over(s, salt, co->cfg.trigger_watermark))
            plan_salt(s, salt, co->cfg.eviction_ratio, &plan);
    bool have = plan.n && coordinator_member_pick(co, ip, sizeof ip, &port);
    pthread_mutex_unlock(&co->mu);
    atomic_fetch_add(&co->ctr.eviction_passes, 1);
    if (plan.n && !have)
        LMC_WARN("coordinator: %zu keys are over quota but no server is registered to delete "
                 "them", plan.keys);
    for (size_t i = 0; have && i < plan.n; i++) {
        char err[256] = "";
        long st = coordinator_call(co, "DELETE", ip, port, "/cache/objects", plan.bodies[i], NULL, err,
                             sizeof err);
        atomic_fetch_add(&co->ctr.eviction_requests, 1);
        if (st < 200 || st > 299) {
            atomic_fetch_add(&co->ctr.eviction_request_failures, 1);
            if (st)
                LMC_WARN("coordinator: eviction DELETE to %s:%d answered %ld", ip, port, st);
            else
                LMC_WARN("coordinator: eviction DELETE failed: %s", err);
        }
    }
    if (have)
        atomic_fetch_add(&co->ctr.eviction_keys_requested, plan.keys);
    for (size_t i = 0; i < plan.n; i++)
        free(plan.bodies[i]);
    free(plan.bodies);
}

void coordinator_evict_once(void *co)
{
    coordinator_evict_pass(co);
}

void coordinator_sweep_once(void *arg)
{
    lmc_coord *co = arg;
    pthread_mutex_lock(&co->mu);
    size_t n = coordinator_members_sweep(co, coordinator_now_mono());
    atomic_fetch_add(&co->ctr.sweeps, 1);
    atomic_fetch_add(&co->ctr.instances_expired, n);
    pthread_mutex_unlock(&co->mu);
}
