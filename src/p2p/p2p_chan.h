/* The P2P transfer channel (docs/p2p.md, "Transfer channel"): a server that
 * lends byte ranges of this process's L1 arena to peers, and a client that
 * reads ranges of a peer's arena into local buffers.  Engine: "tcp", the
 * framing of p2p_wire.h.  Every failure is a per-item miss for the caller,
 * never fatal: a refused range, a peer that is down, stalls, dies mid-reply
 * or sends garbage. */
#ifndef LMC_P2P_CHAN_H
#define LMC_P2P_CHAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether a peer may read [off, off+len) of the arena now (the lease check
 * of the serving side).  holder: the lease holder the connection named in
 * the token handshake (p2p_auth.h; possibly empty, then it holds nothing),
 * NULL without a token (anyone's leases count).  Called from the connection threads, concurrently, for
 * ranges already known to lie inside the arena. */
typedef bool (*lmc_p2p_may_read_fn)(void *user, const uint8_t *holder, size_t holder_len,
                                    uint64_t off, uint64_t len);

typedef struct lmc_p2p_chan_server_opts {
    const char *listen_url;        /* "host:port" ("tcp://" prefix, "[v6]" allowed); port 0 picks one */
    const void *arena;             /* the region lent, arena_size bytes */
    uint64_t arena_size;
    lmc_p2p_may_read_fn may_read;  /* NULL: every range inside the arena */
    void *may_read_user;
    unsigned max_conns;            /* connections served at once (a thread each); 0: 16 */
    uint32_t max_items;            /* items per request; 0: 65536 */
    int io_timeout_ms;             /* a peer that stalls mid-message this long is dropped; 0: 30000 */
    const char *auth_token;        /* non-empty: every connection proves it first (p2p_auth.h) */
} lmc_p2p_chan_server_opts;

typedef struct lmc_p2p_chan_server_stats {
    uint64_t bytes_served;
    uint64_t items_served;
    uint64_t items_refused;        /* outside the arena, or may_read said no */
    uint64_t conns_accepted;
    uint64_t conns_rejected;       /* over max_conns: closed at once */
    uint64_t conns_active;
    uint64_t protocol_errors;      /* bad handshake, message type, item count; stalls */
    uint64_t auth_failures;        /* connections that did not prove the token */
} lmc_p2p_chan_server_stats;

typedef struct lmc_p2p_chan_server lmc_p2p_chan_server;

/* NULL with err filled (naming the listen URL) when it cannot listen. */
lmc_p2p_chan_server *lmc_p2p_chan_server_start(const lmc_p2p_chan_server_opts *o, char *err,
                                               size_t errlen);
int lmc_p2p_chan_server_port(const lmc_p2p_chan_server *s);
void lmc_p2p_chan_server_stats_get(const lmc_p2p_chan_server *s, lmc_p2p_chan_server_stats *out);
/* Closes the listener and every connection, joins their threads. */
void lmc_p2p_chan_server_stop(lmc_p2p_chan_server *s);

/* Serves one already-accepted connection until the peer closes, errs, or
 * stop_fd becomes readable (-1: none).  The fd is not closed.  Used by the
 * server's threads and by fuzz/fuzz_p2p_wire.c. */
void lmc_p2p_chan_serve_fd(const lmc_p2p_chan_server_opts *o, int fd, int stop_fd,
                           lmc_p2p_chan_server_stats *stats_or_null);

typedef struct lmc_p2p_chan_client_opts {
    const char *url;               /* the peer's "host:port" */
    int connect_timeout_ms;        /* 0: 3000 */
    uint32_t max_items;            /* items per request, the rest fail; 0: 65536 */
    uint64_t max_request_bytes;    /* bytes per request, the rest fail; 0: 1 GiB */
    const char *auth_token;        /* non-empty: proved on connect (p2p_auth.h); copied */
    const uint8_t *holder;         /* with a token: the lease holder named to the server */
    size_t holder_len;             /* 0..64 (p2p_auth.h; longer is cut); copied */
} lmc_p2p_chan_client_opts;

typedef struct lmc_p2p_chan_item {
    uint64_t remote_off;           /* offset in the peer's arena */
    uint64_t len;                  /* bytes to read; dst holds at least len */
    void *dst;
} lmc_p2p_chan_item;

typedef struct lmc_p2p_chan_client lmc_p2p_chan_client;

/* Connects lazily, on the first read; NULL only for a URL it cannot parse
 * or no memory (err says which). */
lmc_p2p_chan_client *lmc_p2p_chan_client_open(const lmc_p2p_chan_client_opts *o, char *err,
                                              size_t errlen);
/* Adopts a connected socket, before the handshake (the first read sends
 * it); for the fuzz target and the tests.  Closes fd on failure. */
lmc_p2p_chan_client *lmc_p2p_chan_client_from_fd(int fd, const lmc_p2p_chan_client_opts *o);
/* Reads n items within timeout_ms (connect included); ok[i] says whether
 * items[i].dst now holds the peer's bytes.  Returns the number read.  A
 * failed connection is dropped and the next read reconnects.  Serialised
 * per client. */
size_t lmc_p2p_chan_client_read(lmc_p2p_chan_client *c, const lmc_p2p_chan_item *items, size_t n,
                                int timeout_ms, bool *ok);
void lmc_p2p_chan_client_close(lmc_p2p_chan_client *c);

#endif
