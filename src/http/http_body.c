/* Request bodies under a route limit and the shared upload budget
 * (http_body.h). */
#include "http/http_body.h"

#include <stdlib.h>
#include <string.h>

bool lmc_http_budget_reserve(lmc_http_stats *st, size_t n)
{
    size_t held = atomic_load(&st->upload_held);
    do {
        if (held > st->upload_budget || n > st->upload_budget - held)
            return false;
    } while (!atomic_compare_exchange_weak(&st->upload_held, &held, held + n));
    return true;
}

void lmc_http_budget_release(lmc_http_stats *st, size_t n)
{
    atomic_fetch_sub(&st->upload_held, n);
}

size_t lmc_http_budget_free(const lmc_http_stats *st)
{
    size_t held = atomic_load(&st->upload_held);
    return held < st->upload_budget ? st->upload_budget - held : 0;
}

void lmc_http_body_release(lmc_http_body_state *b, lmc_http_stats *st)
{
    free(b->body);
    b->body = NULL;
    b->len = b->cap = 0;
    lmc_http_budget_release(st, b->held);
    b->held = 0;
}

void lmc_http_body_refuse(lmc_http_body_state *b, lmc_http_stats *st, unsigned status)
{
    lmc_http_body_release(b, st);
    b->refusal = status;
    atomic_fetch_add(status == 413 ? &st->refused_too_large : &st->refused_over_budget, 1);
}

/* A declared length is allocated once; a chunked body doubles, never
 * past its limit. */
static bool grow(lmc_http_body_state *b, size_t need)
{
    if (need <= b->cap)
        return true;
    size_t cap = b->expected >= need ? b->expected + 1 : b->cap ? b->cap : 4096;
    while (cap < need)
        cap = cap > b->limit / 2 ? b->limit + 1 : cap * 2;
    char *grown = realloc(b->body, cap);
    if (!grown)
        return false;
    b->body = grown;
    b->cap = cap;
    return true;
}

bool lmc_http_body_take(lmc_http_body_state *b, lmc_http_stats *st, const char *data,
                        size_t n)
{
    if (b->refusal) {
        b->discarded += n;
        return b->discarded <= LMC_HTTP_DRAIN_LIMIT;
    }
    if (n > b->limit - b->len) {
        lmc_http_body_refuse(b, st, 413);
        return lmc_http_body_take(b, st, data, n);
    }
    /* Bytes reserved from the headers on (lmc_http_options.reserve_declared)
     * are not reserved again. */
    size_t more = b->len + n > b->held ? b->len + n - b->held : 0;
    if (!lmc_http_budget_reserve(st, more)) {
        lmc_http_body_refuse(b, st, 503);
        return lmc_http_body_take(b, st, data, n);
    }
    b->held += more;
    if (!grow(b, b->len + n + 1)) {
        lmc_http_body_refuse(b, st, 503);
        return true;
    }
    memcpy(b->body + b->len, data, n);
    b->len += n;
    b->body[b->len] = '\0';
    return true;
}
