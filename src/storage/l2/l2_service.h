/* The L2 tier of one storage manager: the --l2-adapter adapters, the store
 * controller and the prefetch controller (docs/l2.md).  The server calls
 * lmc_l2_attach() right after creating the storage manager; from then on
 * the storage manager owns the tier (lmc_storage_tier_ops) and closes it
 * first in lmc_storage_manager_close(). */
#ifndef LMC_STORAGE_L2_SERVICE_H
#define LMC_STORAGE_L2_SERVICE_H

#include <stddef.h>

#include "config/config.h"
#include "storage/storage_manager.h"

/* No --l2-adapter: attaches nothing and returns 0.  -1 with a one-line
 * reason in err (unknown type or field, unusable base_path, ...). */
int lmc_l2_attach(lmc_storage_manager *sm, const lmc_config *cfg, char *err, size_t errlen);

#endif
