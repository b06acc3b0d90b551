/* argv + environment -> lmc_config, following Python argparse conventions:
 * "--flag value" and "--flag=value", "--no-flag" for boolean toggles,
 * nargs='*' lists that run until the next "--" argument, repeatable
 * append flags.  Precedence: explicit flag > environment > --config's
 * file > default (docs/configuration.md, "Configuration file"). */
#include "config/config_internal.h"

#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#ifndef LMC_VERSION_STRING
#define LMC_VERSION_STRING "0.1.0"
#endif

typedef struct {
    lmc_config *cfg;
    bool *seen;               /* per flag-table index: given on the command line */
    int argc;
    char *const *argv;
    int i;                    /* index of the argument being parsed */
    lmc_cfg_err *e;
    const char *config_file;  /* --config FILE, or NULL */
    bool print_config;        /* --print-config */
} parser;

/* A following argument that starts with "--" is the next flag, not a value
 * (single-dash values such as "-1" are values, as in argparse). */
static bool is_flag_like(const char *arg)
{
    return strncmp(arg, "--", 2) == 0;
}

static int take_value(parser *p, const lmc_config_flag *f, const char *inline_value,
                      const char *source)
{
    if (inline_value)
        return lmc_cfg_set(p->cfg, f, inline_value, source, p->e);
    if (p->i + 1 >= p->argc || is_flag_like(p->argv[p->i + 1]))
        return lmc_cfg_fail(p->e, "%s: expected one argument", source);
    return lmc_cfg_set(p->cfg, f, p->argv[++p->i], source, p->e);
}

/* nargs='*': zero or more values; a repeated flag replaces the list. */
static int take_values(parser *p, const lmc_config_flag *f, const char *inline_value,
                       const char *source)
{
    lmc_cfg_list_clear(lmc_cfg_field(p->cfg, f));
    if (inline_value)
        return lmc_cfg_set(p->cfg, f, inline_value, source, p->e);
    while (p->i + 1 < p->argc && !is_flag_like(p->argv[p->i + 1]))
        if (lmc_cfg_set(p->cfg, f, p->argv[++p->i], source, p->e) != 0)
            return -1;
    return 0;
}

static bool is_toggle(const lmc_config_flag *f)
{
    return f && (f->kind == LMC_FK_BOOL || f->kind == LMC_FK_TRUE);
}

/* Resolves "name" or "no-name"; *negated tells which matched. */
static const lmc_config_flag *resolve(const char *name, bool *negated)
{
    const lmc_config_flag *f = lmc_cfg_find(name);
    *negated = false;
    if (!f && strncmp(name, "no-", 3) == 0 && is_toggle(lmc_cfg_find(name + 3))) {
        f = lmc_cfg_find(name + 3);
        *negated = true;
    }
    return f;
}

/* Edit distance between a and b (each at most 127 bytes), '_' read as '-'. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[128];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            char ca = a[i - 1] == '_' ? '-' : a[i - 1];
            size_t up = row[j];
            size_t best = diag + (ca != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The flag an unknown name most likely meant: a name it begins (--l1-size
 * for --l1-size-gb), or one within a few typos (docs/configuration.md);
 * NULL when none is that close. */
const char *lmc_cfg_nearest_flag(const char *name)
{
    size_t n, len = strlen(name), best = SIZE_MAX;
    const char *found = NULL;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    if (len < 3 || len > 127)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *f = flags[i].name;
        if (strlen(f) > 127)
            continue;
        size_t d = strncmp(f, name, len) == 0 ? 1 : edit_distance(name, f);
        if (d < best) {
            best = d;
            found = f;
        }
    }
    return best <= 2 + len / 8 ? found : NULL;
}

static int unknown_flag(parser *p, const char *arg, const char *name)
{
    const char *near = lmc_cfg_nearest_flag(name);
    if (near)
        return lmc_cfg_fail(p->e, "unrecognized argument: %s (did you mean --%s?)", arg, near);
    return lmc_cfg_fail(p->e, "unrecognized argument: %s", arg);
}

static int parse_flag(parser *p, const char *arg)
{
    char name[128];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof name)
        return lmc_cfg_fail(p->e, "unrecognized argument: %s", arg);
    memcpy(name, arg, len);
    name[len] = '\0';
    bool negated;
    const lmc_config_flag *f = resolve(name + 2, &negated);
    if (!f)
        return unknown_flag(p, arg, name + 2);
    p->seen[lmc_cfg_index(f)] = true;
    const char *inline_value = eq ? eq + 1 : NULL;
    if (is_toggle(f)) {
        if (inline_value)
            return lmc_cfg_fail(p->e, "%s: ignored explicit argument '%s'", name,
                                inline_value);
        return lmc_cfg_set_bool(p->cfg, f, !negated);
    }
    if (f->kind == LMC_FK_NARGS)
        return take_values(p, f, inline_value, name);
    return take_value(p, f, inline_value, name);
}

static const char *env_lookup(char *const envp[], const char *key)
{
    size_t klen = strlen(key);
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], key, klen) == 0 && envp[i][klen] == '=')
            return envp[i] + klen + 1;
    return NULL;
}

/* Environment values stand in for defaults, so they only fill flags the
 * command line did not give (an explicit flag wins even over a bad value). */
static int apply_env(parser *p, char *const envp[])
{
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        const char *value = flags[i].env ? env_lookup(envp, flags[i].env) : NULL;
        if (!value || p->seen[i])
            continue;
        if (lmc_cfg_set(p->cfg, &flags[i], value, flags[i].env, p->e))
            return -1;
        p->seen[i] = true; /* over --config's file, as a flag would be */
    }
    return 0;
}

