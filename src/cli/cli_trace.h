/* `lmcache-cli trace ...` (docs/cli.md, "trace"): reading a storage trace
 * without a server. */
#ifndef LMC_CLI_CLI_TRACE_H
#define LMC_CLI_CLI_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "storage/storage_whatif.h"

/* argv[0] is the word after "trace" ("info", "whatif"); exit status:
 * 0, 1 (a trace or file refused), 2 (bad usage). */
int lmc_cli_trace_main(int argc, char **argv);

/* One row of the miss-ratio curve. */
typedef struct {
    const char *policy;
    uint64_t l1_bytes;
    lmc_storage_whatif_result r;
} lmc_cli_whatif_row;

/* The CSV (header line and one line per row) and the SVG plot, one
 * polyline per policy (cli_trace_plot.c).  0, or -1 when writing failed. */
int lmc_cli_whatif_write_csv(FILE *f, const lmc_cli_whatif_row *rows, size_t n);
int lmc_cli_whatif_write_svg(FILE *f, const lmc_cli_whatif_row *rows, size_t n);
double lmc_cli_whatif_hit_ratio(const lmc_storage_whatif_result *r);

#endif
