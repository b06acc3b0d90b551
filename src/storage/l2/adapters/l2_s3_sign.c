/* AWS Signature Version 4 for S3 requests. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>

#include "core/hex.h"
#include "storage/l2/adapters/l2_s3.h"

static void hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
    unsigned int len = 32;
    HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &len);
}

int lmc_s3_uri_encode(const char *s, size_t len, bool keep_slash, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        if (o + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
    return (int)o;
}

/* hex(SHA-256(canonical request)) */
static int canonical_request_hash(const char *method, const char *uri, const char *query,
                                  const lmc_s3_header *h, size_t n, const char *payload_hash,
                                  char *signed_names, size_t names_cap, char out_hex[65])
{
    char canon[8192];
    int len = snprintf(canon, sizeof canon, "%s\n%s\n%s\n", method, uri, query);
    size_t nl = 0;
    signed_names[0] = '\0';
    for (size_t i = 0; i < n && len > 0 && (size_t)len < sizeof canon; i++) {
        len += snprintf(canon + len, sizeof canon - (size_t)len, "%s:%s\n", h[i].name, h[i].value);
        nl += (size_t)snprintf(signed_names + nl, names_cap - nl, "%s%s", i ? ";" : "", h[i].name);
        if (nl >= names_cap)
            return -1;
    }
    if (len <= 0 || (size_t)len >= sizeof canon)
        return -1;
    len += snprintf(canon + len, sizeof canon - (size_t)len, "\n%s\n%s", signed_names,
                    payload_hash);
    if ((size_t)len >= sizeof canon)
        return -1;
    unsigned char digest[32];
    SHA256((const unsigned char *)canon, (size_t)len, digest);
    lmc_hex_encode(digest, 32, out_hex);
    return 0;
}

int lmc_s3_authorization(const char *method, const char *canonical_uri, const char *query,
                         const lmc_s3_header *headers, size_t n_headers,
                         const char *payload_hash, const char *access_key,
                         const char *secret_key, const char *region, const char *amz_date,
                         char *out, size_t cap)
{
    char names[512], creq[65], date[9], scope[128], to_sign[512], key[300];
    if (canonical_request_hash(method, canonical_uri, query, headers, n_headers, payload_hash,
                               names, sizeof names, creq) != 0 || strlen(amz_date) != 16)
        return -1;
    memcpy(date, amz_date, 8);
    date[8] = '\0';
    snprintf(scope, sizeof scope, "%s/%s/s3/aws4_request", date, region);
    snprintf(to_sign, sizeof to_sign, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, creq);
    /* signing key = HMAC chain over date, region, service, "aws4_request" */
    unsigned char k1[32], k2[32], sig[32];
    int kl = snprintf(key, sizeof key, "AWS4%s", secret_key);
    if (kl < 0 || (size_t)kl >= sizeof key)
        return -1;
    hmac(key, (size_t)kl, date, k1);
    hmac(k1, 32, region, k2);
    hmac(k2, 32, "s3", k1);
    hmac(k1, 32, "aws4_request", k2);
    hmac(k2, 32, to_sign, sig);
    char sig_hex[65];
    lmc_hex_encode(sig, 32, sig_hex);
    int n = snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                     access_key, scope, names, sig_hex);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}
