/* The channel's token handshake (p2p_auth.h, docs/p2p.md, "Trust model"). */
#include "p2p/p2p_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

#include "p2p/p2p_io.h"

#define MAGIC_LEN 8
#define NONCE_LEN 16
#define MAC_LEN 32

bool lmc_p2p_auth_wanted(const char *token)
{
    return token && token[0];
}

/* HMAC-SHA256(token, role || cn || sn || extra): binds the proof to this
 * connection's two nonces, to the side that made it and (client) to the
 * holder it names, so that neither a replay, a reflection of the other
 * side's proof nor a changed holder passes. */
static int prove(const char *token, const char *role, const uint8_t *cn, const uint8_t *sn,
                 const uint8_t *extra, size_t extra_len, uint8_t out[MAC_LEN])
{
    uint8_t msg[32 + 2 * NONCE_LEN + 1 + LMC_P2P_AUTH_MAX_HOLDER];
    size_t rl = strlen(role), n = 0;
    memcpy(msg, role, rl);
    n += rl;
    memcpy(msg + n, cn, NONCE_LEN);
    n += NONCE_LEN;
    memcpy(msg + n, sn, NONCE_LEN);
    n += NONCE_LEN;
    if (extra_len)
        memcpy(msg + n, extra, extra_len);
    n += extra_len;
    unsigned len = 0;
    return HMAC(EVP_sha256(), token, (int)strlen(token), msg, n, out, &len) && len == MAC_LEN
               ? 0
               : -1;
}

static int nonce(uint8_t out[NONCE_LEN])
{
    return getrandom(out, NONCE_LEN, 0) == NONCE_LEN ? 0 : -1;
}

int lmc_p2p_auth_client(int fd, const char *token, const uint8_t *holder, size_t holder_len,
                        int64_t deadline)
{
    uint8_t hello[MAGIC_LEN + NONCE_LEN], answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    uint8_t want[MAC_LEN], proof[1 + LMC_P2P_AUTH_MAX_HOLDER + MAC_LEN];
    if (holder_len > LMC_P2P_AUTH_MAX_HOLDER)
        return -1;
    memcpy(hello, LMC_P2P_AUTH_MAGIC, MAGIC_LEN);
    const uint8_t *cn = hello + MAGIC_LEN, *sn = answer + MAGIC_LEN;
    proof[0] = (uint8_t)holder_len;
    if (holder_len)
        memcpy(proof + 1, holder, holder_len);
    size_t named = 1 + holder_len;
    if (nonce(hello + MAGIC_LEN) != 0 ||
        lmc_p2p_io_full(fd, hello, sizeof hello, true, -1, deadline, -1) != 0 ||
        lmc_p2p_io_full(fd, answer, sizeof answer, false, -1, deadline, -1) != 0 ||
        memcmp(answer, LMC_P2P_AUTH_MAGIC, MAGIC_LEN) != 0 ||
        prove(token, "lmcached p2p server", cn, sn, NULL, 0, want) != 0 ||
        CRYPTO_memcmp(want, answer + MAGIC_LEN + NONCE_LEN, MAC_LEN) != 0 ||
        prove(token, "lmcached p2p client", cn, sn, proof, named, proof + named) != 0)
        return -1;
    return lmc_p2p_io_full(fd, proof, named + MAC_LEN, true, -1, deadline, -1);
}

int lmc_p2p_auth_server(int fd, const char *token, int stop_fd, int64_t deadline,
                        uint8_t holder[LMC_P2P_AUTH_MAX_HOLDER], size_t *holder_len)
{
    uint8_t hello[MAGIC_LEN + NONCE_LEN], answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    uint8_t want[MAC_LEN], got[MAC_LEN], named[1 + LMC_P2P_AUTH_MAX_HOLDER];
    const uint8_t *cn = hello + MAGIC_LEN, *sn = answer + MAGIC_LEN;
    memcpy(answer, LMC_P2P_AUTH_MAGIC, MAGIC_LEN);
    /* The magic alone first: a client speaking another handshake (an
     * upstream peer's "LMTCP001") is closed at once, not at the deadline. */
    if (lmc_p2p_io_full(fd, hello, MAGIC_LEN, false, stop_fd, deadline, -1) != 0 ||
        memcmp(hello, LMC_P2P_AUTH_MAGIC, MAGIC_LEN) != 0 ||
        lmc_p2p_io_full(fd, hello + MAGIC_LEN, NONCE_LEN, false, stop_fd, deadline, -1) != 0 ||
        nonce(answer + MAGIC_LEN) != 0 ||
        prove(token, "lmcached p2p server", cn, sn, NULL, 0, answer + MAGIC_LEN + NONCE_LEN) ||
        lmc_p2p_io_full(fd, answer, sizeof answer, true, stop_fd, deadline, -1) != 0 ||
        lmc_p2p_io_full(fd, named, 1, false, stop_fd, deadline, -1) != 0 ||
        named[0] > LMC_P2P_AUTH_MAX_HOLDER ||
        lmc_p2p_io_full(fd, named + 1, named[0], false, stop_fd, deadline, -1) != 0 ||
        lmc_p2p_io_full(fd, got, sizeof got, false, stop_fd, deadline, -1) != 0 ||
        prove(token, "lmcached p2p client", cn, sn, named, 1u + named[0], want) != 0 ||
        CRYPTO_memcmp(want, got, MAC_LEN) != 0)
        return -1;
    memcpy(holder, named + 1, named[0]);
    *holder_len = named[0];
    return 0;
}
