/* Lifecycle sampling of L1 objects (docs/metrics.md): the sampler picks an
 * object once, when it becomes resident; every read lease or touch of a
 * picked object records the gap since the previous one for the reuse-gap
 * histogram. */
#include <string.h>

#include "storage/l1/l1_internal.h"

/* Under the mutex: a read or touch of a resident object.  When the buffer
 * is full the gap is dropped (it is a sample anyway). */
void lmc_l1_note_touch(lmc_l1_manager *m, l1_entry *e, int64_t now)
{
    if (e->object.sampled && m->num_reuse_gaps < LMC_L1_REUSE_GAPS_MAX)
        m->reuse_gaps_s[m->num_reuse_gaps++] = (double)(now - e->object.touched_ms) / 1000.0;
    e->object.touched_ms = now;
}

void lmc_l1_manager_set_sampler(lmc_l1_manager *m, lmc_l1_sampler_fn fn, void *user)
{
    pthread_mutex_lock(&m->mutex);
    m->sampler = fn;
    m->sampler_user = user;
    pthread_mutex_unlock(&m->mutex);
}

size_t lmc_l1_manager_take_reuse_gaps(lmc_l1_manager *m, double *gaps_s, size_t cap)
{
    pthread_mutex_lock(&m->mutex);
    size_t n = m->num_reuse_gaps < cap ? m->num_reuse_gaps : cap;
    memcpy(gaps_s, m->reuse_gaps_s, n * sizeof *gaps_s);
    memmove(m->reuse_gaps_s, m->reuse_gaps_s + n, (m->num_reuse_gaps - n) * sizeof *gaps_s);
    m->num_reuse_gaps -= n;
    pthread_mutex_unlock(&m->mutex);
    return n;
}
