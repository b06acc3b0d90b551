/* ObjectKey interning, validation and text forms (docs/hashing.md,
 * "4. Object keys").
 *
 * Round-trip rule: a string or filename that parses prints back to exactly
 * the same text.  That is why parsing accepts only the forms we print:
 * lowercase hex, kv_rank as exactly 8 digits, object_group_id without leading
 * zeros, the salt field only when non-empty, and a non-empty chunk hash. */
#include "core/fnv.h"
#include "core/hex.h"
#include "storage/object_key.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/utf8.h"
#include "obs/log.h"

/* ---- Interning ---------------------------------------------------------- */

/* One interned string: its reference count and table hash sit just before
 * the characters, so a key's `const char *` finds them without a lookup
 * (docs/storage.md, "Interned strings"). */
typedef struct interned_str {
    _Atomic uint64_t refs;
    lmc_key_interner *owner;
    uint64_t hash;
    size_t len;
    char chars[];
} interned_str;

static interned_str *str_header(const char *s)
{
    return (interned_str *)(void *)((char *)(uintptr_t)s - offsetof(interned_str, chars));
}

/* Open-addressing hash set of owned strings.  Each string is a separate
 * allocation, so growing the slot array never moves a returned pointer. */
struct lmc_key_interner {
    pthread_mutex_t mu;
    interned_str **slots; /* NULL = empty slot */
    size_t cap;           /* power of two */
    size_t count;
    size_t max_strings; /* 0: no bound, never evicts */
    uint64_t refused, evicted;
    /* Strings whose count fell to zero since the last sweep: a full
     * interner sweeps only when one may be there to evict. */
    _Atomic uint64_t released;
};

#define INTERN_INITIAL_CAP 64

lmc_key_interner *lmc_key_interner_new(void)
{
    return lmc_key_interner_new_bounded(0);
}

lmc_key_interner *lmc_key_interner_new_bounded(size_t max_strings)
{
    lmc_key_interner *in = calloc(1, sizeof *in);
    if (!in)
        return NULL;
    in->slots = calloc(INTERN_INITIAL_CAP, sizeof *in->slots);
    if (!in->slots || pthread_mutex_init(&in->mu, NULL) != 0) {
        free(in->slots);
        free(in);
        return NULL;
    }
    in->cap = INTERN_INITIAL_CAP;
    in->max_strings = max_strings;
    return in;
}

void lmc_key_interner_free(lmc_key_interner *in)
{
    if (!in)
        return;
    for (size_t i = 0; i < in->cap; i++)
        free(in->slots[i]);
    free(in->slots);
    pthread_mutex_destroy(&in->mu);
    free(in);
}

/* Slot holding (s, len), or the empty slot where it would go. */
static interned_str **find_slot(interned_str **slots, size_t cap, const char *s, size_t len,
                                uint64_t hash)
{
    size_t i = (size_t)hash & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        interned_str *is = slots[i];
        if (!is || (is->hash == hash && is->len == len && memcmp(is->chars, s, len) == 0))
            return &slots[i];
    }
}

/* Moves every string for which `keep` holds into a fresh array of `cap`
 * slots and frees the others.  The old array goes only on success. */
static bool rehash(lmc_key_interner *in, size_t cap, bool evict_unreferenced)
{
    interned_str **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < in->cap; i++) {
        interned_str *is = in->slots[i];
        if (!is)
            continue;
        if (evict_unreferenced && atomic_load_explicit(&is->refs, memory_order_acquire) == 0) {
            free(is);
            in->count--;
            in->evicted++;
            continue;
        }
        *find_slot(slots, cap, is->chars, is->len, is->hash) = is;
    }
    free(in->slots);
    in->slots = slots;
    in->cap = cap;
    return true;
}

/* A full interner first evicts the strings nothing references (no key
 * anywhere names them: docs/storage.md, "Interned strings"), then refuses
 * when that freed nothing; refusals are logged at each power of two of
 * their count, so a flood of new names cannot flood the log. */
static bool refuse_locked(lmc_key_interner *in)
{
    if (!in->max_strings || in->count < in->max_strings)
        return false;
    if (atomic_exchange_explicit(&in->released, 0, memory_order_acq_rel) > 0)
        rehash(in, in->cap, true);
    if (in->count < in->max_strings)
        return false;
    uint64_t n = ++in->refused;
    if ((n & (n - 1)) == 0)
        LMC_WARN("interned strings: %zu held and all in use, the maximum; %llu new model names "
                 "or cache salts refused so far (--max-interned-strings)",
                 in->count, (unsigned long long)in->refused);
    return true;
}

