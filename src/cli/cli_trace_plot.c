/* The what-if's outputs (docs/cli.md, "trace whatif"): the CSV, and the
 * miss-ratio curve as a hand-written SVG, so that no plotting library is
 * needed. */
#include <stdbool.h>
#include <string.h>

#include "cli/cli_trace.h"

#define W 720
#define H 440
#define LEFT 80
#define RIGHT 150
#define TOP 40
#define BOTTOM 60
#define TICKS 5

double lmc_cli_whatif_hit_ratio(const lmc_storage_whatif_result *r)
{
    return r->lookup_keys ? (double)r->hit_keys / (double)r->lookup_keys : 0.0;
}

int lmc_cli_whatif_write_csv(FILE *f, const lmc_cli_whatif_row *rows, size_t n)
{
    fprintf(f, "policy,l1_size_bytes,lookups,lookup_keys,hit_keys,hit_ratio,miss_ratio,"
               "evictions\n");
    for (size_t i = 0; i < n; i++) {
        const lmc_storage_whatif_result *r = &rows[i].r;
        double hit = lmc_cli_whatif_hit_ratio(r);
        fprintf(f, "%s,%llu,%llu,%llu,%llu,%.6f,%.6f,%llu\n", rows[i].policy,
                (unsigned long long)rows[i].l1_bytes, (unsigned long long)r->lookups,
                (unsigned long long)r->lookup_keys, (unsigned long long)r->hit_keys, hit,
                1.0 - hit, (unsigned long long)r->evictions);
    }
    return ferror(f) ? -1 : 0;
}

/* The x axis's unit: the largest binary unit the largest size reaches. */
static void x_unit(uint64_t max, double *div, const char **name)
{
    static const char *names[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    *div = 1;
    while (u < 4 && (double)max >= *div * 1024.0 * 2) {
        *div *= 1024.0;
        u++;
    }
    *name = names[u];
}

static void axes(FILE *f, uint64_t max_x, double div, const char *unit)
{
    int pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"black\"/>\n", LEFT, TOP, pw, ph);
    for (int i = 0; i <= TICKS; i++) {
        double fx = (double)i / TICKS;
        int x = LEFT + (int)(fx * pw), y = TOP + ph - (int)(fx * ph);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", x, TOP, x,
                TOP + ph);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%.3g</text>\n",
                x, TOP + ph + 18, fx * (double)max_x / div);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", LEFT, y,
                LEFT + pw, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">%.1f</text>\n",
                LEFT - 6, y + 4, fx);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"14\" text-anchor=\"middle\">L1 size (%s)"
               "</text>\n", LEFT + pw / 2, H - 15, unit);
    fprintf(f, "<text x=\"20\" y=\"%d\" font-size=\"14\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 20 %d)\">miss ratio</text>\n", TOP + ph / 2, TOP + ph / 2);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">Miss-ratio "
               "curve (lmcache-cli trace whatif)</text>\n", W / 2);
}

static bool seen_before(const lmc_cli_whatif_row *rows, size_t i)
{
    for (size_t j = 0; j < i; j++) {
        if (strcmp(rows[j].policy, rows[i].policy) == 0)
            return true;
    }
    return false;
}

/* One polyline and legend entry for the rows of rows[first]'s policy. */
static void curve(FILE *f, const lmc_cli_whatif_row *rows, size_t n, size_t first, int nth,
                  uint64_t max_x)
{
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
    const char *color = colors[nth % 5], *policy = rows[first].policy;
    int pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
    fprintf(f, "<polyline class=\"policy\" data-policy=\"%s\" fill=\"none\" stroke=\"%s\" "
               "stroke-width=\"2\" points=\"", policy, color);
    for (size_t i = first; i < n; i++) {
        if (strcmp(rows[i].policy, policy) != 0)
            continue;
        double fx = max_x ? (double)rows[i].l1_bytes / (double)max_x : 0;
        double miss = 1.0 - lmc_cli_whatif_hit_ratio(&rows[i].r);
        fprintf(f, "%.1f,%.1f ", LEFT + fx * pw, TOP + ph - miss * ph);
    }
    fprintf(f, "\"/>\n");
    int ly = TOP + 20 + 20 * nth;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
               "\n<text x=\"%d\" y=\"%d\" font-size=\"12\">%s</text>\n", W - RIGHT + 15, ly,
            W - RIGHT + 40, ly, color, W - RIGHT + 45, ly + 4, policy);
}

int lmc_cli_whatif_write_svg(FILE *f, const lmc_cli_whatif_row *rows, size_t n)
{
    uint64_t max_x = 0;
    double div;
    const char *unit;
    for (size_t i = 0; i < n; i++)
        max_x = rows[i].l1_bytes > max_x ? rows[i].l1_bytes : max_x;
    x_unit(max_x, &div, &unit);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/"
               "svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
    axes(f, max_x, div, unit);
    int nth = 0;
    for (size_t i = 0; i < n; i++) {
        if (!seen_before(rows, i))
            curve(f, rows, n, i, nth++, max_x);
    }
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}
