/* P2P peer discovery (docs/p2p.md, "Discovery"): every heartbeat interval
 * GET /instances; this server's state from whether the coordinator lists it
 * with its advertise URL; the peers are the other instances with a channel
 * URL, an ip and an mq port.  A peer missing from more than
 * COORD_P2P_MISS_LIMIT polls in a row is dropped; one whose address changed
 * is replaced. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fleet/fleet_internal.h"
#include "obs/log.h"

static const char *const state_names[] = {"disconnected", "unregistered", "registered"};

static bool field_str(json_t *o, const char *k, char *out, size_t cap)
{
    const char *v = json_string_value(json_object_get(o, k));
    if (!v || !*v || strlen(v) >= cap)
        return false;
    memcpy(out, v, strlen(v) + 1);
    return true;
}

/* One entry of the list as a peer, or false when it is not one. */
static bool as_peer(json_t *inst, lmc_fleet_p2p_peer *p)
{
    memset(p, 0, sizeof *p);
    json_int_t port = json_integer_value(json_object_get(inst, "mq_port"));
    if (!field_str(inst, "instance_id", p->instance_id, sizeof p->instance_id) ||
        !field_str(inst, "ip", p->ip, sizeof p->ip) ||
        !field_str(inst, "p2p_advertised_url", p->url, sizeof p->url) || port < 1 ||
        port > 65535)
        return false;
    p->mq_port = (int)port;
    return true;
}

static lmc_fleet_p2p_peer *find_peer(lmc_fleet *c, const char *id)
{
    for (size_t i = 0; i < c->n_peers; i++)
        if (strcmp(c->peers[i].instance_id, id) == 0)
            return &c->peers[i];
    return NULL;
}

static void tell(lmc_fleet *c, const lmc_fleet_p2p_peer *p, bool present)
{
    if (c->peer_fn)
        c->peer_fn(c->peer_user, p->instance_id, p->ip, p->mq_port, p->url, present);
}

static void see_peer(lmc_fleet *c, const lmc_fleet_p2p_peer *p)
{
    lmc_fleet_p2p_peer *known = find_peer(c, p->instance_id);
    if (known) {
        known->seen = true;
        known->misses = 0;
        if (strcmp(known->ip, p->ip) == 0 && strcmp(known->url, p->url) == 0 &&
            known->mq_port == p->mq_port)
            return;
        LMC_INFO("P2P peer %s moved to %s (mq tcp://%s:%d)", p->instance_id, p->url, p->ip,
                 p->mq_port);
        *known = *p;
        known->seen = true;
        c->peers_replaced++;
        tell(c, known, true);
        return;
    }
    if (c->n_peers == COORD_P2P_PEERS_MAX) {
        c->peers_refused++;
        return;
    }
    c->peers[c->n_peers] = *p;
    c->peers[c->n_peers++].seen = true;
    c->peers_added++;
    tell(c, p, true);
    LMC_INFO("P2P peer %s added: %s (mq tcp://%s:%d)", p->instance_id, p->url, p->ip,
             p->mq_port);
}

/* Peers not seen this poll count a miss; past the limit they go. */
static void age_peers(lmc_fleet *c)
{
    size_t kept = 0;
    for (size_t i = 0; i < c->n_peers; i++) {
        lmc_fleet_p2p_peer *p = &c->peers[i];
        if (!p->seen && ++p->misses > COORD_P2P_MISS_LIMIT) {
            LMC_INFO("P2P peer %s dropped: not listed %u times in a row", p->instance_id,
                     p->misses);
            c->peers_removed++;
            tell(c, p, false);
            continue;
        }
        p->seen = false;
        c->peers[kept++] = *p;
    }
    c->n_peers = kept;
}

