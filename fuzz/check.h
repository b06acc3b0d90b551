/* CHECK: an assertion that stays in every build type (fuzz targets also run
 * as regression tests in release builds, where assert() is compiled out). */
#ifndef LMC_FUZZ_CHECK_H
#define LMC_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

#endif
