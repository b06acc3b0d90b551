/* Token hashing, stateless part: the hasher object and F() for each
 * algorithm.  See token_hash.h and docs/hashing.md. */
#include "hash/token_hash.h"
#include "hash/hash_memo.h"

#include "core/errbuf.h"
#include "hash/cbor.h"
#include "obs/log.h"

#include <blake3.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* Tokens are encoded into a stack buffer and fed to the digest in blocks of
 * this many tokens: 8 KiB for blake3, i.e. several 1 KiB BLAKE3 chunks per
 * update so its SIMD many-chunk path is used, without per-token calls. */
#define TOKENS_PER_BLOCK 2048
/* Worst-case CBOR bytes per token: a uint up to 2^32-1 is 0x1a + 4 bytes. */
#define CBOR_TOKEN_MAX 5

struct lmc_token_hasher {
    lmc_hash_algo algo;
    uint32_t chunk_size;
    uint8_t none_hash[LMC_TOKEN_HASH_LEN];
    EVP_MD *sha256; /* fetched once: implicit fetches per init are slow */
    lmc_hash_memo *memo; /* NULL unless lmc_token_hasher_enable_memo() */
};

const char *lmc_hash_strerror(int code)
{
    switch (code) {
    case LMC_HASH_OK: return "ok";
    case LMC_HASH_ERANGE: return "token range is not chunk-aligned or exceeds the token list";
    case LMC_HASH_ETOKEN: return "token id outside 0..2^32-1";
    case LMC_HASH_ENOMEM: return "out of memory";
    case LMC_HASH_ECRYPTO: return "digest computation failed";
    default: return "unknown hash error";
    }
}

/* ---- blake3 ------------------------------------------------------------- */

/* Writes n tokens as 4-byte big-endian words; false if any is >= 2^32.
 * The range check is folded into one OR so the loop stays branch-free. */
static bool put_be32_block(uint8_t *dst, const uint64_t *toks, size_t n)
{
    uint64_t high = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t t = toks[i];
        high |= t >> 32;
        dst[4 * i] = (uint8_t)(t >> 24);
        dst[4 * i + 1] = (uint8_t)(t >> 16);
        dst[4 * i + 2] = (uint8_t)(t >> 8);
        dst[4 * i + 3] = (uint8_t)t;
    }
    return high == 0;
}

/* F(prefix, toks) for blake3.  `out` may alias `prefix`: the prefix is copied
 * into the buffer before anything is written to `out`. */
static int blake3_f(const uint8_t *prefix, size_t plen, const uint64_t *toks, size_t n,
                    uint8_t *out)
{
    uint8_t buf[LMC_TOKEN_HASH_LEN + 4 * TOKENS_PER_BLOCK];
    blake3_hasher hs;
    blake3_hasher_init(&hs);
    memcpy(buf, prefix, plen);
    size_t used = plen;
    do {
        size_t take = (sizeof buf - used) / 4;
        if (take > n)
            take = n;
        if (!put_be32_block(buf + used, toks, take))
            return LMC_HASH_ETOKEN;
        blake3_hasher_update(&hs, buf, used + 4 * take);
        used = 0;
        toks += take;
        n -= take;
    } while (n > 0);
    blake3_hasher_finalize(&hs, out, LMC_TOKEN_HASH_LEN);
    return LMC_HASH_OK;
}

/* ---- sha256_cbor -------------------------------------------------------- */

/* CBOR-encodes n tokens as shortest uints; returns bytes written or 0 when a
 * token is >= 2^32 (a real encoding of n >= 1 tokens is never empty). */
static size_t put_cbor_block(uint8_t *dst, const uint64_t *toks, size_t n)
{
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (toks[i] > UINT32_MAX)
            return 0;
        used += lmc_cbor_put_uint(dst + used, toks[i]);
    }
    return used;
}

/* Encodes the start of [prefix, [toks...], null]: array(3), bstr, array(n). */
static size_t put_cbor_preamble(uint8_t *dst, const uint8_t *prefix, size_t plen, size_t n)
{
    size_t used = lmc_cbor_put_head(dst, LMC_CBOR_ARRAY, 3);
    used += lmc_cbor_put_head(dst + used, LMC_CBOR_BYTES, plen);
    memcpy(dst + used, prefix, plen);
    used += plen;
    used += lmc_cbor_put_head(dst + used, LMC_CBOR_ARRAY, n);
    return used;
}

/* F(prefix, toks) for sha256_cbor, streaming the CBOR through `md`.
 * `out` may alias `prefix` (copied into the buffer first). */
