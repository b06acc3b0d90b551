#include "storage/storage_manager.h"
#include "storage/storage_metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obs/events.h"
#include "obs/log.h"
#include "storage/l1/l1_eviction.h"
#include "storage/storage_events.h"
#include "storage/storage_manager_testing.h"
#include "storage/storage_telemetry.h"
#include "storage/storage_tier.h"
#include "storage/storage_trace.h"

#define LAZY_COMMIT_GRANULE (64ull << 20)   /* initial commit rounds up to 64 MiB */
#define FALLBACK_COMMIT_GRANULE (4ull << 20) /* steps of a start-up commit /dev/shm cuts short */
/* Committed before the server answers; the pre-fault commits the rest of
 * the initial size behind it in steps (docs/storage.md, "Pre-fault"). */
#define START_COMMIT (4ull << 20)
#define PREFAULT_STEP (64ull << 20)
/* The longest a write waits for the pre-fault to commit room for it. */
#define PREFAULT_WAIT_MS 10000

struct lmc_storage_manager {
    lmc_storage_options opts;
    lmc_l1_arena *arena;
    lmc_l1_manager *l1;
    lmc_l1_eviction *eviction;
    pthread_mutex_t listeners_mutex;    /* guards listeners[] */
    lmc_storage_listener listeners[LMC_STORAGE_MAX_LISTENERS];
    size_t num_listeners;
    pthread_mutex_t grower_mutex;       /* guards grower_* */
    pthread_cond_t grower_wake;
    pthread_t grower;
    bool grower_running;
    bool grower_stop;
    /* Why /dev/shm backs less than the configured L1, "" while it backs
     * all of it so far (grower_mutex): /status says so (docs/storage.md). */
    char shm_short[512];
    /* The pre-fault (docs/storage.md, "Pre-fault"): the initial commit the
     * committer thread reaches without pauses, and its progress
     * (grower_mutex). */
    uint64_t initial_bytes;
    atomic_bool prefaulting;              /* writes may wait for room */
    uint64_t populated_bytes;
    double prefault_started, prefault_seconds;   /* monotonic s; seconds once over */
    const char *prefault_state;           /* "running", "done", "short", "stopped" */
    lmc_l1_populate_method populate_method;
    const lmc_storage_tier_ops *l2_ops;   /* set once before concurrent use */
    void *l2;
    lmc_quotas *quotas;                   /* per-salt L2 limits (docs/l2.md) */
    lmc_storage_telemetry *telemetry;     /* events for the metrics */
    /* docs/fleet.md and docs/kv_events.md; a free slot is NULL */
    _Atomic(const lmc_l2_placement_sink *) placement_sinks[LMC_STORAGE_MAX_PLACEMENT_SINKS];
    lmc_storage_trace *trace;             /* --trace-level storage, else NULL */
};

/* ---- listeners --------------------------------------------------------- */

typedef void (*storage_callback)(void *user, const lmc_object_key *keys, size_t n);

static storage_callback pick_callback(const lmc_storage_listener *l, lmc_l1_event_kind kind)
{
    switch (kind) {
    case LMC_L1_EVENT_WRITE_FINISHED: return l->on_written;
    case LMC_L1_EVENT_DELETED: return l->on_deleted;
    case LMC_L1_EVENT_ACCESSED: return l->on_accessed;
    default: return NULL;
    }
}

/* L1 listener: runs with no L1 lock held; fans out to a snapshot. */
static void fan_out(void *user, lmc_l1_event_kind kind, const lmc_object_key *keys, size_t n)
{
    lmc_storage_manager *sm = user;
    lmc_storage_listener snapshot[LMC_STORAGE_MAX_LISTENERS];
    lmc_storage_telemetry_on_l1_event(sm->telemetry, kind, keys, n);
    pthread_mutex_lock(&sm->listeners_mutex);
    size_t count = sm->num_listeners;
    memcpy(snapshot, sm->listeners, count * sizeof(*snapshot));
    pthread_mutex_unlock(&sm->listeners_mutex);
    for (size_t i = 0; i < count; i++) {
        storage_callback cb = pick_callback(&snapshot[i], kind);
        if (cb)
            cb(snapshot[i].user, keys, n);
    }
}

int lmc_storage_manager_add_listener(lmc_storage_manager *sm, const lmc_storage_listener *l)
{
    int rc = -1;
    pthread_mutex_lock(&sm->listeners_mutex);
    if (sm->num_listeners < LMC_STORAGE_MAX_LISTENERS) {
        sm->listeners[sm->num_listeners++] = *l;
        rc = 0;
    }
    pthread_mutex_unlock(&sm->listeners_mutex);
    return rc;
}

void lmc_storage_manager_remove_listener(lmc_storage_manager *sm, const lmc_storage_listener *l)
{
    pthread_mutex_lock(&sm->listeners_mutex);
    for (size_t i = 0; i < sm->num_listeners; i++) {
        lmc_storage_listener *x = &sm->listeners[i];
        if (x->user == l->user && x->on_written == l->on_written &&
            x->on_deleted == l->on_deleted && x->on_accessed == l->on_accessed) {
            memmove(x, x + 1, (sm->num_listeners - i - 1) * sizeof *x);
            sm->num_listeners--;
            break;
        }
    }
    pthread_mutex_unlock(&sm->listeners_mutex);
}

/* ---- lazy growth ------------------------------------------------------- */

