/* Streaming (non-temporal) bulk copies; why they exist: bulk_copy.h. */
#include "kv/bulk_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* Write-combining buffers hold whole cache lines: a line that is only partly
 * written by streaming stores goes out as a slow partial write, so the
 * kernels stream whole, aligned lines and leave the ragged ends to memcpy. */
#define LINE 64

/* `pf`, where not NULL, is prefetched one line per line moved, at the same
 * offset: the source of the copy that follows (lmc_bulk_copy_ahead).  The
 * loops come in pairs with a constant `pf`, so that a plain copy keeps a
 * loop with nothing added. */
typedef void (*line_loop)(char *d, const char *s, size_t bytes, const char *pf);

__attribute__((always_inline)) static inline void lines_body16(char *d, const char *s,
                                                               size_t bytes, const char *pf)
{
    for (size_t k = 0; k < bytes; k += LINE) {
        if (pf)
            _mm_prefetch(pf + k, _MM_HINT_T0);
        __m128i a = _mm_loadu_si128((const __m128i *)(s + k));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + k + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + k + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + k + 48));
        _mm_stream_si128((__m128i *)(d + k), a);
        _mm_stream_si128((__m128i *)(d + k + 16), b);
        _mm_stream_si128((__m128i *)(d + k + 32), c);
        _mm_stream_si128((__m128i *)(d + k + 48), e);
    }
}

__attribute__((target("avx2"), always_inline)) static inline void
lines_body32(char *d, const char *s, size_t bytes, const char *pf)
{
    for (size_t k = 0; k < bytes; k += LINE) {
        if (pf)
            _mm_prefetch(pf + k, _MM_HINT_T0);
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + k + 32));
        _mm256_stream_si256((__m256i *)(d + k), a);
        _mm256_stream_si256((__m256i *)(d + k + 32), b);
    }
}

static void lines16(char *d, const char *s, size_t bytes, const char *pf)
{
    (void)pf;
    lines_body16(d, s, bytes, NULL);
}

static void lines16_ahead(char *d, const char *s, size_t bytes, const char *pf)
{
    lines_body16(d, s, bytes, pf);
}

__attribute__((target("avx2"))) static void lines32(char *d, const char *s, size_t bytes,
                                                    const char *pf)
{
    (void)pf;
    lines_body32(d, s, bytes, NULL);
}

__attribute__((target("avx2"))) static void lines32_ahead(char *d, const char *s, size_t bytes,
                                                          const char *pf)
{
    lines_body32(d, s, bytes, pf);
}

/* memcpy up to dst's next line boundary, whole lines with `loop`, memcpy
 * of the rest.  Copies too short to hold one aligned line are all memcpy. */
static inline void stream_with(line_loop loop, void *dst, const void *src, size_t n,
                               const char *pf)
{
    size_t head = (size_t)(-(uintptr_t)dst & (LINE - 1));
    if (n < head + LINE) {
        memcpy(dst, src, n);
        return;
    }
    size_t body = (n - head) & ~(size_t)(LINE - 1);
    char *d = (char *)dst;
    const char *s = (const char *)src;
    memcpy(d, s, head);
    loop(d + head, s + head, body, pf ? pf + head : NULL);
    memcpy(d + head + body, s + head + body, n - head - body);
}

bool lmc_bulk_copy_has_avx2(void)
{
    /* One load and a bit test of libgcc's cpu model: cheap next to a copy
     * worth streaming, and no state of ours to initialise. */
    return __builtin_cpu_supports("avx2");
}

void lmc_bulk_copy_stream16(void *dst, const void *src, size_t n)
{
    stream_with(lines16, dst, src, n, NULL);
}

void lmc_bulk_copy_stream32(void *dst, const void *src, size_t n)
{
    stream_with(lines32, dst, src, n, NULL);
}

/* 32-byte stores measure 5-10% above 16-byte ones (likely because a line's
 * write-combining buffer, which also serves load misses, fills and drains
 * in two stores instead of four); 64-byte AVX-512 stores add no more than
 * the noise. */
static void stream_best(void *dst, const void *src, size_t n, const void *pf)
{
    if (lmc_bulk_copy_has_avx2())
        stream_with(pf ? lines32_ahead : lines32, dst, src, n, pf);
    else
        stream_with(pf ? lines16_ahead : lines16, dst, src, n, pf);
}

void lmc_bulk_copy_fence(lmc_copy_method m)
{
    if (m == LMC_COPY_STREAM)
        _mm_sfence();
}

/* Rows of a transpose are short (a head: 128-512 B), so a call and the
 * alignment split of lmc_bulk_copy per row would cost as much as the row:
 * one loop of 32-byte moves instead, streaming when dst allows.  Both
 * halves of a line are loaded before either is stored: the HND scatter
 * ran ~8% faster that way than with each load followed by its store
 * (BENCHMARKS.md, "Server-driven transfers"). */
__attribute__((target("avx2"))) static inline void put32(char *w, __m256i v, bool stream)
{
    if (stream)
        _mm256_stream_si256((__m256i *)w, v);
    else
        _mm256_storeu_si256((__m256i *)w, v);
}

__attribute__((target("avx2"))) static inline void move32(char *w, const char *r, size_t row,
                                                          bool stream, const char *pf)
{
    size_t k = 0;
    for (; k + 64 <= row; k += 64) {
        if (pf)
            _mm_prefetch(pf + k, _MM_HINT_T0);
        __m256i lo = _mm256_loadu_si256((const __m256i *)(r + k));
        __m256i hi = _mm256_loadu_si256((const __m256i *)(r + k + 32));
        put32(w + k, lo, stream);
        put32(w + k + 32, hi, stream);
    }
    if (k < row) {
        if (pf)
            _mm_prefetch(pf + k, _MM_HINT_T0);
        put32(w + k, _mm256_loadu_si256((const __m256i *)(r + k)), stream);
    }
}

