/* lmcache-cli: one-shot requests to a running lmcached (docs/cli.md).
 *
 *   lmcache-cli [--host H] [--port P] [--timeout S] COMMAND [ARGS]
 *
 * Exit status 0 on success, 1 on timeout or error, 2 on bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_trace.h"
#include "cli/cli_trace_replay.h"
#include "rpc/client.h"
#include "rpc/wire.h"

typedef struct {
    const char *name;
    int op_id;
    int nargs;               /* positional arguments the command takes */
    const char *help;
} cli_command;

static const cli_command commands[] = {
    {"noop", LMC_OP_NOOP, 0, "check connectivity (prints OK)"},
    {"get-chunk-size", LMC_OP_GET_CHUNK_SIZE, 0, "print the server's chunk size in tokens"},
    {"ping", LMC_OP_PING, 0, "send an untracked heartbeat (prints true)"},
    {"clear", LMC_OP_CLEAR, 0, "clear every cached object"},
    {"end-session", LMC_OP_END_SESSION, 1, "end-session REQUEST_ID: drop a session's state"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: lmcache-cli [--host HOST] [--port PORT] [--timeout SECONDS] COMMAND [ARGS]\n\n"
                 "options:\n"
                 "  --host HOST        server host (default localhost)\n"
                 "  --port PORT        server port (default 5555)\n"
                 "  --timeout SECONDS  reply timeout (default 5)\n"
                 "  --version          print the version and the commit built from\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "  %-16s %s\n", "trace info", "TRACE: a storage trace's header and counts");
    fprintf(out, "  %-16s %s\n", "trace whatif", "TRACE --l1-size SIZES: the miss-ratio curve");
    fprintf(out, "  %-16s %s\n", "trace replay", "TRACE --server URL: replay a storage trace");
}

static const cli_command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    }
    return NULL;
}

/* Encodes the payload frames of `cmd`; returns how many. */
static size_t encode_args(const cli_command *cmd, char **positional, msgpack_sbuffer *frames)
{
    msgpack_packer pk;
    switch (cmd->op_id) {
    case LMC_OP_PING:
        msgpack_sbuffer_init(&frames[0]);
        msgpack_packer_init(&pk, &frames[0], msgpack_sbuffer_write);
        msgpack_pack_nil(&pk);
        return 1;
    case LMC_OP_END_SESSION:
        msgpack_sbuffer_init(&frames[0]);
        msgpack_packer_init(&pk, &frames[0], msgpack_sbuffer_write);
        lmc_mp_pack_cstr(&pk, positional[0]);
        return 1;
    default:
        return 0;  /* CLEAR sends no frame, like upstream's CLI */
    }
}

static int print_result(const cli_command *cmd, char **positional, const lmc_client_reply *r)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    bool decoded = r->has_response &&
                   msgpack_unpack_next(&up, (const char *)r->data, r->len, &off) ==
                       MSGPACK_UNPACK_SUCCESS;
    int rc = 0;
    switch (cmd->op_id) {
    case LMC_OP_NOOP:
    case LMC_OP_GET_CHUNK_SIZE:
    case LMC_OP_PING:
        if (!decoded) {
            fprintf(stderr, "lmcache-cli: %s: malformed reply\n", cmd->name);
            rc = 1;
        } else if (up.data.type == MSGPACK_OBJECT_STR) {
            printf("%.*s\n", (int)up.data.via.str.size, up.data.via.str.ptr);
        } else {
            msgpack_object_print(stdout, up.data);
            putchar('\n');
        }
        break;
    case LMC_OP_CLEAR:
        printf("Cache cleared successfully.\n");
        break;
    case LMC_OP_END_SESSION:
        printf("Session %s ended.\n", positional[0]);
        break;
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

static int run_command(const char *host, int port, double timeout_s, const cli_command *cmd,
                       char **positional)
{
    char url[512];
    snprintf(url, sizeof url, "tcp://%s:%d", host, port);
    lmc_client *client = lmc_client_connect(url);
    if (!client) {
        fprintf(stderr, "lmcache-cli: cannot connect to %s\n", url);
        return 1;
    }
    msgpack_sbuffer frames[1];
    size_t nframes = encode_args(cmd, positional, frames);
    lmc_client_reply reply;
    lmc_client_status st =
        lmc_client_call(client, cmd->op_id, frames, nframes, (int)(timeout_s * 1000), &reply);
    for (size_t i = 0; i < nframes; i++)
        msgpack_sbuffer_destroy(&frames[i]);
    int rc = 1;
    if (st == LMC_CLIENT_TIMEOUT)
        fprintf(stderr, "lmcache-cli: %s: no reply from %s within %.1f s\n", cmd->name, url,
                timeout_s);
    else if (st == LMC_CLIENT_REMOTE_ERROR)
        fprintf(stderr, "lmcache-cli: %s: the server reported an error\n", cmd->name);
    else if (st != LMC_CLIENT_OK)
        fprintf(stderr, "lmcache-cli: %s: cannot send to %s\n", cmd->name, url);
    else
        rc = print_result(cmd, positional, &reply);
    lmc_client_reply_free(&reply);
    lmc_client_close(client);
    return rc;
}

static bool parse_number(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *s && !*end;
}

int main(int argc, char **argv)
{
    const char *host = "localhost";
    double port = 5555, timeout_s = 5;
    char *positional[8];
    int npos = 0;
    if (argc >= 3 && !strcmp(argv[1], "trace") && !strcmp(argv[2], "replay"))
        return lmc_cli_trace_replay_main(argc - 3, argv + 3);
    if (argc >= 2 && strcmp(argv[1], "trace") == 0)   /* no server: docs/cli.md, "trace" */
        return lmc_cli_trace_main(argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            printf("lmcache-cli %s (commit %s)\n", LMC_VERSION_STRING, LMC_COMMIT_STRING);
            return 0;
        }
        bool takes_value = !strcmp(a, "--host") || !strcmp(a, "--port") || !strcmp(a, "--timeout");
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, "lmcache-cli: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--host")) {
            host = argv[++i];
        } else if (!strcmp(a, "--port")) {
            if (!parse_number(argv[++i], &port) || port < 1 || port > 65535 || port != (int)port) {
                fprintf(stderr, "lmcache-cli: --port: invalid port '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--timeout")) {
            if (!parse_number(argv[++i], &timeout_s) || !(timeout_s > 0)) {
                fprintf(stderr, "lmcache-cli: --timeout: invalid value '%s'\n", argv[i]);
                return 2;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "lmcache-cli: unknown option %s\n", a);
            return 2;
        } else if (npos < 8) {
            positional[npos++] = argv[i];
        }
    }
    const cli_command *cmd = npos ? find_command(positional[0]) : NULL;
    if (!cmd || npos - 1 != cmd->nargs) {
        if (npos && !cmd)
            fprintf(stderr, "lmcache-cli: unknown command '%s'\n", positional[0]);
        else if (cmd)
            fprintf(stderr, "lmcache-cli: %s takes %d argument(s)\n", cmd->name, cmd->nargs);
        usage(stderr);
        return 2;
    }
    return run_command(host, (int)port, timeout_s, cmd, positional + 1);
}
