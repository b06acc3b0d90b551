/* Start-up of lmcached (issue 34; docs/storage.md, "Pre-fault"): the time
 * from exec to the first NOOP answered, for several L1 sizes, beside the
 * floor measured in the same run: exec of the same binary to its exit
 * with --version (the loader and the libraries, nothing of the server).
 *
 * The client connects before the server binds, with a 1 ms reconnect
 * interval, and sends a NOOP every millisecond until one is answered, so
 * that it measures the server, not ZMQ's default 100 ms of reconnect.
 *
 *   startup_bench [--runs N] [--lmcached PATH] [SIZE_GB ...]
 *
 * Defaults: 5 runs of 0.0625, 1 and 4 GiB; lmcached beside this binary. */
#include <limits.h>
#include <msgpack.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define NOOP_OP 24

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static pid_t spawn(char *const argv[])
{
    fflush(NULL);   /* or the child's exit writes our buffered lines again */
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* exec -> exit of `lmcached --version`, ms. */
static double floor_once(const char *bin)
{
    char *argv[] = {(char *)bin, "--version", NULL};
    double t0 = now_ms();
    pid_t pid = spawn(argv);
    int status;
    waitpid(pid, &status, 0);
    return now_ms() - t0;
}

static int send_noop(void *sock, unsigned uid)
{
    char buf[16];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_unsigned_int(&pk, uid);
    size_t uid_len = sb.size;
    msgpack_pack_int(&pk, NOOP_OP);
    memcpy(buf, sb.data, sb.size);
    int rc = zmq_send(sock, buf, uid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
             zmq_send(sock, buf + uid_len, sb.size - uid_len, ZMQ_DONTWAIT) < 0;
    msgpack_sbuffer_destroy(&sb);
    return rc ? -1 : 0;
}

/* exec -> first NOOP answered, ms; -1 when the server did not answer. */
static double startup_once(void *ctx, const char *bin, const char *gb, int port)
{
    char url[64], port_s[16], http_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(http_s, sizeof http_s, "%d", port + 1);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int one = 1, zero = 0;
    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &one, sizeof one);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(sock, url);
    char *argv[] = {(char *)bin, "--host", "127.0.0.1", "--port", port_s, "--http-host",
                    "127.0.0.1", "--http-port", http_s, "--l1-size-gb", (char *)gb,
                    "--eviction-policy", "LRU", NULL};
    double t0 = now_ms(), took = -1;
    pid_t pid = spawn(argv);
    for (unsigned uid = 0; now_ms() - t0 < 20000; uid++) {
        send_noop(sock, uid);
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 1) > 0) {
            took = now_ms() - t0;
            break;
        }
    }
    zmq_close(sock);
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    return took;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int runs = 5;
    char bin[PATH_MAX] = "";
    const char *sizes[16];
    size_t n_sizes = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lmcached") == 0 && i + 1 < argc)
            snprintf(bin, sizeof bin, "%s", argv[++i]);
        else if (n_sizes < 16)
            sizes[n_sizes++] = argv[i];
    }
    if (runs < 1 || runs > 100) {
        fprintf(stderr, "startup_bench: --runs must be in [1, 100]\n");
        return 2;
    }
    if (!bin[0]) {   /* beside this binary, as the build puts it */
        ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
        if (n <= 0)
            return 1;
        bin[n] = '\0';
        char *slash = strrchr(bin, '/');
        snprintf(slash ? slash + 1 : bin, 16, "lmcached");
    }
    if (n_sizes == 0) {
        sizes[0] = "0.0625", sizes[1] = "1", sizes[2] = "4";
        n_sizes = 3;
    }
    void *ctx = zmq_ctx_new();
    double floor_ms[100], t[100];
    for (int r = 0; r < runs; r++)
        floor_ms[r] = floor_once(bin);
    qsort(floor_ms, (size_t)runs, sizeof *floor_ms, cmp_double);
    double floor_med = floor_ms[runs / 2];
    printf("startup_bench: %s, %d runs\n", bin, runs);
    printf("  floor: exec -> exit of --version, median %.1f ms\n", floor_med);
    int port = 21000 + getpid() % 20000;
    for (size_t s = 0; s < n_sizes; s++) {
        for (int r = 0; r < runs; r++) {
            t[r] = startup_once(ctx, bin, sizes[s], port);
            port += 2;
            if (t[r] < 0) {
                fprintf(stderr, "startup_bench: no answer with --l1-size-gb %s\n", sizes[s]);
                return 1;
            }
        }
        qsort(t, (size_t)runs, sizeof *t, cmp_double);
        printf("  --l1-size-gb %-7s exec -> first NOOP: median %.1f ms (min %.1f, max %.1f), "
               "%.2fx the floor\n", sizes[s], t[runs / 2], t[0], t[runs - 1],
               t[runs / 2] / floor_med);
    }
    zmq_ctx_term(ctx);
    return 0;
}
