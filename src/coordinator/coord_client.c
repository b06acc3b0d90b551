/* Outbound HTTP calls to lmcached servers (docs/coordinator.md,
 * "Outbound calls"): libcurl, 30 s timeout, the server bearer token when
 * one is configured. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"

#define MAX_REPLY ((size_t)64 << 20)

typedef struct {
    char *buf;
    size_t len;
    bool overflow;
} sink;

static size_t on_data(char *data, size_t size, size_t n, void *user)
{
    sink *s = user;
    size_t bytes = size * n;
    if (s->overflow || bytes > MAX_REPLY - s->len) {
        s->overflow = true;
        return 0;
    }
    char *grown = realloc(s->buf, s->len + bytes + 1);
    if (!grown)
        return 0;
    memcpy(grown + s->len, data, bytes);
    s->buf = grown;
    s->len += bytes;
    s->buf[s->len] = '\0';
    return bytes;
}

static struct curl_slist *headers_for(const lmc_coord *co, bool json)
{
    struct curl_slist *h = NULL, *next;
    if (json && (next = curl_slist_append(h, "Content-Type: application/json")))
        h = next;
    if (co->cfg.server_auth_token[0]) {
        char auth[sizeof co->cfg.server_auth_token + 32];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", co->cfg.server_auth_token);
        if ((next = curl_slist_append(h, auth)))
            h = next;
    }
    return h;
}

long coordinator_call(lmc_coord *co, const char *method, const char *ip, int port, const char *path,
                const char *body, char **reply, char *err, size_t errlen)
{
    CURL *c = curl_easy_init();
    if (!c)
        return snprintf(err, errlen, "out of memory"), 0;
    char url[512];
    bool v6 = strchr(ip, ':') != NULL;
    snprintf(url, sizeof url, "http://%s%s%s:%d%s", v6 ? "[" : "", ip, v6 ? "]" : "", port, path);
    sink s = {0};
    struct curl_slist *h = headers_for(co, body != NULL);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, COORD_OUTBOUND_TIMEOUT_S);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    long status = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(err, errlen, "%s %s: %s", method, url,
                 s.overflow ? "reply larger than 64 MiB" : curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (reply && status)
        *reply = s.buf ? s.buf : strdup("");
    else
        free(s.buf);
    return status;
}
