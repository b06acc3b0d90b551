/* Private to src/config/: helpers shared by the parser, validator, JSON
 * renderer and help printer.  Nothing here is part of the public API. */
#ifndef LMC_CONFIG_INTERNAL_H
#define LMC_CONFIG_INTERNAL_H

#include "config/config.h"

#include <jansson.h>
#include <stdarg.h>

/* Error sink: every failure writes one line and returns LMC_CONFIG_ERROR. */
typedef struct {
    char *buf;
    size_t len;
} lmc_cfg_err;

int lmc_cfg_fail(lmc_cfg_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Lookup by name without "--"; NULL if unknown. */
const lmc_config_flag *lmc_cfg_find(const char *name);
size_t lmc_cfg_index(const lmc_config_flag *f);
void *lmc_cfg_field(lmc_config *cfg, const lmc_config_flag *f);
const void *lmc_cfg_cfield(const lmc_config *cfg, const lmc_config_flag *f);

/* Converts `text` and stores it in f's field.  `source` names where the
 * text came from ("--port" or an environment variable) for the error line.
 * Returns 0 or -1 (err filled). */
int lmc_cfg_set(lmc_config *cfg, const lmc_config_flag *f, const char *text,
                const char *source, lmc_cfg_err *e);
int lmc_cfg_set_bool(lmc_config *cfg, const lmc_config_flag *f, bool value);
int lmc_cfg_list_push(lmc_strlist *l, const char *text);
void lmc_cfg_list_clear(lmc_strlist *l);

/* Strict number parsing: whole string, no surrounding junk. */
bool lmc_cfg_parse_i64(const char *text, int64_t *out);
bool lmc_cfg_parse_double(const char *text, double *out);

/* Writes a random RFC 4122 version-4 UUID (36 chars + NUL) into out[37]. */
int lmc_cfg_uuid4(char out[37]);

/* The flag an unknown name most likely meant, or NULL (config_parse.c). */
const char *lmc_cfg_nearest_flag(const char *name);

/* Fills the flags not yet seen (per flag-table index) from the JSON file
 * at path, and marks them seen (config_file.c).  0, or -1 with e filled. */
int lmc_cfg_apply_file(lmc_config *cfg, const char *path, bool *seen, lmc_cfg_err *e);

/* --print-config: every flag by name, secrets as "***", the instance id
 * null when it was drawn at random (config_json.c).  malloc'd text, NULL
 * when out of memory. */
char *lmc_cfg_to_flag_json(const lmc_config *cfg, bool random_instance_id);

/* What --help says of a flag whose feature this build refuses
 * (config_built.c), or NULL for a flag that works. */
const char *lmc_cfg_unbuilt_help(const lmc_config_flag *f);

/* Post-parse checks: table-driven ranges, then the cross-field rules. */
int lmc_cfg_validate(lmc_config *cfg, lmc_cfg_err *e);
int lmc_cfg_check_l1_managers(const lmc_config *cfg, lmc_cfg_err *e);
int lmc_cfg_check_l2_adapters(const lmc_config *cfg, lmc_cfg_err *e);
int lmc_cfg_check_verbs(const lmc_config *cfg, lmc_cfg_err *e);
/* The HTTP token rules (config_http.c); reads --http-auth-token-file into
 * cfg->http.auth_token. */
int lmc_cfg_check_http(lmc_config *cfg, lmc_cfg_err *e);

/* Sets *type to the type ("DRAM", "DEVDAX", "GDS") of the L1 with this
 * tag, NULL if none.  Legacy mode has one L1 tagged "_default".  Points
 * into static storage.  0, or -1 when out of memory (*type unset). */
int lmc_cfg_l1_type_of_tag(const lmc_config *cfg, const char *tag, const char **type);

/* Parses --l1-manager entry i (already validated, so NULL means out of
 * memory, or no entry i); caller json_decref()s. */
json_t *lmc_cfg_l1_entry(const lmc_config *cfg, size_t i);

/* json_loads() of a flag's JSON text.  NULL when it does not load: then
 * *oom tells an allocation failure from bad JSON (jansson reports some
 * failures as syntax errors, or with no text), and `why` holds "out of
 * memory" or jansson's reason. */
json_t *lmc_cfg_json_load(const char *text, size_t flags, bool *oom, char *why, size_t whylen);
/* Whether `text` is one well-formed JSON text as json_loads(text, flags)
 * reads it (syntax, UTF-8, escapes, nesting; not duplicate keys or number
 * ranges).  Allocates nothing. */
bool lmc_cfg_json_syntax_ok(const char *text, size_t flags);

#endif
