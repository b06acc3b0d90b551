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

/* HMAC-SHA256(token, role || cn || sn): binds the proof to this
 * connection's two nonces and to the side that made it, so that neither a
 * replay nor a reflection of the other side's proof passes. */
static int prove(const char *token, const char *role, const uint8_t *cn, const uint8_t *sn,
                 uint8_t out[MAC_LEN])
{
    uint8_t msg[32 + 2 * NONCE_LEN];
    size_t rl = strlen(role);
    memcpy(msg, role, rl);
    memcpy(msg + rl, cn, NONCE_LEN);
    memcpy(msg + rl + NONCE_LEN, sn, NONCE_LEN);
    unsigned len = 0;
    return HMAC(EVP_sha256(), token, (int)strlen(token), msg, rl + 2 * NONCE_LEN, out, &len) &&
                   len == MAC_LEN
               ? 0
               : -1;
}

static int nonce(uint8_t out[NONCE_LEN])
{
    return getrandom(out, NONCE_LEN, 0) == NONCE_LEN ? 0 : -1;
}

int lmc_p2p_auth_client(int fd, const char *token, int64_t deadline)
{
    uint8_t hello[MAGIC_LEN + NONCE_LEN], answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    uint8_t want[MAC_LEN], mine[MAC_LEN];
    memcpy(hello, LMC_P2P_AUTH_MAGIC, MAGIC_LEN);
    const uint8_t *cn = hello + MAGIC_LEN, *sn = answer + MAGIC_LEN;
    if (nonce(hello + MAGIC_LEN) != 0 ||
        lmc_p2p_io_full(fd, hello, sizeof hello, true, -1, deadline, -1) != 0 ||
        lmc_p2p_io_full(fd, answer, sizeof answer, false, -1, deadline, -1) != 0 ||
        memcmp(answer, LMC_P2P_AUTH_MAGIC, MAGIC_LEN) != 0 ||
        prove(token, "lmcached p2p server", cn, sn, want) != 0 ||
        CRYPTO_memcmp(want, answer + MAGIC_LEN + NONCE_LEN, MAC_LEN) != 0 ||
        prove(token, "lmcached p2p client", cn, sn, mine) != 0)
        return -1;
    return lmc_p2p_io_full(fd, mine, sizeof mine, true, -1, deadline, -1);
}

int lmc_p2p_auth_server(int fd, const char *token, int stop_fd, int64_t deadline)
{
    uint8_t hello[MAGIC_LEN + NONCE_LEN], answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    uint8_t want[MAC_LEN], got[MAC_LEN];
    const uint8_t *cn = hello + MAGIC_LEN, *sn = answer + MAGIC_LEN;
    memcpy(answer, LMC_P2P_AUTH_MAGIC, MAGIC_LEN);
    /* The magic alone first: a client speaking another handshake (an
     * upstream peer's "LMTCP001") is closed at once, not at the deadline. */
    if (lmc_p2p_io_full(fd, hello, MAGIC_LEN, false, stop_fd, deadline, -1) != 0 ||
        memcmp(hello, LMC_P2P_AUTH_MAGIC, MAGIC_LEN) != 0 ||
        lmc_p2p_io_full(fd, hello + MAGIC_LEN, NONCE_LEN, false, stop_fd, deadline, -1) != 0 ||
        nonce(answer + MAGIC_LEN) != 0 ||
        prove(token, "lmcached p2p server", cn, sn, answer + MAGIC_LEN + NONCE_LEN) != 0 ||
        lmc_p2p_io_full(fd, answer, sizeof answer, true, stop_fd, deadline, -1) != 0 ||
        lmc_p2p_io_full(fd, got, sizeof got, false, stop_fd, deadline, -1) != 0 ||
        prove(token, "lmcached p2p client", cn, sn, want) != 0)
        return -1;
    return CRYPTO_memcmp(want, got, MAC_LEN) == 0 ? 0 : -1;
}
