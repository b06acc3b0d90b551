/* Membership: /instances (docs/coordinator.md, "Membership").  In memory
 * only; servers re-register after a coordinator restart. */
#include <ctype.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "coordinator/coord_events.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

#define MAX_METADATA 64
#define MAX_META_STR 1024
#define MAX_URL 1024

coordinator_member *coordinator_member_find(lmc_coord *co, const char *id)
{
    for (size_t i = 0; i < co->n_members; i++)
        if (strcmp(co->members[i]->id, id) == 0)
            return co->members[i];
    return NULL;
}

static void member_free(coordinator_member *m)
{
    if (m) {
        free(m->p2p_url);
        json_decref(m->metadata);
        free(m);
    }
}

static void member_remove(lmc_coord *co, size_t i)
{
    member_free(co->members[i]);
    co->members[i] = co->members[--co->n_members];
}

void coordinator_members_free(lmc_coord *co)
{
    while (co->n_members)
        member_remove(co, co->n_members - 1);
    free(co->members);
    co->members = NULL;
}

/* Copies s without leading and trailing blanks into out; false when it
 * does not fit. */
static bool trimmed(const char *s, char *out, size_t cap)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    if (n >= cap)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

static bool port_field(const json_t *v, int lo, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > 65535)
        return false;
    *out = (int)json_integer_value(v);
    return true;
}

static const char *check_metadata(const json_t *meta)
{
    if (!json_is_object(meta) || json_object_size(meta) > MAX_METADATA)
        return "metadata must be an object of at most 64 str: str entries";
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v) || strlen(k) > MAX_META_STR || json_string_length(v) > MAX_META_STR)
            return "metadata values must be str (keys and values at most 1024 bytes)";
    }
    return NULL;
}

/* The registration body as a member (not yet in the table), or NULL with
 * the reason. */
static coordinator_member *parse_member(const json_t *b, const char **why)
{
    coordinator_member *m = calloc(1, sizeof *m);
    json_t *id = json_object_get(b, "instance_id"), *ip = json_object_get(b, "ip");
    json_t *meta = json_object_get(b, "metadata"), *url = json_object_get(b, "p2p_advertised_url");
    json_t *mq = json_object_get(b, "mq_port");
    *why = !m ? "out of memory"
         : id && !json_is_null(id) && !json_is_string(id) ? "instance_id must be a str"
         : id && json_is_string(id) && !trimmed(json_string_value(id), m->id, sizeof m->id)
             ? "instance_id must be at most 256 bytes"
         : !json_is_string(ip) || !trimmed(json_string_value(ip), m->ip, sizeof m->ip) || !m->ip[0]
             ? "ip must be a non-empty str of at most 255 bytes"
         : !port_field(json_object_get(b, "http_port"), 1, &m->http_port)
             ? "http_port must be an integer in 1..65535"
         : mq && !port_field(mq, 0, &m->mq_port) ? "mq_port must be an integer in 0..65535"
         : url && (!json_is_string(url) || json_string_length(url) > MAX_URL)
             ? "p2p_advertised_url must be a str of at most 1024 bytes"
         : meta && check_metadata(meta) ? check_metadata(meta)
                                         : NULL;
    if (*why) {
        member_free(m);
        return NULL;
    }
    m->p2p_url = strdup(url ? json_string_value(url) : "");
    m->metadata = meta ? json_deep_copy(meta) : json_object();
    if (!m->p2p_url || !m->metadata) {
        *why = "out of memory";
        member_free(m);
        return NULL;
    }
    return m;
}

static void mint_id(char *out, size_t cap)
{
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (uint8_t)((uint64_t)ts.tv_nsec >> (i % 8 * 4) ^ i * 131);
    }
    int n = snprintf(out, cap, "mp-");
    for (size_t i = 0; i < sizeof r; i++)
        n += snprintf(out + n, cap - (size_t)n, "%02x", r[i]);
}

void coordinator_ep_register(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                             const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_t *b = coordinator_body_object(rq, out);
    if (!b)
        return;
    const char *why;
    coordinator_member *m = parse_member(b, &why);
    json_decref(b);
    if (!m)
        return coordinator_reply_detail(out, 422, "%s", why);
    if (!m->id[0])
        mint_id(m->id, sizeof m->id);
    m->registered_wall = coordinator_now_wall();
    m->heartbeat_mono = coordinator_now_mono();
    pthread_mutex_lock(&co->mu);
    bool again = false;
    for (size_t i = 0; i < co->n_members && !again; i++) {
        if (strcmp(co->members[i]->id, m->id) == 0) {
            member_free(co->members[i]);
            co->members[i] = m;
            again = true;
        }
    }
    bool full = !again && co->n_members >= COORD_MAX_MEMBERS;
    if (full) {
        pthread_mutex_unlock(&co->mu);
        member_free(m);
        return coordinator_reply_detail(out, 503, "at most %d instances are registered at once",
                                  COORD_MAX_MEMBERS);
    }
    if (!again)
        co->members[co->n_members++] = m;
    LMC_INFO("coordinator: instance %s %sregistered (http://%s:%d)", m->id, again ? "re-" : "",
             m->ip, m->http_port);
    lmc_http_reply_json(out, 200, json_pack("{s:s, s:b}", "instance_id", m->id, "re_registered",
                                         again));
    pthread_cond_broadcast(&co->wake); /* the resync may be waiting for a server */
    pthread_mutex_unlock(&co->mu);
}

