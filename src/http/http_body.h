/* Request bodies under two bounds (docs/http.md, "Request bodies"): the
 * route's own limit, and the upload budget shared by every connection,
 * reserved as bytes arrive and released when the request ends.  No
 * libmicrohttpd here: http_server.c feeds the upload chunks in. */
#ifndef LMC_HTTP_HTTP_BODY_H
#define LMC_HTTP_HTTP_BODY_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http_internal.h"

/* Bytes read and thrown away after a refusal before the connection is
 * dropped unanswered: libmicrohttpd 0.9.75 can only answer once the whole
 * body has been read, and a client must not hold a worker forever. */
#define LMC_HTTP_DRAIN_LIMIT ((size_t)1 << 20)

typedef struct {
    char *body;        /* NUL-terminated; NULL until the first byte */
    size_t len, cap;
    size_t expected;   /* declared Content-Length; 0 when chunked or absent */
    size_t limit;      /* this route's limit, already capped by the budget */
    size_t held;       /* bytes of the upload budget this body holds: len,
                        * or its declared length once reserved */
    size_t discarded;  /* bytes thrown away since the refusal */
    unsigned refusal;  /* 0, or the answer once the body has been read: 413, 503 */
} lmc_http_body_state;

/* Reserves n bytes of st's budget; false (nothing reserved) when they do
 * not fit. */
bool lmc_http_budget_reserve(lmc_http_stats *st, size_t n);
void lmc_http_budget_release(lmc_http_stats *st, size_t n);
/* Bytes of the budget not reserved now (a snapshot). */
size_t lmc_http_budget_free(const lmc_http_stats *st);

/* One upload chunk.  Past the limit the body is refused 413, past the
 * budget (or out of memory) 503: it is freed and its reservation released
 * at once, and later chunks are discarded.  Returns false once more than
 * LMC_HTTP_DRAIN_LIMIT bytes were discarded: drop the connection. */
bool lmc_http_body_take(lmc_http_body_state *b, lmc_http_stats *st, const char *data,
                        size_t n);
/* Frees the body, releases its reservation and records `status` (413 or
 * 503) as the answer. */
void lmc_http_body_refuse(lmc_http_body_state *b, lmc_http_stats *st, unsigned status);
/* Frees the body and releases its reservation (end of the request). */
void lmc_http_body_release(lmc_http_body_state *b, lmc_http_stats *st);

#endif