/* Caller holds in->mu.  The string comes with one reference. */
static const char *intern_locked(lmc_key_interner *in, const char *s, size_t len, uint64_t hash)
{
    interned_str **sl = find_slot(in->slots, in->cap, s, len, hash);
    if (*sl) {
        atomic_fetch_add_explicit(&(*sl)->refs, 1, memory_order_relaxed);
        return (*sl)->chars;
    }
    if (refuse_locked(in))
        return NULL;
    /* Keep the load factor <= 1/2 so probe runs stay short. */
    if (2 * (in->count + 1) > in->cap) {
        if (!rehash(in, in->cap * 2, false))
            return NULL;
    }
    sl = find_slot(in->slots, in->cap, s, len, hash); /* a sweep or growth moved it */
    interned_str *is = malloc(sizeof *is + len + 1);
    if (!is)
        return NULL;
    atomic_init(&is->refs, 1);
    is->owner = in;
    is->hash = hash;
    is->len = len;
    memcpy(is->chars, s, len);
    is->chars[len] = '\0';
    *sl = is;
    in->count++;
    return is->chars;
}

const char *lmc_intern(lmc_key_interner *in, const char *s, size_t len)
{
    const uint64_t hash = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, s, len); /* outside the lock */
    pthread_mutex_lock(&in->mu);
    const char *r = intern_locked(in, s, len, hash);
    pthread_mutex_unlock(&in->mu);
    return r;
}

const char *lmc_intern_find(lmc_key_interner *in, const char *s, size_t len)
{
    const uint64_t hash = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, s, len);
    pthread_mutex_lock(&in->mu);
    interned_str *is = *find_slot(in->slots, in->cap, s, len, hash);
    if (is)
        atomic_fetch_add_explicit(&is->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&in->mu);
    return is ? is->chars : NULL;
}

/* The sweep reads a count under the interner's lock; a reference is only
 * ever taken from another one (a key copied from a key that holds its
 * own) or under that lock, so a count seen at zero stays zero. */
static void str_add(const char *s, uint64_t n)
{
    atomic_fetch_add_explicit(&str_header(s)->refs, n, memory_order_relaxed);
}

static void str_sub(const char *s, uint64_t n)
{
    interned_str *is = str_header(s);
    /* Read before the count falls: at zero a sweep may free `is` at once. */
    lmc_key_interner *owner = is->owner;
    if (atomic_fetch_sub_explicit(&is->refs, n, memory_order_acq_rel) == n)
        atomic_fetch_add_explicit(&owner->released, 1, memory_order_relaxed);
}

void lmc_intern_release(const char *s)
{
    if (s)
        str_sub(s, 1);
}

/* Adds or subtracts one reference per counted key, summing runs of keys
 * that share a string so a batch of one request's keys costs two atomic
 * operations, not two per key. */
static void keys_adjust(const lmc_object_key *keys, size_t n, void (*op)(const char *, uint64_t))
{
    const char *model = NULL, *salt = NULL;
    uint64_t model_run = 0, salt_run = 0;
    for (size_t i = 0; i < n; i++) {
        const lmc_object_key *k = &keys[i];
        if (!k->interned)
            continue;
        if (k->model_name != model) {
            if (model_run)
                op(model, model_run);
            model = k->model_name, model_run = 0;
        }
        if (k->cache_salt != salt) {
            if (salt_run)
                op(salt, salt_run);
            salt = k->cache_salt, salt_run = 0;
        }
        model_run++, salt_run++;
    }
    if (model_run)
        op(model, model_run);
    if (salt_run)
        op(salt, salt_run);
}

void lmc_keys_hold(const lmc_object_key *keys, size_t n)
{
    keys_adjust(keys, n, str_add);
}

void lmc_keys_drop(const lmc_object_key *keys, size_t n)
{
    keys_adjust(keys, n, str_sub);
}

void lmc_object_key_set_strings(lmc_object_key *k, const char *model, const char *salt)
{
    k->model_name = model;
    k->cache_salt = salt;
    k->interned = 1;
}

size_t lmc_key_interner_count(lmc_key_interner *in)
{
    pthread_mutex_lock(&in->mu);
    size_t n = in->count;
    pthread_mutex_unlock(&in->mu);
    return n;
}

bool lmc_key_interner_full(lmc_key_interner *in)
{
    pthread_mutex_lock(&in->mu);
    bool full = in->max_strings && in->count >= in->max_strings;
    pthread_mutex_unlock(&in->mu);
    return full;
}