/* Walks whichever side `walk_src` names in order, the other by stride. */
__attribute__((target("avx2"), always_inline)) static inline void
transpose32(char *d, const char *s, size_t row, size_t a, size_t b, bool stream, bool walk_src,
            const char *pf)
{
    const char *s0 = s;
    if (walk_src) {   /* src [a][b] in order; dst column i, stride a rows */
        for (size_t i = 0; i < a; i++) {
            char *w = d + i * row;
            for (size_t j = 0; j < b; j++, s += row, w += a * row)
                move32(w, s, row, stream, pf ? pf + (s - s0) : NULL);
        }
    } else {          /* dst [b][a] in order; src column j, stride b rows */
        for (size_t j = 0; j < b; j++) {
            const char *r = s + j * row;
            for (size_t i = 0; i < a; i++, d += row, r += b * row)
                move32(d, r, row, stream, pf ? pf + (r - s0) : NULL);
        }
    }
}

__attribute__((target("avx2"))) static void transpose_streaming(char *d, const char *s, size_t row,
                                                                size_t a, size_t b, bool walk_src,
                                                                const char *pf)
{
    if (pf)   /* two inlined loops: the one without a prefetch has no test for it */
        transpose32(d, s, row, a, b, true, walk_src, pf);
    else
        transpose32(d, s, row, a, b, true, walk_src, NULL);
}

__attribute__((target("avx2"))) static void transpose_storing(char *d, const char *s, size_t row,
                                                              size_t a, size_t b, bool walk_src,
                                                              const char *pf)
{
    if (pf)
        transpose32(d, s, row, a, b, false, walk_src, pf);
    else
        transpose32(d, s, row, a, b, false, walk_src, NULL);
}

static bool transpose_fast(lmc_copy_method m, void *dst, const void *src, size_t row, size_t a,
                           size_t b, bool walk_src, const void *next)
{
    if (row % 32 || !lmc_bulk_copy_has_avx2())
        return false;
    /* Constant `stream`: the compiler keeps a loop of each kind with no
     * branch per store. */
    if (m == LMC_COPY_STREAM && (uintptr_t)dst % 32 == 0)
        transpose_streaming(dst, src, row, a, b, walk_src, next);
    else
        transpose_storing(dst, src, row, a, b, walk_src, next);
    return true;
}

lmc_copy_method lmc_copy_method_default(void)
{
    return LMC_COPY_STREAM;
}

#else /* !__x86_64__: no streaming kernels, STREAM is memcpy */

bool lmc_bulk_copy_has_avx2(void)
{
    return false;
}

void lmc_bulk_copy_stream16(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

void lmc_bulk_copy_stream32(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

static void stream_best(void *dst, const void *src, size_t n, const void *pf)
{
    (void)pf;
    memcpy(dst, src, n);
}

void lmc_bulk_copy_fence(lmc_copy_method m)
{
    (void)m;
}

static bool transpose_fast(lmc_copy_method m, void *dst, const void *src, size_t row, size_t a,
                           size_t b, bool walk_src, const void *next)
{
    (void)m, (void)dst, (void)src, (void)row, (void)a, (void)b, (void)walk_src, (void)next;
    return false;
}

lmc_copy_method lmc_copy_method_default(void)
{
    return LMC_COPY_MEMCPY;
}

#endif

void lmc_bulk_copy(lmc_copy_method m, void *dst, const void *src, size_t n)
{
    if (n == 0)   /* an empty run may carry NULL pointers, which memcpy may not get */
        return;
    if (m == LMC_COPY_STREAM)
        stream_best(dst, src, n, NULL);
    else
        memcpy(dst, src, n);
}

void lmc_bulk_copy_ahead(lmc_copy_method m, void *dst, const void *src, size_t n,
                         const void *next, size_t ahead)
{
    if (m != LMC_COPY_STREAM || !next || ahead == 0 || n == 0) {
        lmc_bulk_copy(m, dst, src, n);
        return;
    }
    size_t lead = n > ahead ? n - ahead : 0;
    lmc_bulk_copy(m, dst, src, lead);
    stream_best((char *)dst + lead, (const char *)src + lead, n - lead, next);
}

int lmc_copy_method_parse(const char *name, lmc_copy_method *out)
{
    if (!name)
        return -1;
    if (strcmp(name, "memcpy") == 0)
        *out = LMC_COPY_MEMCPY;
    else if (strcmp(name, "stream") == 0)
        *out = LMC_COPY_STREAM;
    else
        return -1;
    return 0;
}

const char *lmc_copy_method_name(lmc_copy_method m)
{
    return m == LMC_COPY_STREAM ? "stream" : "memcpy";
}

void lmc_bulk_copy_transpose(lmc_copy_method m, void *dst, const void *src, size_t row,
                             size_t a, size_t b, bool walk_src, const void *next)
{
    if (row == 0 || a == 0 || b == 0 || transpose_fast(m, dst, src, row, a, b, walk_src, next))
        return;
    char *d = dst;
    const char *s = src;
    for (size_t j = 0; j < b; j++)
        for (size_t i = 0; i < a; i++, d += row)
            memcpy(d, s + (i * b + j) * row, row);
}
