/* The host stand-in's runtime calls (cuda_runtime_api.h). */
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"

const char *cudaGetErrorString(cudaError_t e)
{
    return e ? "host stand-in error" : "no error";
}
cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n);
    return *p ? cudaSuccess : 2;
}
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaMalloc(p, n);
}
cudaError_t cudaFreeHost(void *p)
{
    return cudaFree(p);
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    (void)k;
    memcpy(d, s, n);
    return cudaSuccess;
}
/* Filled with junk, as fresh device memory may be: the executor must not
 * read what it did not write. */
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t st)
{
    (void)st;
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p)
        return 2;
    memset(*p, 0x5c, n);
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t st)
{
    (void)st;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st)
{
    (void)st;
    return cudaMemcpy(d, s, n, k);
}