static bool grower_sleep(lmc_storage_manager *sm, uint32_t ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&sm->grower_mutex);
    int rc = 0;
    while (!sm->grower_stop && ms > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&sm->grower_wake, &sm->grower_mutex, &deadline);
    bool stop = sm->grower_stop;
    pthread_mutex_unlock(&sm->grower_mutex);
    return !stop;
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool grower_stopping(lmc_storage_manager *sm)
{
    pthread_mutex_lock(&sm->grower_mutex);
    bool stop = sm->grower_stop;
    pthread_mutex_unlock(&sm->grower_mutex);
    return stop;
}

/* Backs [committed, committed + step) and hands it to the allocator, after
 * faulting it into this process's mapping: the server's first write to the
 * range then takes no page fault.  The new committed size, or `committed`
 * with the reason in `err` when /dev/shm cannot hold the range. */
static uint64_t commit_step(lmc_storage_manager *sm, uint64_t committed, uint64_t step,
                            char *err, size_t errlen)
{
    if (lmc_l1_arena_commit(sm->arena, committed, step, err, errlen) != 0)
        return committed;
    lmc_l1_populate_method how = lmc_l1_arena_populate(sm->arena, committed, step);
    uint64_t next = lmc_l1_manager_grow(sm->l1, step);
    pthread_mutex_lock(&sm->grower_mutex);
    sm->populate_method = how;
    sm->populated_bytes = next;
    pthread_mutex_unlock(&sm->grower_mutex);
    return next;
}

static void record_short(lmc_storage_manager *sm, const char *why)
{
    pthread_mutex_lock(&sm->grower_mutex);
    snprintf(sm->shm_short, sizeof sm->shm_short, "%s", why);
    pthread_mutex_unlock(&sm->grower_mutex);
}

/* Commits the initial size without pauses, lowest offsets first: steps of
 * PREFAULT_STEP, then, where /dev/shm runs short, of FALLBACK_COMMIT_GRANULE
 * until not even that fits (docs/storage.md, "A small /dev/shm"). */
static uint64_t prefault(lmc_storage_manager *sm, uint64_t committed, const char **state)
{
    uint64_t target = sm->initial_bytes, granule = PREFAULT_STEP;
    char why[512] = "";
    *state = "done";
    while (committed < target) {
        if (grower_stopping(sm)) {
            *state = "stopped";
            return committed;
        }
        uint64_t step = target - committed < granule ? target - committed : granule;
        char err[512];
        uint64_t next = commit_step(sm, committed, step, err, sizeof err);
        if (next != committed) {
            committed = next;
            continue;
        }
        if (!why[0])
            snprintf(why, sizeof why, "%s", err);
        uint64_t fallback = FALLBACK_COMMIT_GRANULE > sm->opts.l1_align_bytes
                                ? FALLBACK_COMMIT_GRANULE
                                : sm->opts.l1_align_bytes;
        if (granule == fallback || step <= fallback) {
            *state = "short";
            record_short(sm, why);
            LMC_ERROR("L1: /dev/shm can back only %llu of the %llu bytes to commit at start; "
                      "serving with %llu (%s); enlarge /dev/shm (docker: --shm-size) or lower "
                      "%s", (unsigned long long)committed, (unsigned long long)target,
                      (unsigned long long)committed, why,
                      target < lmc_l1_arena_describe(sm->arena)->size ? "--l1-init-size-gb"
                                                                       : "--l1-size-gb");
            return committed;
        }
        granule = fallback;
    }
    return committed;
}

/* The line an operator reads for the L1's size: the bytes it can use now
 * when /dev/shm cut the start short, not only the bytes asked for. */
static void log_l1_ready(lmc_storage_manager *sm)
{
    const lmc_l1_arena_desc *d = lmc_l1_arena_describe(sm->arena);
    lmc_l1_stats st;
    lmc_l1_manager_stats(sm->l1, &st);
    const char *where = d->shm_name[0] ? "shm " : "private memory";
    char why[sizeof sm->shm_short];
    if (lmc_storage_manager_l1_short(sm, why, sizeof why)) /* the grower may write it */
        LMC_WARN("L1: %llu bytes configured but only %llu usable (%s%s, /dev/shm is too small: "
                 "enlarge it, docker: --shm-size), eviction %s",
                 (unsigned long long)d->size, (unsigned long long)st.committed_bytes, where,
                 d->shm_name, sm->opts.eviction_policy);
    else
        LMC_INFO("L1: %llu bytes (%s%s, %llu of /dev/shm kept free), eviction %s",
                 (unsigned long long)d->size, where, d->shm_name,
                 (unsigned long long)d->shm_reserve, sm->opts.eviction_policy);
}

/* The committer thread: the pre-fault of the initial size, then lazy
 * growth of the rest step by step.  Each range is backed by the arena
 * (tmpfs pages now; pinned memory in a CUDA build) and faulted in before
 * the allocator may hand it out.  A /dev/shm that fills up ends it. */
