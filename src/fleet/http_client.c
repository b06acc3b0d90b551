#include "fleet/http_client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

static size_t on_data(char *data, size_t size, size_t nmemb, void *user)
{
    lmc_fleet_reply *r = user;
    size_t n = size * nmemb;
    if (n > LMC_FLEET_MAX_REPLY - r->len) {
        r->too_large = true;
        return 0;   /* curl aborts the transfer: CURLE_WRITE_ERROR */
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    const atomic_bool *cancel = user;
    return cancel && atomic_load(cancel) ? 1 : 0;
}

static struct curl_slist *headers_for(const lmc_fleet_request *rq)
{
    struct curl_slist *h = NULL, *next;
    if (rq->body && (next = curl_slist_append(h, "Content-Type: application/json")))
        h = next;
    if (rq->auth_token) {
        char line[4200];   /* tokens are at most 4096 bytes (docs/configuration.md) */
        snprintf(line, sizeof line, "Authorization: Bearer %s", rq->auth_token);
        if ((next = curl_slist_append(h, line)))
            h = next;
        memset(line, 0, sizeof line);
    }
    return h;
}

static void set_options(CURL *c, const lmc_fleet_request *rq, lmc_fleet_reply *reply,
                        struct curl_slist *headers)
{
    long timeout_ms = (long)(rq->timeout_s * 1000.0);
    curl_easy_setopt(c, CURLOPT_URL, rq->url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, reply);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)rq->cancel);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (rq->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, rq->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
    } else if (strcmp(rq->method, "PUT") == 0 || strcmp(rq->method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
}

int lmc_fleet_http(const lmc_fleet_request *rq, lmc_fleet_reply *reply)
{
    reply->status = 0;
    reply->len = 0;
    reply->body[0] = '\0';
    reply->too_large = false;
    reply->timed_out = false;
    reply->error[0] = '\0';
    CURL *c = curl_easy_init();
    struct curl_slist *headers = c ? headers_for(rq) : NULL;
    if (!c) {
        snprintf(reply->error, sizeof reply->error, "cannot create an HTTP client");
        return -1;
    }
    set_options(c, rq, reply, headers);
    CURLcode rc = curl_easy_perform(c);
    reply->timed_out = rc == CURLE_OPERATION_TIMEDOUT;
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &reply->status);
    else if (reply->too_large)
        snprintf(reply->error, sizeof reply->error, "reply larger than %u bytes",
                 LMC_FLEET_MAX_REPLY);
    else
        snprintf(reply->error, sizeof reply->error, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK)
        reply->status = 0;
    return rc == CURLE_OK && reply->status > 0 ? 0 : -1;
}
