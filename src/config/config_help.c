/* --help: flags grouped by section, like upstream's argparse groups, each
 * with its type, default, environment fallback and a one-line help. */
#include "config/config_internal.h"

#include <ctype.h>
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

static void print_default(FILE *out, const lmc_config_flag *f)
{
    if (f->def_doc)
        fprintf(out, "default: %s", f->def_doc);
    else if (!f->def)
        fputs("default: None", out);
    else if (!*f->def)
        fputs("default: \"\"", out);
    else
        fprintf(out, "default: %s", f->def);
}

static void print_flag(FILE *out, const lmc_config_flag *f)
{
    print_usage_form(out, f);
    fprintf(out, "        (%s, ", type_name(f));
    print_default(out, f);
    if (f->env)
        fprintf(out, ", env %s", f->env);
    if (f->flags & LMC_FF_ADDITION)
        fputs(", lmcached", out);
    fprintf(out, ") %s\n", f->help);
}

void lmc_config_print_help(FILE *out, const char *prog)
{
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    fprintf(out, "usage: %s [options]\n\nLMCache multiprocess KV-cache server (lmcached).\n\n"
                 "options:\n  -h, --help\n        show this help message and exit\n"
                 "  --version\n        print the version and exit\n",
            prog ? prog : "lmcached");
    for (int g = 0; g < LMC_FG_COUNT; g++) {
        fprintf(out, "\n%s:\n", lmc_config_group_title((lmc_flag_group)g));
        for (size_t i = 0; i < n; i++)
            if ((int)flags[i].group == g)
                print_flag(out, &flags[i]);
    }
}