static void *grower_main(void *arg)
{
    lmc_storage_manager *sm = arg;
    lmc_l1_stats st;
    lmc_l1_manager_stats(sm->l1, &st);
    uint64_t committed = st.committed_bytes;
    lmc_l1_populate_method how = lmc_l1_arena_populate(sm->arena, 0, committed);
    pthread_mutex_lock(&sm->grower_mutex);
    sm->populate_method = how;
    sm->populated_bytes = committed;
    pthread_mutex_unlock(&sm->grower_mutex);
    const char *state;
    committed = prefault(sm, committed, &state);
    atomic_store(&sm->prefaulting, false);
    lmc_l1_manager_set_commit_target(sm->l1, 0);   /* wakes the writes that wait */
    pthread_mutex_lock(&sm->grower_mutex);
    sm->prefault_state = state;
    sm->prefault_seconds = monotonic_s() - sm->prefault_started;
    pthread_cond_broadcast(&sm->grower_wake);   /* lmc_storage_manager_wait_prefault */
    pthread_mutex_unlock(&sm->grower_mutex);
    LMC_INFO("L1: pre-fault %s: %llu bytes committed and faulted in, %.3f s", state,
             (unsigned long long)committed, sm->prefault_seconds);
    log_l1_ready(sm);   /* now that the size it serves with is known */
    while (committed < st.configured_bytes && grower_sleep(sm, sm->opts.lazy_grow_interval_ms)) {
        uint64_t step = st.configured_bytes - committed;
        if (step > sm->opts.lazy_grow_step_bytes)
            step = sm->opts.lazy_grow_step_bytes;
        char err[512];
        uint64_t next = commit_step(sm, committed, step, err, sizeof err);
        if (next == committed) {
            LMC_ERROR("L1: growth stopped at %llu of %llu bytes: %s",
                      (unsigned long long)committed, (unsigned long long)st.configured_bytes,
                      err);
            record_short(sm, err);
            break;
        }
        committed = next;
    }
    LMC_INFO("L1: %llu of %llu bytes committed", (unsigned long long)committed,
             (unsigned long long)st.configured_bytes);
    return NULL;
}

/* The committer runs whatever the sizes: even a fully committed L1 is
 * faulted in (private memory, hugepages). */
static int start_grower(lmc_storage_manager *sm)
{
    sm->prefault_state = "running";
    sm->prefault_started = monotonic_s();
    atomic_store(&sm->prefaulting, true);
    lmc_l1_manager_set_commit_target(sm->l1, sm->initial_bytes);
    if (pthread_create(&sm->grower, NULL, grower_main, sm) != 0) {
        atomic_store(&sm->prefaulting, false);
        lmc_l1_manager_set_commit_target(sm->l1, 0);
        return -1;
    }
    sm->grower_running = true;
    return 0;
}

static void stop_grower(lmc_storage_manager *sm)
{
    pthread_mutex_lock(&sm->grower_mutex);
    sm->grower_stop = true;
    pthread_cond_broadcast(&sm->grower_wake);
    pthread_mutex_unlock(&sm->grower_mutex);
    if (sm->grower_running)
        pthread_join(sm->grower, NULL);
    sm->grower_running = false;
}

/* ---- creation ---------------------------------------------------------- */

static int validate_options(const lmc_storage_options *o, char *err, size_t errlen)
{
    uint64_t align = o->l1_align_bytes;
    if (align == 0 || (align & (align - 1)) != 0)
        snprintf(err, errlen, "--l1-align-bytes must be a power of two");
    else if (o->l1_size_bytes < align)
        snprintf(err, errlen, "the L1 size must be at least --l1-align-bytes (%llu bytes)",
                 (unsigned long long)align);
    else if (o->l1_write_ttl_seconds <= 0 || o->l1_read_ttl_seconds <= 0)
        snprintf(err, errlen, "L1 lock TTLs must be positive");
    else if (!(o->eviction_trigger_watermark >= 0 && o->eviction_trigger_watermark <= 1))
        snprintf(err, errlen, "--eviction-trigger-watermark must be within [0, 1]");
    else if (!(o->eviction_ratio >= 0 && o->eviction_ratio <= 1))
        snprintf(err, errlen, "--eviction-ratio must be within [0, 1]");
    else if (o->l1_use_lazy && o->lazy_grow_step_bytes < align)
        snprintf(err, errlen, "lazy growth step must be at least the alignment");
    else
        return 0;
    return -1;
}

/* Bytes committed to the allocator at start. */
static uint64_t initial_commit(const lmc_storage_options *o, uint64_t configured)
{
    if (!o->l1_use_lazy || o->l1_use_hugepages)
        return configured;
    uint64_t init = (o->l1_init_bytes + LAZY_COMMIT_GRANULE - 1) & ~(LAZY_COMMIT_GRANULE - 1);
    return init < configured ? init : configured;
}

/* Backs the first bytes of the arena for the allocator: where /dev/shm
 * cannot hold even these, the server does not start.  Where it runs short
 * later, the pre-fault serves with what fits (docs/storage.md). */
static int back_first(lmc_storage_manager *sm, uint64_t first, const char *flag, char *err,
                      size_t errlen)
{
    char why[384];
    if (lmc_l1_arena_commit(sm->arena, 0, first, why, sizeof why) == 0)
        return 0;
    snprintf(err, errlen, "%s; enlarge /dev/shm (docker: --shm-size) or lower %s", why, flag);
    return -1;
}

