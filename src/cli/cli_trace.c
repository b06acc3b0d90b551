/* `lmcache-cli trace info` and `trace whatif` (docs/cli.md, "trace";
 * the simulation's rules: docs/trace.md, "What-if"). */
#include "cli/cli_trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/storage_manager.h"

#define MAX_SIZES 256
#define MAX_POLICIES 8
#define AUTO_POINTS 16

typedef struct {
    const char *trace;
    const char *sizes;
    const char *csv, *svg;
    char policies[MAX_POLICIES][32];
    size_t n_policies;
    double watermark, ratio;
} whatif_args;

static int usage_error(const char *fmt, const char *what)
{
    fprintf(stderr, "lmcache-cli: trace ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\nusage: lmcache-cli trace info TRACE\n"
                    "       lmcache-cli trace whatif TRACE --l1-size SIZES|auto "
                    "[--policy LRU,noop] [--csv OUT.csv] [--svg OUT.svg]\n"
                    "              [--eviction-trigger-watermark F] [--eviction-ratio F]\n");
    return 2;
}

/* Reads the whole trace into t; its header into *h (caller clears). */
static int load(const char *path, lmc_storage_whatif_trace *t, lmc_trace_header *h)
{
    char err[512];
    lmc_trace_reader *r = lmc_trace_reader_open(path, err, sizeof err);
    lmc_trace_record rec;
    int rc = -1;
    if (!r) {
        fprintf(stderr, "lmcache-cli: trace: %s\n", err);
        return -1;
    }
    while ((rc = lmc_trace_reader_next(r, &rec, err, sizeof err)) == 1) {
        if (lmc_storage_whatif_trace_add(t, &rec) != 0) {
            snprintf(err, sizeof err, "%s: out of memory", path);
            rc = -1;
            break;
        }
    }
    if (rc != 0)
        fprintf(stderr, "lmcache-cli: trace: %s\n", err);
    *h = *lmc_trace_reader_header(r);
    h->sm_config_json = strdup(h->sm_config_json ? h->sm_config_json : "");
    lmc_trace_reader_close(r);
    return rc;
}

static const char *op_name(int op)
{
    static const char *names[] = {"reserve_write", "finish_write", "abort_write",
                                  "submit_prefetch_task", "finish_read_prefetched",
                                  "read_prefetched_results.__enter__",
                                  "read_prefetched_results.__exit__", "other"};
    return names[op];
}

static int info(const char *path)
{
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    lmc_trace_header h = {0};
    lmc_storage_whatif_summary s;
    if (!t || load(path, t, &h) != 0) {
        lmc_storage_whatif_trace_free(t);
        lmc_trace_header_clear(&h);
        return 1;
    }
    lmc_storage_whatif_trace_summary(t, &s);
    time_t wall = (time_t)h.t_wall_start;
    struct tm tm;
    char when[32] = "";
    if (gmtime_r(&wall, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("file: %s\nformat_version: %d\ntrace_schema_version: %d\nlevel: %s\n"
           "t_wall_start: %.6f (%s)\nsm_config_digest: %s\nrecords: %" PRIu64 "\n",
           path, h.format_version, h.schema_version, h.level, h.t_wall_start, when,
           h.sm_config_digest, s.records);
    for (int op = 0; op <= LMC_STORAGE_TRACE_UNKNOWN; op++)
        printf("  %s: %" PRIu64 "\n", op_name(op), s.by_op[op]);
    printf("time_span_s: %.6f\ndistinct_keys: %" PRIu64 "\ndistinct_bytes: %" PRIu64 "\n",
           s.records ? s.t_last - s.t_first : 0.0, s.distinct_keys, s.distinct_bytes);
    lmc_storage_whatif_trace_free(t);
    lmc_trace_header_clear(&h);
    return 0;
}

/* "1GiB", "512MiB", "1.5GB", "4096": bytes, > 0. */
static bool parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},       {"B", 1},       {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
                 {"TiB", 0x1p40}, {"KB", 1e3},  {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || *s == '-' || *s == '+' || (s[0] | 0x20) == 'i' ||
        (s[0] | 0x20) == 'n')
        return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) != 0)
            continue;
        double bytes = floor(v * units[i].mult);
        if (!(bytes >= 1) || bytes >= 0x1p63)
            return false;
        *out = (uint64_t)bytes;
        return true;
    }
    return false;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* AUTO_POINTS sizes from the smallest object to the distinct bytes, and
 * the first size whose usage with every object stays under the watermark. */
