/* POST /events ingest rate of lmcached-coordinator (docs/coordinator.md,
 * "Benchmark"), beside a bare libmicrohttpd echo server answering the same
 * bodies, both pinned to one core; and the coordinator's memory per tracked
 * key (RSS growth / keys).
 *
 *   coord_ingest_bench COORDINATOR_BIN [--seconds S] [--cpu C] [--entries N]
 *                      [--connections K]
 *
 * Every request carries one store batch of N (1000) new L2 keys, so the
 * coordinator's table grows through the run.  The load comes from K
 * blocking keep-alive connections, one thread each, on the other cores. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int port;
    int entries;
    int id;
    double seconds;
    atomic_bool *stop;
    unsigned long long requests, failures;
    unsigned long long seq;
} client;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One store batch of `entries` keys unique to (client, seq).  The body is
 * written once per connection and only its seq digits are rewritten per
 * request (fixed width, at remembered offsets): formatting 1000 entries
 * per request would make the client, not the server under test, the
 * bottleneck of the echo run. */
typedef struct {
    char *text;
    size_t len;
    size_t seq_at;     /* the batch's "seq" value: 20 digits */
    size_t *hash_at;   /* per entry: the 16 hex digits of seq in its hash */
    int entries;
} body_template;

static void template_init(body_template *t, int id, int entries)
{
    size_t cap = (size_t)entries * 400 + 4096;
    t->text = malloc(cap);
    t->hash_at = malloc((size_t)entries * sizeof *t->hash_at);
    t->entries = entries;
    size_t n = (size_t)snprintf(t->text, cap, "{\"batches\":[{\"instance_id\":\"bench-%d\","
                                "\"incarnation\":1,\"seq\":", id);
    t->seq_at = n;
    n += (size_t)snprintf(t->text + n, cap - n, "%020d,\"event_type\":\"store\","
                          "\"tier\":\"l2\",\"backend\":\"fs\",\"shared\":true,"
                          "\"ts\":1.0,\"entries\":[", 0);
    for (int i = 0; i < entries; i++) {
        n += (size_t)snprintf(t->text + n, cap - n, "%s{\"key\":{\"chunk_hash_hex\":\"%08x",
                              i ? "," : "", (unsigned)id);
        t->hash_at[i] = n;
        n += (size_t)snprintf(t->text + n, cap - n,
                              "%016x%08x%032x\","
                              "\"model_name\":\"meta-llama/Llama-3.1-8B\",\"kv_rank\":16908289,"
                              "\"object_group_id\":0,\"cache_salt\":\"tenant-%d\"},"
                              "\"size_bytes\":2097152,\"token_ids\":[],\"token_offset\":-1}",
                              0, (unsigned)i, 0, i % 8);
    }
    n += (size_t)snprintf(t->text + n, cap - n, "]}]}");
    t->len = n;
}

/* The body of request seq; a JSON integer cannot have leading zeros, so
 * the seq is written right-aligned after blanks. */
static void template_set_seq(body_template *t, unsigned long long seq)
{
    char digits[24], hex[17];
    snprintf(digits, sizeof digits, "%20llu", seq);
    memcpy(t->text + t->seq_at, digits, 20);
    snprintf(hex, sizeof hex, "%016llx", seq);
    for (int i = 0; i < t->entries; i++)
        memcpy(t->text + t->hash_at[i], hex, 16);
}

static void template_free(body_template *t)
{
    free(t->text);
    free(t->hash_at);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads one response (headers + Content-Length body); its status or 0. */
static int read_response(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    char *end = NULL;
    while (!(end = memmem(buf, len, "\r\n\r\n", 4))) {
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r <= 0)
            return 0;
        len += (size_t)r;
    }
    int status = atoi(buf + 9);
    char *cl = memmem(buf, (size_t)(end - buf), "Content-Length:", 15);
    if (!cl)
        cl = memmem(buf, (size_t)(end - buf), "content-length:", 15);
    size_t body = cl ? strtoul(cl + 15, NULL, 10) : 0, have = len - (size_t)(end + 4 - buf);
    while (have < body) {
        ssize_t r = recv(fd, buf, cap, 0);
        if (r <= 0)
            return 0;
        have += (size_t)r;
    }
    return status;
}