static int create_l1(lmc_storage_manager *sm, char *err, size_t errlen)
{
    const lmc_storage_options *o = &sm->opts;
    uint64_t configured = o->l1_size_bytes & ~(o->l1_align_bytes - 1);
    lmc_l1_arena_options ao = {configured, o->shm_auto ? NULL : o->shm_name,
                               o->l1_use_hugepages, o->l1_shm_reserve_bytes};
    sm->arena = lmc_l1_arena_create(&ao, err, errlen);
    if (!sm->arena)
        return -1;
    uint64_t initial = initial_commit(o, configured);
    sm->initial_bytes = initial;
    /* Only the first granule before the server answers (docs/storage.md,
     * "Pre-fault"): not even that fitting still stops the start. */
    uint64_t first = START_COMMIT > o->l1_align_bytes ? START_COMMIT : o->l1_align_bytes;
    if (first > initial)
        first = initial;
    if (back_first(sm, first, initial < configured ? "--l1-init-size-gb" : "--l1-size-gb", err,
                   errlen) != 0)
        return -1;
    uint64_t backed = first;
    lmc_l1_manager_options mo = {
        .configured_bytes = configured,
        .committed_bytes = backed,
        .align_bytes = o->l1_align_bytes,
        .write_ttl_ms = (int64_t)o->l1_write_ttl_seconds * 1000,
        .read_ttl_ms = (int64_t)o->l1_read_ttl_seconds * 1000,
        .clock = o->clock,
        .clock_user = o->clock_user,
        .backend = "dram",
        .check_books = o->check_books,
    };
    sm->l1 = lmc_l1_manager_new(&mo);
    if (sm->l1)
        sm->telemetry = lmc_storage_telemetry_new(sm->l1, o->clock, o->clock_user);
    if (!sm->telemetry || lmc_l1_manager_add_listener(sm->l1, fan_out, sm) != 0) {
        snprintf(err, errlen, "cannot create the L1 manager (out of memory)");
        return -1;
    }
    lmc_l1_manager_set_sampler(sm->l1, lmc_storage_telemetry_sample, sm->telemetry);
    return 0;
}

static int create_eviction(lmc_storage_manager *sm, char *err, size_t errlen)
{
    const lmc_storage_options *o = &sm->opts;
    lmc_eviction_policy *policy = lmc_eviction_policy_new(o->eviction_policy);
    if (!policy) {
        snprintf(err, errlen, "--eviction-policy %s is not supported (use LRU or noop)",
                 o->eviction_policy);
        return -1;
    }
    lmc_l1_eviction_options eo = {
        .trigger_watermark = o->eviction_trigger_watermark,
        .eviction_ratio = o->eviction_ratio,
        .period_ms = o->eviction_period_ms,
        .on_cycle = lmc_storage_telemetry_on_cycle,
        .on_evicted = lmc_storage_telemetry_on_evicted,
        .observer_user = sm->telemetry,
    };
    sm->eviction = lmc_l1_eviction_new(sm->l1, policy, &eo);
    if (!sm->eviction || lmc_l1_eviction_start(sm->eviction) != 0) {
        snprintf(err, errlen, "cannot start the L1 eviction controller");
        return -1;
    }
    return 0;
}

lmc_storage_manager *lmc_storage_manager_create(const lmc_storage_options *o,
                                                char *err, size_t errlen)
{
    if (validate_options(o, err, errlen) != 0)
        return NULL;
    lmc_storage_manager *sm = calloc(1, sizeof(*sm));
    if (!sm) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sm->opts = *o;
    pthread_mutex_init(&sm->listeners_mutex, NULL);
    pthread_mutex_init(&sm->grower_mutex, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&sm->grower_wake, &attr);
    pthread_condattr_destroy(&attr);
    if (create_l1(sm, err, errlen) != 0 || create_eviction(sm, err, errlen) != 0)
        goto fail;
    if (!(sm->quotas = lmc_quotas_new())) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (start_grower(sm) != 0) {
        snprintf(err, errlen, "cannot start the L1 growth thread");
        goto fail;
    }
    return sm;
fail:
    lmc_storage_manager_close(sm);
    return NULL;
}

void lmc_storage_manager_set_event_bus(lmc_storage_manager *sm, lmc_event_bus *bus,
                                       double sample_rate)
{
    lmc_storage_telemetry_attach(sm->telemetry, bus, sample_rate);
}

bool lmc_storage_manager_events_enabled(const lmc_storage_manager *sm)
{
    return lmc_storage_telemetry_enabled(sm->telemetry);
}

void lmc_storage_manager_publish(lmc_storage_manager *sm, const char *type, json_t *metadata)
{
    lmc_storage_telemetry_publish(sm->telemetry, type, metadata);
}

void lmc_storage_manager_report_read_failure(lmc_storage_manager *sm, const char *during,
                                             const char *reason, const lmc_object_key *key,
                                             size_t n)
{
    if (n == 0 || !lmc_storage_telemetry_enabled(sm->telemetry))
        return;
    lmc_storage_telemetry_publish(sm->telemetry, LMC_EVENT_L1_READ_FAILURE,
                                  json_pack("{s:s, s:s, s:s, s:I}", "during", during, "reason",
                                            reason, "model_name", key->model_name, "num_keys",
                                            (json_int_t)n));
}

json_t *lmc_storage_keys_by_salt(const lmc_object_key *keys, size_t n)
{
    json_t *by_salt = json_object();
    size_t run = 0;
    for (size_t i = 0; i < n && by_salt; i++) {
        run++;
        if (i + 1 < n && keys[i + 1].cache_salt == keys[i].cache_salt)
            continue;   /* interned: equal salts share a pointer */
        json_t *c = json_object_get(by_salt, keys[i].cache_salt);
        json_int_t before = c ? json_integer_value(c) : 0;
        json_object_set_new(by_salt, keys[i].cache_salt, json_integer(before + (json_int_t)run));
        run = 0;
    }
    return by_salt;
}

