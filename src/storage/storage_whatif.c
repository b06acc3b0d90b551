/* The trace what-if (storage_whatif.h; the rules it follows are in
 * docs/trace.md, "What-if"). */
#include "storage/storage_whatif.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/eviction_policy.h"
#include "storage/l1/l1_eviction.h"

#define NONE UINT32_MAX

typedef struct {
    uint8_t op;                  /* lmc_storage_trace_op */
    uint32_t n;                  /* keys, at idx[first, first + n) */
    uint64_t first;
    uint64_t size;               /* reserve_write's object size */
} wi_op;

struct lmc_storage_whatif_trace {
    wi_op *ops;
    size_t n_ops, cap_ops;
    uint32_t *idx;
    size_t n_idx, cap_idx;
    lmc_object_key *keys;        /* distinct keys; strings in `in` */
    uint64_t *key_bytes;         /* each key's largest reserve_write */
    size_t n_keys, cap_keys, cap_key_bytes;
    uint32_t *slots;             /* open addressing over keys; NONE empty */
    size_t n_slots;
    size_t max_keys_per_op;
    lmc_key_interner *in;
    lmc_storage_whatif_summary sum;
};

/* Doubles *cap until it holds `need` items of `size` bytes. */
static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

lmc_storage_whatif_trace *lmc_storage_whatif_trace_new(void)
{
    lmc_storage_whatif_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->in = lmc_key_interner_new()) ||
        !(t->slots = malloc(1024 * sizeof *t->slots))) {
        lmc_storage_whatif_trace_free(t);
        return NULL;
    }
    t->n_slots = 1024;
    memset(t->slots, 0xff, t->n_slots * sizeof *t->slots);
    return t;
}

void lmc_storage_whatif_trace_free(lmc_storage_whatif_trace *t)
{
    if (!t)
        return;
    free(t->ops);
    free(t->idx);
    free(t->keys);
    free(t->key_bytes);
    free(t->slots);
    lmc_key_interner_free(t->in);   /* no bound: the keys' references need no giving back */
    free(t);
}

static size_t slot_of(const lmc_storage_whatif_trace *t, const lmc_object_key *k)
{
    size_t mask = t->n_slots - 1;
    for (size_t i = lmc_object_key_hash(k) & mask;; i = (i + 1) & mask) {
        if (t->slots[i] == NONE || lmc_object_key_equal(&t->keys[t->slots[i]], k))
            return i;
    }
}

static uint32_t find_key(const lmc_storage_whatif_trace *t, const lmc_object_key *k)
{
    return t->slots[slot_of(t, k)];
}

static int grow_slots(lmc_storage_whatif_trace *t)
{
    size_t n = t->n_slots * 2;
    uint32_t *slots = malloc(n * sizeof *slots);
    if (!slots)
        return -1;
    memset(slots, 0xff, n * sizeof *slots);
    free(t->slots);
    t->slots = slots;
    t->n_slots = n;
    for (uint32_t id = 0; id < t->n_keys; id++)
        t->slots[slot_of(t, &t->keys[id])] = id;
    return 0;
}

/* The index of `k`, added (its strings interned here) when new; NONE. */
static uint32_t key_id(lmc_storage_whatif_trace *t, const lmc_object_key *k)
{
    size_t s = slot_of(t, k);
    if (t->slots[s] != NONE)
        return t->slots[s];
    if (t->n_keys >= NONE - 1 ||
        grow((void **)&t->keys, &t->cap_keys, t->n_keys + 1, sizeof *t->keys) != 0)
        return NONE;
    if (grow((void **)&t->key_bytes, &t->cap_key_bytes, t->n_keys + 1, sizeof *t->key_bytes) != 0)
        return NONE;
    const char *m = lmc_intern(t->in, k->model_name, strlen(k->model_name));
    const char *c = lmc_intern(t->in, k->cache_salt, strlen(k->cache_salt));
    if (!m || !c)
        return NONE;
    uint32_t id = (uint32_t)t->n_keys++;
    t->keys[id] = *k;
    lmc_object_key_set_strings(&t->keys[id], m, c);
    t->key_bytes[id] = 0;
    t->slots[s] = id;
    t->sum.distinct_keys = t->n_keys;
    if (t->n_keys * 4 > t->n_slots * 3 && grow_slots(t) != 0)
        return NONE;
    return id;
}

static void note_size(lmc_storage_whatif_trace *t, uint32_t id, uint64_t size)
{
    lmc_storage_whatif_summary *s = &t->sum;
    if (size > t->key_bytes[id]) {
        s->distinct_bytes += size - t->key_bytes[id];
        t->key_bytes[id] = size;
    }
    if (size > 0 && (s->min_object == 0 || size < s->min_object))
        s->min_object = size;
    if (size > s->max_object)
        s->max_object = size;
}