static int sha256_f(const lmc_token_hasher *h, EVP_MD_CTX *md, const uint8_t *prefix,
                    size_t plen, const uint64_t *toks, size_t n, uint8_t *out)
{
    uint8_t buf[3 * LMC_CBOR_HEAD_MAX + LMC_TOKEN_HASH_LEN + CBOR_TOKEN_MAX * TOKENS_PER_BLOCK];
    if (!EVP_DigestInit_ex(md, h->sha256, NULL))
        return LMC_HASH_ECRYPTO;
    size_t used = put_cbor_preamble(buf, prefix, plen, n);
    while (n > 0) {
        size_t take = (sizeof buf - used) / CBOR_TOKEN_MAX;
        if (take > n)
            take = n;
        size_t w = put_cbor_block(buf + used, toks, take);
        if (w == 0)
            return LMC_HASH_ETOKEN;
        if (!EVP_DigestUpdate(md, buf, used + w))
            return LMC_HASH_ECRYPTO;
        used = 0;
        toks += take;
        n -= take;
    }
    buf[used++] = LMC_CBOR_NULL;
    unsigned int olen = 0;
    if (!EVP_DigestUpdate(md, buf, used) || !EVP_DigestFinal_ex(md, out, &olen))
        return LMC_HASH_ECRYPTO;
    return LMC_HASH_OK;
}

/* ---- chaining ----------------------------------------------------------- */

/* Per-call state: sha256 needs an EVP context, reused for every chunk. */
typedef struct {
    const lmc_token_hasher *h;
    EVP_MD_CTX *md;
} call_ctx;

static int call_open(call_ctx *c, const lmc_token_hasher *h)
{
    c->h = h;
    c->md = NULL;
    if (h->algo == LMC_HASH_ALGO_SHA256_CBOR && !(c->md = EVP_MD_CTX_new()))
        return LMC_HASH_ENOMEM;
    return LMC_HASH_OK;
}

static void call_close(call_ctx *c)
{
    EVP_MD_CTX_free(c->md);
}

/* Advances the chain by n_chunks: `prev` holds the previous hash on entry and
 * the last computed one on exit; each hash is also copied to out (if any). */
static int run_chain(call_ctx *c, uint8_t *prev, const uint64_t *tokens, size_t n_chunks,
                     uint8_t *out)
{
    const size_t cs = c->h->chunk_size;
    lmc_hash_memo *memo = c->h->memo;
    for (size_t i = 0; i < n_chunks; i++) {
        const uint64_t *toks = tokens + i * cs;
        uint8_t next[LMC_TOKEN_HASH_LEN];
        if (!memo || !lmc_hash_memo_get(memo, prev, toks, next)) {
            int rc = c->md ? sha256_f(c->h, c->md, prev, LMC_TOKEN_HASH_LEN, toks, cs, next)
                           : blake3_f(prev, LMC_TOKEN_HASH_LEN, toks, cs, next);
            if (rc != LMC_HASH_OK)
                return rc;
            if (memo)
                lmc_hash_memo_put(memo, prev, toks, next);
        }
        memcpy(prev, next, LMC_TOKEN_HASH_LEN);
        if (out)
            memcpy(out + i * LMC_TOKEN_HASH_LEN, prev, LMC_TOKEN_HASH_LEN);
    }
    return LMC_HASH_OK;
}

int lmc_hash_chunks_from(const lmc_token_hasher *h, const uint8_t *prefix,
                         const uint64_t *tokens, size_t n_chunks, uint8_t *out)
{
    uint8_t prev[LMC_TOKEN_HASH_LEN];
    memcpy(prev, prefix, sizeof prev);
    call_ctx c;
    int rc = call_open(&c, h);
    if (rc == LMC_HASH_OK)
        rc = run_chain(&c, prev, tokens, n_chunks, out);
    call_close(&c);
    return rc;
}

size_t lmc_hash_num_chunks(const lmc_token_hasher *h, size_t n_tokens)
{
    return n_tokens / h->chunk_size;
}

int lmc_hash_chunks(const lmc_token_hasher *h, const uint64_t *tokens, size_t n_tokens,
                    size_t start, size_t end, uint8_t *out)
{
    const size_t cs = h->chunk_size;
    if (start % cs || end % cs || start > end || end > n_tokens)
        return LMC_HASH_ERANGE;
    uint8_t prev[LMC_TOKEN_HASH_LEN];
    memcpy(prev, h->none_hash, sizeof prev);
    call_ctx c;
    int rc = call_open(&c, h);
    /* The chunks before `start` are needed only as the chain's prefix. */
    if (rc == LMC_HASH_OK)
        rc = run_chain(&c, prev, tokens, start / cs, NULL);
    if (rc == LMC_HASH_OK)
        rc = run_chain(&c, prev, tokens + start, (end - start) / cs, out);
    call_close(&c);
    return rc;
}

/* ---- construction ------------------------------------------------------- */

static bool random_bytes(uint8_t *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = getrandom(buf + got, len - got, 0);
        if (r < 0 && errno != EINTR)
            return false;
        if (r > 0)
            got += (size_t)r;
    }
    return true;
}

/* vLLM's init_none_hash for sha256_cbor: SHA-256 of the seed as a CBOR text
 * string when PYTHONHASHSEED is set (even to ""), else random bytes. */
