/* An engine's worker for the server-driven benchmarks: paged KV tensors in
 * POSIX shared memory (block size 16, one segment per layer) registered
 * with REGISTER_KV_CACHE as CpuShmTensorWrapper pickles, and the
 * STORE / RETRIEVE / LOOKUP requests it and its scheduler send
 * (docs/protocol.md). */
#include "common/sd_worker.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

double sdw_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

void sdw_sb_packer(msgpack_sbuffer *sb, msgpack_packer *pk)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

void sdw_pack_key(msgpack_sbuffer *sb, const sd_worker *w, const uint64_t *toks, size_t start,
                  size_t end, const char *rid, bool any_worker)
{
    msgpack_packer pk;
    sdw_sb_packer(sb, &pk);
    msgpack_pack_map(&pk, 8);
    lmc_mp_pack_cstr(&pk, "model_name"), lmc_mp_pack_cstr(&pk, w->model);
    lmc_mp_pack_cstr(&pk, "world_size"), msgpack_pack_uint32(&pk, w->world);
    lmc_mp_pack_cstr(&pk, "worker_id");
    any_worker ? msgpack_pack_nil(&pk) : msgpack_pack_uint32(&pk, w->rank);
    lmc_mp_pack_cstr(&pk, "token_ids"), msgpack_pack_array(&pk, (uint32_t)end);
    for (size_t i = 0; i < end; i++)
        msgpack_pack_uint64(&pk, toks[i]);
    lmc_mp_pack_cstr(&pk, "start"), msgpack_pack_uint64(&pk, start);
    lmc_mp_pack_cstr(&pk, "end"), msgpack_pack_uint64(&pk, end);
    lmc_mp_pack_cstr(&pk, "request_id"), lmc_mp_pack_cstr(&pk, rid);
    lmc_mp_pack_cstr(&pk, "cache_salt"), lmc_mp_pack_cstr(&pk, "");
}

/* The CpuShmTensorWrapper pickle of one layer [2, NB, BS, NH, HS] (or
 * [2, NB, NH, BS, HS]), as Python's pickle writes it (docs/protocol.md,
 * "Shared tensor handles"). */
size_t sdw_wrapper_pickle(uint8_t *out, const char *name, uint64_t nbytes,
                          const int64_t shape[5])
{
    uint8_t *p = out;
#define PUT(s, n) (memcpy(p, s, n), p += (n))
#define STR(s) (*p++ = 0x8c, *p++ = (uint8_t)strlen(s), PUT(s, strlen(s)), *p++ = 0x94)
#define INT(v) (*p++ = 0x8a, *p++ = 8, memcpy(p, &(uint64_t){(uint64_t)(v)}, 8), p += 8)
    PUT("\x80\x04", 2);
    STR("lmcache.v1.platform.cpu.shm");
    STR("CpuShmTensorWrapper");
    PUT("\x93\x94\x29\x81\x94\x7d\x94\x28", 8);
    STR("shm_name"), STR(name);
    STR("nbytes"), INT(nbytes);
    STR("handle"), *p++ = 'N';
    STR("dtype"), STR("torch"), STR("float16"), PUT("\x93\x94", 2);
    STR("shape"), *p++ = '(';
    int64_t stride[5], acc = 1;
    for (int d = 4; d >= 0; d--)
        stride[d] = acc, acc *= shape[d];
    for (int d = 0; d < 5; d++)
        INT(shape[d]);
    PUT("t\x94", 2);
    STR("stride"), *p++ = '(';
    for (int d = 0; d < 5; d++)
        INT(stride[d]);
    PUT("t\x94", 2);
    STR("storage_offset"), INT(0);
    STR("device_uuid"), STR("cpu");
    PUT("ub.", 3);
#undef PUT
#undef STR
#undef INT
    return (size_t)(p - out);
}

/* A STORE / RETRIEVE reply [handle, success] with success true. */
bool sdw_reply_ok(const lmc_client_reply *r)
{
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_init(&z, 256);
    bool ok = r->has_response &&
              msgpack_unpack((const char *)r->data, r->len, &off, &z, &o) ==
                  MSGPACK_UNPACK_SUCCESS &&
              o.type == MSGPACK_OBJECT_ARRAY && o.via.array.size == 2 &&
              o.via.array.ptr[1].type == MSGPACK_OBJECT_BOOLEAN && o.via.array.ptr[1].via.boolean;
    msgpack_zone_destroy(&z);
    return ok;
}

int sdw_call(lmc_client *c, int op, msgpack_sbuffer *args, size_t n, bool *ok)
{
    lmc_client_reply r;
    lmc_client_status st = lmc_client_call(c, op, args, n, 60000, &r);
    for (size_t i = 0; i < n; i++)
        msgpack_sbuffer_destroy(&args[i]);
    if (st != LMC_CLIENT_OK)
        return -1;
    if (ok)
        *ok = sdw_reply_ok(&r);
    lmc_client_reply_free(&r);
    return 0;
}

