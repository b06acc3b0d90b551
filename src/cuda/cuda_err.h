/* liblmcached_cuda.so's error lines (kv/cuda_transfer.h: every function
 * returns 0 or -1 with one line in err, never aborts), shared by its .cu
 * files. */
#ifndef LMC_CUDA_CUDA_ERR_H
#define LMC_CUDA_CUDA_ERR_H

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* -1 with "what: CUDA's reason" when e is an error; 0 otherwise. */
static inline int check(cudaError_t e, const char *what, char *err, size_t errlen)
{
    if (e == cudaSuccess)
        return 0;
    return fail(err, errlen, "%s: %s", what, cudaGetErrorString(e));
}

#endif
