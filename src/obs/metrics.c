/* Prometheus registry and text exposition (format 0.0.4).  Sources that
 * feed it from /proc, the event bus, the RPC core and the server status
 * are at the end of this file. */
#include "obs/metrics.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct series {
    char *values[LMC_METRICS_MAX_LABELS];
    double value;       /* counter / gauge */
    uint64_t *buckets;  /* histogram: n_bounds + 1 non-cumulative counts */
    double sum;
    uint64_t count;
    struct series *next;
} series;

struct lmc_metric {
    lmc_metrics *reg;
    lmc_metric_type type;
    char *name, *help;
    char *labels[LMC_METRICS_MAX_LABELS];
    size_t n_labels;
    double *bounds;
    size_t n_bounds;
    series *head, *tail;
    size_t n_series;
    struct lmc_metric *next;
};

typedef struct collector {
    lmc_metrics_collect_fn fn;
    void *user;
    bool owns_user;  /* free(user) with the registry */
    struct collector *next;
} collector;

struct lmc_metrics {
    pthread_mutex_t lock;
    lmc_metric *head, *tail;
    collector *collectors, *last_collector;
    uint64_t series_dropped;
    lmc_metric *dropped;  /* lmcache_mp_metrics_series_dropped_total */
};

/* ---- names and helpers ---------------------------------------------- */