static int make_tensors(sd_worker *w, bool hnd)
{
    w->layer_bytes = 2 * w->nb * SDW_BS * SDW_NH * w->hs * 2;
    for (size_t l = 0; l < w->layers; l++) {
        snprintf(w->names[l], sizeof w->names[l], "/lmcache_kv_bench_%d_%lld_%zu", getpid(),
                 (long long)w->instance, l);
        int fd = shm_open(w->names[l], O_CREAT | O_RDWR | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)w->layer_bytes) != 0)
            return -1;
        w->layer[l] = mmap(NULL, w->layer_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (w->layer[l] == MAP_FAILED)
            return -1;
        for (size_t i = 0; i + 8 <= w->layer_bytes; i += 64) {  /* distinct lines */
            uint64_t v = (i + l * w->layer_bytes) * 0x9e3779b97f4a7c15ull;
            memcpy(w->layer[l] + i, &v, sizeof v);
        }
    }
    (void)hnd;
    return 0;
}

void sdw_free_tensors(sd_worker *w)
{
    for (size_t l = 0; l < w->layers; l++) {
        if (w->layer[l] && w->layer[l] != MAP_FAILED)
            munmap(w->layer[l], w->layer_bytes);
        shm_unlink(w->names[l]);
    }
}

int sdw_register_worker(sd_worker *w, bool hnd)
{
    if (make_tensors(w, hnd) != 0)
        return -1;
    msgpack_sbuffer a[7];
    msgpack_packer pk;
    sdw_sb_packer(&a[0], &pk), msgpack_pack_int64(&pk, w->instance);
    sdw_sb_packer(&a[1], &pk), msgpack_pack_array(&pk, (uint32_t)w->layers);
    int64_t shape[5] = {2, (int64_t)w->nb, hnd ? SDW_NH : SDW_BS, hnd ? SDW_BS : SDW_NH,
                        (int64_t)w->hs};
    for (size_t l = 0; l < w->layers; l++) {
        uint8_t pick[512];
        size_t n = sdw_wrapper_pickle(pick, w->names[l], w->layer_bytes, shape);
        msgpack_pack_ext(&pk, n, 1);
        msgpack_pack_ext_body(&pk, pick, n);
    }
    sdw_sb_packer(&a[2], &pk), lmc_mp_pack_cstr(&pk, w->model);
    sdw_sb_packer(&a[3], &pk), msgpack_pack_uint32(&pk, w->world);
    sdw_sb_packer(&a[4], &pk), lmc_mp_pack_cstr(&pk, "vllm");
    sdw_sb_packer(&a[5], &pk), msgpack_pack_map(&pk, 1);
    lmc_mp_pack_cstr(&pk, "kv_layout"), lmc_mp_pack_cstr(&pk, hnd ? "HND" : "NHD");
    sdw_sb_packer(&a[6], &pk), msgpack_pack_array(&pk, 0);
    return sdw_call(w->c, LMC_OP_REGISTER_KV_CACHE, a, 7, NULL);
}

/* The payload of a STORE, RETRIEVE or RETRIEVE_LAYERWISE of chunks
 * [c0, c0+n) of toks, blocks from `first`: key, instance, block ids, an
 * empty event, skip 0. */
void sdw_pack_transfer(msgpack_sbuffer a[5], const sd_worker *w, const uint64_t *toks,
                       size_t c0, size_t n, size_t first, const char *rid)
{
    msgpack_packer pk;
    sdw_pack_key(&a[0], w, toks, c0 * w->cs, (c0 + n) * w->cs, rid, false);
    sdw_sb_packer(&a[1], &pk), msgpack_pack_int64(&pk, w->instance);
    sdw_sb_packer(&a[2], &pk), msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, (uint32_t)(n * w->cs / SDW_BS));
    for (size_t i = 0; i < n * w->cs / SDW_BS; i++)
        msgpack_pack_uint64(&pk, first + i);
    static const char zeros[64];
    sdw_sb_packer(&a[3], &pk), msgpack_pack_bin(&pk, 64), msgpack_pack_bin_body(&pk, zeros, 64);
    sdw_sb_packer(&a[4], &pk), msgpack_pack_int(&pk, 0);
}

/* Sends the STORE or RETRIEVE of chunks [c0, c0+n) of toks, blocks from
 * `first`; its uid, 0 when it could not be sent. */
uint64_t sdw_transfer_send(sd_worker *w, const uint64_t *toks, size_t c0, size_t n, size_t first,
                           const char *rid, bool store)
{
    msgpack_sbuffer a[5];
    sdw_pack_transfer(a, w, toks, c0, n, first, rid);
    size_t nargs = store ? 4 : 5;
    uint64_t uid = lmc_client_send(w->c, store ? LMC_OP_STORE : LMC_OP_RETRIEVE, a, nargs);
    for (size_t i = 0; i < 5; i++)
        msgpack_sbuffer_destroy(&a[i]);
    return uid;
}

/* The next STORE / RETRIEVE reply: 0 when it says success. */
int sdw_transfer_wait(sd_worker *w)
{
    lmc_client_reply r;
    uint64_t uid;
    if (lmc_client_receive(w->c, 60000, &uid, &r) != LMC_CLIENT_OK)
        return -1;
    bool ok = sdw_reply_ok(&r);
    lmc_client_reply_free(&r);
    return ok ? 0 : -1;
}