static void apply_derived(parser *p)
{
    lmc_mp_config *mp = &p->cfg->mp;
    if (!p->seen[lmc_cfg_index(lmc_cfg_find("max-gpu-workers"))])
        mp->max_gpu_workers = mp->max_workers;
    if (!p->seen[lmc_cfg_index(lmc_cfg_find("max-cpu-workers"))])
        mp->max_cpu_workers = mp->max_workers;
}

static const char *prog_name(int argc, char *const argv[])
{
    if (argc < 1 || !argv[0] || !*argv[0])
        return "lmcached";
    const char *slash = strrchr(argv[0], '/');
    return slash ? slash + 1 : argv[0];
}

/* Returns 0 to go on, 1 when --help/--version was printed, -1 on error. */
static int parse_argv(parser *p, FILE *help_out)
{
    for (p->i = 1; p->i < p->argc; p->i++) {
        const char *arg = p->argv[p->i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            lmc_config_print_help(help_out ? help_out : stdout, prog_name(p->argc, p->argv));
            return 1;
        }
        if (strcmp(arg, "--version") == 0) {
            fprintf(help_out ? help_out : stdout, "lmcached %s\n", LMC_VERSION_STRING);
            return 1;
        }
        if (strcmp(arg, "--print-config") == 0) {
            p->print_config = true;
            continue;
        }
        if (strncmp(arg, "--config", 8) == 0 && (arg[8] == '=' || arg[8] == '\0')) {
            if (arg[8] == '=')
                p->config_file = arg + 9;
            else if (p->i + 1 < p->argc && !is_flag_like(p->argv[p->i + 1]))
                p->config_file = p->argv[++p->i];
            else
                return lmc_cfg_fail(p->e, "--config: expected one argument");
            continue;
        }
        if (!is_flag_like(arg) || arg[2] == '\0')
            return lmc_cfg_fail(p->e, "unrecognized argument: %s", arg);
        if (parse_flag(p, arg) != 0)
            return -1;
    }
    return 0;
}

/* A value the file gave that validation refused ("--port: must be in
 * [1, 65535], got 70000") is named with the file, which the operator
 * must edit: there is no --port on the command line to look for. */
static void name_the_file(const parser *p, const bool *seen_before_file)
{
    char name[128], copy[512];
    const char *msg = p->e->buf;
    size_t len = msg ? strcspn(msg, ":") : 0;
    if (!msg || strncmp(msg, "--", 2) != 0 || msg[len] != ':' || len - 2 >= sizeof name)
        return;
    memcpy(name, msg + 2, len - 2);
    name[len - 2] = '\0';
    const lmc_config_flag *f = lmc_cfg_find(name);
    if (!f || seen_before_file[lmc_cfg_index(f)] || !p->seen[lmc_cfg_index(f)])
        return;
    snprintf(copy, sizeof copy, "%s", msg);
    lmc_cfg_fail(p->e, "--config %s: \"%s\"%s", p->config_file, name, copy + len);
}

/* 1 (exit 0) once printed, -1 when out of memory. */
static int print_config(const parser *p, FILE *out)
{
    bool drawn = !p->seen[lmc_cfg_index(lmc_cfg_find("instance-id"))];
    char *text = lmc_cfg_to_flag_json(p->cfg, drawn);
    if (!text)
        return lmc_cfg_fail(p->e, "--print-config: out of memory");
    fprintf(out, "%s\n", text);
    free(text);
    return 1;
}

lmc_config_status lmc_config_parse(lmc_config *cfg, int argc, char *const argv[],
                                   char *const envp[], FILE *help_out, char *err,
                                   size_t errlen)
{
    lmc_cfg_err e = {err, errlen};
    if (err && errlen)
        err[0] = '\0';
    size_t n;
    lmc_config_flags(&n);
    parser p = {.cfg = cfg, .seen = calloc(n, sizeof(bool)), .argc = argc, .argv = argv, .e = &e};
    memset(cfg, 0, sizeof *cfg);
    if (!p.seen || lmc_config_init_defaults(cfg) != 0) { /* init frees on failure */
        free(p.seen);
        lmc_cfg_fail(&e, "out of memory");
        return LMC_CONFIG_ERROR;
    }
    int rc = parse_argv(&p, help_out);
    if (rc == 0)
        rc = apply_env(&p, envp);
    bool *before_file = rc == 0 && p.config_file ? malloc(n * sizeof(bool)) : NULL;
    if (rc == 0 && p.config_file) {
        if (before_file)
            memcpy(before_file, p.seen, n * sizeof(bool));
        rc = before_file ? lmc_cfg_apply_file(cfg, p.config_file, p.seen, &e)
                         : lmc_cfg_fail(&e, "out of memory");
    }
    if (rc == 0) {
        apply_derived(&p);
        rc = lmc_cfg_validate(cfg, &e);
        if (rc < 0 && before_file)
            name_the_file(&p, before_file);
    }
    free(before_file);
    if (rc == 0 && p.print_config)
        rc = print_config(&p, help_out ? help_out : stdout);
    free(p.seen);
    if (rc == 0)
        return LMC_CONFIG_OK;
    lmc_config_free(cfg);
    return rc > 0 ? LMC_CONFIG_EXIT_OK : LMC_CONFIG_ERROR;
}
