/* ObjectKey interning, validation and text forms (docs/hashing.md,
 * "4. Object keys").
 *
 * Round-trip rule: a string or filename that parses prints back to exactly
 * the same text.  That is why parsing accepts only the forms we print:
 * lowercase hex, kv_rank as exactly 8 digits, object_group_id without leading
 * zeros, the salt field only when non-empty, and a non-empty chunk hash. */
#include "storage/object_key.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "obs/log.h"

/* ---- Interning ---------------------------------------------------------- */

/* Open-addressing hash set of owned strings.  Each string is a separate
 * allocation, so growing the slot array never moves a returned pointer. */
typedef struct {
    char *str; /* NULL = empty slot */
    size_t len;
    uint64_t hash;
} intern_slot;

struct lmc_key_interner {
    pthread_mutex_t mu;
    intern_slot *slots;
    size_t cap; /* power of two */
    size_t count;
    size_t max_strings; /* 0: no bound */
    uint64_t refused;
};

#define INTERN_INITIAL_CAP 64

static uint64_t fnv1a(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

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
        free(in->slots[i].str);
    free(in->slots);
    pthread_mutex_destroy(&in->mu);
    free(in);
}

/* Slot holding (s, len), or the empty slot where it would go. */
static intern_slot *find_slot(intern_slot *slots, size_t cap, const char *s, size_t len,
                              uint64_t hash)
{
    size_t i = (size_t)hash & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        intern_slot *sl = &slots[i];
        if (!sl->str || (sl->hash == hash && sl->len == len && memcmp(sl->str, s, len) == 0))
            return sl;
    }
}

static bool grow(lmc_key_interner *in)
{
    size_t cap = in->cap * 2;
    intern_slot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < in->cap; i++) {
        const intern_slot *old = &in->slots[i];
        if (old->str)
            *find_slot(slots, cap, old->str, old->len, old->hash) = *old;
    }
    free(in->slots);
    in->slots = slots;
    in->cap = cap;
    return true;
}

/* A full bounded interner refuses the string; logged at each power of
 * two refusals, so a flood of new names cannot flood the log. */
static bool refuse_locked(lmc_key_interner *in)
{
    if (!in->max_strings || in->count < in->max_strings)
        return false;
    uint64_t n = ++in->refused;
    if ((n & (n - 1)) == 0)
        LMC_WARN("interned strings: %zu held, the maximum; %llu new model names or cache salts "
                 "refused so far (--max-interned-strings)",
                 in->count, (unsigned long long)in->refused);
    return true;
}

/* Caller holds in->mu. */
static const char *intern_locked(lmc_key_interner *in, const char *s, size_t len, uint64_t hash)
{
    intern_slot *sl = find_slot(in->slots, in->cap, s, len, hash);
    if (sl->str)
        return sl->str;
    if (refuse_locked(in))
        return NULL;
    /* Keep the load factor <= 1/2 so probe runs stay short. */
    if (2 * (in->count + 1) > in->cap) {
        if (!grow(in))
            return NULL;
        sl = find_slot(in->slots, in->cap, s, len, hash);
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    *sl = (intern_slot){.str = copy, .len = len, .hash = hash};
    in->count++;
    return copy;
}

const char *lmc_intern(lmc_key_interner *in, const char *s, size_t len)
{
    const uint64_t hash = fnv1a(s, len); /* outside the lock */
    pthread_mutex_lock(&in->mu);
    const char *r = intern_locked(in, s, len, hash);
    pthread_mutex_unlock(&in->mu);
    return r;
}

const char *lmc_intern_find(lmc_key_interner *in, const char *s, size_t len)
{
    const uint64_t hash = fnv1a(s, len);
    pthread_mutex_lock(&in->mu);
    const char *r = find_slot(in->slots, in->cap, s, len, hash)->str;
    pthread_mutex_unlock(&in->mu);
    return r;
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

/* ---- Validation --------------------------------------------------------- */

bool lmc_model_name_valid(const char *s, size_t len)
{
    return len > 0 && len <= LMC_MODEL_NAME_MAX && !memchr(s, '@', len) &&
           !memchr(s, '\0', len);
}

bool lmc_cache_salt_valid(const char *s, size_t len)
{
    if (len > LMC_CACHE_SALT_MAX)
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
    static const char digits[] = "0123456789abcdef";
    char hex[2 * LMC_CHUNK_HASH_MAX + 1];
    size_t hl = k->chunk_hash_len <= LMC_CHUNK_HASH_MAX ? k->chunk_hash_len : LMC_CHUNK_HASH_MAX;
    for (size_t i = 0; i < hl; i++) {
        hex[2 * i] = digits[k->chunk_hash[i] >> 4];
        hex[2 * i + 1] = digits[k->chunk_hash[i] & 15];
    }
    hex[2 * hl] = '\0';
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

/* Lowercase hex digit value, or -1 (uppercase is rejected on purpose). */
static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* 1..8 hex digits into a u32. */
static bool parse_hex_u32(span f, uint32_t *out)
{
    if (f.len == 0 || f.len > 8)
        return false;
    uint32_t v = 0;
    for (size_t i = 0; i < f.len; i++) {
        int d = hexval(f.p[i]);
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
    for (size_t i = 0; i < f.len / 2; i++) {
        int hi = hexval(f.p[2 * i]), lo = hexval(f.p[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        kf->hash[i] = (uint8_t)(hi << 4 | lo);
    }
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
    const char *salt = lmc_intern(in, kf->salt.p, kf->salt.len);
    if (!m || !salt)
        return -1;
    memset(out, 0, sizeof *out);
    memcpy(out->chunk_hash, kf->hash, kf->hash_len);
    out->chunk_hash_len = kf->hash_len;
    out->kv_rank = kf->kv_rank;
    out->object_group_id = kf->group;
    out->model_name = m;
    out->cache_salt = salt;
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
