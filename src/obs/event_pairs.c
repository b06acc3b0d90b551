#include "obs/event_pairs.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t slot_of(const char *key)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % LMC_EVENT_PAIRS_SLOTS;
}

void lmc_event_pairs_key(char *buf, const char *kind, const char *session, const char *device)
{
    snprintf(buf, LMC_EVENT_PAIRS_KEY, "%s|%s|%s", kind, session ? session : "",
             device ? device : "");
}

void lmc_event_pairs_put(lmc_event_pairs *p, const char *key, double start)
{
    lmc_event_pair_slot *s = &p->slots[slot_of(key)];
    snprintf(s->key, sizeof s->key, "%s", key);
    s->start = start;
}

bool lmc_event_pairs_take(lmc_event_pairs *p, const char *key, double *start)
{
    lmc_event_pair_slot *s = &p->slots[slot_of(key)];
    if (!s->key[0] || strncmp(s->key, key, sizeof s->key - 1) != 0)
        return false;
    *start = s->start;
    s->key[0] = '\0';
    return true;
}
