/* Bulk copies of the server-driven KV path: gathering paged engine tensors
 * into L1 chunk objects and scattering them back.  Such a batch writes far
 * more bytes than the caches hold and nobody reads them again soon, so
 * ordinary stores pay twice: a read-for-ownership of every destination line
 * and the eviction of useful lines.  Non-temporal ("streaming") stores skip
 * both.  glibc switches to them only above its non-temporal threshold (tens
 * of MiB on a large-L3 host), which one 2 MiB object or one 4 KiB run never
 * reaches, however big the whole batch is.
 *
 * bench/copy_bench.c on a 2-vCPU Sapphire Rapids VM, 1 GiB per pass: memcpy
 * 4-6 GiB/s, streaming 1.2-1.35x that for 2 MiB, 32 KiB and 4 KiB runs,
 * gathered or scattered (a single core's loads are the limit there: reading
 * alone runs at ~8 GiB/s).  Scatters into random places win at every run
 * size down to 256 B (1.7-2.2x: no read-for-ownership of far lines), but
 * gathers of runs of 1 KiB or less from random places lose (0.7-1.0x), so a
 * gather should memcpy runs below 2 KiB. */
#ifndef LMC_KV_BULK_COPY_H
#define LMC_KV_BULK_COPY_H

#include <stdbool.h>
#include <stddef.h>

typedef enum lmc_copy_method {
    LMC_COPY_MEMCPY = 0,   /* plain memcpy */
    LMC_COPY_STREAM,       /* non-temporal stores (memcpy off x86-64) */
} lmc_copy_method;

/* Copies n bytes; the ranges must not overlap.  After a batch of
 * LMC_COPY_STREAM copies, call lmc_bulk_copy_fence before publishing. */
void lmc_bulk_copy(lmc_copy_method m, void *dst, const void *src, size_t n);

/* lmc_bulk_copy, which also prefetches the source of the copy that
 * follows: `ahead` bytes at `next`, one line per line copied over the last
 * `ahead` bytes of this copy (or all of it, when shorter).  The hardware
 * prefetcher cannot guess where a paged tensor's next block lies; without
 * this, a gather of 8 KiB blocks in scattered places ran at 0.56x the copy
 * (BENCHMARKS.md, "Server-driven transfers").  Only LMC_COPY_STREAM
 * prefetches. */
void lmc_bulk_copy_ahead(lmc_copy_method m, void *dst, const void *src, size_t n,
                         const void *next, size_t ahead);

/* Transposes the leading two dimensions of rows of `row` bytes: src is
 * [a][b][row], dst [b][a][row] (a paged block's heads-first rows into an
 * object's slot-major rows, or back).  `walk_src`: rows go in src's order,
 * else in dst's; with streaming stores, reading in order measured faster
 * both ways (BENCHMARKS.md, "Server-driven transfers").  `next`, where not
 * NULL, is the source of the next transpose of the same shape: its lines
 * are prefetched, one per line moved, as lmc_bulk_copy_ahead does. */
void lmc_bulk_copy_transpose(lmc_copy_method m, void *dst, const void *src, size_t row,
                             size_t a, size_t b, bool walk_src, const void *next);

/* Streaming stores are weakly ordered: another thread that sees a later
 * ordinary store (a flag, a refcount, a queue push) may still read stale
 * data without this sfence.  A no-op for LMC_COPY_MEMCPY. */
void lmc_bulk_copy_fence(lmc_copy_method m);

/* LMC_COPY_STREAM on x86-64, LMC_COPY_MEMCPY elsewhere. */
lmc_copy_method lmc_copy_method_default(void);

/* "memcpy" or "stream".  0, or -1 (and *out untouched) for another name. */
int lmc_copy_method_parse(const char *name, lmc_copy_method *out);
const char *lmc_copy_method_name(lmc_copy_method m);

/* The two streaming kernels behind LMC_COPY_STREAM, named so that the tests
 * and the benchmark can reach each one; callers use lmc_bulk_copy.  16: SSE2
 * stores (baseline x86-64); 32: AVX stores, only where
 * lmc_bulk_copy_has_avx2().  Both are memcpy off x86-64. */
void lmc_bulk_copy_stream16(void *dst, const void *src, size_t n);
void lmc_bulk_copy_stream32(void *dst, const void *src, size_t n);
bool lmc_bulk_copy_has_avx2(void);

#endif