lmc_quotas *lmc_storage_manager_quotas(lmc_storage_manager *sm)
{
    return sm->quotas;
}

void lmc_storage_manager_close(lmc_storage_manager *sm)
{
    if (!sm)
        return;
    if (sm->l2_ops)
        sm->l2_ops->close(sm->l2);   /* releases its L1 locks and staging first */
    stop_grower(sm);
    if (sm->eviction)
        lmc_l1_eviction_free(sm->eviction);
    lmc_l1_manager_free(sm->l1);
    lmc_storage_telemetry_free(sm->telemetry);   /* the L1 sampler used it */
    lmc_l1_arena_destroy(sm->arena);
    lmc_quotas_free(sm->quotas);
    pthread_cond_destroy(&sm->grower_wake);
    pthread_mutex_destroy(&sm->grower_mutex);
    pthread_mutex_destroy(&sm->listeners_mutex);
    free(sm);
}

/* ---- data path --------------------------------------------------------- */

static const char *tag_or_default(const char *tag)
{
    return tag ? tag : LMC_STORAGE_DEFAULT_WRITER_TAG;
}

/* Caller's result array, or a temporary one freed by release_results. */
static lmc_l1_result *results_or_scratch(lmc_l1_result *results, size_t n)
{
    return results ? results : malloc((n ? n : 1) * sizeof(*results));
}

static void release_results(lmc_l1_result *mine, const lmc_l1_result *callers)
{
    if (mine != callers)
        free(mine);
}

/* While the pre-fault runs, the committed size before a write (0 when
 * none runs: the write then never waits). */
static uint64_t committed_now(lmc_storage_manager *sm)
{
    if (!atomic_load(&sm->prefaulting))
        return 0;
    lmc_l1_stats st;
    lmc_l1_manager_stats(sm->l1, &st);
    return st.committed_bytes;
}

/* The writes that found no room while the pre-fault was committing more
 * are tried again as it commits (docs/storage.md, "Pre-fault"): room on
 * its way is no reason to refuse a write, nor to evict for it. */
static void wait_for_room(lmc_storage_manager *sm, const lmc_object_key *keys,
                          const bool *temporary, size_t n, uint64_t object_size,
                          const char *tag, lmc_lease *leases, lmc_l1_result *r, uint64_t seen)
{
    size_t *at = malloc((n ? n : 1) * sizeof *at);
    lmc_object_key *sub_keys = malloc((n ? n : 1) * sizeof *sub_keys);
    bool *sub_temp = malloc((n ? n : 1) * sizeof *sub_temp);
    lmc_lease *sub_leases = malloc((n ? n : 1) * sizeof *sub_leases);
    lmc_l1_result *sub_r = malloc((n ? n : 1) * sizeof *sub_r);
    double give_up = monotonic_s() + PREFAULT_WAIT_MS / 1000.0;
    while (at && sub_keys && sub_temp && sub_leases && sub_r) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (r[i] == LMC_L1_OUT_OF_MEMORY) {
                at[m] = i;
                sub_keys[m] = keys[i];
                sub_temp[m++] = temporary && temporary[i];
            }
        double left = give_up - monotonic_s();
        if (m == 0 || left <= 0 || !lmc_l1_manager_wait_growth(sm->l1, seen, (int64_t)(left * 1000)))
            break;
        seen = committed_now(sm);
        if (lmc_l1_manager_lease_write(sm->l1, sub_keys, sub_temp, m, object_size, tag,
                                       sub_leases, sub_r) != 0)
            break;
        for (size_t k = 0; k < m; k++) {
            r[at[k]] = sub_r[k];
            leases[at[k]] = sub_leases[k];
        }
        if (!seen)
            break;   /* the pre-fault is over: what still finds no room is full */
    }
    free(at);
    free(sub_keys);
    free(sub_temp);
    free(sub_leases);
    free(sub_r);
}

int lmc_storage_manager_lease_write(lmc_storage_manager *sm, const lmc_object_key *keys,
                                    size_t n, uint64_t object_size, bool is_temporary,
                                    const char *writer_tag, lmc_lease *leases,
                                    lmc_l1_result *results)
{
    bool prefetch = writer_tag && strcmp(writer_tag, LMC_STORAGE_L2_PREFETCH_TAG) == 0;
    if (sm->trace && !prefetch)   /* upstream's prefetch reserves nothing */
        lmc_storage_trace_record(sm->trace, LMC_STORAGE_TRACE_RESERVE_WRITE, keys, n,
                                 object_size);
    bool *temporary = NULL;
    lmc_l1_result *r = results_or_scratch(results, n);
    if (is_temporary && r) {
        temporary = malloc((n ? n : 1) * sizeof(*temporary));
        for (size_t i = 0; temporary && i < n; i++)
            temporary[i] = true;
    }
    int rc = -1;
    uint64_t seen = committed_now(sm);
    if (r && (temporary || !is_temporary))
        rc = lmc_l1_manager_lease_write(sm->l1, keys, temporary, n, object_size,
                                        tag_or_default(writer_tag), leases, r);
    if (rc == 0 && seen)
        wait_for_room(sm, keys, temporary, n, object_size, tag_or_default(writer_tag), leases,
                      r, seen);
    free(temporary);
    if (rc == 0) {
        lmc_storage_telemetry_write_outcome(sm->telemetry, keys, n, r,
                                            prefetch ? "l2_prefetch" : "l1_store");
    }
    release_results(r, results);
    return rc;
}

