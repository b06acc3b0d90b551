/* Converting flag text into typed config fields, plus the lifecycle of an
 * lmc_config (defaults, free) and the random instance id. */
#include "config/config_internal.h"
#include "obs/log.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

int lmc_cfg_fail(lmc_cfg_err *e, const char *fmt, ...)
{
    if (e && e->buf && e->len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->buf, e->len, fmt, ap);
        va_end(ap);
        /* The contract is one line: a value with a newline must not break it. */
        for (char *p = e->buf; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return -1;
}

bool lmc_cfg_parse_i64(const char *text, int64_t *out)
{
    /* strtoll skips leading blanks; argparse's int() would too, but a value
     * like " 5" on a command line is almost surely a quoting mistake. */
    if (!text || !*text || isspace((unsigned char)*text))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = (int64_t)v;
    return true;
}

bool lmc_cfg_parse_double(const char *text, double *out)
{
    if (!text || !*text || isspace((unsigned char)*text))
        return false;
    /* Python's float() has no hex floats; keep "0x10" an error here too. */
    const char *p = text + (*text == '+' || *text == '-');
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    /* ERANGE on underflow still yields a usable (tiny) value, as in Python. */
    if (*end != '\0' || (errno == ERANGE && (v == HUGE_VAL || v == -HUGE_VAL)))
        return false;
    *out = v;
    return true;
}

int lmc_cfg_list_push(lmc_strlist *l, const char *text)
{
    char *copy = strdup(text);
    char **grown = copy ? realloc(l->items, (l->count + 1) * sizeof *grown) : NULL;
    if (!grown) {
        free(copy);
        return -1;
    }
    grown[l->count++] = copy;
    l->items = grown;
    return 0;
}

void lmc_cfg_list_clear(lmc_strlist *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

static void choices_text(const lmc_config_flag *f, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; f->choices[i] && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? ", " : "",
                                 f->choices[i]);
}

/* Returns the stored spelling of a valid choice, NULL if invalid. */
static const char *canonical_choice(const lmc_config_flag *f, const char *text)
{
    if (f->flags & LMC_FF_LOG_LEVEL) {
        lmc_log_level level;
        return lmc_log_level_parse(text, &level) ? lmc_log_level_name(level) : NULL;
    }
    if (!f->choices)
        return text;
    for (size_t i = 0; f->choices[i]; i++)
        if (strcmp(f->choices[i], text) == 0)
            return f->choices[i];
    return NULL;
}

static int set_string(char **slot, const lmc_config_flag *f, const char *text,
                      const char *source, lmc_cfg_err *e)
{
    const char *value = canonical_choice(f, text);
    if (!value) {
        char list[256];
        choices_text(f, list, sizeof list);
        return lmc_cfg_fail(e, "%s: invalid choice '%s' (choose from %s)", source, text,
                            list);
    }
    char *copy = strdup(value);
    if (!copy)
        return lmc_cfg_fail(e, "%s: out of memory", source);
    free(*slot);
    *slot = copy;
    return 0;
}

static int set_integer(void *slot, const lmc_config_flag *f, const char *text,
                       const char *source, lmc_cfg_err *e)
{
    int64_t v;
    if (!lmc_cfg_parse_i64(text, &v))
        return lmc_cfg_fail(e, "%s: invalid int value '%s'", source, text);
    if (f->kind == LMC_FK_I64) {
        *(int64_t *)slot = v;
        return 0;
    }
    if (v < INT_MIN || v > INT_MAX)
        return lmc_cfg_fail(e, "%s: value out of range for int, got %s", source, text);
    *(int *)slot = (int)v;
    return 0;
}

/* Text form of a boolean from a default or an environment variable. */
static bool truthy(const char *text)
{
    return strcasecmp(text, "1") == 0 || strcasecmp(text, "true") == 0 ||
           strcasecmp(text, "yes") == 0;
}

int lmc_cfg_set_bool(lmc_config *cfg, const lmc_config_flag *f, bool value)
{
    *(bool *)lmc_cfg_field(cfg, f) = value;
    return 0;
}

int lmc_cfg_set(lmc_config *cfg, const lmc_config_flag *f, const char *text,
                const char *source, lmc_cfg_err *e)
{
    void *slot = lmc_cfg_field(cfg, f);
    double d;
    switch (f->kind) {
    case LMC_FK_STR:
    case LMC_FK_NSTR:
        return set_string(slot, f, text, source, e);
    case LMC_FK_INT:
    case LMC_FK_I64:
        return set_integer(slot, f, text, source, e);
    case LMC_FK_DBL:
    case LMC_FK_OPT_DBL:
        if (!lmc_cfg_parse_double(text, &d))
            return lmc_cfg_fail(e, "%s: invalid float value '%s'", source, text);
        if (f->kind == LMC_FK_DBL)
            *(double *)slot = d;
        else
            *(lmc_opt_double *)slot = (lmc_opt_double){.set = true, .value = d};
        return 0;
    case LMC_FK_BOOL:
    case LMC_FK_TRUE:
        return lmc_cfg_set_bool(cfg, f, truthy(text));
    case LMC_FK_APPEND:
    case LMC_FK_NARGS:
        if (lmc_cfg_list_push(slot, text) != 0)
            return lmc_cfg_fail(e, "%s: out of memory", source);
        return 0;
    }
    return lmc_cfg_fail(e, "%s: unsupported flag kind", source);
}

int lmc_cfg_uuid4(char out[37])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hex[b[i] >> 4];
        *p++ = hex[b[i] & 15];
    }
    *p = '\0';
    return 0;
}

int lmc_config_init_defaults(lmc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        if (flags[i].def && lmc_cfg_set(cfg, &flags[i], flags[i].def, flags[i].name, NULL)) {
            lmc_config_free(cfg);
            return -1;
        }
    }
    cfg->mp.max_gpu_workers = cfg->mp.max_workers;
    cfg->mp.max_cpu_workers = cfg->mp.max_workers;
    char id[37];
    if (lmc_cfg_uuid4(id) != 0 || !(cfg->mp.instance_id = strdup(id))) {
        lmc_config_free(cfg);
        return -1;
    }
    return 0;
}

void lmc_config_free(lmc_config *cfg)
{
    if (!cfg)
        return;
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        void *slot = lmc_cfg_field(cfg, &flags[i]);
        if (flags[i].kind == LMC_FK_STR || flags[i].kind == LMC_FK_NSTR)
            free(*(char **)slot);
        else if (flags[i].kind == LMC_FK_APPEND || flags[i].kind == LMC_FK_NARGS)
            lmc_cfg_list_clear(slot);
    }
    memset(cfg, 0, sizeof *cfg);
}