static bool valid_name(const char *s, bool label)
{
    if (!s || !*s || isdigit((unsigned char)s[0]))
        return false;
    if (label && strncmp(s, "__", 2) == 0)
        return false;
    for (const char *p = s; *p; p++) {
        bool ok = isalnum((unsigned char)*p) || *p == '_' || (!label && *p == ':');
        if (!ok || (unsigned char)*p >= 0x80)
            return false;
    }
    return true;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void free_series(series *s, size_t n_labels)
{
    for (size_t i = 0; i < n_labels; i++)
        free(s->values[i]);
    free(s->buckets);
    free(s);
}

static void free_family(lmc_metric *m)
{
    for (series *s = m->head, *next; s; s = next) {
        next = s->next;
        free_series(s, m->n_labels);
    }
    for (size_t i = 0; i < m->n_labels; i++)
        free(m->labels[i]);
    free(m->name);
    free(m->help);
    free(m->bounds);
    free(m);
}

static lmc_metric *family_register(lmc_metrics *r, lmc_metric_type type, const char *name,
                                   const char *help, const char *const *labels,
                                   const double *bounds, size_t n_bounds);

lmc_metrics *lmc_metrics_new(void)
{
    lmc_metrics *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pthread_mutex_init(&r->lock, NULL);
    r->dropped = family_register(
        r, LMC_METRIC_COUNTER, "lmcache_mp_metrics_series_dropped_total",
        "Label sets not recorded because their family reached its series limit", NULL, NULL, 0);
    if (!r->dropped) {
        lmc_metrics_free(r);
        return NULL;
    }
    return r;
}

void lmc_metrics_free(lmc_metrics *r)
{
    if (!r)
        return;
    for (lmc_metric *m = r->head, *next; m; m = next) {
        next = m->next;
        free_family(m);
    }
    for (collector *c = r->collectors, *next; c; c = next) {
        next = c->next;
        if (c->owns_user)
            free(c->user);
        free(c);
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* ---- series lookup (registry lock held) ------------------------------ */

static bool series_matches(const series *s, const lmc_metric *m, const char *const *values)
{
    for (size_t i = 0; i < m->n_labels; i++) {
        if (strcmp(s->values[i], values[i]) != 0)
            return false;
    }
    return true;
}

static series *new_series(lmc_metric *m, const char *const *values)
{
    series *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    bool ok = true;
    for (size_t i = 0; i < m->n_labels; i++)
        ok = ok && (s->values[i] = strdup(values[i])) != NULL;
    if (ok && m->type == LMC_METRIC_HISTOGRAM)
        ok = (s->buckets = calloc(m->n_bounds + 1, sizeof *s->buckets)) != NULL;
    if (!ok) {
        free_series(s, m->n_labels);
        return NULL;
    }
    if (m->tail)
        m->tail->next = s;
    else
        m->head = s;
    m->tail = s;
    m->n_series++;
    return s;
}

/* Finds or (when `create`) adds the series for `values`. */
static series *get_series(lmc_metric *m, const char *const *values, bool create)
{
    if (m->n_labels > 0 && !values)
        return NULL;
    for (size_t i = 0; i < m->n_labels; i++) {
        if (!values[i])
            return NULL;
    }
    for (series *s = m->head; s; s = s->next) {
        if (series_matches(s, m, values))
            return s;
    }
    if (!create)
        return NULL;
    if (m->n_series >= LMC_METRICS_MAX_SERIES) {
        m->reg->series_dropped++;
        return NULL;
    }
    return new_series(m, values);
}

/* ---- registration ---------------------------------------------------- */

static bool same_shape(const lmc_metric *m, lmc_metric_type type, const char *const *labels,
                       size_t n_labels)
{
    if (m->type != type || m->n_labels != n_labels)
        return false;
    for (size_t i = 0; i < n_labels; i++) {
        if (strcmp(m->labels[i], labels[i]) != 0)
            return false;
    }
    return true;
}

static bool check_spec(lmc_metric_type type, const char *name, const char *const *labels,
                       size_t *n_labels)
{
    if (!valid_name(name, false))
        return false;
    if (type == LMC_METRIC_COUNTER && !has_suffix(name, "_total"))
        return false;
    size_t n = 0;
    while (labels && labels[n]) {
        if (n == LMC_METRICS_MAX_LABELS || !valid_name(labels[n], true))
            return false;
        if (type == LMC_METRIC_HISTOGRAM && strcmp(labels[n], "le") == 0)
            return false;
        n++;
    }
    *n_labels = n;
    return true;
}

static bool check_bounds(const double *bounds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
            return false;
    }
    return n == 0 || bounds != NULL;
}

static lmc_metric *alloc_family(lmc_metrics *r, lmc_metric_type type, const char *name,
                                const char *help, const char *const *labels, size_t n_labels,
                                const double *bounds, size_t n_bounds)
{
    lmc_metric *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->reg = r;
    m->type = type;
    m->n_labels = n_labels;
    m->n_bounds = n_bounds;
    bool ok = (m->name = strdup(name)) && (m->help = strdup(help ? help : ""));
    for (size_t i = 0; ok && i < n_labels; i++)
        ok = (m->labels[i] = strdup(labels[i])) != NULL;
    if (ok && n_bounds) {
        ok = (m->bounds = malloc(n_bounds * sizeof *bounds)) != NULL;
        if (ok)
            memcpy(m->bounds, bounds, n_bounds * sizeof *bounds);
    }
    /* A family without labels has its one series from the start. */
    if (ok && n_labels == 0)
        ok = new_series(m, NULL) != NULL;
    if (!ok) {
        free_family(m);
        return NULL;
    }
    return m;
}

static lmc_metric *family_register(lmc_metrics *r, lmc_metric_type type, const char *name,
                                   const char *help, const char *const *labels,
                                   const double *bounds, size_t n_bounds)
{
    size_t n_labels;
    if (!r || !check_spec(type, name, labels, &n_labels) || !check_bounds(bounds, n_bounds))
        return NULL;
    pthread_mutex_lock(&r->lock);
    lmc_metric *m;
    for (m = r->head; m; m = m->next) {
        if (strcmp(m->name, name) == 0)
            break;
    }
    if (m) {
        if (!same_shape(m, type, labels, n_labels))
            m = NULL;
    } else if ((m = alloc_family(r, type, name, help, labels, n_labels, bounds, n_bounds))) {
        if (r->tail)
            r->tail->next = m;
        else
            r->head = m;
        r->tail = m;
    }
    pthread_mutex_unlock(&r->lock);
    return m;
}

lmc_metric *lmc_metrics_counter(lmc_metrics *r, const char *name, const char *help,
                                const char *const *labels)
{
    return family_register(r, LMC_METRIC_COUNTER, name, help, labels, NULL, 0);
}

lmc_metric *lmc_metrics_gauge(lmc_metrics *r, const char *name, const char *help,
                              const char *const *labels)
{
    return family_register(r, LMC_METRIC_GAUGE, name, help, labels, NULL, 0);
}

lmc_metric *lmc_metrics_histogram(lmc_metrics *r, const char *name, const char *help,
                                  const char *const *labels, const double *bounds, size_t n)
{
    return family_register(r, LMC_METRIC_HISTOGRAM, name, help, labels, bounds, n);
}

/* ---- updates ---------------------------------------------------------- */

void lmc_metric_add(lmc_metric *m, const char *const *values, double v)
{
    if (!m || m->type == LMC_METRIC_HISTOGRAM || isnan(v))
        return;
    if (m->type == LMC_METRIC_COUNTER && v < 0)
        return;
    pthread_mutex_lock(&m->reg->lock);
    series *s = get_series(m, values, true);
    if (s)
        s->value += v;
    pthread_mutex_unlock(&m->reg->lock);
}

void lmc_metric_set(lmc_metric *m, const char *const *values, double v)
{
    if (!m || m->type == LMC_METRIC_HISTOGRAM)
        return;
    pthread_mutex_lock(&m->reg->lock);
    series *s = get_series(m, values, true);
    if (s)
        s->value = v;
    pthread_mutex_unlock(&m->reg->lock);
}

void lmc_metric_clear(lmc_metric *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->reg->lock);
    for (series *s = m->head, *next; s; s = next) {
        next = s->next;
        free_series(s, m->n_labels);
    }
    m->head = m->tail = NULL;
    m->n_series = 0;
    pthread_mutex_unlock(&m->reg->lock);
}

void lmc_metric_observe(lmc_metric *m, const char *const *values, double v)
{
    if (!m || m->type != LMC_METRIC_HISTOGRAM || isnan(v))
        return;
    pthread_mutex_lock(&m->reg->lock);
    series *s = get_series(m, values, true);
    if (s) {
        size_t b = 0;
        while (b < m->n_bounds && v > m->bounds[b])
            b++;
        s->buckets[b]++;
        s->sum += v;
        s->count++;
    }
    pthread_mutex_unlock(&m->reg->lock);
}

double lmc_metric_value(lmc_metric *m, const char *const *values)
{
    if (!m)
        return 0;
    pthread_mutex_lock(&m->reg->lock);
    series *s = get_series(m, values, false);
    double v = !s ? 0 : m->type == LMC_METRIC_HISTOGRAM ? (double)s->count : s->value;
    pthread_mutex_unlock(&m->reg->lock);
    return v;
}

int lmc_metrics_add_collector(lmc_metrics *r, lmc_metrics_collect_fn fn, void *user)
{
    collector *c = calloc(1, sizeof *c);
    if (!r || !fn || !c) {
        free(c);
        return -1;
    }
    c->fn = fn;
    c->user = user;
    pthread_mutex_lock(&r->lock);
    if (r->last_collector)
        r->last_collector->next = c;
    else
        r->collectors = c;
    r->last_collector = c;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

int lmc_metrics_add_owned_collector(lmc_metrics *r, lmc_metrics_collect_fn fn, void *user)
{
    if (lmc_metrics_add_collector(r, fn, user) != 0) {
        free(user);
        return -1;
    }
    pthread_mutex_lock(&r->lock);
    r->last_collector->owns_user = true;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

/* ---- rendering -------------------------------------------------------- */

void lmc_metrics_format_value(double v, char *buf, size_t len)
{
    if (isnan(v)) {
        snprintf(buf, len, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, len, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (fabs(v) < 1e15 && v == (double)(int64_t)v) {
        snprintf(buf, len, "%.0f", v == 0 ? 0.0 : v); /* no "-0" */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* HELP text escapes \ and newline; label values also escape ". */
static void write_escaped(FILE *f, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (quote && *s == '"')
            fputs("\\\"", f);
        else
            fputc(*s, f);
    }
}

/* Writes {a="x",b="y"[,le="..."]}, or nothing without labels. */
static void write_labels(FILE *f, const lmc_metric *m, const series *s, const char *le)
{
    if (m->n_labels == 0 && !le)
        return;
    fputc('{', f);
    for (size_t i = 0; i < m->n_labels; i++) {
        fprintf(f, "%s%s=\"", i ? "," : "", m->labels[i]);
        write_escaped(f, s->values[i], true);
        fputc('"', f);
    }
    if (le)
        fprintf(f, "%sle=\"%s\"", m->n_labels ? "," : "", le);
    fputc('}', f);
}

static void write_sample(FILE *f, const lmc_metric *m, const series *s, const char *suffix,
                         const char *le, double v)
{
    char num[64];
    lmc_metrics_format_value(v, num, sizeof num);
    fprintf(f, "%s%s", m->name, suffix);
    write_labels(f, m, s, le);
    fprintf(f, " %s\n", num);
}

static void write_histogram(FILE *f, const lmc_metric *m, const series *s)
{
    char le[64];
    uint64_t cumulative = 0;
    for (size_t b = 0; b <= m->n_bounds; b++) {
        cumulative += s->buckets[b];
        if (b < m->n_bounds)
            lmc_metrics_format_value(m->bounds[b], le, sizeof le);
        else
            snprintf(le, sizeof le, "+Inf");
        write_sample(f, m, s, "_bucket", le, (double)cumulative);
    }
    write_sample(f, m, s, "_sum", NULL, s->sum);
    write_sample(f, m, s, "_count", NULL, (double)s->count);
}

static const char *type_name(lmc_metric_type t)
{
    return t == LMC_METRIC_COUNTER ? "counter" : t == LMC_METRIC_GAUGE ? "gauge" : "histogram";
}

static void write_family(FILE *f, const lmc_metric *m)
{
    fprintf(f, "# HELP %s ", m->name);
    write_escaped(f, m->help, false);
    fprintf(f, "\n# TYPE %s %s\n", m->name, type_name(m->type));
    for (const series *s = m->head; s; s = s->next) {
        if (m->type == LMC_METRIC_HISTOGRAM)
            write_histogram(f, m, s);
        else
            write_sample(f, m, s, "", NULL, s->value);
    }
}

static void run_collectors(lmc_metrics *r)
{
    pthread_mutex_lock(&r->lock);
    collector *c = r->collectors;
    pthread_mutex_unlock(&r->lock);
    /* Collectors are only ever appended, so the list can be walked
     * without the lock; each `next` is read under it. */
    while (c) {
        c->fn(r, c->user);
        pthread_mutex_lock(&r->lock);
        c = c->next;
        pthread_mutex_unlock(&r->lock);
    }
}

/* ---- snapshot (OTLP export) ------------------------------------------ */

static json_t *series_json(const lmc_metric *m, const series *s)
{
    json_t *labels = json_object();
    for (size_t i = 0; i < m->n_labels; i++)
        json_object_set_new(labels, m->labels[i], json_string(s->values[i]));
    if (m->type != LMC_METRIC_HISTOGRAM)
        return json_pack("{s:o, s:f}", "labels", labels, "value", s->value);
    json_t *buckets = json_array();
    for (size_t b = 0; b <= m->n_bounds; b++)
        json_array_append_new(buckets, json_integer((json_int_t)s->buckets[b]));
    return json_pack("{s:o, s:o, s:f, s:I}", "labels", labels, "buckets", buckets, "sum",
                     s->sum, "count", (json_int_t)s->count);
}

static json_t *family_json(const lmc_metric *m)
{
    json_t *bounds = json_array(), *list = json_array();
    for (size_t b = 0; b < m->n_bounds; b++)
        json_array_append_new(bounds, json_real(m->bounds[b]));
    for (const series *s = m->head; s; s = s->next)
        json_array_append_new(list, series_json(m, s));
    return json_pack("{s:s, s:s, s:s, s:o, s:o}", "name", m->name, "help", m->help, "type",
                     type_name(m->type), "bounds", bounds, "series", list);
}

json_t *lmc_metrics_snapshot(lmc_metrics *r)
{
    if (!r)
        return NULL;
    run_collectors(r);
    json_t *out = json_array();
    pthread_mutex_lock(&r->lock);
    r->dropped->head->value = (double)r->series_dropped;
    for (const lmc_metric *m = r->head; m && out; m = m->next)
        json_array_append_new(out, family_json(m));
    pthread_mutex_unlock(&r->lock);
    return out;
}

char *lmc_metrics_render(lmc_metrics *r)
{
    if (!r)
        return NULL;
    run_collectors(r);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    pthread_mutex_lock(&r->lock);
    r->dropped->head->value = (double)r->series_dropped;
    for (const lmc_metric *m = r->head; m; m = m->next)
        write_family(f, m);
    pthread_mutex_unlock(&r->lock);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