int lmc_storage_manager_publish_writes(lmc_storage_manager *sm, const lmc_object_key *keys,
                                       lmc_lease *leases, size_t n, uint32_t readers,
                                       lmc_l1_result *results)
{
    if (sm->trace && readers == 0)   /* readers: an L2 prefetch's load */
        lmc_storage_trace_record(sm->trace, LMC_STORAGE_TRACE_FINISH_WRITE, keys, n, 0);
    lmc_l1_result *r = results_or_scratch(results, n);
    if (!r)
        return -1;
    int rc = lmc_l1_manager_publish_writes(sm->l1, keys, leases, n, readers, r);
    release_results(r, results);
    return rc;
}

size_t lmc_storage_manager_lease_read(lmc_storage_manager *sm, const lmc_object_key *keys,
                                      size_t n, uint32_t readers, bool prefix,
                                      const lmc_object_sizes *want, lmc_lease *leases,
                                      lmc_l1_result *results)
{
    if (sm->trace)   /* every READ lease is a lookup's (docs/trace.md) */
        lmc_storage_trace_record(sm->trace, LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK, keys, n,
                                 want && want->count ? want->sizes[0] : 0);
    lmc_l1_result *r = results_or_scratch(results, n);
    if (!r)
        return 0;
    size_t granted = lmc_l1_manager_lease_read(sm->l1, keys, n, readers, prefix, want, leases,
                                               r);
    if (prefix)   /* a lookup: its hits and misses are the L1 hit-rate metrics */
        lmc_storage_telemetry_read_outcome(sm->telemetry, keys, n, granted);
    release_results(r, results);
    return granted;
}

size_t lmc_storage_manager_lease_copy(lmc_storage_manager *sm, const lmc_object_key *keys,
                                      size_t n, lmc_copy_share share, bool all_or_none,
                                      const lmc_object_sizes *want, lmc_lease *leases,
                                      lmc_l1_result *results)
{
    lmc_l1_result *r = results_or_scratch(results, n);
    if (!r)
        return 0;
    bool retrieve = share == LMC_COPY_CARRIES_SHARE;
    if (sm->trace && retrieve)
        lmc_storage_trace_record(sm->trace, LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER, keys, n, 0);
    size_t granted = lmc_l1_manager_lease_copy(sm->l1, keys, n, share, all_or_none, want,
                                               leases, r);
    for (size_t i = 0; retrieve && i < n; i++)
        leases[i].retrieve = leases[i].kind == LMC_LEASE_COPY;
    release_results(r, results);
    return granted;
}

/* The op a lease given back is traced as (docs/trace.md, "What is
 * recorded"): a WRITE never published is abort_write, a lookup's READ
 * finish_read_prefetched, a RETRIEVE's COPY read_prefetched_results'
 * exit; other COPY leases are no storage-manager call upstream. */
static lmc_storage_trace_op given_back_as(const lmc_lease *l)
{
    switch (l->kind) {
    case LMC_LEASE_WRITE: return LMC_STORAGE_TRACE_ABORT_WRITE;
    case LMC_LEASE_READ: return LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED;
    case LMC_LEASE_COPY:
        return l->retrieve ? LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT : LMC_STORAGE_TRACE_UNKNOWN;
    default: return LMC_STORAGE_TRACE_UNKNOWN;
    }
}

/* One record of the keys of the leases given back as `op`. */
static void trace_given_back(lmc_storage_trace *trace, lmc_storage_trace_op op,
                             const lmc_object_key *keys, const lmc_lease *leases, size_t n)
{
    lmc_object_key stack[64], *picked = stack;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += given_back_as(&leases[i]) == op;
    if (count == 0)
        return;
    if (count > sizeof stack / sizeof stack[0] && !(picked = malloc(count * sizeof *picked)))
        return;
    count = 0;
    for (size_t i = 0; i < n; i++)
        if (given_back_as(&leases[i]) == op)
            picked[count++] = keys[i];
    lmc_storage_trace_record(trace, op, picked, count, 0);
    if (picked != stack)
        free(picked);
}

void lmc_storage_manager_give_back(lmc_storage_manager *sm, const lmc_object_key *keys,
                                   lmc_lease *leases, size_t n)
{
    if (sm->trace) {
        trace_given_back(sm->trace, LMC_STORAGE_TRACE_ABORT_WRITE, keys, leases, n);
        trace_given_back(sm->trace, LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED, keys, leases, n);
        trace_given_back(sm->trace, LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT, keys, leases, n);
    }
    lmc_l1_manager_give_back(sm->l1, keys, leases, n);
}

void lmc_storage_manager_lease_counts(lmc_storage_manager *sm, lmc_lease_counts *out)
{
    lmc_l1_manager_lease_counts(sm->l1, out);
}

void lmc_storage_manager_set_trace(lmc_storage_manager *sm, lmc_storage_trace *trace)
{
    sm->trace = trace;
}

/* ---- L2 tier ----------------------------------------------------------- */