static size_t auto_sizes(const lmc_storage_whatif_summary *s, double watermark, uint64_t *out)
{
    uint64_t lo = s->min_object, hi = s->distinct_bytes;
    size_t n = 0;
    if (lo == 0)
        return 0;
    for (int i = 0; i < AUTO_POINTS; i++)
        out[n++] = lo + (uint64_t)((double)(hi - lo) * i / (AUTO_POINTS - 1));
    if (watermark > 0 && (double)hi / watermark < 0x1p63)
        out[n++] = (uint64_t)((double)hi / watermark) + 1;
    qsort(out, n, sizeof *out, cmp_u64);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k == 0 || out[i] != out[k - 1])
            out[k++] = out[i];
    }
    return k;
}

static int parse_list(const char *list, whatif_args *a, uint64_t *sizes, size_t *n_sizes,
                      bool policies)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf)
        return -1;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (policies) {
            if (!lmc_storage_whatif_policy_known(tok) || a->n_policies == MAX_POLICIES)
                return -1;
            for (size_t i = 0; i < a->n_policies; i++) {
                if (strcmp(a->policies[i], tok) == 0)
                    return -1;   /* one curve a policy */
            }
            snprintf(a->policies[a->n_policies++], sizeof a->policies[0], "%s", tok);
        } else if (*n_sizes == MAX_SIZES || !parse_size(tok, &sizes[(*n_sizes)++])) {
            return -1;
        }
    }
    return policies ? (a->n_policies ? 0 : -1) : (*n_sizes ? 0 : -1);
}

static bool parse_fraction(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0 && v <= 1))
        return false;
    *out = v;
    return true;
}

static int whatif_parse(int argc, char **argv, whatif_args *a)
{
    lmc_storage_options defaults;
    lmc_storage_options_defaults(&defaults);
    a->watermark = defaults.eviction_trigger_watermark;
    a->ratio = defaults.eviction_ratio;
    const char *policy = "LRU";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (o[0] != '-') {
            if (a->trace)
                return usage_error("whatif: one TRACE only, '%s' is extra", o);
            a->trace = o;
            continue;
        }
        if (i + 1 >= argc)
            return usage_error("whatif: %s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--l1-size"))
            a->sizes = v;
        else if (!strcmp(o, "--policy"))
            policy = v;
        else if (!strcmp(o, "--csv"))
            a->csv = v;
        else if (!strcmp(o, "--svg"))
            a->svg = v;
        else if (!strcmp(o, "--eviction-trigger-watermark") && parse_fraction(v, &a->watermark))
            continue;
        else if (!strcmp(o, "--eviction-ratio") && parse_fraction(v, &a->ratio))
            continue;
        else if (!strcmp(o, "--eviction-trigger-watermark") || !strcmp(o, "--eviction-ratio"))
            return usage_error("whatif: %s must be a number within [0, 1]", o);
        else
            return usage_error("whatif: unknown option %s", o);
    }
    if (!a->trace)
        return usage_error("whatif: %s", "TRACE is missing");
    if (!a->sizes)
        return usage_error("whatif: %s", "--l1-size is missing");
    if (parse_list(policy, a, NULL, NULL, true) != 0)
        return usage_error("whatif: --policy '%s': a comma-separated list of LRU and noop, each once",
                           policy);
    return 0;
}