/* The id of /instances/{id}/heartbeat in rest (the path after the
 * prefix): ID_OK with it in id, ID_TOO_LONG (no such instance can exist),
 * or NOT_HEARTBEAT when rest does not end in /heartbeat. */
typedef enum { NOT_HEARTBEAT, ID_TOO_LONG, ID_OK } heartbeat_path;

static heartbeat_path heartbeat_id(const char *rest, char id[COORD_INSTANCE_ID_MAX + 1])
{
    static const char suffix[] = "/heartbeat";
    size_t n = strlen(rest), sn = sizeof suffix - 1;
    if (n <= sn || strcmp(rest + n - sn, suffix) != 0)
        return NOT_HEARTBEAT;
    if (n - sn > COORD_INSTANCE_ID_MAX)
        return ID_TOO_LONG;
    memcpy(id, rest, n - sn);
    id[n - sn] = '\0';
    return ID_OK;
}

static void unknown_instance(lmc_http_reply *out, const char *id)
{
    lmc_http_reply_json(out, 404, id ? json_pack("{s:s++}", "error", "unknown instance ", id,
                                                 "; re-register")
                                     : json_pack("{s:s}", "error", "unknown instance; "
                                                 "re-register"));
}

/* PUT /instances/{id}/heartbeat; arg: the prefix "/instances/".  PUT of
 * anything else under it is not a route (405, DELETE removes one). */
void coordinator_ep_heartbeat(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                              const char *arg)
{
    lmc_coord *co = ctx;
    char id[COORD_INSTANCE_ID_MAX + 1];
    heartbeat_path shape = heartbeat_id(rq->path + strlen(arg), id);
    if (shape == NOT_HEARTBEAT)
        return coordinator_reply_not_allowed(out, "DELETE");
    if (shape == ID_TOO_LONG)
        return unknown_instance(out, NULL);
    pthread_mutex_lock(&co->mu);
    coordinator_member *m = coordinator_member_find(co, id);
    if (m)
        m->heartbeat_mono = coordinator_now_mono();
    pthread_mutex_unlock(&co->mu);
    if (!m)
        return unknown_instance(out, id);
    lmc_http_reply_json(out, 200, json_pack("{s:s}", "instance_id", id));
}

/* DELETE /instances/{id}; arg: the prefix.  A server gone for good: its
 * L1 is gone with it, and its stream starts afresh if it ever comes back. */
void coordinator_ep_deregister(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                               const char *arg)
{
    lmc_coord *co = ctx;
    const char *id = rq->path + strlen(arg);
    char heartbeat_of[COORD_INSTANCE_ID_MAX + 1];
    heartbeat_path shape = heartbeat_id(id, heartbeat_of);
    if (shape == ID_TOO_LONG)
        return unknown_instance(out, NULL);
    if (shape == ID_OK) /* a heartbeat path is PUT only */
        return coordinator_reply_not_allowed(out, "PUT");
    pthread_mutex_lock(&co->mu);
    for (size_t i = 0; i < co->n_members; i++)
        if (strcmp(co->members[i]->id, id) == 0)
            member_remove(co, i--);
    uint32_t inst = coordinator_names_find(&co->st.instances, id);
    if (inst != COORD_NONE && inst < co->st.cursor_cap) {
        coordinator_events_fence(&co->st, inst);
        co->st.cursor[inst].used = false;
        co->st.cursor[inst].n_caps = 0;
        coordinator_db_del_cursor(co->db, id);
    }
    pthread_mutex_unlock(&co->mu);
    lmc_http_reply_text(out, 204, "application/json", NULL);
}

void coordinator_ep_instances(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                              const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    (void)rq;
    json_t *list = json_array();
    pthread_mutex_lock(&co->mu);
    for (size_t i = 0; list && i < co->n_members; i++) {
        const coordinator_member *m = co->members[i];
        json_array_append_new(list, json_pack("{s:s, s:s, s:i, s:f, s:O, s:s, s:i}",
                                              "instance_id", m->id, "ip", m->ip, "http_port",
                                              m->http_port, "registration_time",
                                              m->registered_wall, "metadata", m->metadata,
                                              "p2p_advertised_url", m->p2p_url, "mq_port",
                                              m->mq_port));
    }
    pthread_mutex_unlock(&co->mu);
    lmc_http_reply_json(out, 200, json_pack("{s:o}", "instances", list));
}

size_t coordinator_members_sweep(lmc_coord *co, double now)
{
    size_t n = 0;
    for (size_t i = 0; i < co->n_members; i++) {
        coordinator_member *m = co->members[i];
        if (now - m->heartbeat_mono <= co->cfg.instance_timeout_s)
            continue;
        uint32_t inst = coordinator_names_find(&co->st.instances, m->id);
        size_t voided = inst != COORD_NONE ? coordinator_events_fence(&co->st, inst) : 0;
        LMC_WARN("coordinator: instance %s sent no heartbeat for %.1f s: removed, %zu L1 "
                 "placements voided", m->id, now - m->heartbeat_mono, voided);
        member_remove(co, i--);
        n++;
    }
    return n;
}

bool coordinator_member_pick(lmc_coord *co, char *ip, size_t iplen, int *port)
{
    if (!co->n_members)
        return false;
    co->rng = co->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    const coordinator_member *m = co->members[(co->rng >> 33) % co->n_members];
    snprintf(ip, iplen, "%s", m->ip);
    *port = m->http_port;
    return true;
}