static bool simulated(lmc_storage_trace_op op)
{
    return op == LMC_STORAGE_TRACE_RESERVE_WRITE || op == LMC_STORAGE_TRACE_FINISH_WRITE ||
           op == LMC_STORAGE_TRACE_ABORT_WRITE || op == LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK;
}

int lmc_storage_whatif_trace_add(lmc_storage_whatif_trace *t, const lmc_trace_record *rec)
{
    lmc_storage_whatif_summary *s = &t->sum;
    if (s->records == 0)
        s->t_first = rec->t_mono;
    s->t_last = rec->t_mono;
    s->records++;
    s->by_op[rec->op <= LMC_STORAGE_TRACE_UNKNOWN ? rec->op : LMC_STORAGE_TRACE_UNKNOWN]++;
    if (grow((void **)&t->idx, &t->cap_idx, t->n_idx + rec->n_keys, sizeof *t->idx) != 0)
        return -1;
    for (size_t i = 0; i < rec->n_keys; i++) {
        uint32_t id = key_id(t, &rec->keys[i]);
        if (id == NONE)
            return -1;
        if (rec->op == LMC_STORAGE_TRACE_RESERVE_WRITE)
            note_size(t, id, rec->object_size);
        t->idx[t->n_idx + i] = id;
    }
    if (!simulated(rec->op) || rec->n_keys == 0)
        return 0;
    if (grow((void **)&t->ops, &t->cap_ops, t->n_ops + 1, sizeof *t->ops) != 0)
        return -1;
    t->ops[t->n_ops++] = (wi_op){.op = (uint8_t)rec->op, .n = (uint32_t)rec->n_keys,
                                 .first = t->n_idx, .size = rec->object_size};
    t->n_idx += rec->n_keys;
    if (rec->n_keys > t->max_keys_per_op)
        t->max_keys_per_op = rec->n_keys;
    return 0;
}

void lmc_storage_whatif_trace_summary(const lmc_storage_whatif_trace *t,
                                      lmc_storage_whatif_summary *out)
{
    *out = t->sum;
}

/* ---- one simulation ----------------------------------------------------- */

enum { ABSENT, STAGED, RESIDENT, PENDING };

typedef struct {
    const lmc_storage_whatif_trace *t;
    const lmc_storage_whatif_config *c;
    lmc_eviction_policy *policy;
    uint8_t *state;              /* per key */
    uint64_t *bytes;             /* per key, while not ABSENT */
    uint64_t used;
    lmc_object_key *batch;       /* keys handed to the policy */
    lmc_storage_whatif_result *r;
} sim;

/* What lmc_l1_manager_is_evictable answers: live staging is not evictable. */
static lmc_l1_evictability evictable(void *user, const lmc_object_key *key)
{
    const sim *s = user;
    uint32_t id = find_key(s->t, key);
    if (id == NONE || s->state[id] == ABSENT)
        return LMC_L1_GONE;
    return s->state[id] == RESIDENT ? LMC_L1_EVICTABLE : LMC_L1_NOT_EVICTABLE;
}

/* One cycle of the L1 controller (lmc_l1_eviction_run_once); the keys it
 * evicted. */
static size_t cycle(sim *s)
{
    size_t target = lmc_l1_eviction_plan(s->used, s->c->l1_bytes,
                                         s->policy->ops->num_tracked(s->policy),
                                         s->c->trigger_watermark, s->c->eviction_ratio);
    if (target == 0)
        return 0;
    lmc_object_key *victims = malloc(target * sizeof *victims);
    if (!victims)
        return 0;
    size_t n = s->policy->ops->select_victims(s->policy, target, evictable, s, victims), k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = find_key(s->t, &victims[i]);
        if (id == NONE || s->state[id] != RESIDENT)
            continue;
        s->state[id] = ABSENT;
        s->used -= s->bytes[id];
        victims[k++] = victims[i];
    }
    lmc_l1_eviction_feed(s->policy, LMC_L1_EVENT_DELETED, victims, k);
    lmc_keys_drop(victims, n);
    free(victims);
    s->r->evictions += k;
    return k;
}

static bool fits(const sim *s, uint64_t need)
{
    return need <= s->c->l1_bytes && s->used <= s->c->l1_bytes - need;
}

/* The keys of op `o` in state `from` (each once), moved to state `to`,
 * into s->batch; how many. */