static int sha256_none_hash(lmc_token_hasher *h, const char *seed, char *err, size_t errlen)
{
    if (!seed) {
        if (!random_bytes(h->none_hash, LMC_TOKEN_HASH_LEN))
            return lmc_err(err, errlen, "getrandom failed: %s", strerror(errno));
        LMC_WARN("sha256_cbor: PYTHONHASHSEED unset, using a random NONE_HASH; chunk hashes "
                 "will not match any other server process");
        return 0;
    }
    size_t len = strlen(seed);
    uint8_t head[LMC_CBOR_HEAD_MAX];
    size_t hl = lmc_cbor_put_head(head, LMC_CBOR_TEXT, len);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int olen = 0;
    bool ok = md && EVP_DigestInit_ex(md, h->sha256, NULL) && EVP_DigestUpdate(md, head, hl) &&
              EVP_DigestUpdate(md, seed, len) && EVP_DigestFinal_ex(md, h->none_hash, &olen);
    const char *why = md ? "SHA-256 of the hash seed failed" : "out of memory";
    EVP_MD_CTX_free(md);
    return ok ? 0 : lmc_err(err, errlen, "%s", why);
}

/* blake3's deterministic seed F(int 0, [0]): the int prefix 0 is 8 zero
 * bytes (big-endian signed), then token 0 as 4 zero bytes. */
static void blake3_none_hash(lmc_token_hasher *h)
{
    static const uint8_t zero_prefix[8] = {0};
    static const uint64_t zero_token[1] = {0};
    (void)blake3_f(zero_prefix, sizeof zero_prefix, zero_token, 1, h->none_hash);
}

static int parse_algorithm(const char *name, lmc_hash_algo *algo, char *err, size_t errlen)
{
    if (name && strcmp(name, "blake3") == 0) {
        *algo = LMC_HASH_ALGO_BLAKE3;
        return 0;
    }
    if (name && strcmp(name, "sha256_cbor") == 0) {
        *algo = LMC_HASH_ALGO_SHA256_CBOR;
        return 0;
    }
    if (name && strcmp(name, "builtin") == 0)
        return lmc_err(err, errlen,
                       "hash algorithm 'builtin' is not supported: it is CPython's hash() of a "
                       "tuple, which depends on the CPython version and PYTHONHASHSEED and cannot "
                       "be reproduced outside CPython; use 'blake3' (default) or 'sha256_cbor'");
    return lmc_err(err, errlen, "unknown hash algorithm '%s' (expected 'blake3' or 'sha256_cbor')",
                   name ? name : "(null)");
}

int lmc_token_hasher_new(const char *algorithm, uint32_t chunk_size,
                         const char *python_hash_seed, lmc_token_hasher **out,
                         char *err, size_t errlen)
{
    *out = NULL;
    lmc_hash_algo algo = LMC_HASH_ALGO_BLAKE3;
    if (parse_algorithm(algorithm, &algo, err, errlen) != 0)
        return -1;
    if (chunk_size == 0)
        return lmc_err(err, errlen, "chunk size must be > 0");
    lmc_token_hasher *h = calloc(1, sizeof *h);
    if (!h)
        return lmc_err(err, errlen, "out of memory");
    h->algo = algo;
    h->chunk_size = chunk_size;
    int rc = 0;
    if (algo == LMC_HASH_ALGO_BLAKE3) {
        blake3_none_hash(h);
    } else if (!(h->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL))) {
        rc = lmc_err(err, errlen, "OpenSSL could not fetch SHA256 (no provider, or out of memory)");
    } else {
        rc = sha256_none_hash(h, python_hash_seed, err, errlen);
    }
    if (rc != 0) {
        lmc_token_hasher_free(h);
        return -1;
    }
    *out = h;
    return 0;
}

int lmc_token_hasher_enable_memo(lmc_token_hasher *h, size_t budget_bytes)
{
    lmc_hash_memo_free(h->memo);
    h->memo = budget_bytes ? lmc_hash_memo_new(h->chunk_size, budget_bytes) : NULL;
    return budget_bytes && !h->memo ? -1 : 0;
}

bool lmc_token_hasher_memo_stats(const lmc_token_hasher *h, lmc_hash_memo_stats *out)
{
    if (!h->memo)
        return false;
    *out = lmc_hash_memo_get_stats(h->memo);
    return true;
}

void lmc_token_hasher_free(lmc_token_hasher *h)
{
    if (!h)
        return;
    lmc_hash_memo_free(h->memo);
    EVP_MD_free(h->sha256);
    free(h);
}

lmc_hash_algo lmc_token_hasher_algo(const lmc_token_hasher *h)
{
    return h->algo;
}

const char *lmc_token_hasher_name(const lmc_token_hasher *h)
{
    return h->algo == LMC_HASH_ALGO_BLAKE3 ? "blake3" : "sha256_cbor";
}

uint32_t lmc_token_hasher_chunk_size(const lmc_token_hasher *h)
{
    return h->chunk_size;
}

size_t lmc_token_hasher_digest_len(const lmc_token_hasher *h)
{
    (void)h;
    return LMC_TOKEN_HASH_LEN;
}

const uint8_t *lmc_token_hasher_none_hash(const lmc_token_hasher *h)
{
    return h->none_hash;
}
