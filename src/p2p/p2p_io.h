/* Socket helpers of the transfer channel (p2p_chan.c): whole-buffer I/O
 * bounded in time, and host:port parsing. */
#ifndef LMC_P2P_IO_H
#define LMC_P2P_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int64_t lmc_p2p_io_now_ms(void);

/* Sends or receives exactly len bytes.  Gives up (-1) when the peer closes
 * or errs, when stop_fd (-1: none) becomes readable, when the absolute
 * deadline (lmc_p2p_io_now_ms; -1: none) passes, or when no byte moves for
 * stall_ms (-1: no bound). */
int lmc_p2p_io_full(int fd, void *buf, size_t len, bool sending, int stop_fd, int64_t deadline,
                    int stall_ms);

/* A non-blocking TCP connect (TCP_NODELAY) to the first address of
 * host:port that answers by the absolute deadline; -1 if none. */
int lmc_p2p_io_dial(const char *host, const char *port, int64_t deadline);

/* A non-blocking listening socket on url ("host:port", port 0: any),
 * its port in *port_out; -1 with err naming the URL. */
int lmc_p2p_io_listen(const char *url, int *port_out, char *err, size_t errlen);

/* Splits "host:port", "tcp://host:port" or "[v6]:port" into host and port
 * strings.  False for anything else. */
bool lmc_p2p_io_split_url(const char *url, char *host, size_t hostlen, char *port, size_t portlen);

#endif
