/* Prefetch controller (docs/l2.md, "Prefetch (LOOKUP)"): extends a
 * LOOKUP's L1 hit run with
 * objects loaded from L2.
 *
 * Per request, on the controller thread only:
 *   LOOKUP  lookup-and-lock on every adapter in parallel;
 *   plan    each key goes to the lowest-index adapter that has it; keep the
 *           leading run of whole units; WRITE leases on L1 staging (temporary unless
 *           retain) and trim to the leading run that reserved; unlock the
 *           L2 locks outside the plan; report the lookup hits;
 *   LOAD    one load task per adapter straight into the staging buffers;
 *   final   publish the leading loaded run as READ leases for the caller, give
 *           the rest back, unlock L2, report on_done.
 * A deadline (--l2-prefetch-load-timeout) turns outstanding work into
 * misses: the request is answered at once and stays as a "zombie" until
 * its late tasks arrive, so that locks are released and staging buffers an
 * adapter may still write into are freed only after it finished. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "obs/events.h"
#include "obs/log.h"
#include "storage/l2/l2_internal.h"

typedef struct part {         /* one adapter's share of a request */
    uint64_t lookup_id;       /* pending lookup task, 0: none */
    uint8_t *found;           /* n */
    lmc_object_key *keys;     /* plan keys this adapter loads */
    uint64_t *offsets, *sizes;
    size_t *idx;              /* their indices in the request */
    size_t m;
    uint64_t load_id;         /* pending load task, 0: none */
    double load_submitted_s;
} part;

typedef enum { PH_QUEUED, PH_LOOKUP, PH_LOAD, PH_ZOMBIE } phase;

typedef struct preq {
    lmc_l2_prefetch_request r; /* r.keys points at keys */
    lmc_object_key *keys;     /* copies holding their names once keys_held */
    bool keys_held;
    uint64_t *sizes;
    lmc_lease *leases;        /* WRITE leases of the plan's staging buffers */
    uint8_t *loaded;
    size_t plan_n;
    int64_t deadline_ms;      /* 0: none */
    phase ph;
    part *parts;
    struct preq *next;
} preq;

struct lmc_l2_prefetch_ctl {
    lmc_storage_manager *sm;
    lmc_l2_adapter *const *ad;
    size_t na;
    lmc_l2_prefetch_options o;
    pthread_mutex_t mu;       /* guards queue, queued, accepting */
    preq *queue, **queue_tail;
    size_t queued;
    bool accepting;
    int efd;
    pthread_t thread;
    bool running;
    atomic_bool stop;
    preq *active;             /* controller thread only (and stop/free after join) */
    size_t n_active;          /* LOOKUP or LOAD, not zombies */
    atomic_uint_fast64_t submitted, refused, completed, hit_units, l2_lookup_keys, loaded_keys,
        load_failed_keys, timeouts, l1_reserve_failed;
};

static void preq_free(preq *q, size_t na)
{
    for (size_t a = 0; q->parts && a < na; a++) {
        part *p = &q->parts[a];
        free(p->found);
        free(p->keys);
        free(p->offsets);
        free(p->sizes);
        free(p->idx);
    }
    free(q->parts);
    if (q->keys_held)
        lmc_keys_drop(q->keys, q->r.n);
    free(q->keys);
    free(q->sizes);
    free(q->leases);
    free(q->loaded);
    free(q);
}

static preq *preq_new(const lmc_l2_prefetch_request *r, size_t na, double timeout_s)
{
    preq *q = calloc(1, sizeof *q);
    size_t n = r->n ? r->n : 1;
    if (!q)
        return NULL;
    q->keys = malloc(n * sizeof *q->keys);
    q->sizes = malloc(n * sizeof *q->sizes);
    q->leases = calloc(n, sizeof *q->leases);
    q->loaded = calloc(n, 1);
    q->parts = calloc(na, sizeof *q->parts);
    for (size_t a = 0; q->parts && a < na; a++)
        if (!(q->parts[a].found = calloc(n, 1)))
            goto fail;
    if (!q->keys || !q->sizes || !q->leases || !q->loaded || !q->parts)
        goto fail;
    q->r = *r;
    memcpy(q->keys, r->keys, r->n * sizeof *q->keys);
    lmc_keys_hold(q->keys, r->n); /* the request may outlive the caller's keys */
    q->keys_held = true;
    q->r.keys = q->keys;
    for (size_t i = 0; i < r->n; i++)
        q->sizes[i] = r->unit_sizes ? r->unit_sizes[i % r->keys_per_unit] : r->object_size;
    q->r.unit_sizes = NULL;   /* q->sizes holds them from here on */
    if (timeout_s > 0)
        q->deadline_ms = lmc_l2_now_ms() + (int64_t)(timeout_s * 1000);
    return q;
fail:
    preq_free(q, na);
    return NULL;
}

