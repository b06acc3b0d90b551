/* The finaliser of splitmix64: a bijection of 64-bit words whose every
 * output bit depends on every input bit.  For seeding, and for spreading a
 * value whose low bits are poor before they pick a table slot.  Span ids
 * leave the process (docs/observability.md), so it must never change. */
#ifndef LMC_CORE_MIX_H
#define LMC_CORE_MIX_H

#include <stdint.h>

static inline uint64_t lmc_core_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

#endif
