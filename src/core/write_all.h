/* write(2) until every byte is written: retried on EINTR and after a short
 * write, as files on a full or slow disk may take a buffer in pieces. */
#ifndef LMC_CORE_WRITE_ALL_H
#define LMC_CORE_WRITE_ALL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* 0 once all n bytes are written, -1 (errno set) when write fails. */
static inline int lmc_core_write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

#endif
