/* The registrar (docs/fleet.md, "Registration"): POST /instances until an
 * id is held, then PUT /instances/{id}/heartbeat every heartbeat interval;
 * a 404 forgets the id (re-registration next tick), every other failure
 * keeps it, so the coordinator never sees duplicate registrations.  The
 * first registration is immediate; there is no backoff.  At shutdown a
 * held id is deregistered, best-effort, within a short timeout. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fleet/fleet_internal.h"
#include "obs/log.h"

/* The local address of a UDP socket connect()ed toward the coordinator's
 * host: the interface the host routes to it through.  No packet is sent. */
static bool outbound_ip(const char *url, char *out, size_t len)
{
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL;
    bool ok = false;
    if (!u || curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK)
        goto done;
    curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {   /* IPv6 literal */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(host, port ? port : "80", &hints, &ai) != 0)
        goto done;
    for (struct addrinfo *p = ai; p && !ok; p = p->ai_next) {
        int fd = socket(p->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage local;
        socklen_t sl = sizeof local;
        if (fd >= 0 && connect(fd, p->ai_addr, p->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&local, &sl) == 0) {
            const void *addr = local.ss_family == AF_INET6
                                   ? (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr
                                   : (const void *)&((struct sockaddr_in *)&local)->sin_addr;
            ok = inet_ntop(local.ss_family, addr, out, (socklen_t)len) != NULL;
        }
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(ai);
done:
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return ok;
}

static void pick_advertise_ip(lmc_fleet *c)
{
    char ip[64] = "";
    if (c->advertise_ip_opt[0]) {
        snprintf(ip, sizeof ip, "%s", c->advertise_ip_opt);
    } else if (!outbound_ip(c->url, ip, sizeof ip)) {
        snprintf(ip, sizeof ip, "127.0.0.1");
        LMC_WARN("coordinator: cannot tell this host's outbound address toward %s; "
                 "advertising 127.0.0.1 (set --coordinator-advertise-ip)", c->shown_url);
    }
    pthread_mutex_lock(&c->mu);
    snprintf(c->advertise_ip, sizeof c->advertise_ip, "%s", ip);
    pthread_mutex_unlock(&c->mu);
}

static void note_failure(lmc_fleet *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    snprintf(c->last_error, sizeof c->last_error, "%s", why);
    c->request_failures++;
    bool warn = lmc_fleet_warn_due(&c->reg_warn);
    uint64_t streak = c->reg_warn.streak;
    pthread_mutex_unlock(&c->mu);
    if (warn && streak == 1)
        LMC_WARN("coordinator %s: %s", c->shown_url, why);
    else if (warn)
        LMC_WARN("coordinator %s: still failing (%llu times in a row): %s", c->shown_url,
                 (unsigned long long)streak, why);
}

static void note_success(lmc_fleet *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t streak = lmc_fleet_warn_reset(&c->reg_warn);
    c->last_heartbeat = lmc_fleet_wall_now();
    c->last_error[0] = '\0';
    pthread_mutex_unlock(&c->mu);
    if (streak > 0)
        LMC_INFO("coordinator %s reachable again after %llu failed request(s)", c->shown_url,
                 (unsigned long long)streak);
}

static json_t *registration_body(lmc_fleet *c)
{
    pthread_mutex_lock(&c->mu);
    json_t *body = json_pack("{s:s, s:s, s:i, s:s, s:i}", "instance_id", c->configured_id, "ip",
                             c->advertise_ip, "http_port", c->http_port, "p2p_advertised_url",
                             c->p2p_url, "mq_port", c->mq_port);
    pthread_mutex_unlock(&c->mu);
    return body;
}

static int exchange(lmc_fleet *c, const char *method, const char *url, const char *body,
                    lmc_fleet_reply *reply)
{
    lmc_fleet_request rq = {.method = method, .url = url, .body = body,
                            .body_len = body ? strlen(body) : 0, .auth_token = c->auth_token,
                            .timeout_s = COORD_REQUEST_TIMEOUT_S, .cancel = &c->stop};
    return lmc_fleet_http(&rq, reply);
}

/* {"instance_id": non-empty str, "re_registered": bool}: the id, or NULL. */
static const char *registered_id(const lmc_fleet_reply *r, json_t **doc, bool *again)
{
    *doc = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, NULL);
    const char *id = json_string_value(json_object_get(*doc, "instance_id"));
    json_t *re = json_object_get(*doc, "re_registered");
    *again = json_is_true(re);
    return id && *id && strlen(id) < COORD_ID_MAX && json_is_boolean(re) ? id : NULL;
}

static void register_once(lmc_fleet *c, lmc_fleet_reply *reply)
{
    char url[COORD_URL_MAX + 32], why[COORD_ERROR_MAX];
    snprintf(url, sizeof url, "%s/instances", c->url);
    json_t *body = registration_body(c);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return note_failure(c, "POST /instances: out of memory");
    int rc = exchange(c, "POST", url, text, reply);
    free(text);
    if (rc != 0 || reply->status < 200 || reply->status > 299)
        return lmc_fleet_describe_failure("POST /instances", reply, why, sizeof why),
               note_failure(c, why);
    json_t *doc;
    bool again;
    const char *id = registered_id(reply, &doc, &again);
    if (!id) {
        json_decref(doc);
        return note_failure(c, "POST /instances: the reply is not {\"instance_id\", "
                               "\"re_registered\"}");
    }
    pthread_mutex_lock(&c->mu);
    snprintf(c->held_id, sizeof c->held_id, "%s", id);
    c->registrations++;
    pthread_mutex_unlock(&c->mu);
    note_success(c);
    LMC_INFO("coordinator %s: registered as %s (%s:%d)%s", c->shown_url, id, c->advertise_ip,
             c->http_port, again ? ", replacing an earlier registration" : "");
    json_decref(doc);
    /* The coordinator keeps the capacity declaration in memory only. */
    if (c->events)
        lmc_fleet_event_batcher_redeclare(c->events);
}

static void heartbeat_once(lmc_fleet *c, const char *id, lmc_fleet_reply *reply)
{
    char url[COORD_URL_MAX + 2 * COORD_ID_MAX + 32], why[COORD_ERROR_MAX];
    char *escaped = curl_easy_escape(NULL, id, 0);
    snprintf(url, sizeof url, "%s/instances/%s/heartbeat", c->url, escaped ? escaped : id);
    curl_free(escaped);
    int rc = exchange(c, "PUT", url, NULL, reply);
    if (rc == 0 && reply->status == 404) {
        pthread_mutex_lock(&c->mu);
        if (strcmp(c->held_id, id) == 0)
            c->held_id[0] = '\0';
        snprintf(c->last_error, sizeof c->last_error, "heartbeat: 404, re-registering");
        pthread_mutex_unlock(&c->mu);
        LMC_INFO("coordinator %s no longer knows %s; registering again", c->shown_url, id);
        return;
    }
    if (rc != 0 || reply->status < 200 || reply->status > 299)
        return lmc_fleet_describe_failure("PUT heartbeat", reply, why, sizeof why),
               note_failure(c, why);
    json_t *doc = json_loadb(reply->body, reply->len, JSON_REJECT_DUPLICATES, NULL);
    bool understood = json_is_string(json_object_get(doc, "instance_id"));
    json_decref(doc);
    if (!understood)
        return note_failure(c, "PUT heartbeat: the reply is not {\"instance_id\"}");
    pthread_mutex_lock(&c->mu);
    c->heartbeats_ok++;
    pthread_mutex_unlock(&c->mu);
    note_success(c);
}

void *lmc_fleet_registrar_main(void *arg)
{
    lmc_fleet *c = arg;
    lmc_fleet_reply *reply = malloc(sizeof *reply);   /* 64 KiB: not on the stack */
    if (!reply) {
        LMC_ERROR("coordinator: out of memory; not registering");
        return NULL;
    }
    pick_advertise_ip(c);
    do {
        char id[COORD_ID_MAX];
        pthread_mutex_lock(&c->mu);
        snprintf(id, sizeof id, "%s", c->held_id);
        pthread_mutex_unlock(&c->mu);
        if (!id[0])
            register_once(c, reply);
        else
            heartbeat_once(c, id, reply);
    } while (lmc_fleet_sleep(c, c->heartbeat_interval));
    free(reply);
    return NULL;
}

/* Best-effort: errors are logged once and ignored; the stop flag is not a
 * cancel here (it is set already), the short timeout bounds it. */
void lmc_fleet_deregister(lmc_fleet *c)
{
    char id[COORD_ID_MAX];
    pthread_mutex_lock(&c->mu);
    snprintf(id, sizeof id, "%s", c->held_id);
    c->held_id[0] = '\0';
    pthread_mutex_unlock(&c->mu);
    if (!id[0])
        return;
    lmc_fleet_reply *reply = malloc(sizeof *reply);
    char url[COORD_URL_MAX + 2 * COORD_ID_MAX + 32];
    char *escaped = curl_easy_escape(NULL, id, 0);
    snprintf(url, sizeof url, "%s/instances/%s", c->url, escaped ? escaped : id);
    curl_free(escaped);
    lmc_fleet_request rq = {.method = "DELETE", .url = url, .auth_token = c->auth_token,
                            .timeout_s = COORD_DELETE_TIMEOUT_S};
    if (reply && lmc_fleet_http(&rq, reply) == 0 && reply->status >= 200 && reply->status < 300) {
        pthread_mutex_lock(&c->mu);
        c->deregistrations++;
        pthread_mutex_unlock(&c->mu);
        LMC_INFO("coordinator %s: deregistered %s", c->shown_url, id);
    } else {
        char why[COORD_ERROR_MAX] = "out of memory";
        if (reply)
            lmc_fleet_describe_failure("DELETE /instances", reply, why, sizeof why);
        LMC_WARN("coordinator %s: deregistration of %s failed (%s); it will time out there",
                 c->shown_url, id, why);
    }
    free(reply);
}
