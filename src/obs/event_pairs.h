/* A fixed-size table pairing *_START events with their *_END: put() the
 * start time under a key (e.g. "STORE|<session>|<device>"), take() it back
 * at the end.  Lossy by design: a key hashes to one of LMC_EVENT_PAIRS_SLOTS
 * slots and a later put() to a taken slot overwrites it (that START then
 * goes unpaired).  Not thread-safe: one owner (the bus drain thread). */
#ifndef LMC_OBS_EVENT_PAIRS_H
#define LMC_OBS_EVENT_PAIRS_H

#include <stdbool.h>

#define LMC_EVENT_PAIRS_SLOTS 1024
#define LMC_EVENT_PAIRS_KEY 120

typedef struct {
    char key[LMC_EVENT_PAIRS_KEY]; /* "" = free */
    double start;
} lmc_event_pair_slot;

typedef struct {
    lmc_event_pair_slot slots[LMC_EVENT_PAIRS_SLOTS];
} lmc_event_pairs;

/* Keys longer than LMC_EVENT_PAIRS_KEY - 1 are truncated. */
void lmc_event_pairs_put(lmc_event_pairs *p, const char *key, double start);
/* True and *start when `key` was put and not taken yet (frees the slot). */
bool lmc_event_pairs_take(lmc_event_pairs *p, const char *key, double *start);
/* Builds "<kind>|<session>|<device>" into buf. */
void lmc_event_pairs_key(char *buf, const char *kind, const char *session, const char *device);

#endif
