/* Fuzz target: the tcp transfer channel's two decoders on the bytes of a
 * hostile peer (src/p2p/, docs/p2p.md "Transfer channel").  The first byte
 * picks the side: even, the rest is what a client sends to the server's
 * connection loop (handshake, requests) over a 4 KiB arena; odd, the rest is
 * everything a server answers to a client's three-item read.  A socketpair
 * carries the bytes, so that the very code the sockets run is fuzzed; ASan
 * catches any write past a destination, the lease check any range past the
 * arena.  The same bytes also go through the ucx engine's bootstrap header
 * decoder (src/p2p/p2p_ucx_wire.h).  First byte % 4 of 2 or 3: both sides
 * hold a token, so the bytes meet the token handshake first
 * (src/p2p/p2p_auth.h). */
#include "check.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2p/p2p_chan.h"
#include "p2p/p2p_ucx_wire.h"

static uint8_t arena[4096];

static bool deny_odd_offsets(void *user, const uint8_t *holder, size_t holder_len, uint64_t off,
                             uint64_t len)
{
    (void)user, (void)holder, (void)holder_len;
    CHECK(off < sizeof arena && len <= sizeof arena - off && len > 0);
    return off % 2 == 0;
}

static void *drain(void *arg)
{
    int fd = *(int *)arg;
    char buf[65536];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    return NULL;
}

static void as_server(const uint8_t *data, size_t len, int sv[2], const char *token)
{
    pthread_t th;
    CHECK(send(sv[1], data, len, MSG_NOSIGNAL) == (ssize_t)len);
    shutdown(sv[1], SHUT_WR);
    pthread_create(&th, NULL, drain, &sv[1]);
    lmc_p2p_chan_server_opts o = {.arena = arena, .arena_size = sizeof arena,
                                  .may_read = deny_odd_offsets, .max_items = 16,
                                  .io_timeout_ms = 200, .auth_token = token};
    lmc_p2p_chan_server_stats st;
    lmc_p2p_chan_serve_fd(&o, sv[0], -1, &st);
    shutdown(sv[0], SHUT_RDWR);
    pthread_join(th, NULL);
    CHECK(st.bytes_served <= st.items_served * sizeof arena);
    /* The proof covers the server's fresh nonce: no input can forge it. */
    CHECK(!token || (st.items_served == 0 && st.items_refused == 0));
}

static void as_client(const uint8_t *data, size_t len, int sv[2], const char *token)
{
    CHECK(send(sv[1], data, len, MSG_NOSIGNAL) == (ssize_t)len);
    shutdown(sv[1], SHUT_WR);
    lmc_p2p_chan_client_opts co = {.auth_token = token};
    lmc_p2p_chan_client *c = lmc_p2p_chan_client_from_fd(sv[0], &co);
    CHECK(c);
    size_t lens[3] = {1, 17, 100};
    lmc_p2p_chan_item it[3];
    for (int i = 0; i < 3; i++)
        it[i] = (lmc_p2p_chan_item){(uint64_t)i * 64, lens[i], malloc(lens[i])};
    bool ok[3];
    size_t got = lmc_p2p_chan_client_read(c, it, 3, 200, ok);
    CHECK(got == (size_t)ok[0] + ok[1] + ok[2]);
    for (int i = 0; i < 3; i++)
        free(it[i].dst);
    lmc_p2p_chan_client_close(c);   /* closes sv[0] */
    sv[0] = -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len < 1)
        return 0;
    lmc_p2p_ucx_hdr h;   /* the ucx engine's bootstrap header, on the same bytes */
    if (len - 1 >= LMC_P2P_UCX_HDR && lmc_p2p_ucx_wire_hdr(data + 1, &h) == 0)
        CHECK(h.addr_len >= 1 && h.addr_len <= LMC_P2P_UCX_MAX_PART && h.rkey_len >= 1 &&
              h.rkey_len <= LMC_P2P_UCX_MAX_PART);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    /* Modes 2 and 3: the same with the token handshake first (p2p_auth.h). */
    const char *token = data[0] % 4 >= 2 ? "fuzz-token" : NULL;
    if (data[0] % 2 == 0)
        as_server(data + 1, len - 1, sv, token);
    else
        as_client(data + 1, len - 1, sv, token);
    if (sv[0] >= 0)
        close(sv[0]);
    close(sv[1]);
    return 0;
}
