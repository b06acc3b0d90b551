/* FNV-1a, 64 bits: the byte hash behind the in-process hash tables and
 * the span trace ids (docs/architecture.md, "Libraries").  The seed is the
 * caller's, so that one hash can run over several pieces and the sites
 * that started from a different basis keep their numbers (trace ids leave
 * the process, so they must not change). */
#ifndef LMC_CORE_FNV_H
#define LMC_CORE_FNV_H

#include <stddef.h>
#include <stdint.h>

#define LMC_FNV1A64_OFFSET_BASIS 0xcbf29ce484222325ULL
#define LMC_FNV1A64_PRIME 0x100000001b3ULL
/* The basis above with its last digit lost, which the RPC server's
 * identity hash, the coordinator's name table and the engine-driven op
 * digest have always started from; kept so that their numbers (and the
 * worker an identity lands on) stay what they were. */
#define LMC_FNV1A64_SHORT_BASIS 1469598103934665603ULL

/* Continues the hash h over [data, data+len). */
static inline uint64_t lmc_fnv1a64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * LMC_FNV1A64_PRIME;
    return h;
}

/* Continues the hash h over a NUL-terminated string (without its NUL). */
static inline uint64_t lmc_fnv1a64_str(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * LMC_FNV1A64_PRIME;
    return h;
}

#endif
