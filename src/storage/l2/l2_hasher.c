/* Checksum pool of the fs backend (issue 18; docs/l2.md, "fs").  One mutex
 * guards the queue and every job's state; hashing runs outside it. */
#include "storage/l2/l2_hasher.h"

#include <stddef.h>
#include <stdlib.h>

#include "blake3.h"

_Static_assert(sizeof(blake3_hasher) <= sizeof(((lmc_l2_inline_hash *)0)->state),
               "lmc_l2_inline_hash holds a blake3_hasher");
_Static_assert(_Alignof(blake3_hasher) <= _Alignof(lmc_l2_inline_hash), "blake3_hasher alignment");

void lmc_l2_inline_init(lmc_l2_inline_hash *ih)
{
    blake3_hasher_init((blake3_hasher *)(void *)ih->state);
}

void lmc_l2_inline_update(lmc_l2_inline_hash *ih, const uint8_t *p, size_t n)
{
    blake3_hasher_update((blake3_hasher *)(void *)ih->state, p, n);
}

void lmc_l2_inline_final(lmc_l2_inline_hash *ih, uint8_t digest[LMC_L2_DIGEST_LEN])
{
    blake3_hasher_finalize((blake3_hasher *)(void *)ih->state, digest, LMC_L2_DIGEST_LEN);
}

struct lmc_l2_hasher {
    pthread_mutex_t mu;
    pthread_cond_t work;
    lmc_l2_hash_job *head, *tail;   /* queued jobs no thread has taken */
    bool stop;
    size_t n;
    pthread_t threads[];
};

/* Hashes the ready bytes of `j` in order until all are hashed or the job is
 * aborted; called and returns with h->mu held.  After `done` is set the
 * caller may free the job, so nothing touches it once h->mu is released. */
static void hash_job_locked(lmc_l2_hasher *h, lmc_l2_hash_job *j)
{
    blake3_hasher b;
    uint64_t hashed = 0;
    blake3_hasher_init(&b);
    while (!j->aborted && hashed < j->size) {
        if (hashed == j->ready) {
            pthread_cond_wait(&j->cv, &h->mu);
            continue;
        }
        uint64_t to = j->ready;
        pthread_mutex_unlock(&h->mu);
        blake3_hasher_update(&b, j->data + hashed, to - hashed);
        pthread_mutex_lock(&h->mu);
        hashed = to;
    }
    if (!j->aborted)
        blake3_hasher_finalize(&b, j->digest, LMC_L2_DIGEST_LEN);
    j->done = true;
    pthread_cond_broadcast(&j->cv);
}

static void *hasher_main(void *arg)
{
    lmc_l2_hasher *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        lmc_l2_hash_job *j = h->head;
        if (!j) {
            pthread_cond_wait(&h->work, &h->mu);
            continue;
        }
        h->head = j->next;
        if (!h->head)
            h->tail = NULL;
        j->taken = true;
        hash_job_locked(h, j);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* BLAKE3 detects the CPU's features lazily, into a global of its own, on
 * its first compression.  Doing one here, before the pool's threads (and
 * the adapter's workers) exist, keeps them from racing to write it. */
static void detect_blake3_features(void)
{
    blake3_hasher b;
    uint8_t byte = 0, out[BLAKE3_OUT_LEN];
    blake3_hasher_init(&b);
    blake3_hasher_update(&b, &byte, 1);
    blake3_hasher_finalize(&b, out, sizeof out);
}

lmc_l2_hasher *lmc_l2_hasher_new(size_t threads)
{
    detect_blake3_features();
    lmc_l2_hasher *h = calloc(1, sizeof *h + threads * sizeof h->threads[0]);
    if (!h)
        return NULL;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->work, NULL);
    for (; h->n < threads; h->n++)
        if (pthread_create(&h->threads[h->n], NULL, hasher_main, h) != 0)
            break;
    if (h->n == 0) {
        lmc_l2_hasher_free(h);
        return NULL;
    }
    return h;
}

void lmc_l2_hasher_free(lmc_l2_hasher *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->work);
    pthread_mutex_unlock(&h->mu);
    for (size_t i = 0; i < h->n; i++)
        pthread_join(h->threads[i], NULL);
    pthread_cond_destroy(&h->work);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void lmc_l2_hash_start(lmc_l2_hasher *h, lmc_l2_hash_job *j, const uint8_t *data,
                       uint64_t size, uint64_t ready)
{
    *j = (lmc_l2_hash_job){.data = data, .size = size, .ready = ready};
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&h->mu);
    if (h->tail)
        h->tail->next = j;
    else
        h->head = j;
    h->tail = j;
    pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
}

void lmc_l2_hash_advance(lmc_l2_hasher *h, lmc_l2_hash_job *j, uint64_t ready)
{
    pthread_mutex_lock(&h->mu);
    j->ready = ready;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Takes `j` out of the queue if no thread has it yet; h->mu held. */
static bool unqueue_locked(lmc_l2_hasher *h, lmc_l2_hash_job *j)
{
    if (j->taken)
        return false;
    lmc_l2_hash_job **p = &h->head, *prev = NULL;
    while (*p != j)
        prev = *p, p = &(*p)->next;
    *p = j->next;
    if (h->tail == j)
        h->tail = prev;
    j->taken = true;
    return true;
}

static void wait_done_locked(lmc_l2_hasher *h, lmc_l2_hash_job *j)
{
    while (!j->done)
        pthread_cond_wait(&j->cv, &h->mu);
}

void lmc_l2_hash_finish(lmc_l2_hasher *h, lmc_l2_hash_job *j,
                        uint8_t digest[LMC_L2_DIGEST_LEN])
{
    pthread_mutex_lock(&h->mu);
    j->ready = j->size;
    if (unqueue_locked(h, j)) {
        hash_job_locked(h, j);   /* every pool thread is busy: hash it here */
    } else {
        pthread_cond_broadcast(&j->cv);
        wait_done_locked(h, j);
    }
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < LMC_L2_DIGEST_LEN; i++)
        digest[i] = j->digest[i];
    pthread_cond_destroy(&j->cv);
}

void lmc_l2_hash_abort(lmc_l2_hasher *h, lmc_l2_hash_job *j)
{
    pthread_mutex_lock(&h->mu);
    j->aborted = true;
    if (!unqueue_locked(h, j)) {
        pthread_cond_broadcast(&j->cv);
        wait_done_locked(h, j);
    }
    pthread_mutex_unlock(&h->mu);
    pthread_cond_destroy(&j->cv);
}
