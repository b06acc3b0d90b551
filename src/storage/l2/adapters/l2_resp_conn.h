/* Internal to the resp backend: one RESP2 connection with a small read
 * buffer, command writing with writev, and reply reading. */
#ifndef LMC_STORAGE_L2_RESP_CONN_H
#define LMC_STORAGE_L2_RESP_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RESP_LINE_MAX 512

typedef struct resp_conn {
    int fd;                    /* -1 when closed */
    size_t pos, len;           /* unread bytes: buf[pos..len) */
    char buf[4096];
} resp_conn;

/* A command argument; `data` may point straight into an L1 buffer. */
typedef struct {
    const void *data;
    size_t len;
} resp_arg;

void lmc_resp_conn_init(resp_conn *c);
int lmc_resp_conn_open(resp_conn *c, const char *host, int port, int timeout_ms);
/* The same, with why the connection failed in why (NULL: not wanted):
 * "host:port: connect: Connection refused". */
int lmc_resp_conn_open_why(resp_conn *c, const char *host, int port, int timeout_ms, char *why,
                           size_t cap);
void lmc_resp_conn_close(resp_conn *c);
/* Sends one command (RESP array of bulk strings).  0, or -1 (closed). */
int lmc_resp_send_command(resp_conn *c, const resp_arg *args, size_t n);
/* Appends one command to out (grown as needed), for pipelines sent with
 * lmc_resp_send_raw.  0, or -1 when out of memory. */
int lmc_resp_append_command(char **out, size_t *len, size_t *cap, const resp_arg *args, size_t n);
/* Sends bytes as they are.  0, or -1 (closed). */
int lmc_resp_send_raw(resp_conn *c, const void *data, size_t len);
/* Reads one reply line without its CRLF into line (NUL-terminated).  The
 * first byte is the RESP type (+ - : $ *).  0, or -1 (closed). */
int lmc_resp_read_line(resp_conn *c, char *line, size_t cap);
/* Reads exactly n bytes (dst NULL: discards them).  0, or -1 (closed). */
int lmc_resp_read_exact(resp_conn *c, void *dst, size_t n);
/* Reads a bulk payload of `len` bytes plus its CRLF into dst (NULL: discard). */
int lmc_resp_read_bulk_body(resp_conn *c, void *dst, size_t len);
/* Parses the integer after the type byte; false if malformed. */
bool lmc_resp_parse_int(const char *line, int64_t *out);

#endif
