/* An engine's worker for the server-driven benchmarks (docs/protocol.md):
 * paged KV in POSIX shared memory, block size SDW_BS, SDW_NH heads, one
 * segment per layer, registered as CpuShmTensorWrapper pickles; the
 * requests its ranks and its scheduler send, over lmc_client. */
#ifndef LMC_BENCH_SD_WORKER_H
#define LMC_BENCH_SD_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/client.h"
#include "rpc/wire.h"

#define SDW_BS 16
#define SDW_NH 2
#define SDW_MAX_LAYERS 8

typedef struct {
    lmc_client *c;
    int64_t instance;
    uint32_t rank, world;
    const char *model;
    size_t nb, layers, hs;
    size_t cs;                          /* the server's --chunk-size */
    uint8_t *layer[SDW_MAX_LAYERS];
    char names[SDW_MAX_LAYERS][64];
    size_t layer_bytes;
} sd_worker;

double sdw_now_s(void);
void sdw_sb_packer(msgpack_sbuffer *sb, msgpack_packer *pk);
/* An IPC key of toks[start, end) (token_ids: toks[0, end)); worker_id nil
 * with any_worker (a scheduler's key). */
void sdw_pack_key(msgpack_sbuffer *sb, const sd_worker *w, const uint64_t *toks, size_t start,
                  size_t end, const char *rid, bool any_worker);
size_t sdw_wrapper_pickle(uint8_t *out, const char *name, uint64_t nbytes,
                          const int64_t shape[5]);
/* A STORE / RETRIEVE reply [handle, success] with success true. */
bool sdw_reply_ok(const lmc_client_reply *r);
/* Calls op with args (destroyed); *ok (if set) from sdw_reply_ok.  0, or
 * -1 without a reply. */
int sdw_call(lmc_client *c, int op, msgpack_sbuffer *args, size_t n, bool *ok);
/* Creates the worker's segments (nb blocks, `layers` layers, head size hs;
 * HND or NHD) and registers them with REGISTER_KV_CACHE. */
int sdw_register_worker(sd_worker *w, bool hnd);
void sdw_free_tensors(sd_worker *w);
/* The payload of a STORE, RETRIEVE or RETRIEVE_LAYERWISE of chunks
 * [c0, c0+n) of toks, blocks from `first`. */
void sdw_pack_transfer(msgpack_sbuffer a[5], const sd_worker *w, const uint64_t *toks,
                       size_t c0, size_t n, size_t first, const char *rid);
uint64_t sdw_transfer_send(sd_worker *w, const uint64_t *toks, size_t c0, size_t n,
                           size_t first, const char *rid, bool store);
int sdw_transfer_wait(sd_worker *w);
int sdw_transfer(sd_worker *w, const uint64_t *toks, size_t c0, size_t n, size_t first,
                 const char *rid, bool store);
/* LOOKUP of toks' first `chunks` chunks, then one QUERY_PREFETCH_STATUS. */
int sdw_lookup(sd_worker *w, const uint64_t *toks, size_t chunks, const char *rid);
/* The same, QUERY_PREFETCH_STATUS polled until it answers; *hits its count
 * (-1: not a count). */
int sdw_lookup_wait(sd_worker *w, const uint64_t *toks, size_t chunks, const char *rid,
                    int64_t *hits);
void sdw_fill_tokens(uint64_t *t, size_t n, uint64_t seed);
int sdw_cmp_double(const void *a, const void *b);
int sdw_end_session(sd_worker *w, const char *rid);
size_t sdw_status_get(int http_port, char *body, size_t cap);
double sdw_wait_status(int http_port, bool (*done)(const char *body));
/* For sdw_wait_status: the L1 pre-fault is over (docs/storage.md,
 * "Pre-fault"); every registered engine segment is faulted in
 * (docs/protocol.md). */
bool sdw_l1_prefaulted(const char *body);
bool sdw_engine_mapped(const char *body);

#endif
