/* Bearer-token check of the guarded routes (docs/http.md,
 * "Authentication").  Only a SHA-256 digest of the token is kept; a
 * presented token is digested too and the digests are compared with
 * CRYPTO_memcmp, so the time taken tells nothing about how much of a
 * guess was right, nor about the token's length. */
#ifndef LMC_HTTP_HTTP_AUTH_H
#define LMC_HTTP_HTTP_AUTH_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>

#define LMC_HTTP_DIGEST_LEN 32

typedef struct {
    bool enabled;
    EVP_MD *sha256;  /* fetched once: a fetch per request would cost a microsecond */
    unsigned char digest[LMC_HTTP_DIGEST_LEN];
} lmc_http_auth;

/* token NULL or "" = no authentication (lmc_http_auth_ok always true).
 * 0, or -1 when SHA-256 is unavailable. */
int lmc_http_auth_init(lmc_http_auth *a, const char *token);
void lmc_http_auth_free(lmc_http_auth *a);

/* Whether an Authorization header value (NULL = absent) carries the token:
 * "Bearer <token>", the scheme case-insensitive (RFC 7235), blanks around
 * the token ignored.  Thread-safe. */
bool lmc_http_auth_ok(const lmc_http_auth *a, const char *authorization);

#endif
