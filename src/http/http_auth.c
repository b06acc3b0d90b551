/* Bearer-token check (http_auth.h). */
#include "http/http_auth.h"

#include <openssl/crypto.h>
#include <string.h>
#include <strings.h>

static bool digest(const lmc_http_auth *a, const char *data, size_t len,
                   unsigned char out[LMC_HTTP_DIGEST_LEN])
{
    unsigned int n = 0;
    return EVP_Digest(data, len, out, &n, a->sha256, NULL) == 1 && n == LMC_HTTP_DIGEST_LEN;
}

int lmc_http_auth_init(lmc_http_auth *a, const char *token)
{
    memset(a, 0, sizeof *a);
    if (!token || !*token)
        return 0;
    a->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!a->sha256 || !digest(a, token, strlen(token), a->digest)) {
        lmc_http_auth_free(a);
        return -1;
    }
    a->enabled = true;
    return 0;
}

void lmc_http_auth_free(lmc_http_auth *a)
{
    EVP_MD_free(a->sha256);
    OPENSSL_cleanse(a->digest, sizeof a->digest);
    memset(a, 0, sizeof *a);
}

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

/* The token of "Bearer <token>" as [*start, *start + *len), or false. */
static bool bearer_token(const char *header, const char **start, size_t *len)
{
    if (!header)
        return false;
    while (blank(*header))
        header++;
    if (strncasecmp(header, "Bearer", 6) != 0 || !blank(header[6]))
        return false;
    const char *p = header + 7;
    while (blank(*p))
        p++;
    size_t n = strlen(p);
    while (n > 0 && blank(p[n - 1]))
        n--;
    *start = p;
    *len = n;
    return n > 0;
}

bool lmc_http_auth_ok(const lmc_http_auth *a, const char *authorization)
{
    if (!a->enabled)
        return true;
    const char *token;
    size_t len;
    unsigned char got[LMC_HTTP_DIGEST_LEN];
    if (!bearer_token(authorization, &token, &len) || !digest(a, token, len, got))
        return false;
    return CRYPTO_memcmp(got, a->digest, LMC_HTTP_DIGEST_LEN) == 0;
}