uint64_t lmc_key_interner_refused(lmc_key_interner *in)
{
    pthread_mutex_lock(&in->mu);
    uint64_t n = in->refused;
    pthread_mutex_unlock(&in->mu);
    return n;
}

uint64_t lmc_key_interner_evicted(lmc_key_interner *in)
{
    pthread_mutex_lock(&in->mu);
    uint64_t n = in->evicted;
    pthread_mutex_unlock(&in->mu);
    return n;
}

/* ---- Validation --------------------------------------------------------- */

bool lmc_model_name_valid(const char *s, size_t len)
{
    return len > 0 && len <= LMC_MODEL_NAME_MAX && !memchr(s, '@', len) &&
           !memchr(s, '\0', len) && lmc_utf8_valid(s, len);
}

bool lmc_cache_salt_valid(const char *s, size_t len)
{
    if (len > LMC_CACHE_SALT_MAX || !lmc_utf8_valid(s, len))
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (ch == '@' || ch == '/' || ch == '\\' || ch == '\0')
            return false;
    }
    return true;
}

/* ---- Printing ----------------------------------------------------------- */

#define FS_SEP "-SEP-"
#define FS_SUFFIX ".data"

size_t lmc_object_key_text_cap(const lmc_object_key *k)
{
    /* Worst case: every model char is '/' -> "-SEP-" (5 chars), then
     * "@0x" 8 "@" 8 "@" 64 "@" salt ".data" NUL. */
    return 5 * strlen(k->model_name) + 3 + 8 + 1 + 8 + 1 + 2 * LMC_CHUNK_HASH_MAX + 1 +
           strlen(k->cache_salt) + sizeof FS_SUFFIX;
}