static size_t take(sim *s, const wi_op *o, uint8_t from, uint8_t to)
{
    const uint32_t *ids = s->t->idx + o->first;
    size_t n = 0;
    for (uint32_t i = 0; i < o->n; i++) {
        if (s->state[ids[i]] != from)
            continue;
        s->state[ids[i]] = to;
        s->batch[n++] = s->t->keys[ids[i]];
    }
    return n;
}

static void set_state(sim *s, const wi_op *o, uint8_t from, uint8_t to)
{
    const uint32_t *ids = s->t->idx + o->first;
    for (uint32_t i = 0; i < o->n; i++) {
        if (s->state[ids[i]] == from)
            s->state[ids[i]] = to;
    }
}

static void reserve(sim *s, const wi_op *o)
{
    size_t n = take(s, o, ABSENT, PENDING);   /* resident and staged keys: NOT_WRITABLE */
    uint64_t need;
    if (n == 0)
        return;
    if (__builtin_mul_overflow((uint64_t)n, o->size, &need))
        need = UINT64_MAX;
    cycle(s);
    while (!fits(s, need) && cycle(s) > 0)
        ;
    if (!fits(s, need)) {   /* one batched allocation: all or none */
        set_state(s, o, PENDING, ABSENT);
        s->r->writes_refused += n;
        return;
    }
    const uint32_t *ids = s->t->idx + o->first;
    for (uint32_t i = 0; i < o->n; i++) {
        if (s->state[ids[i]] == PENDING)
            s->bytes[ids[i]] = o->size;
    }
    set_state(s, o, PENDING, STAGED);
    s->used += need;
    lmc_l1_eviction_feed(s->policy, LMC_L1_EVENT_WRITE_RESERVED, s->batch, n);
}

static void abort_write(sim *s, const wi_op *o)
{
    const uint32_t *ids = s->t->idx + o->first;
    size_t n = 0;
    for (uint32_t i = 0; i < o->n; i++) {
        if (s->state[ids[i]] != STAGED)
            continue;
        s->state[ids[i]] = ABSENT;
        s->used -= s->bytes[ids[i]];
        s->batch[n++] = s->t->keys[ids[i]];
    }
    lmc_l1_eviction_feed(s->policy, LMC_L1_EVENT_DELETED, s->batch, n);
}

static void lookup(sim *s, const wi_op *o)
{
    const uint32_t *ids = s->t->idx + o->first;
    uint32_t hit = 0;
    while (hit < o->n && s->state[ids[hit]] == RESIDENT) {
        s->batch[hit] = s->t->keys[ids[hit]];
        hit++;
    }
    s->r->lookups++;
    s->r->lookup_keys += o->n;
    s->r->hit_keys += hit;
    if (hit > 0)
        lmc_l1_eviction_feed(s->policy, LMC_L1_EVENT_ACCESSED, s->batch, hit);
}

static void step(sim *s, const wi_op *o)
{
    switch (o->op) {
    case LMC_STORAGE_TRACE_RESERVE_WRITE: reserve(s, o); break;
    case LMC_STORAGE_TRACE_FINISH_WRITE: {
        size_t n = take(s, o, STAGED, RESIDENT);
        lmc_l1_eviction_feed(s->policy, LMC_L1_EVENT_WRITE_FINISHED, s->batch, n);
        break;
    }
    case LMC_STORAGE_TRACE_ABORT_WRITE: abort_write(s, o); break;
    case LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK: lookup(s, o); break;
    default: break;
    }
}

bool lmc_storage_whatif_policy_known(const char *name)
{
    lmc_eviction_policy *p = lmc_eviction_policy_new(name);
    lmc_eviction_policy_free(p);
    return p != NULL;
}

int lmc_storage_whatif_run(const lmc_storage_whatif_trace *t, const lmc_storage_whatif_config *c,
                           lmc_storage_whatif_result *out, char *err, size_t errlen)
{
    sim s = {.t = t, .c = c, .r = out};
    int rc = -1;
    memset(out, 0, sizeof *out);
    if (!(s.policy = lmc_eviction_policy_new(c->policy))) {
        snprintf(err, errlen, "--policy %s is not supported (use LRU or noop)", c->policy);
        return -1;
    }
    s.state = calloc(t->n_keys ? t->n_keys : 1, 1);
    s.bytes = calloc(t->n_keys ? t->n_keys : 1, sizeof *s.bytes);
    s.batch = malloc((t->max_keys_per_op ? t->max_keys_per_op : 1) * sizeof *s.batch);
    if (!s.state || !s.bytes || !s.batch) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < t->n_ops; i++)
        step(&s, &t->ops[i]);
    rc = 0;
out:
    lmc_eviction_policy_free(s.policy);
    free(s.state);
    free(s.bytes);
    free(s.batch);
    return rc;
}
