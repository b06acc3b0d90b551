/* Schema of --l2-adapter JSON objects (docs/l2.md, "Flags" and the
 * section of each adapter type).
 * Shared by the start-up flag validation (lenient: checks the fields that
 * are present and known) and the adapter factory in src/storage/l2
 * (strict: unknown types and fields, missing required fields). */
#ifndef LMC_CONFIG_CONFIG_L2_H
#define LMC_CONFIG_CONFIG_L2_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* 0, or -1 with a one-line reason in err. */
int lmc_config_l2_adapter_check(const json_t *o, bool strict, char *err, size_t errlen);

#endif
