/* The UCX functions the ucx engine calls, looked up at run time in
 * libucp.so.0 (docs/p2p.md, "ucx").  Not linked: libucm, which libucp
 * brings, exports its own mmap/munmap/madvise to hook memory events, and
 * linked into a binary they would stand in for libc's for the whole
 * process, ucx engine used or not (ThreadSanitizer's runtime crashes in
 * them at every thread start).  Loaded locally, its symbols stay its own.
 * One table per server or client: dlopen counts its users. */
#ifndef LMC_P2P_UCX_API_H
#define LMC_P2P_UCX_API_H

#include <stddef.h>
#include <ucp/api/ucp.h>

#define LMC_P2P_UCX_FUNCS(X)                                                                  \
    X(ucp_init_version) X(ucp_cleanup) X(ucp_worker_create) X(ucp_worker_destroy)             \
    X(ucp_worker_progress) X(ucp_worker_arm) X(ucp_worker_get_efd) X(ucp_worker_get_address)  \
    X(ucp_worker_release_address) X(ucp_mem_map) X(ucp_mem_unmap) X(ucp_rkey_pack)            \
    X(ucp_rkey_buffer_release) X(ucp_ep_create) X(ucp_ep_close_nbx) X(ucp_ep_rkey_unpack)     \
    X(ucp_rkey_destroy) X(ucp_get_nbx) X(ucp_request_check_status) X(ucp_request_free)        \
    X(ucs_status_string)

typedef struct lmc_p2p_ucx_api {
    void *lib;
#define LMC_P2P_UCX_FIELD(name) __typeof__(&name) name;
    LMC_P2P_UCX_FUNCS(LMC_P2P_UCX_FIELD)
#undef LMC_P2P_UCX_FIELD
} lmc_p2p_ucx_api;

/* 0, or -1 with err naming what is missing. */
int lmc_p2p_ucx_api_load(lmc_p2p_ucx_api *a, char *err, size_t errlen);
void lmc_p2p_ucx_api_unload(lmc_p2p_ucx_api *a);

#endif
