/* /cache/objects handlers (http_objects.c). */
#ifndef LMC_HTTP_HTTP_OBJECTS_H
#define LMC_HTTP_HTTP_OBJECTS_H

#include "http/http_internal.h"

void lmc_http_objects_list(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
void lmc_http_objects_remove(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
void lmc_http_checksums(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
void lmc_http_checksums_legacy(const lmc_http_request *req, lmc_http_reply *out,
                               const char *arg);
void lmc_http_prefetch_submit(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
/* arg: the route prefix ("/cache/prefetches/"); the request id follows it. */
void lmc_http_prefetch_query(const lmc_http_request *req, lmc_http_reply *out, const char *arg);

#endif
