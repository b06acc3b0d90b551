#include "obs/json_dump.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap;
    bool failed; /* sticky: jansson may go on writing after a failed write */
} dump_buf;

static int put(const char *s, size_t n, void *data)
{
    dump_buf *b = data;
    if (b->failed)
        return -1;
    if (n >= b->cap - b->len) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        if (cap < b->len + n + 1)
            cap = b->len + n + 1;
        char *grown = realloc(b->buf, cap);
        if (!grown) {
            b->failed = true;
            return -1;
        }
        b->buf = grown;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
    return 0;
}

char *lmc_json_dumps(const json_t *v, size_t flags)
{
    dump_buf b = {0};
    if (!v || json_dump_callback(v, put, &b, flags) != 0 || b.failed) {
        free(b.buf);
        return NULL;
    }
    return b.buf ? b.buf : calloc(1, 1);
}
