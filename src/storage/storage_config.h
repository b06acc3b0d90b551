/* The storage manager's options from a parsed configuration: kept out of
 * storage_manager.h so that the storage contract does not carry the whole
 * configuration (docs/storage.md, "StorageManager facade"). */
#ifndef LMC_STORAGE_STORAGE_CONFIG_H
#define LMC_STORAGE_STORAGE_CONFIG_H

#include <stddef.h>

#include "config/config.h"
#include "storage/storage_manager.h"

/* From the storage group and mp.shm_name of `cfg` (legacy flags or the
 * first --l1-manager DRAM entry).  0, or -1 with a reason in `err`. */
int lmc_storage_options_from_config(const lmc_config *cfg, lmc_storage_options *o, char *err,
                                    size_t errlen);

#endif
