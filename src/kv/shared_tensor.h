/* The tensor handles of REGISTER_KV_CACHE (docs/protocol.md, "Shared
 * tensor handles"): each is a msgpack ext type 1 whose data is either a
 * pickled wrapper object, read with the whitelisting pickle reader
 * (rpc/pickle.h), or the msgpack descriptor that lmcache 0.5.6 and later
 * send instead; both become the same plain description.  Nothing is
 * opened or mapped here; the transfer module does that with what this
 * returns. */
#ifndef LMC_KV_SHARED_TENSOR_H
#define LMC_KV_SHARED_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_TENSOR_MAX_DIMS 8
#define LMC_CUDA_IPC_HANDLE_BYTES 64
#define LMC_SHM_NAME_MAX 255

typedef enum lmc_tensor_wrapper {
    LMC_WRAPPER_CUDA_IPC,      /* CudaIPCWrapper: torch's _share_cuda_() tuple */
    LMC_WRAPPER_RAW_CUDA_IPC,  /* RawCudaIPCWrapper: one cudaIpcMemHandle of the allocation */
    LMC_WRAPPER_CPU_SHM,       /* CpuShmTensorWrapper: a POSIX shared memory segment */
} lmc_tensor_wrapper;

typedef struct lmc_shared_tensor {
    lmc_tensor_wrapper wrapper;
    char dtype[24];            /* torch name: "bfloat16", "float8_e4m3fn", ... */
    uint32_t itemsize;         /* bytes per element */
    uint32_t ndim;
    int64_t shape[LMC_TENSOR_MAX_DIMS];    /* physical order, elements */
    int64_t stride[LMC_TENSOR_MAX_DIMS];   /* elements */
    int64_t storage_offset;                /* elements */
    char device_uuid[64];
    /* CUDA_IPC and RAW_CUDA_IPC: the cudaIpcMemHandle_t of the allocation's
     * base, and the tensor storage's byte offset from that base. */
    uint8_t mem_handle[LMC_CUDA_IPC_HANDLE_BYTES];
    uint64_t base_offset_bytes;
    uint64_t storage_bytes;    /* CUDA_IPC: storage size; RAW: nbytes; CPU_SHM: nbytes */
    /* CUDA_IPC only: the exporter's share-time event and torch's ref counter. */
    bool event_sync_required;
    uint8_t event_handle[LMC_CUDA_IPC_HANDLE_BYTES];
    char ref_counter_file[LMC_SHM_NAME_MAX + 1];
    int64_t ref_counter_slot;
    /* CPU_SHM only. */
    char shm_name[LMC_SHM_NAME_MAX + 1];
} lmc_shared_tensor;

/* Decodes one handle, a pickle or a descriptor (told apart by the first
 * byte).  0; -1 refused, with the reason in `err` (a class, type, global
 * or field this server does not accept, a malformed or hostile input);
 * -2 out of memory. */
int lmc_shared_tensor_decode(const uint8_t *data, size_t len, lmc_shared_tensor *out, char *err,
                             size_t errlen);

/* Bytes per element of a torch dtype name, 0 when unsupported. */
uint32_t lmc_torch_dtype_itemsize(const char *name, size_t len);
const char *lmc_tensor_wrapper_name(lmc_tensor_wrapper w);

#endif
