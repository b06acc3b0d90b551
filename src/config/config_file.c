/* --config FILE: a JSON object whose keys are flag names, the same values
 * the flags take (docs/configuration.md, "Configuration file").  The file
 * fills only what neither the command line nor the environment gave, so
 * a flag always overrides it. */
#include "config/config_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* An operator's file, not a client's; the bound only keeps a wrong path
 * (a disk image, /dev/zero) from being read into memory. */
#define CONFIG_FILE_MAX (1u << 20)

static char *read_bounded(const char *path, lmc_cfg_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        lmc_cfg_fail(e, "--config: cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(CONFIG_FILE_MAX + 1);
    size_t n = text ? fread(text, 1, CONFIG_FILE_MAX + 1, f) : 0;
    bool failed = text && ferror(f);
    fclose(f);
    if (!text || failed || n > CONFIG_FILE_MAX) {
        lmc_cfg_fail(e, "--config: '%s' %s", path,
                     !text ? "cannot be read: out of memory"
                     : failed ? "cannot be read"
                              : "is larger than 1 MiB");
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* One JSON value as the text the flag would take on the command line;
 * NULL (and e filled) when the value cannot stand for this flag. */
static char *value_text(const lmc_config_flag *f, const json_t *v, const char *source,
                        lmc_cfg_err *e)
{
    char buf[64];
    if (json_is_string(v))
        return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
        return strdup(buf);
    }
    if ((json_is_object(v) || json_is_array(v)) && (f->flags & LMC_FF_JSON))
        return json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    lmc_cfg_fail(e, "%s: expected %s, got a JSON %s", source,
                 (f->flags & LMC_FF_JSON) ? "a JSON object" : "a string or a number",
                 json_is_boolean(v) ? "boolean" : json_is_null(v) ? "null"
                 : json_is_array(v) ? "array" : "object");
    return NULL;
}

static int set_one(lmc_config *cfg, const lmc_config_flag *f, const json_t *v,
                   const char *source, lmc_cfg_err *e)
{
    char *text = value_text(f, v, source, e);
    if (!text)
        return e->buf && e->buf[0] ? -1 : lmc_cfg_fail(e, "out of memory");
    int rc = lmc_cfg_set(cfg, f, text, source, e);
    free(text);
    return rc;
}

static int set_from_json(lmc_config *cfg, const lmc_config_flag *f, const json_t *v,
                         const char *source, lmc_cfg_err *e)
{
    if (f->kind == LMC_FK_BOOL || f->kind == LMC_FK_TRUE) {
        if (!json_is_boolean(v))
            return lmc_cfg_fail(e, "%s: expected true or false", source);
        return lmc_cfg_set_bool(cfg, f, json_is_true(v));
    }
    if ((f->flags & LMC_FF_SECRET) && json_is_string(v) && !strcmp(json_string_value(v), "***"))
        return lmc_cfg_fail(e, "%s: '***' is the placeholder --print-config writes for a "
                               "secret; put the secret itself here", source);
    if (f->kind != LMC_FK_APPEND && f->kind != LMC_FK_NARGS)
        return set_one(cfg, f, v, source, e);
    lmc_cfg_list_clear(lmc_cfg_field(cfg, f));
    if (!json_is_array(v))
        return set_one(cfg, f, v, source, e);
    size_t i;
    const json_t *item;
    json_array_foreach(v, i, item)
        if (set_one(cfg, f, item, source, e) != 0)
            return -1;
    return 0;
}

/* A key in the file's spelling ("l1_size_gb" or "l1-size-gb") as a flag. */
static const lmc_config_flag *flag_of_key(const char *key, char *name, size_t cap)
{
    size_t len = strlen(key);
    if (len == 0 || len >= cap)
        return NULL;
    for (size_t i = 0; i <= len; i++)
        name[i] = key[i] == '_' ? '-' : key[i];
    return lmc_cfg_find(name);
}

int lmc_cfg_apply_file(lmc_config *cfg, const char *path, bool *seen, lmc_cfg_err *e)
{
    char *text = read_bounded(path, e);
    if (!text)
        return -1;
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(root)) {
        if (root)
            lmc_cfg_fail(e, "--config: '%s' must hold one JSON object of flag names", path);
        else
            lmc_cfg_fail(e, "--config: '%s' line %d: %s", path, jerr.line, jerr.text);
        json_decref(root);
        return -1;
    }
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        char name[128], source[192];
        const lmc_config_flag *f = flag_of_key(key, name, sizeof name);
        snprintf(source, sizeof source, "--config %s: \"%s\"", path, key);
        if (!f) {
            const char *near = lmc_cfg_nearest_flag(key);
            rc = near ? lmc_cfg_fail(e, "%s: no such flag (did you mean \"%s\"?)", source, near)
                      : lmc_cfg_fail(e, "%s: no such flag", source);
            break;
        }
        /* Given on the command line or in the environment; or null, which
         * --print-config writes for None and for a random instance id. */
        if (seen[lmc_cfg_index(f)] || json_is_null(v))
            continue;
        if ((rc = set_from_json(cfg, f, v, source, e)) != 0)
            break;
        seen[lmc_cfg_index(f)] = true; /* derived defaults must not replace it */
    }
    json_decref(root);
    return rc;
}
