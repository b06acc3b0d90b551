#include "storage/quota.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Tenants per server are few: a JSON object under a mutex is enough, and it
 * is already the shape capture() returns. */
struct lmc_quotas {
    pthread_mutex_t lock;
    json_t *limits;            /* salt -> integer bytes */
    bool has_default;
    uint64_t default_bytes;
};

lmc_quotas *lmc_quotas_new(void)
{
    lmc_quotas *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->limits = json_object();
    if (!q->limits) {
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    return q;
}

void lmc_quotas_free(lmc_quotas *q)
{
    if (!q)
        return;
    json_decref(q->limits);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

int lmc_quotas_set(lmc_quotas *q, const char *salt, uint64_t limit_bytes)
{
    pthread_mutex_lock(&q->lock);
    int rc = json_object_set_new(q->limits, salt, json_integer((json_int_t)limit_bytes));
    pthread_mutex_unlock(&q->lock);
    return rc;
}

bool lmc_quotas_delete(lmc_quotas *q, const char *salt)
{
    pthread_mutex_lock(&q->lock);
    bool removed = json_object_del(q->limits, salt) == 0;
    pthread_mutex_unlock(&q->lock);
    return removed;
}

bool lmc_quotas_has(lmc_quotas *q, const char *salt)
{
    pthread_mutex_lock(&q->lock);
    bool has = json_object_get(q->limits, salt) != NULL;
    pthread_mutex_unlock(&q->lock);
    return has;
}

uint64_t lmc_quotas_get_limit(lmc_quotas *q, const char *salt)
{
    pthread_mutex_lock(&q->lock);
    uint64_t v = (uint64_t)json_integer_value(json_object_get(q->limits, salt));
    pthread_mutex_unlock(&q->lock);
    return v;
}

void lmc_quotas_set_default(lmc_quotas *q, bool has_default, uint64_t limit_bytes)
{
    pthread_mutex_lock(&q->lock);
    q->has_default = has_default;
    q->default_bytes = limit_bytes;
    pthread_mutex_unlock(&q->lock);
}

bool lmc_quotas_effective_limit(lmc_quotas *q, const char *salt, uint64_t *limit_bytes)
{
    pthread_mutex_lock(&q->lock);
    json_t *v = json_object_get(q->limits, salt);
    bool limited = v || q->has_default;
    *limit_bytes = v ? (uint64_t)json_integer_value(v) : q->default_bytes;
    pthread_mutex_unlock(&q->lock);
    return limited;
}

json_t *lmc_quotas_capture(lmc_quotas *q)
{
    pthread_mutex_lock(&q->lock);
    json_t *snap = json_pack("{s:O, s:o}", "limits", q->limits, "default_limit_bytes",
                             q->has_default ? json_integer((json_int_t)q->default_bytes)
                                            : json_null());
    json_t *copy = json_deep_copy(snap); /* detached from the live registry */
    json_decref(snap);
    pthread_mutex_unlock(&q->lock);
    return copy;
}

int lmc_quotas_restore(lmc_quotas *q, const json_t *snapshot)
{
    json_t *limits = json_object_get(snapshot, "limits");
    json_t *def = json_object_get(snapshot, "default_limit_bytes");
    const char *salt;
    json_t *v;
    if (!json_is_object(limits) || (def && !json_is_null(def) && !json_is_integer(def)))
        return -1;
    json_object_foreach(limits, salt, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return -1;
    }
    json_t *copy = json_deep_copy(limits);
    if (!copy)
        return -1;
    pthread_mutex_lock(&q->lock);
    json_decref(q->limits);
    q->limits = copy;
    q->has_default = json_is_integer(def);
    q->default_bytes = q->has_default ? (uint64_t)json_integer_value(def) : 0;
    pthread_mutex_unlock(&q->lock);
    return 0;
}