void lmc_storage_manager_attach_tier(lmc_storage_manager *sm, const lmc_storage_tier_ops *ops,
                                     void *impl)
{
    sm->l2_ops = ops;
    sm->l2 = impl;
}

void *lmc_storage_manager_tier(const lmc_storage_manager *sm, const lmc_storage_tier_ops *ops)
{
    return sm->l2_ops == ops ? sm->l2 : NULL;
}


/* ---- maintenance and status -------------------------------------------- */

int lmc_storage_manager_delete(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                               bool force, size_t *deleted, size_t *skipped_locked)
{
    lmc_l1_result *r = results_or_scratch(NULL, n);
    if (!r)
        return -1;
    int rc = lmc_l1_manager_delete(sm->l1, keys, n, force, r);
    size_t done = 0, locked = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        done += r[i] == LMC_L1_SUCCESS;
        locked += r[i] == LMC_L1_KEY_IS_LOCKED;
    }
    free(r);
    if (deleted)
        *deleted = done;
    if (skipped_locked)
        *skipped_locked = locked;
    return rc;
}

size_t lmc_storage_manager_delete_other_size(lmc_storage_manager *sm, const lmc_object_key *keys,
                                             size_t n, uint64_t object_size)
{
    lmc_l1_result *r = results_or_scratch(NULL, n);
    if (!r)
        return 0;
    size_t done = 0;
    if (lmc_l1_manager_delete_other_size(sm->l1, keys, n, object_size, r) == 0)
        for (size_t i = 0; i < n; i++)
            done += r[i] == LMC_L1_SUCCESS;
    free(r);
    return done;
}

long lmc_storage_manager_clear(lmc_storage_manager *sm, bool force)
{
    return lmc_l1_manager_clear(sm->l1, force);
}

int lmc_storage_manager_add_l2_placement_sink(lmc_storage_manager *sm,
                                              const lmc_l2_placement_sink *sink)
{
    for (size_t i = 0; i < LMC_STORAGE_MAX_PLACEMENT_SINKS; i++) {
        const lmc_l2_placement_sink *none = NULL;
        if (atomic_compare_exchange_strong(&sm->placement_sinks[i], &none, sink))
            return 0;
    }
    return -1;
}

void lmc_storage_manager_remove_l2_placement_sink(lmc_storage_manager *sm,
                                                  const lmc_l2_placement_sink *sink)
{
    for (size_t i = 0; i < LMC_STORAGE_MAX_PLACEMENT_SINKS; i++) {
        const lmc_l2_placement_sink *expected = sink;
        atomic_compare_exchange_strong(&sm->placement_sinks[i], &expected, NULL);
    }
}

void lmc_storage_manager_report_l2_placement(lmc_storage_manager *sm, lmc_placement_kind kind,
                                             const char *backend, bool shared,
                                             const lmc_object_key *keys, const uint64_t *sizes,
                                             size_t n)
{
    for (size_t i = 0; n > 0 && i < LMC_STORAGE_MAX_PLACEMENT_SINKS; i++) {
        const lmc_l2_placement_sink *sink = atomic_load(&sm->placement_sinks[i]);
        if (sink)
            sink->fn(sink->user, kind, backend, shared, keys, sizes, n);
    }
}

void lmc_storage_manager_resident_sizes(lmc_storage_manager *sm, const lmc_object_key *keys,
                                        size_t n, uint64_t *sizes)
{
    lmc_l1_manager_resident_sizes(sm->l1, keys, n, sizes);
}

void lmc_storage_manager_touch(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n)
{
    lmc_l1_manager_touch(sm->l1, keys, n);
}

void lmc_storage_manager_usage(lmc_storage_manager *sm, uint64_t *used, uint64_t *total)
{
    lmc_l1_manager_usage(sm->l1, used, total);
}

bool lmc_storage_manager_check_books(lmc_storage_manager *sm)
{
    return lmc_l1_manager_check_books(sm->l1);
}

uint64_t lmc_storage_manager_invariant_violations(lmc_storage_manager *sm)
{
    return lmc_l1_manager_invariant_violations(sm->l1);
}

const lmc_l1_arena_desc *lmc_storage_manager_l1_arena(const lmc_storage_manager *sm)
{
    return lmc_l1_arena_describe(sm->arena);
}

size_t lmc_storage_manager_run_eviction_once(lmc_storage_manager *sm)
{
    return lmc_l1_eviction_run_once(sm->eviction);
}

bool lmc_storage_manager_prefault_progress(lmc_storage_manager *sm, uint64_t *populated)
{
    pthread_mutex_lock(&sm->grower_mutex);
    *populated = sm->populated_bytes;
    bool running = sm->prefault_state && strcmp(sm->prefault_state, "running") == 0;
    pthread_mutex_unlock(&sm->grower_mutex);
    return running;
}

bool lmc_storage_manager_wait_prefault(lmc_storage_manager *sm, int timeout_ms)
{
    double give_up = monotonic_s() + timeout_ms / 1000.0;
    pthread_mutex_lock(&sm->grower_mutex);
    while (sm->prefault_state && strcmp(sm->prefault_state, "running") == 0) {
        double left = give_up - monotonic_s();
        if (left <= 0)
            break;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)((left < 0.1 ? left : 0.1) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&sm->grower_wake, &sm->grower_mutex, &until);
    }
    bool over = !sm->prefault_state || strcmp(sm->prefault_state, "running") != 0;
    pthread_mutex_unlock(&sm->grower_mutex);
    return over;
}

