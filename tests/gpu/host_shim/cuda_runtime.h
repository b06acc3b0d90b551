/* See cuda_runtime_api.h. */
#include "cuda_runtime_api.h"