static void *client_main(void *arg)
{
    client *c = arg;
    body_template body;
    template_init(&body, c->id, c->entries);
    char *head = malloc(256), *resp = malloc(1 << 20);
    int fd = connect_to(c->port);
    while (fd >= 0 && !atomic_load(c->stop)) {
        template_set_seq(&body, ++c->seq);
        int h = snprintf(head, 256, "POST /events HTTP/1.1\r\nHost: b\r\nContent-Type: "
                                    "application/json\r\nContent-Length: %zu\r\n\r\n",
                         body.len);
        if (!send_all(fd, head, (size_t)h) || !send_all(fd, body.text, body.len))
            break;
        int st = read_response(fd, resp, 1 << 20);
        if (st == 200)
            c->requests++;
        else
            c->failures++;
        if (!st)
            break;
    }
    if (fd >= 0)
        close(fd);
    template_free(&body);
    free(head);
    free(resp);
    return NULL;
}

/* K clients for `seconds`; requests per second. */
static double drive(int port, int k, int entries, double seconds, unsigned long long *failures,
                    unsigned long long *done)
{
    atomic_bool stop = false;
    client *cs = calloc((size_t)k, sizeof *cs);
    pthread_t *t = calloc((size_t)k, sizeof *t);
    for (int i = 0; i < k; i++) {
        cs[i] = (client){.port = port, .entries = entries, .id = i, .stop = &stop,
                         .seq = 0};
        pthread_create(&t[i], NULL, client_main, &cs[i]);
    }
    double t0 = now_s();
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&stop, true);
    unsigned long long n = 0;
    for (int i = 0; i < k; i++) {
        pthread_join(t[i], NULL);
        n += cs[i].requests;
        *failures += cs[i].failures;
    }
    double rate = (double)n / (now_s() - t0);
    *done = n;
    free(cs);
    free(t);
    return rate;
}

/* ---- the echo server ------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
} echo_body;

static enum MHD_Result echo(void *cls, struct MHD_Connection *conn, const char *url,
                            const char *method, const char *version, const char *data,
                            size_t *size, void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version;
    echo_body *b = *con_cls;
    if (!b) {
        *con_cls = calloc(1, sizeof *b);
        return MHD_YES;
    }
    if (*size) {
        if (b->len + *size > b->cap) {
            b->cap = (b->len + *size) * 2;
            b->buf = realloc(b->buf, b->cap);
        }
        memcpy(b->buf + b->len, data, *size);
        b->len += *size;
        *size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(b->len, b->buf, MHD_RESPMEM_MUST_FREE);
    b->buf = NULL;
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static void echo_done(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    echo_body *b = *con_cls;
    if (b) {
        free(b->buf);
        free(b);
    }
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static pid_t start_echo(int port, int cpu)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    pin(cpu);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC, (uint16_t)port, NULL, NULL,
        echo, NULL, MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(128u << 10), MHD_OPTION_NOTIFY_COMPLETED, echo_done, NULL, MHD_OPTION_END);
    if (!d)
        _exit(1);
    pause();
    _exit(0);
}

/* ---- the coordinator ---------------------------------------------------------------- */

static pid_t start_coordinator(const char *bin, int port, int cpu, const char *db)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    pin(cpu);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    setenv("LMCACHE_MP_COORDINATOR_HOST", "127.0.0.1", 1);
    setenv("LMCACHE_MP_COORDINATOR_PORT", p, 1);
    setenv("LMCACHE_MP_COORDINATOR_DB_PATH", db, 1);
    setenv("LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC", "false", 1);
    /* Every key of the run is new and recorded: past the default bound
     * (10 M, some 5 s of this load) the run would time refusals instead. */
    setenv("LMCACHE_MP_COORDINATOR_MAX_KEYS", "1000000000", 1);
    setenv("LMCACHE_LOG_LEVEL", "WARNING", 1);
    execl(bin, bin, (char *)NULL);
    _exit(127);
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kib;
}