bool lmc_storage_manager_l1_short(lmc_storage_manager *sm, char *why, size_t cap)
{
    pthread_mutex_lock(&sm->grower_mutex);
    bool short_of = sm->shm_short[0] != '\0';
    if (short_of && cap)
        snprintf(why, cap, "%s", sm->shm_short);
    pthread_mutex_unlock(&sm->grower_mutex);
    return short_of;
}

/* /status l1 "prefault" (docs/storage.md, "Pre-fault"). */
static json_t *prefault_status(lmc_storage_manager *sm)
{
    pthread_mutex_lock(&sm->grower_mutex);
    bool running = sm->prefault_state && strcmp(sm->prefault_state, "running") == 0;
    double seconds = running ? monotonic_s() - sm->prefault_started : sm->prefault_seconds;
    json_t *o = json_pack("{s:s, s:I, s:I, s:f, s:s, s:s, s:b}", "state",
                          sm->prefault_state ? sm->prefault_state : "stopped", "target_bytes",
                          (json_int_t)sm->initial_bytes, "populated_bytes",
                          (json_int_t)sm->populated_bytes, "seconds", seconds, "method",
                          sm->populate_method == LMC_L1_POPULATE_TOUCH ? "touch"
                                                                       : "madv_populate_write",
                          "transparent_hugepages", lmc_l1_arena_thp_setting(sm->arena),
                          "huge_pages_requested", lmc_l1_arena_thp_requested(sm->arena));
    pthread_mutex_unlock(&sm->grower_mutex);
    return o;
}

static json_t *arena_status(lmc_storage_manager *sm)
{
    const lmc_l1_arena_desc *d = lmc_l1_arena_describe(sm->arena);
    lmc_l1_stats st;
    lmc_l1_manager_stats(sm->l1, &st);
    pthread_mutex_lock(&sm->grower_mutex);
    json_t *shm_short = sm->shm_short[0] ? json_string(sm->shm_short) : json_null();
    pthread_mutex_unlock(&sm->grower_mutex);
    json_t *prefault = prefault_status(sm);
    return json_pack("{s:s, s:I, s:I, s:b, s:b, s:I, s:I, s:o, s:o}", "shm_name", d->shm_name,
                     "size_bytes", (json_int_t)d->size, "committed_bytes",
                     (json_int_t)st.committed_bytes, "hugepages", d->hugepages, "lazy",
                     sm->opts.l1_use_lazy && !sm->opts.l1_use_hugepages, "align_bytes",
                     (json_int_t)sm->opts.l1_align_bytes, "shm_reserve_bytes",
                     (json_int_t)d->shm_reserve, "shm_short", shm_short, "prefault", prefault);
}

void lmc_storage_manager_l1_stats(lmc_storage_manager *sm, lmc_l1_stats *out)
{
    lmc_l1_manager_stats(sm->l1, out);
}

void lmc_storage_manager_eviction_counts(lmc_storage_manager *sm, uint64_t *cycles,
                                         uint64_t *triggered_cycles, uint64_t *evicted_keys)
{
    lmc_l1_eviction_counts c = lmc_l1_eviction_get_counts(sm->eviction);
    *cycles = c.cycles;
    *triggered_cycles = c.triggered_cycles;
    *evicted_keys = c.evicted_keys;
}

size_t lmc_storage_manager_l2_counts(lmc_storage_manager *sm, lmc_storage_l2_counts *out,
                                     size_t max)
{
    if (!sm->l2_ops || !sm->l2_ops->adapter_counts)
        return 0;
    return sm->l2_ops->adapter_counts(sm->l2, out, max);
}

static bool child_healthy(json_t *status)
{
    return json_is_true(json_object_get(status, "is_healthy"));
}

json_t *lmc_storage_manager_report_status(lmc_storage_manager *sm)
{
    json_t *l1 = lmc_l1_manager_report_status(sm->l1);
    json_t *ev = lmc_l1_eviction_report_status(sm->eviction);
    uint64_t used, total;
    lmc_l1_manager_usage(sm->l1, &used, &total);
    json_t *st = NULL;
    if (!l1 || !ev)
        goto out;
    st = json_pack("{s:b, s:O, s:{s:O}, s:O, s:{s:O}, s:i, s:[], s:[I,I], s:O, s:o}",
                   "is_healthy", child_healthy(l1) && child_healthy(ev),
                   "l1_manager", l1, "l1_managers", "_default", l1,
                   "l1_eviction_controller", ev, "l1_eviction_controllers", "_default", ev,
                   "num_l2_adapters", 0, "l2_adapters",
                   "l1_usage", (json_int_t)used, (json_int_t)total,
                   "l1_capacity_bytes_by_backend",
                   json_object_get(l1, "capacity_bytes_by_backend"),
                   "l1_arena", arena_status(sm));
    if (st && sm->l2_ops) {
        json_t *l2 = sm->l2_ops->report_status(sm->l2);
        if (json_is_false(json_object_get(l2, "is_healthy")))
            json_object_set(st, "is_healthy", json_false());
        json_object_del(l2, "is_healthy");
        json_object_update(st, l2);
        json_decref(l2);
    }
out:
    json_decref(l1);
    json_decref(ev);
    return st;
}
