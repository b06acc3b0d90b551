/* Quota endpoint handlers (http_quota.c); `prefix` is the route's path
 * prefix ("/quota/" or "/api/quota/"), the salt follows it. */
#ifndef LMC_HTTP_HTTP_QUOTA_H
#define LMC_HTTP_HTTP_QUOTA_H

#include "http/http_internal.h"

void lmc_http_quota_put(const lmc_http_request *req, lmc_http_reply *out, const char *prefix);
void lmc_http_quota_get(const lmc_http_request *req, lmc_http_reply *out, const char *prefix);
void lmc_http_quota_delete(const lmc_http_request *req, lmc_http_reply *out, const char *prefix);
void lmc_http_quota_list(const lmc_http_request *req, lmc_http_reply *out, const char *prefix);

#endif