int sdw_transfer(sd_worker *w, const uint64_t *toks, size_t c0, size_t n, size_t first,
                 const char *rid, bool store)
{
    return sdw_transfer_send(w, toks, c0, n, first, rid, store) ? sdw_transfer_wait(w) : -1;
}

/* The scheduler's LOOKUP of toks' first `chunks` chunks (worker_id nil). */
static int lookup_send(sd_worker *w, const uint64_t *toks, size_t chunks, const char *rid)
{
    msgpack_sbuffer a[2];
    msgpack_packer pk;
    sdw_pack_key(&a[0], w, toks, 0, chunks * w->cs, rid, true);
    sdw_sb_packer(&a[1], &pk), msgpack_pack_int(&pk, 1);
    return sdw_call(w->c, LMC_OP_LOOKUP, a, 2, NULL);
}

int sdw_lookup(sd_worker *w, const uint64_t *toks, size_t chunks, const char *rid)
{
    msgpack_sbuffer a[1];
    msgpack_packer pk;
    if (lookup_send(w, toks, chunks, rid) != 0)
        return -1;
    sdw_sb_packer(&a[0], &pk), lmc_mp_pack_cstr(&pk, rid);
    lmc_client_reply r;
    int rc = lmc_client_call(w->c, LMC_OP_QUERY_PREFETCH_STATUS, a, 1, 60000, &r);
    msgpack_sbuffer_destroy(&a[0]);
    if (rc != LMC_CLIENT_OK)
        return -1;
    lmc_client_reply_free(&r);
    return 0;
}

/* LOOKUP of toks' first `chunks` chunks, then QUERY_PREFETCH_STATUS
 * polled until it answers a count (None while the job runs), as a
 * scheduler does; *hits that count.  0, or -1 on a failed call. */
int sdw_lookup_wait(sd_worker *w, const uint64_t *toks, size_t chunks, const char *rid,
                    int64_t *hits)
{
    msgpack_sbuffer a[1];
    msgpack_packer pk;
    if (lookup_send(w, toks, chunks, rid) != 0)
        return -1;
    for (;;) {
        lmc_client_reply r;
        sdw_sb_packer(&a[0], &pk), lmc_mp_pack_cstr(&pk, rid);
        int rc = lmc_client_call(w->c, LMC_OP_QUERY_PREFETCH_STATUS, a, 1, 60000, &r);
        msgpack_sbuffer_destroy(&a[0]);
        if (rc != LMC_CLIENT_OK)
            return -1;
        msgpack_zone z;
        msgpack_object o;
        size_t off = 0;
        msgpack_zone_init(&z, 64);
        bool done = r.has_response &&
                    msgpack_unpack((const char *)r.data, r.len, &off, &z, &o) ==
                        MSGPACK_UNPACK_SUCCESS &&
                    o.type != MSGPACK_OBJECT_NIL;
        if (done)
            *hits = o.type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)o.via.u64 : -1;
        msgpack_zone_destroy(&z);
        lmc_client_reply_free(&r);
        if (done)
            return 0;
    }
}

void sdw_fill_tokens(uint64_t *t, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (seed * 1000003 + i * 7919) % 120000;
}

int sdw_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int sdw_end_session(sd_worker *w, const char *rid)
{
    msgpack_sbuffer a[1];
    msgpack_packer pk;
    sdw_sb_packer(&a[0], &pk), lmc_mp_pack_cstr(&pk, rid);
    return sdw_call(w->c, LMC_OP_END_SESSION, a, 1, NULL);
}

/* One GET of the server's /status on 127.0.0.1:http_port (with curl) into
 * body (NUL-terminated, at most cap - 1 bytes); its length, 0 if none. */
size_t sdw_status_get(int http_port, char *body, size_t cap)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "curl -s --max-time 5 http://127.0.0.1:%d/status", http_port);
    FILE *f = popen(cmd, "r");
    size_t n = f ? fread(body, 1, cap - 1, f) : 0;
    if (f)
        pclose(f);
    body[n] = '\0';
    return n;
}

/* Polls /status until `done` finds what it waits for in it; seconds
 * waited, or -1 after a minute. */
double sdw_wait_status(int http_port, bool (*done)(const char *body))
{
    double t0 = sdw_now_s();
    size_t cap = 1 << 20;
    char *body = malloc(cap);
    for (int i = 0; body && i < 3000; i++) {
        sdw_status_get(http_port, body, cap);
        if (done(body)) {
            free(body);
            return sdw_now_s() - t0;
        }
        usleep(20 * 1000);
    }
    free(body);
    return -1;
}

bool sdw_l1_prefaulted(const char *body)
{
    const char *pf = strstr(body, "\"prefault\"");
    return pf && !strstr(pf, "\"running\"");
}

bool sdw_engine_mapped(const char *body)
{
    const char *at = strstr(body, "\"populating\":");
    return at && strtol(at + strlen("\"populating\":"), NULL, 10) == 0;
}
