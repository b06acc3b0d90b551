/* --help: flags grouped by section, like upstream's argparse groups, each
 * with its type, default, environment fallback and a one-line help. */
#include "config/config_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const char *type_name(const lmc_config_flag *f)
{
    switch (f->kind) {
    case LMC_FK_STR:
    case LMC_FK_NSTR: return (f->flags & LMC_FF_JSON) ? "JSON" : "str";
    case LMC_FK_INT:
    case LMC_FK_I64: return "int";
    case LMC_FK_DBL:
    case LMC_FK_OPT_DBL: return "float";
    case LMC_FK_BOOL: return "bool";
    case LMC_FK_TRUE: return "flag";
    case LMC_FK_APPEND: return (f->flags & LMC_FF_JSON) ? "JSON, repeatable" : "str, repeatable";
    case LMC_FK_NARGS: return "list of str";
    }
    return "?";
}

static void print_usage_form(FILE *out, const lmc_config_flag *f)
{
    if (f->kind == LMC_FK_BOOL || f->kind == LMC_FK_TRUE) {
        fprintf(out, "  --%s, --no-%s\n", f->name, f->name);
        return;
    }
    fprintf(out, "  --%s ", f->name);
    if (f->choices) {
        for (size_t i = 0; f->choices[i]; i++)
            fprintf(out, "%c%s", i ? ',' : '{', f->choices[i]);
        fputc('}', out);
    } else {
        for (const char *p = f->name; *p; p++)
            fputc(*p == '-' ? '_' : toupper((unsigned char)*p), out);
    }
    fputs(f->kind == LMC_FK_NARGS ? " ...\n" : "\n", out);
}

static void describe_default(char *buf, size_t cap, const lmc_config_flag *f)
{
    if (f->def_doc)
        snprintf(buf, cap, "default: %s", f->def_doc);
    else if (!f->def)
        snprintf(buf, cap, "default: None");
    else if (!*f->def)
        snprintf(buf, cap, "default: \"\"");
    else
        snprintf(buf, cap, "default: %s", f->def);
}

/* Writes text as lines of at most HELP_WIDTH columns, each indented by
 * HELP_INDENT, breaking at spaces (a word longer than a line stays whole):
 * --help must read in an 80-column terminal (docs/configuration.md). */
#define HELP_WIDTH 79
#define HELP_INDENT 8
static void print_wrapped(FILE *out, const char *text)
{
    while (*text) {
        size_t room = HELP_WIDTH - HELP_INDENT, len = strlen(text), cut = len;
        if (len > room) {
            cut = room;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            if (cut == 0) /* one long word: up to its end */
                cut = strcspn(text, " ");
        }
        fprintf(out, "%*s%.*s\n", HELP_INDENT, "", (int)cut, text);
        text += cut;
        while (*text == ' ')
            text++;
    }
}

static void print_flag(FILE *out, const lmc_config_flag *f)
{
    char def[256], line[1024];
    print_usage_form(out, f);
    describe_default(def, sizeof def, f);
    const char *unbuilt = lmc_cfg_unbuilt_help(f);
    snprintf(line, sizeof line, "(%s, %s%s%s%s) %s", type_name(f), def, f->env ? ", env " : "",
             f->env ? f->env : "", (f->flags & LMC_FF_ADDITION) ? ", lmcached" : "",
             unbuilt ? unbuilt : f->help);
    print_wrapped(out, line);
}

void lmc_config_print_help(FILE *out, const char *prog)
{
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    fprintf(out, "usage: %s [options]\n\nLMCache multiprocess KV-cache server (lmcached).\n\n"
                 "options:\n  -h, --help\n        show this help message and exit\n"
                 "  --version\n        print the version and exit\n"
                 "  --config FILE\n"
                 "        JSON object of flag names and values; flags and environment\n"
                 "        variables override it (docs/configuration.md)\n"
                 "  --print-config\n"
                 "        print the effective configuration as --config JSON, secrets as\n"
                 "        \"***\", and exit\n",
            prog ? prog : "lmcached");
    for (int g = 0; g < LMC_FG_COUNT; g++) {
        fprintf(out, "\n%s:\n", lmc_config_group_title((lmc_flag_group)g));
        for (size_t i = 0; i < n; i++)
            if ((int)flags[i].group == g)
                print_flag(out, &flags[i]);
    }
}