/* CPU seconds (user + system) the process has used so far. */
static double cpu_s(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long ut = 0, st = 0;
    /* the fields after the command name (which may hold blanks): state is
     * the 3rd field, utime and stime the 14th and 15th */
    if (f && fscanf(f, "%*d (%*[^)]) %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                    &st) != 2)
        ut = st = 0;
    if (f)
        fclose(f);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static void wait_up(int port)
{
    for (int i = 0; i < 200; i++) {
        int fd = connect_to(port);
        if (fd >= 0)
            return (void)close(fd);
        usleep(20000);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COORDINATOR_BIN [--seconds S] [--cpu C] [--entries N] "
                        "[--connections K]\n", argv[0]);
        return 2;
    }
    double seconds = 5;
    int cpu = 0, entries = 1000, k = 4;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--cpu")) cpu = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--entries")) entries = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--connections")) k = atoi(argv[i + 1]);
    }
    char db[128];
    snprintf(db, sizeof db, "/tmp/coord-ingest-bench-%d.db", (int)getpid());
    int eport = free_port(), cport = free_port();
    pid_t e = start_echo(eport, cpu), c = start_coordinator(argv[1], cport, cpu, db);
    wait_up(eport);
    wait_up(cport);
    unsigned long long efail = 0, cfail = 0, n_echo = 0, n_coord = 0;
    double ecpu = cpu_s(e);
    double echo_rate = drive(eport, k, entries, seconds, &efail, &n_echo);
    ecpu = cpu_s(e) - ecpu;
    long rss0 = rss_kib(c);
    double ccpu = cpu_s(c);
    double coord_rate = drive(cport, k, entries, seconds, &cfail, &n_coord);
    ccpu = cpu_s(c) - ccpu;
    long rss1 = rss_kib(c);
    unsigned long long keys = n_coord * (unsigned long long)entries;
    printf("coord_ingest_bench: %d entries per batch, %d connections, %.0f s each, server on "
           "cpu %d\n", entries, k, seconds, cpu);
    /* A server far from 100 % busy was held back by the client or by
     * other load on its core: its rate is then not its capacity. */
    printf("  echo server       %8.1f requests/s  (%.0f entries/s)  failures %llu  cpu %3.0f %%\n",
           echo_rate, echo_rate * entries, efail, 100 * ecpu / seconds);
    printf("  coordinator       %8.1f requests/s  (%.0f entries/s)  failures %llu  cpu %3.0f %%\n",
           coord_rate, coord_rate * entries, cfail, 100 * ccpu / seconds);
    printf("  ratio             %8.2f  (goal >= 0.5)\n", coord_rate / echo_rate);
    /* The same ratio from CPU time per request: what each would do with
     * the whole core, steadier when other work shares the machine. */
    double echo_us = n_echo ? 1e6 * ecpu / (double)n_echo : 0;
    double coord_us = n_coord ? 1e6 * ccpu / (double)n_coord : 0;
    printf("  cpu per request   echo %.0f us, coordinator %.0f us: ratio %.2f\n", echo_us, coord_us,
           coord_us > 0 ? echo_us / coord_us : 0.0);
    printf("  memory            RSS %ld -> %ld KiB over ~%llu new keys: %.1f B/key (goal <= 200)\n",
           rss0, rss1, keys, keys ? (double)(rss1 - rss0) * 1024 / (double)keys : 0.0);
    kill(e, SIGTERM);
    kill(c, SIGTERM);
    waitpid(e, NULL, 0);
    waitpid(c, NULL, 0);
    char p[160];
    unlink(db);
    snprintf(p, sizeof p, "%s-wal", db);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", db);
    unlink(p);
    return 0;
}