static void wake(lmc_l2_prefetch_ctl *c)
{
    uint64_t one = 1;
    (void)!write(c->efd, &one, sizeof one);
}

int lmc_l2_prefetch_ctl_submit(lmc_l2_prefetch_ctl *c, const lmc_l2_prefetch_request *req)
{
    if (req->n == 0 || req->keys_per_unit == 0 || req->n < req->keys_per_unit)
        return -1;
    preq *q = preq_new(req, c->na, c->o.load_timeout_s);
    if (!q) {
        atomic_fetch_add(&c->refused, 1);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    bool ok = c->accepting;
    if (ok) {
        *c->queue_tail = q;
        c->queue_tail = &q->next;
        c->queued++;
    }
    pthread_mutex_unlock(&c->mu);
    if (!ok) {
        preq_free(q, c->na);
        atomic_fetch_add(&c->refused, 1);
        return -1;
    }
    atomic_fetch_add(&c->submitted, 1);
    wake(c);
    return 0;
}

/* ---- phases ------------------------------------------------------------ */

static void start_lookup(lmc_l2_prefetch_ctl *c, preq *q)
{
    q->ph = PH_LOOKUP;
    c->n_active++;
    atomic_fetch_add(&c->l2_lookup_keys, q->r.n);
    lmc_l2_publish_by_salt(c->sm, LMC_EVENT_L2_PREFETCH_LOOKUP, q->keys, q->r.n);
    for (size_t a = 0; a < c->na; a++)
        q->parts[a].lookup_id =
            lmc_l2_adapter_submit_lookup_and_lock(c->ad[a], q->keys, q->sizes, q->r.n);
}

/* Answers the request (exactly once) and leaves it a zombie. */
static void deliver(lmc_l2_prefetch_ctl *c, preq *q, size_t units)
{
    if (q->ph == PH_LOOKUP || q->ph == PH_LOAD)
        c->n_active--;
    q->ph = PH_ZOMBIE;
    atomic_fetch_add(&c->completed, 1);
    atomic_fetch_add(&c->hit_units, units);
    q->r.on_done(q->r.user, units);
}

/* owner[i] for the leading run of keys some adapter found; returns its
 * length trimmed to whole units. */
static size_t plan_prefix(lmc_l2_prefetch_ctl *c, preq *q, int *owner)
{
    size_t i = 0;
    for (; i < q->r.n; i++) {
        owner[i] = -1;
        for (size_t a = 0; a < c->na && owner[i] < 0; a++)
            if (q->parts[a].found[i])
                owner[i] = (int)a;
        if (owner[i] < 0)
            break;
    }
    return i / q->r.keys_per_unit * q->r.keys_per_unit;
}

/* Gives back the L2 locks of keys outside [0, plan_n) of each owner. */
static void unlock_outside_plan(lmc_l2_prefetch_ctl *c, preq *q, const int *owner,
                                lmc_object_key *scratch)
{
    for (size_t a = 0; a < c->na; a++) {
        size_t m = 0;
        for (size_t i = 0; i < q->r.n; i++)
            if (q->parts[a].found[i] && !(i < q->plan_n && owner[i] == (int)a))
                scratch[m++] = q->keys[i];
        lmc_l2_adapter_unlock(c->ad[a], scratch, m);
    }
}

/* Gives back the leases of q->keys[from..to) that are still held. */
static void give_back_range(lmc_l2_prefetch_ctl *c, preq *q, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (lmc_lease_held(&q->leases[i]))
            lmc_storage_manager_give_back(c->sm, &q->keys[i], &q->leases[i], 1);
}

/* Gives back the WRITE leases of the part's keys at request index >= from
 * (loads that will not be published). */
static void give_back_part(lmc_l2_prefetch_ctl *c, preq *q, const part *p, size_t from)
{
    for (size_t j = 0; j < p->m; j++)
        if (p->idx[j] >= from)
            give_back_range(c, q, p->idx[j], p->idx[j] + 1);
}

/* WRITE leases on staging for the plan; trims it to the leading reserved
 * units. */
static void reserve_plan(lmc_l2_prefetch_ctl *c, preq *q)
{
    lmc_l1_result *res = malloc(q->plan_n * sizeof *res);
    size_t ok = 0;
    /* Runs of one size in one call: objects of different sizes (several
     * object groups) take one call each. */
    bool failed = !res;
    for (size_t i = 0; !failed && i < q->plan_n;) {
        size_t j = i + 1;
        while (j < q->plan_n && q->sizes[j] == q->sizes[i])
            j++;
        failed = lmc_storage_manager_lease_write(c->sm, q->keys + i, j - i, q->sizes[i],
                                                 !(c->o.retain || q->r.retain),
                                                 LMC_L2_PREFETCH_TAG, q->leases + i,
                                                 res + i) != 0;
        i = j;
    }
    while (!failed && ok < q->plan_n && res[ok] == LMC_L1_SUCCESS)
        ok++;
    size_t keep = ok / q->r.keys_per_unit * q->r.keys_per_unit;
    if (keep < q->plan_n) {
        atomic_fetch_add(&c->l1_reserve_failed, q->plan_n - keep);
        lmc_l2_publish_prefetch_failure(c->sm, "l1_oom", &q->keys[keep], q->plan_n - keep);
    }
    give_back_range(c, q, keep, q->plan_n);
    q->plan_n = keep;
    free(res);
}

static int build_part(preq *q, part *p, const int *owner, int a)
{
    size_t m = 0;
    for (size_t i = 0; i < q->plan_n; i++)
        m += owner[i] == a;
    p->m = 0;
    if (m == 0)
        return 0;
    p->keys = malloc(m * sizeof *p->keys);
    p->offsets = malloc(m * sizeof *p->offsets);
    p->sizes = malloc(m * sizeof *p->sizes);
    p->idx = malloc(m * sizeof *p->idx);
    if (!p->keys || !p->offsets || !p->sizes || !p->idx)
        return -1;
    for (size_t i = 0; i < q->plan_n; i++) {
        if (owner[i] != a)
            continue;
        p->keys[p->m] = q->keys[i];
        p->offsets[p->m] = q->leases[i].offset;
        p->sizes[p->m] = q->sizes[i];
        p->idx[p->m++] = i;
    }
    return 0;
}

static void finalize(lmc_l2_prefetch_ctl *c, preq *q);

static void start_load(lmc_l2_prefetch_ctl *c, preq *q, const int *owner)
{
    q->ph = PH_LOAD;
    size_t used = 0;
    for (size_t a = 0; a < c->na; a++) {
        part *p = &q->parts[a];
        if (build_part(q, p, owner, (int)a) != 0)
            p->m = 0;   /* out of memory: its keys stay unloaded (misses) */
        if (!p->m)
            continue;
        p->load_submitted_s = lmc_l2_now_s();
        p->load_id = lmc_l2_adapter_submit_load(c->ad[a], p->keys, p->offsets, p->sizes, p->m);
        used += p->load_id != 0;
    }
    if (used && lmc_storage_manager_events_enabled(c->sm))
        lmc_storage_manager_publish(
            c->sm, LMC_EVENT_L2_PREFETCH_LOAD_SUBMITTED,
            json_pack("{s:I, s:o}", "adapters", (json_int_t)used, "by_salt",
                      lmc_storage_keys_by_salt(q->keys, q->plan_n)));
    finalize(c, q);   /* no-op while loads are pending */
}

/* Every lookup answered (or timed out): plan, reserve, report, load. */
static void plan(lmc_l2_prefetch_ctl *c, preq *q)
{
    int *owner = malloc(q->r.n * sizeof *owner);
    lmc_object_key *scratch = malloc(q->r.n * sizeof *scratch);
    if (!owner || !scratch) {
        q->plan_n = 0;
        if (scratch)
            unlock_outside_plan(c, q, owner, scratch);
    } else {
        q->plan_n = plan_prefix(c, q, owner);
        if (q->plan_n)
            reserve_plan(c, q);
        unlock_outside_plan(c, q, owner, scratch);
    }
    free(scratch);
    if (q->r.on_lookup_done)
        q->r.on_lookup_done(q->r.user, q->plan_n / q->r.keys_per_unit);
    if (q->plan_n == 0 || !owner)
        deliver(c, q, 0);
    else
        start_load(c, q, owner);
    free(owner);
}

static bool loads_pending(const lmc_l2_prefetch_ctl *c, const preq *q)
{
    for (size_t a = 0; a < c->na; a++)
        if (q->parts[a].load_id)
            return true;
    return false;
}

static bool tasks_pending(const lmc_l2_prefetch_ctl *c, const preq *q)
{
    for (size_t a = 0; a < c->na; a++)
        if (q->parts[a].load_id || q->parts[a].lookup_id)
            return true;
    return false;
}

static bool expired(const preq *q, int64_t now)
{
    return q->deadline_ms && now >= q->deadline_ms;
}

/* Publishes keys[0..good) as READ leases for the caller; returns the
 * leading published run in whole units (what is beyond it goes back). */
static size_t commit(lmc_l2_prefetch_ctl *c, preq *q, size_t good)
{
    lmc_l1_result *res = malloc((good ? good : 1) * sizeof *res);
    size_t s = 0;
    if (res && lmc_storage_manager_publish_writes(c->sm, q->keys, q->leases, good, q->r.readers,
                                                  res) == 0)
        while (s < good && res[s] == LMC_L1_SUCCESS)
            s++;
    size_t s2 = s / q->r.keys_per_unit * q->r.keys_per_unit;
    give_back_range(c, q, s2, good);
    if (q->r.leases)   /* the caller's from here on */
        memcpy(q->r.leases, q->leases, s2 * sizeof *q->leases);
    else
        give_back_range(c, q, 0, s2);
    free(res);
    return s2;
}

/* Ends the LOAD phase once every load answered, the deadline passed, or
 * `force` (shutdown).  Parts still loading are left to reap_late(). */
static void finalize_ex(lmc_l2_prefetch_ctl *c, preq *q, bool force)
{
    if (q->ph != PH_LOAD)
        return;
    bool late = expired(q, lmc_l2_now_ms());
    if (loads_pending(c, q) && !late && !force)
        return;
    if (loads_pending(c, q))
        atomic_fetch_add(&c->timeouts, 1);
    size_t good = 0;
    while (!force && good < q->plan_n && q->loaded[good])
        good++;
    good = good / q->r.keys_per_unit * q->r.keys_per_unit;
    size_t published = commit(c, q, good);
    lmc_l2_publish_by_salt(c->sm, LMC_EVENT_L2_PREFETCH_LOAD_COMPLETED, q->keys, published);
    for (size_t a = 0; a < c->na; a++) {
        part *p = &q->parts[a];
        if (p->load_id)
            continue;
        give_back_part(c, q, p, good);
        lmc_l2_adapter_unlock(c->ad[a], p->keys, p->m);
    }
    deliver(c, q, published / q->r.keys_per_unit);
}

static void finalize(lmc_l2_prefetch_ctl *c, preq *q)
{
    finalize_ex(c, q, false);
}

/* Lookup answers: recorded while planning is pending, else unlocked. */
static void poll_lookups(lmc_l2_prefetch_ctl *c, preq *q, uint8_t *scratch_bits,
                         lmc_object_key *scratch_keys)
{
    for (size_t a = 0; a < c->na; a++) {
        part *p = &q->parts[a];
        uint8_t *dst = q->ph == PH_LOOKUP ? p->found : scratch_bits;
        if (!p->lookup_id || !lmc_l2_adapter_query_lookup(c->ad[a], p->lookup_id, dst))
            continue;
        p->lookup_id = 0;
        if (dst == p->found)
            continue;
        size_t m = 0;
        for (size_t i = 0; i < q->r.n; i++)
            if (scratch_bits[i])
                scratch_keys[m++] = q->keys[i];
        lmc_l2_adapter_unlock(c->ad[a], scratch_keys, m);
    }
    if (q->ph != PH_LOOKUP)
        return;
    bool pending = false;
    for (size_t a = 0; a < c->na; a++)
        pending = pending || q->parts[a].lookup_id;
    if (pending && !expired(q, lmc_l2_now_ms()))
        return;
    if (pending)
        atomic_fetch_add(&c->timeouts, 1);
    plan(c, q);
}

/* One adapter's load answered while the request waits for it. */
static void record_load(lmc_l2_prefetch_ctl *c, preq *q, size_t a, const uint8_t *ok)
{
    part *p = &q->parts[a];
    uint64_t bytes = 0;
    size_t failed = 0, first_failed = 0;
    for (size_t j = 0; j < p->m; j++) {
        q->loaded[p->idx[j]] = ok[j];
        atomic_fetch_add(ok[j] ? &c->loaded_keys : &c->load_failed_keys, 1);
        if (ok[j])
            bytes += p->sizes[j];
        else if (failed++ == 0)
            first_failed = j;
    }
    if (bytes)
        lmc_l2_publish_task(c->sm, LMC_EVENT_L2_LOAD_TASK, c->ad[a], bytes,
                            lmc_l2_now_s() - p->load_submitted_s);
    if (failed)
        lmc_l2_publish_prefetch_failure(c->sm, "not_found", &p->keys[first_failed], failed);
}

/* Load answers: recorded while loading, else (zombie) the part's staging
 * is dropped and its L2 locks released now that the adapter is done. */
static void poll_loads(lmc_l2_prefetch_ctl *c, preq *q, uint8_t *scratch)
{
    for (size_t a = 0; a < c->na; a++) {
        part *p = &q->parts[a];
        if (!p->load_id || !lmc_l2_adapter_query_load(c->ad[a], p->load_id, scratch))
            continue;
        p->load_id = 0;
        if (q->ph == PH_LOAD) {
            record_load(c, q, a, scratch);
        } else {
            give_back_part(c, q, p, 0);
            lmc_l2_adapter_unlock(c->ad[a], p->keys, p->m);
        }
    }
    finalize(c, q);
}

static void admit(lmc_l2_prefetch_ctl *c)
{
    while (c->n_active < c->o.max_in_flight) {
        pthread_mutex_lock(&c->mu);
        preq *q = c->queue;
        if (q) {
            c->queue = q->next;
            if (!c->queue)
                c->queue_tail = &c->queue;
            c->queued--;
        }
        pthread_mutex_unlock(&c->mu);
        if (!q)
            return;
        q->next = c->active;
        c->active = q;
        start_lookup(c, q);
    }
}

static void step(lmc_l2_prefetch_ctl *c, preq *q)
{
    uint8_t *bits = malloc(q->r.n);
    lmc_object_key *keys = malloc(q->r.n * sizeof *keys);
    if (bits && keys) {   /* out of memory: retried on the next round */
        poll_lookups(c, q, bits, keys);
        poll_loads(c, q, bits);
    }
    free(bits);
    free(keys);
}

/* Frees answered requests that have no task left in any adapter. */
static void sweep(lmc_l2_prefetch_ctl *c)
{
    for (preq **pp = &c->active; *pp;) {
        preq *q = *pp;
        if (q->ph == PH_ZOMBIE && !tasks_pending(c, q)) {
            *pp = q->next;
            preq_free(q, c->na);
        } else {
            pp = &q->next;
        }
    }
}

static int poll_timeout(const lmc_l2_prefetch_ctl *c)
{
    int64_t now = lmc_l2_now_ms(), t = 500;
    for (const preq *q = c->active; q; q = q->next)
        if (q->deadline_ms && (q->ph == PH_LOOKUP || q->ph == PH_LOAD) &&
            q->deadline_ms - now < t)
            t = q->deadline_ms - now;
    return t < 0 ? 0 : (int)t;
}

static void *prefetch_main(void *arg)
{
    lmc_l2_prefetch_ctl *c = arg;
    size_t nfds = 1 + 2 * c->na;
    struct pollfd *fds = calloc(nfds, sizeof *fds);
    if (!fds)
        return NULL;
    fds[0] = (struct pollfd){.fd = c->efd, .events = POLLIN};
    for (size_t a = 0; a < c->na; a++) {
        fds[1 + 2 * a] = (struct pollfd){
            .fd = lmc_l2_adapter_event_fd(c->ad[a], LMC_L2_OP_LOOKUP), .events = POLLIN};
        fds[2 + 2 * a] = (struct pollfd){
            .fd = lmc_l2_adapter_event_fd(c->ad[a], LMC_L2_OP_LOAD), .events = POLLIN};
    }
    while (!atomic_load(&c->stop)) {
        poll(fds, nfds, poll_timeout(c));
        for (size_t i = 0; i < nfds; i++)
            lmc_l2_drain_fd(fds[i].fd);
        admit(c);
        for (preq *q = c->active; q; q = q->next)
            step(c, q);
        sweep(c);
    }
    free(fds);
    return NULL;
}

lmc_l2_prefetch_ctl *lmc_l2_prefetch_ctl_new(lmc_storage_manager *sm, lmc_l2_adapter *const *ad,
                                             size_t n_adapters,
                                             const lmc_l2_prefetch_options *o)
{
    lmc_l2_prefetch_ctl *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = (lmc_l2_prefetch_ctl){.sm = sm, .ad = ad, .na = n_adapters, .o = *o,
                               .accepting = true};
    if (c->o.max_in_flight == 0)
        c->o.max_in_flight = 1;
    c->queue_tail = &c->queue;
    pthread_mutex_init(&c->mu, NULL);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd < 0 || pthread_create(&c->thread, NULL, prefetch_main, c) != 0) {
        lmc_l2_prefetch_ctl_free(c);
        return NULL;
    }
    c->running = true;
    return c;
}

