/* Hooks of the tests and benchmarks into the storage manager (the books of
 * docs/storage.md, "Invariants").  Nothing under src/ but the storage
 * manager itself includes this header, and the layering check holds it to
 * that (docs/storage.md, "StorageManager facade"), so that no server code
 * path depends on them. */
#ifndef LMC_STORAGE_STORAGE_MANAGER_TESTING_H
#define LMC_STORAGE_STORAGE_MANAGER_TESTING_H

#include <stdbool.h>
#include <stdint.h>

#include "storage/storage_manager.h"

/* The L1 books (lmc_l1_manager_check_books): true when they balance. */
bool lmc_storage_manager_check_books(lmc_storage_manager *sm);
/* How many times a check of the books found them unbalanced. */
uint64_t lmc_storage_manager_invariant_violations(lmc_storage_manager *sm);

/* Waits up to timeout_ms for the pre-fault (docs/storage.md, "Pre-fault")
 * to be over; true when it is. */
bool lmc_storage_manager_wait_prefault(lmc_storage_manager *sm, int timeout_ms);

#endif
