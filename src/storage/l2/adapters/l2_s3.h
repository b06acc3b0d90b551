/* "s3" L2 backend: an S3-compatible object store over libcurl with AWS
 * Signature Version 4 (docs/l2.md, "`s3`").  Object name = the canonical
 * object-key string; value = the raw object bytes; path-style URLs
 * (endpoint/bucket/key), which every S3-compatible store accepts. */
#ifndef LMC_STORAGE_L2_S3_H
#define LMC_STORAGE_L2_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l2/l2_adapter.h"

typedef struct lmc_l2_s3_options {
    const char *endpoint;        /* e.g. "http://127.0.0.1:9000" (required) */
    const char *bucket;          /* required */
    const char *region;          /* NULL: "us-east-1" */
    const char *access_key;      /* NULL: $AWS_ACCESS_KEY_ID */
    const char *secret_key;      /* NULL: $AWS_SECRET_ACCESS_KEY */
    bool create_bucket;          /* create the bucket at start when missing */
    size_t num_connections;      /* concurrent requests (one per adapter worker) */
    uint64_t capacity_bytes;     /* max_capacity_gb in bytes; 0 = unlimited */
    long timeout_ms;             /* per request; 0 = 10000 */
    bool keep_found;             /* keep the objects listed at start for for_each_recovered
                                  * (the adapter has an "eviction" object) */
} lmc_l2_s3_options;

/* Counts the objects already in the bucket (ListObjectsV2, docs/l2.md
 * "Usage and capacity of resp and s3") when it is reachable. */
lmc_l2_backend *lmc_l2_s3_new(const lmc_l2_s3_options *o, char *err, size_t errlen);

/* ---- SigV4, exposed for tests ------------------------------------------- */
typedef struct {
    const char *name;            /* lower-case */
    const char *value;           /* trimmed */
} lmc_s3_header;

/* RFC 3986 encoding as SigV4 wants it: unreserved characters kept, '/'
 * kept when keep_slash, everything else %XX (upper-case hex).  Returns the
 * length written, or -1 when cap is too small. */
int lmc_s3_uri_encode(const char *s, size_t len, bool keep_slash, char *out, size_t cap);

/* The Authorization header value for a request.  `headers` (sorted by
 * name) are the signed headers; `query` is the canonical query string
 * (sorted, encoded) or "".  amz_date is "YYYYMMDDTHHMMSSZ". */
int lmc_s3_authorization(const char *method, const char *canonical_uri, const char *query,
                         const lmc_s3_header *headers, size_t n_headers,
                         const char *payload_hash, const char *access_key,
                         const char *secret_key, const char *region, const char *amz_date,
                         char *out, size_t cap);

#endif
