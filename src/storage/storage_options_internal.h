/* Private to storage_options*.c. */
#ifndef LMC_STORAGE_STORAGE_OPTIONS_INTERNAL_H
#define LMC_STORAGE_STORAGE_OPTIONS_INTERNAL_H

#include <stddef.h>

#include "storage/storage_manager.h"

/* Applies one --l1-manager JSON object (type DRAM) on top of `o`. */
int lmc_storage_options_apply_l1_manager_json(const char *text, lmc_storage_options *o,
                                              char *err, size_t errlen);

#endif
