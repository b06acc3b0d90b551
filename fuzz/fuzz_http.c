/* Fuzz target: the HTTP frontend with the real server behind it.  One
 * lmcached runs inside this process (HTTP on a free loopback port, an
 * engine-driven context registered for model "m" so the /api/kv endpoints
 * have a layout); each input becomes one well-formed HTTP/1.1 request whose
 * method, path, headers and body come from the input, sent on a fresh
 * connection.  Not libmicrohttpd's parser but our routes and the server
 * callbacks behind them are the target.
 *
 * Input: [method: 1 byte][path]\n[header lines]\n\n[body]; CR and NUL are
 * dropped from the path and headers so the request stays well formed.
 * Findings: a crash (ASan/UBSan), no complete answer within 5 s, or a 500
 * (bad input must get a 4xx, never an internal error). */
#include <arpa/inet.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "embedded_server.h"

static fuzz_server *server;

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Registers an engine-driven context for ("m", world size 1) over ZMQ, as a
 * worker would, and waits for the reply. */
static void register_model(const char *zmq_url)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    pack_str(&pk, "instance_id"), msgpack_pack_int(&pk, 77);
    pack_str(&pk, "model_name"), pack_str(&pk, "m");
    pack_str(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    pack_str(&pk, "block_size"), msgpack_pack_int(&pk, 16);
    pack_str(&pk, "num_layers"), msgpack_pack_int(&pk, 2);
    pack_str(&pk, "hidden_dim_size"), msgpack_pack_int(&pk, 8);
    pack_str(&pk, "dtype_str"), pack_str(&pk, "float16");
    pack_str(&pk, "use_mla"), msgpack_pack_false(&pk);
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    CHECK(zmq_connect(d, zmq_url) == 0);
    zmq_send(d, "\x01", 1, ZMQ_SNDMORE);
    zmq_send(d, "\x0e", 1, ZMQ_SNDMORE);   /* op 14 */
    zmq_send(d, sb.data, sb.size, 0);
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    CHECK(zmq_poll(&it, 1, 10000) == 1);
    zmq_close(d);
    zmq_ctx_term(ctx);
    msgpack_sbuffer_destroy(&sb);
}

static void start(void)
{
    char url[64];
    server = fuzz_start_server(true);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", server->zmq_port);
    register_model(url);
}

static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"};

/* Copies [p, end) up to `stop` into out, dropping CR and NUL. */
static size_t take_line(const uint8_t **p, const uint8_t *end, const char *stop, char *out,
                        size_t cap)
{
    size_t n = 0, stop_len = strlen(stop);
    while (*p < end) {
        if ((size_t)(end - *p) >= stop_len && memcmp(*p, stop, stop_len) == 0) {
            *p += stop_len;
            break;
        }
        uint8_t c = *(*p)++;
        if (c != '\r' && c != '\0' && n + 1 < cap)
            out[n++] = (char)c;
    }
    out[n] = '\0';
    return n;
}

/* A header line the harness passes on: "Name: value" with a plain token
 * name, no control bytes, and none of the headers that frame the request
 * (a folded line or a second Connection would turn "close" into
 * keep-alive, and the harness reads each answer up to the connection's end). */
static bool header_ok(const char *line)
{
    static const char *const framing[] = {"connection", "content-length", "transfer-encoding",
                                          "host", "expect", "upgrade"};
    const char *colon = strchr(line, ':');
    if (!colon || colon == line)
        return false;
    for (const char *c = line; *c; c++) {
        if ((unsigned char)*c < 0x20 && *c != '\t')
            return false;
        if (c < colon && (*c == ' ' || *c == '\t'))
            return false;
    }
    for (size_t i = 0; i < sizeof framing / sizeof framing[0]; i++)
        if ((size_t)(colon - line) == strlen(framing[i]) &&
            strncasecmp(line, framing[i], strlen(framing[i])) == 0)
            return false;
    return true;
}

static int connect_http(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)server->http_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (!server)
        start();
    if (len == 0)
        return 0;
    const char *method = methods[data[0] % (sizeof methods / sizeof methods[0])];
    const uint8_t *p = data + 1, *end = data + len;
    char path[1024], headers[2048];
    take_line(&p, end, "\n", path, sizeof path);
    take_line(&p, end, "\n\n", headers, sizeof headers);
    for (char *c = path; *c; c++)   /* one request line: no spaces in the target */
        if (*c == ' ' || *c == '\n')
            *c = '_';
    if (path[0] != '/')
        return 0;
    size_t body_len = (size_t)(end - p);
    char *req = malloc(sizeof path + sizeof headers + body_len + 256);
    if (!req)
        return 0;
    int n = sprintf(req, "%s %s HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n", method, path);
    for (char *line = strtok(headers, "\n"); line; line = strtok(NULL, "\n"))
        if (header_ok(line))
            n += sprintf(req + n, "%s\r\n", line);
    n += sprintf(req + n, "Content-Length: %zu\r\n\r\n", body_len);
    memcpy(req + n, p, body_len);
    int s = connect_http();
    size_t total = (size_t)n + body_len, sent = 0;
    while (sent < total) {
        ssize_t w = send(s, req + sent, total - sent, MSG_NOSIGNAL);
        if (w <= 0)
            break;   /* the server may answer (413, 400) and close early */
        sent += (size_t)w;
    }
    char head[16] = "";
    size_t got = 0;
    for (;;) {
        struct pollfd pfd = {s, POLLIN, 0};
        if (poll(&pfd, 1, 5000) != 1) {
            fprintf(stderr, "fuzz_http: no complete answer within 5 s to %s %s\n", method, path);
            abort();
        }
        char buf[4096];
        ssize_t r = recv(s, buf, sizeof buf, 0);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r && got + 1 < sizeof head; i++)
            head[got++] = buf[i];
    }
    close(s);
    free(req);
    head[got] = '\0';
    if (getenv("FUZZ_HTTP_VERBOSE"))   /* what each corpus request got */
        fprintf(stderr, "%s %s -> %.12s\n", method, path, head);
    CHECK(strncmp(head, "HTTP/1.", 7) == 0);
    if (strncmp(head + 9, "500", 3) == 0) {
        fprintf(stderr, "fuzz_http: 500 for %s %s\n", method, path);
        abort();
    }
    return 0;
}
