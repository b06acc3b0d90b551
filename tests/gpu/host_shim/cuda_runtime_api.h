/* A host stand-in of the few CUDA runtime calls that cuda_blend.cu and
 * blend_check.c make, so that CacheBlend's kernels run on the CPU in the
 * normal build (docs/cacheblend.md, "CUDA kernels"): device memory is
 * host memory, copies are memcpy, a launch runs every block and thread of
 * the grid in turn (plugin.cpp).  It checks the kernels' index arithmetic
 * against the CPU executor; CUDA itself (concurrency, the memory model,
 * the compiler's device code) is only checked by blend_check on a GPU. */
#ifndef LMC_TESTS_HOST_SHIM_CUDA_RUNTIME_API_H
#define LMC_TESTS_HOST_SHIM_CUDA_RUNTIME_API_H

#include <stddef.h>
#include <stdint.h>

typedef int cudaError_t;
#define cudaSuccess 0
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
typedef void *cudaStream_t;

#ifdef __cplusplus
extern "C" {
#endif
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t st);
cudaError_t cudaFreeAsync(void *p, cudaStream_t st);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st);
#ifdef __cplusplus
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
extern dim3 blockIdx, threadIdx, blockDim, gridDim;
template <class T> T __ldcg(const T *p)
{
    return *p;
}
template <class T> void __stcg(T *p, T v)
{
    *p = v;
}
cudaError_t cudaLaunchKernel(const void *fn, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t st);
#define __global__
#define __launch_bounds__(n)
#endif

#endif
