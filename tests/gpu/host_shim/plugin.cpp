/* cuda_blend.cu built for the host (cuda_runtime_api.h), behind an ops
 * table with what blend_check.c calls: init, stream_new, blend_execute,
 * sync, stream_free. */
#include "cuda/cuda_blend.cu"

dim3 blockIdx, threadIdx, blockDim, gridDim;

/* Every kernel of cuda_blend.cu takes one blend_args by value. */
cudaError_t cudaLaunchKernel(const void *fn, dim3 g, dim3 b, void **args, size_t shared,
                             cudaStream_t st)
{
    (void)shared, (void)st;
    void (*kernel)(blend_args) = (void (*)(blend_args))fn;
    const blend_args a = *(const blend_args *)args[0];
    gridDim = g;
    blockDim = b;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++)
                for (unsigned t = 0; t < b.x * b.y * b.z; t++) {
                    blockIdx = dim3(x, y, z);
                    threadIdx = dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
                    kernel(a);
                }
    return cudaSuccess;
}

static int host_init(int *devices, char *, size_t)
{
    *devices = 1;
    return 0;
}
static int g_stream_token;
static lmc_cuda_stream *host_stream_new(int, uint64_t, char *, size_t)
{
    return (lmc_cuda_stream *)&g_stream_token;
}
static void host_stream_free(lmc_cuda_stream *) {}
static int host_sync(lmc_cuda_stream *, char *, size_t)
{
    return 0;
}
static int host_blend_execute(lmc_cuda_stream *, const lmc_cuda_blend *b, char *err,
                              size_t errlen)
{
    return lmc_cuda_blend_run(NULL, b, err, errlen);
}

static lmc_cuda_ops g_ops;

extern "C" __attribute__((visibility("default"))) const lmc_cuda_ops *lmc_cuda_transfer_ops(void)
{
    g_ops.abi_version = LMC_CUDA_ABI_VERSION;
    g_ops.init = host_init;
    g_ops.stream_new = host_stream_new;
    g_ops.stream_free = host_stream_free;
    g_ops.sync = host_sync;
    g_ops.blend_execute = host_blend_execute;
    return &g_ops;
}