static int write_file(const char *path, const char *flag, const lmc_cli_whatif_row *rows,
                      size_t n, int (*fn)(FILE *, const lmc_cli_whatif_row *, size_t))
{
    FILE *f = fopen(path, "w");
    int rc = f ? fn(f, rows, n) : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    if (rc != 0)
        fprintf(stderr, "lmcache-cli: trace whatif: %s: cannot write '%s': %s\n", flag, path,
                strerror(errno));
    return rc;
}

static int simulate(const lmc_storage_whatif_trace *t, const whatif_args *a,
                    const uint64_t *sizes, size_t n_sizes, lmc_cli_whatif_row *rows)
{
    char err[256];
    size_t k = 0;
    for (size_t p = 0; p < a->n_policies; p++) {
        for (size_t i = 0; i < n_sizes; i++, k++) {
            lmc_storage_whatif_config c = {.policy = a->policies[p], .l1_bytes = sizes[i],
                                           .trigger_watermark = a->watermark,
                                           .eviction_ratio = a->ratio};
            rows[k].policy = a->policies[p];
            rows[k].l1_bytes = sizes[i];
            if (lmc_storage_whatif_run(t, &c, &rows[k].r, err, sizeof err) != 0) {
                fprintf(stderr, "lmcache-cli: trace whatif: %s\n", err);
                return -1;
            }
        }
    }
    return 0;
}

static int whatif(int argc, char **argv)
{
    whatif_args a = {0};
    uint64_t sizes[MAX_SIZES + AUTO_POINTS + 1];
    size_t n_sizes = 0;
    int rc = whatif_parse(argc, argv, &a);
    if (rc != 0)
        return rc;
    bool is_auto = strcmp(a.sizes, "auto") == 0;
    if (!is_auto && parse_list(a.sizes, &a, sizes, &n_sizes, false) != 0)
        return usage_error("whatif: --l1-size '%s': a comma-separated list of sizes "
                           "(4096, 512MiB, 1GiB, 1.5GB) or auto", a.sizes);
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    lmc_trace_header h = {0};
    lmc_cli_whatif_row *rows = NULL;
    rc = 1;
    if (!t || load(a.trace, t, &h) != 0)
        goto out;
    if (is_auto) {
        lmc_storage_whatif_summary s;
        lmc_storage_whatif_trace_summary(t, &s);
        if (!(n_sizes = auto_sizes(&s, a.watermark, sizes))) {
            fprintf(stderr, "lmcache-cli: trace whatif: --l1-size auto: %s has no "
                            "reserve_write of more than 0 bytes to size a sweep by\n", a.trace);
            goto out;
        }
    }
    if (!(rows = calloc(n_sizes * a.n_policies, sizeof *rows)) ||
        simulate(t, &a, sizes, n_sizes, rows) != 0)
        goto out;
    size_t n = n_sizes * a.n_policies;
    if ((a.csv ? write_file(a.csv, "--csv", rows, n, lmc_cli_whatif_write_csv)
               : lmc_cli_whatif_write_csv(stdout, rows, n)) != 0 ||
        (a.svg && write_file(a.svg, "--svg", rows, n, lmc_cli_whatif_write_svg) != 0))
        goto out;
    rc = 0;
out:
    free(rows);
    lmc_storage_whatif_trace_free(t);
    lmc_trace_header_clear(&h);
    return rc;
}

int lmc_cli_trace_main(int argc, char **argv)
{
    if (argc >= 1 && strcmp(argv[0], "info") == 0) {
        if (argc != 2)
            return usage_error("info: %s", "takes one TRACE");
        return info(argv[1]);
    }
    if (argc >= 1 && strcmp(argv[0], "whatif") == 0)
        return whatif(argc, argv);
    return usage_error("%s: unknown subcommand (info, whatif)", argc ? argv[0] : "");
}
