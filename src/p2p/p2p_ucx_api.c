/* Run-time lookup of the UCX functions (p2p_ucx_api.h: why not linked). */
#include "p2p/p2p_ucx_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int lmc_p2p_ucx_api_load(lmc_p2p_ucx_api *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->lib = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        snprintf(err, errlen, "p2p channel (ucx): cannot load libucp.so.0 (Debian: libucx0): %s",
                 dlerror());
        return -1;
    }
#define LMC_P2P_UCX_LOOKUP(name)                                                              \
    if (!(*(void **)&a->name = dlsym(a->lib, #name))) {                                       \
        snprintf(err, errlen, "p2p channel (ucx): libucp.so.0 has no %s", #name);             \
        lmc_p2p_ucx_api_unload(a);                                                            \
        return -1;                                                                            \
    }
    LMC_P2P_UCX_FUNCS(LMC_P2P_UCX_LOOKUP)
#undef LMC_P2P_UCX_LOOKUP
    return 0;
}

void lmc_p2p_ucx_api_unload(lmc_p2p_ucx_api *a)
{
    if (a->lib)
        dlclose(a->lib);
    memset(a, 0, sizeof *a);
}