/* "@<rank>@<group>@<hash>[@<salt>]<suffix>" at out; rank_prefix is "" or "0x". */
static int print_fields(const lmc_object_key *k, const char *rank_prefix, const char *suffix,
                        char *out, size_t cap)
{
    char hex[2 * LMC_CHUNK_HASH_MAX + 1];
    size_t hl = k->chunk_hash_len <= LMC_CHUNK_HASH_MAX ? k->chunk_hash_len : LMC_CHUNK_HASH_MAX;
    lmc_hex_encode(k->chunk_hash, hl, hex);
    const bool salted = k->cache_salt[0] != '\0';
    int n = snprintf(out, cap, "@%s%08" PRIx32 "@%" PRIx32 "@%s%s%s%s", rank_prefix, k->kv_rank,
                     k->object_group_id, hex, salted ? "@" : "", k->cache_salt, suffix);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int lmc_object_key_to_string(const lmc_object_key *k, char *out, size_t cap)
{
    size_t ml = strlen(k->model_name);
    if (ml >= cap)
        return -1;
    memcpy(out, k->model_name, ml);
    int n = print_fields(k, "", "", out + ml, cap - ml);
    return n < 0 || ml > (size_t)(INT_MAX - n) ? -1 : (int)ml + n;
}

int lmc_object_key_to_filename(const lmc_object_key *k, char *out, size_t cap)
{
    size_t len = 0;
    for (const char *p = k->model_name; *p; p++) {
        const char *piece = *p == '/' ? FS_SEP : p;
        size_t pl = *p == '/' ? sizeof FS_SEP - 1 : 1;
        if (len + pl >= cap)
            return -1;
        memcpy(out + len, piece, pl);
        len += pl;
    }
    int n = print_fields(k, "0x", FS_SUFFIX, out + len, cap - len);
    return n < 0 || len > (size_t)(INT_MAX - n) ? -1 : (int)len + n;
}

/* ---- Parsing ------------------------------------------------------------ */

typedef struct {
    const char *p;
    size_t len;
} span;

typedef struct {
    span model; /* still in fs encoding for filenames */
    uint32_t kv_rank;
    uint32_t group;
    uint8_t hash[LMC_CHUNK_HASH_MAX];
    uint8_t hash_len;
    span salt; /* len 0 when absent */
} key_fields;

/* 1..8 hex digits into a u32. */
static bool parse_hex_u32(span f, uint32_t *out)
{
    if (f.len == 0 || f.len > 8)
        return false;
    uint32_t v = 0;
    for (size_t i = 0; i < f.len; i++) {
        int d = lmc_hex_nibble(f.p[i]);
        if (d < 0)
            return false;
        v = (v << 4) | (uint32_t)d;
    }
    *out = v;
    return true;
}

static bool parse_rank(span f, bool fs_form, uint32_t *out)
{
    if (fs_form) {
        if (f.len < 2 || f.p[0] != '0' || f.p[1] != 'x')
            return false;
        f.p += 2;
        f.len -= 2;
    }
    return f.len == 8 && parse_hex_u32(f, out);
}

/* "%x" never prints leading zeros, so "0" is the only field starting with 0. */
static bool parse_group(span f, uint32_t *out)
{
    return (f.len == 1 || (f.len > 1 && f.p[0] != '0')) && parse_hex_u32(f, out);
}

static bool parse_hash(span f, key_fields *kf)
{
    if (f.len == 0 || f.len % 2 || f.len > 2 * LMC_CHUNK_HASH_MAX)
        return false;
    if (!lmc_hex_decode(f.p, f.len / 2, kf->hash))
        return false;
    kf->hash_len = (uint8_t)(f.len / 2);
    return true;
}

/* Splits [s, s+len) on '@'; returns the field count, or 0 if not 4 or 5. */
static size_t split_fields(const char *s, size_t len, span f[5])
{
    size_t n = 0;
    const char *start = s, *end = s + len;
    for (const char *p = s; p <= end; p++) {
        if (p < end && *p != '@')
            continue;
        if (n == 5)
            return 0;
        f[n++] = (span){start, (size_t)(p - start)};
        start = p + 1;
    }
    return n >= 4 ? n : 0;
}

static bool parse_fields(const char *s, size_t len, bool fs_form, key_fields *kf)
{
    span f[5];
    size_t n = split_fields(s, len, f);
    if (n == 0)
        return false;
    kf->model = f[0];
    kf->salt = n == 5 ? f[4] : (span){"", 0};
    /* A present salt field is never empty: an empty salt prints no field. */
    if (n == 5 && (f[4].len == 0 || !lmc_cache_salt_valid(f[4].p, f[4].len)))
        return false;
    return parse_rank(f[1], fs_form, &kf->kv_rank) && parse_group(f[2], &kf->group) &&
           parse_hash(f[3], kf);
}

/* Validates the decoded model name, interns both strings, fills *out. */
static int build_key(lmc_key_interner *in, span model, const key_fields *kf, lmc_object_key *out)
{
    if (!lmc_model_name_valid(model.p, model.len))
        return -1;
    const char *m = lmc_intern(in, model.p, model.len);
    const char *salt = m ? lmc_intern(in, kf->salt.p, kf->salt.len) : NULL;
    if (!m || !salt) {
        lmc_intern_release(m);
        return -1;
    }
    memset(out, 0, sizeof *out);
    memcpy(out->chunk_hash, kf->hash, kf->hash_len);
    out->chunk_hash_len = kf->hash_len;
    out->kv_rank = kf->kv_rank;
    out->object_group_id = kf->group;
    lmc_object_key_set_strings(out, m, salt); /* the key takes both references */
    /* Names of an interner without a bound live as long as it does, so
     * its keys count nothing: a copy may outlive such an interner (an L2
     * adapter's) and must not touch it then. */
    out->interned = in->max_strings != 0;
    return 0;
}

int lmc_object_key_parse_string(lmc_key_interner *in, const char *s, lmc_object_key *out)
{
    key_fields kf;
    if (!parse_fields(s, strlen(s), false, &kf))
        return -1;
    return build_key(in, kf.model, &kf, out);
}

/* Undoes the "/" -> "-SEP-" substitution into dst (room for src.len + 1). */
static size_t decode_fs_model(span src, char *dst)
{
    const size_t sl = sizeof FS_SEP - 1;
    size_t n = 0;
    for (size_t i = 0; i < src.len;) {
        if (src.len - i >= sl && memcmp(src.p + i, FS_SEP, sl) == 0) {
            dst[n++] = '/';
            i += sl;
        } else {
            dst[n++] = src.p[i++];
        }
    }
    dst[n] = '\0';
    return n;
}

int lmc_object_key_parse_filename(lmc_key_interner *in, const char *name, lmc_object_key *out)
{
    const size_t len = strlen(name), sl = sizeof FS_SUFFIX - 1;
    key_fields kf;
    /* A '/' could not have been printed (models encode it, salts forbid it). */
    if (len < sl || memcmp(name + len - sl, FS_SUFFIX, sl) != 0 || memchr(name, '/', len) ||
        !parse_fields(name, len - sl, true, &kf))
        return -1;
    char *model = malloc(kf.model.len + 1);
    if (!model)
        return -1;
    span decoded = {model, decode_fs_model(kf.model, model)};
    int rc = build_key(in, decoded, &kf, out);
    free(model);
    return rc;
}