/* After the join only this thread touches the requests. */
void lmc_l2_prefetch_ctl_stop(lmc_l2_prefetch_ctl *c)
{
    pthread_mutex_lock(&c->mu);
    bool was = c->accepting;
    c->accepting = false;
    preq *queued = c->queue;
    c->queue = NULL;
    c->queue_tail = &c->queue;
    c->queued = 0;
    pthread_mutex_unlock(&c->mu);
    if (!was)
        return;
    atomic_store(&c->stop, true);
    wake(c);
    if (c->running)
        pthread_join(c->thread, NULL);
    c->running = false;
    while (queued) {
        preq *q = queued;
        queued = q->next;
        q->r.on_done(q->r.user, 0);
        preq_free(q, c->na);
    }
    for (preq *q = c->active; q; q = q->next) {
        if (q->ph == PH_LOOKUP)
            deliver(c, q, 0);   /* late lookups: the adapters close with their locks */
        else if (q->ph == PH_LOAD)
            finalize_ex(c, q, true);
    }
}

/* Runs after the adapters were closed: no task can write any more, so the
 * staging of loads that never answered can be dropped. */
void lmc_l2_prefetch_ctl_free(lmc_l2_prefetch_ctl *c)
{
    if (!c)
        return;
    lmc_l2_prefetch_ctl_stop(c);
    while (c->active) {
        preq *q = c->active;
        c->active = q->next;
        for (size_t a = 0; a < c->na; a++)
            if (q->parts[a].load_id)
                give_back_part(c, q, &q->parts[a], 0);
        preq_free(q, c->na);
    }
    if (c->efd >= 0)
        close(c->efd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

json_t *lmc_l2_prefetch_ctl_status(lmc_l2_prefetch_ctl *c)
{
    pthread_mutex_lock(&c->mu);
    size_t queued = c->queued;
    pthread_mutex_unlock(&c->mu);
    return json_pack("{s:b, s:s, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                     "is_healthy", 1, "policy", c->o.retain ? "retain" : "default",
                     "max_in_flight", (json_int_t)c->o.max_in_flight, "load_timeout_s",
                     c->o.load_timeout_s, "queued", (json_int_t)queued, "submitted",
                     (json_int_t)atomic_load(&c->submitted), "refused",
                     (json_int_t)atomic_load(&c->refused), "completed",
                     (json_int_t)atomic_load(&c->completed), "hit_chunks",
                     (json_int_t)atomic_load(&c->hit_units), "lookup_keys",
                     (json_int_t)atomic_load(&c->l2_lookup_keys), "loaded_keys",
                     (json_int_t)atomic_load(&c->loaded_keys), "load_failed_keys",
                     (json_int_t)atomic_load(&c->load_failed_keys), "timeouts",
                     (json_int_t)atomic_load(&c->timeouts), "l1_reserve_failed_keys",
                     (json_int_t)atomic_load(&c->l1_reserve_failed));
}
