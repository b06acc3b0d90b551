/* CacheBlend's retrieve on the device (docs/cacheblend.md, "CUDA
 * kernels"): the part of liblmcached_cuda.so behind the ops table's
 * blend_execute (kv/cuda_transfer.h has the contract).  cuda_transfer.cu
 * holds the stream's lock and its device current around the call. */
#ifndef LMC_CUDA_CUDA_BLEND_H
#define LMC_CUDA_CUDA_BLEND_H

#include <cuda_runtime.h>

#include "kv/cuda_transfer.h"

/* Checks b, then enqueues its waves on st.  0, or -1 with the reason. */
int lmc_cuda_blend_run(cudaStream_t st, const lmc_cuda_blend *b, char *err, size_t errlen);

#endif
