/* Handlers of the /api/kv endpoints (http_kv.c). */
#ifndef LMC_HTTP_HTTP_KV_H
#define LMC_HTTP_HTTP_KV_H

#include "http/http_internal.h"

void lmc_http_kv_store(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
void lmc_http_kv_retrieve(const lmc_http_request *req, lmc_http_reply *out, const char *arg);
void lmc_http_kv_lookup(const lmc_http_request *req, lmc_http_reply *out, const char *arg);

#endif