/* The state this reply gives, the peers it lists seen (under p2p_mu). */
static int apply_list(lmc_fleet *c, const lmc_fleet_reply *r, const char *own_id)
{
    json_t *doc = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, NULL);
    json_t *list = json_object_get(doc, "instances");
    int state = COORD_P2P_UNREGISTERED;
    size_t i;
    json_t *inst;
    json_array_foreach(list, i, inst) {
        const char *id = json_string_value(json_object_get(inst, "instance_id"));
        const char *url = json_string_value(json_object_get(inst, "p2p_advertised_url"));
        if (id && own_id[0] && strcmp(id, own_id) == 0)
            state = url && strcmp(url, c->p2p_url) == 0 ? COORD_P2P_REGISTERED : state;
    }
    if (state == COORD_P2P_REGISTERED) {
        json_array_foreach(list, i, inst) {
            lmc_fleet_p2p_peer p;
            if (as_peer(inst, &p) && strcmp(p.instance_id, own_id) != 0)
                see_peer(c, &p);
        }
    }
    json_decref(doc);
    return state;
}

static void poll_once(lmc_fleet *c, lmc_fleet_reply *reply)
{
    char url[COORD_URL_MAX + 32], own_id[COORD_ID_MAX];
    snprintf(url, sizeof url, "%s/instances", c->url);
    pthread_mutex_lock(&c->mu);
    snprintf(own_id, sizeof own_id, "%s", c->held_id);
    pthread_mutex_unlock(&c->mu);
    double t = c->heartbeat_interval > 1.0 ? c->heartbeat_interval : 1.0;
    lmc_fleet_request rq = {.method = "GET", .url = url, .auth_token = c->auth_token,
                            .timeout_s = t, .cancel = &c->stop};
    int rc = lmc_fleet_http(&rq, reply);
    pthread_mutex_lock(&c->p2p_mu);
    c->p2p_polls++;
    if (rc != 0 && reply->timed_out)
        c->p2p_state = COORD_P2P_DISCONNECTED;
    else if (rc != 0 || reply->status != 200)
        c->p2p_state = COORD_P2P_UNREGISTERED;
    else
        c->p2p_state = apply_list(c, reply, own_id);
    age_peers(c);
    pthread_mutex_unlock(&c->p2p_mu);
}

void *lmc_fleet_discovery_main(void *arg)
{
    lmc_fleet *c = arg;
    lmc_fleet_reply *reply = malloc(sizeof *reply);   /* 64 KiB: not on the stack */
    if (!reply) {
        LMC_ERROR("P2P: out of memory; peers are not discovered");
        return NULL;
    }
    while (lmc_fleet_sleep(c, c->heartbeat_interval))
        poll_once(c, reply);
    free(reply);
    return NULL;
}

void lmc_fleet_set_peer_listener(lmc_fleet *c, lmc_fleet_peer_fn fn, void *user)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->p2p_mu);
    c->peer_fn = fn;
    c->peer_user = user;
    for (size_t i = 0; i < c->n_peers; i++)
        tell(c, &c->peers[i], true);
    pthread_mutex_unlock(&c->p2p_mu);
}

json_t *lmc_fleet_p2p_status(lmc_fleet *c)
{
    if (!c || !c->p2p_url[0])
        return json_pack("{s:b, s:s, s:i, s:[]}", "p2p_enabled", false, "p2p_state",
                         "disabled", "p2p_peer_count", 0, "p2p_peers");
    json_t *peers = json_array();
    pthread_mutex_lock(&c->p2p_mu);
    for (size_t i = 0; peers && i < c->n_peers; i++) {
        const lmc_fleet_p2p_peer *p = &c->peers[i];
        json_array_append_new(peers, json_pack("{s:s, s:s, s:i, s:s, s:i}", "instance_id",
                                               p->instance_id, "ip", p->ip, "mq_port",
                                               p->mq_port, "p2p_advertised_url", p->url,
                                               "misses", (int)p->misses));
    }
    json_t *o = json_pack("{s:b, s:s, s:I, s:o?, s:{s:I, s:I, s:I, s:I, s:I}}", "p2p_enabled",
                          true, "p2p_state", state_names[c->p2p_state], "p2p_peer_count",
                          (json_int_t)c->n_peers, "p2p_peers", peers, "p2p_discovery",
                          "polls", (json_int_t)c->p2p_polls, "peers_added",
                          (json_int_t)c->peers_added, "peers_replaced",
                          (json_int_t)c->peers_replaced, "peers_removed",
                          (json_int_t)c->peers_removed, "peers_refused",
                          (json_int_t)c->peers_refused);
    pthread_mutex_unlock(&c->p2p_mu);
    return o;
}
