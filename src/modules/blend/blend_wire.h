/* The CacheBlend RPCs on the wire (docs/cacheblend.md, "Blend RPCs on the
 * wire"): decoders from a call's payload frames into plain structs, and
 * encoders of the replies.  Nothing here touches server state; the
 * handlers that use these do the semantic checks against it (a known
 * instance, a group count).
 *
 * Each decoder takes the call's payload frames (one msgpack document
 * each, as lmc_rpc_call_arg_raw gives them).  0 on success; -1 with a
 * one-line reason in `err` when the input is refused (the caller logs
 * it); -2 when memory ran out.  On any failure nothing is left to free.
 * On success the struct owns its memory: give it back with the matching
 * free function.  Every count and size read from the wire is bounded by
 * the constants below and computed with core/checked.h. */
#ifndef LMC_MODULES_BLEND_BLEND_WIRE_H
#define LMC_MODULES_BLEND_BLEND_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/shared_tensor.h"
#include "modules/services/ipc_key.h"

#define LMC_BLEND_PROTOCOL_VERSION 1
/* Bounds (docs/cacheblend.md, "Blend RPCs on the wire"). */
#define LMC_BLEND_MAX_ROPE_CACHES 16      /* distinct ropes of one model */
#define LMC_BLEND_MAX_GROUPS 1024         /* engine groups (group_to_cache, group_rot, block tables) */
#define LMC_BLEND_MAX_HEAD_SIZE 65536     /* head_size, elements */
#define LMC_BLEND_MAX_ROW_ELEMS (1u << 20) /* offset + width of a rotation window */
#define LMC_BLEND_MAX_MATCHES 65536       /* CBMatchResults in one retrieve */
#define LMC_BLEND_MAX_BLOCKS (1u << 22)   /* block ids in one retrieve, all groups together */
#define LMC_BLEND_MAX_POSITION ((uint64_t)LMC_KEY_MAX_TOKENS) /* any token position */
#define LMC_BLEND_HASH_BYTES 32           /* a chained chunk hash (SHA-256) */
#define LMC_BLEND_EVENT_BYTES 64          /* a CUDA IPC event handle; b"" on the CPU path */
#define LMC_BLEND_MAX_FRAME_DEPTH 8
#define LMC_BLEND_NO_CACHE UINT32_MAX

/* One payload frame. */
typedef struct {
    const uint8_t *data;
    size_t len;
} lmc_blend_frame;

/* CB_PROTOCOL_HANDSHAKE (33). */
int lmc_blend_decode_handshake(const lmc_blend_frame *f, size_t n, int64_t *client_version,
                               char *err, size_t errlen);
/* True when this server speaks `client_version`; false with the reason. */
bool lmc_blend_handshake_compatible(int64_t client_version, char *err, size_t errlen);
/* [server_version, compatible]: 92 01 c3 or 92 01 c2. */
int lmc_blend_encode_handshake_reply(msgpack_packer *pk, int64_t client_version);

/* CB_REGISTER_ROPE (25). */
typedef struct {
    bool rotate;                    /* false: the wire's [], leave this group alone */
    uint32_t offset, width;         /* elements within a token row */
} lmc_blend_rot;

typedef struct {
    int64_t instance_id;
    uint32_t n_caches;
    lmc_shared_tensor *caches;      /* each 2-D [max_position, rot_dim], rot_dim even */
    uint32_t head_size;
    bool is_neox;
    uint32_t n_group_to_cache;      /* 0: every group uses cache 0 */
    uint32_t *group_to_cache;       /* each < n_caches, or LMC_BLEND_NO_CACHE (-1 on
                                     * the wire: the group is not rotated) */
    uint32_t n_group_rot;           /* 0: legacy inference (head_size dims at 0) */
    lmc_blend_rot *group_rot;
    uint32_t n_frames;              /* 4..6 as sent (older clients send 4) */
} lmc_blend_register_rope;

int lmc_blend_decode_register_rope(const lmc_blend_frame *f, size_t n,
                                   lmc_blend_register_rope *out, char *err, size_t errlen);
void lmc_blend_register_rope_free(lmc_blend_register_rope *r);

/* CB_UNREGISTER_ROPE (26). */
int lmc_blend_decode_unregister_rope(const lmc_blend_frame *f, size_t n, int64_t *instance_id,
                                     char *err, size_t errlen);

/* CB_UNIFIED_LOOKUP (28): the key against chunk size `cs`, and tp_size
 * (accepted and ignored by the server; 0 when the frame is absent). */
typedef struct {
    lmc_ipc_key key;
    int64_t tp_size;
} lmc_blend_unified_lookup;

int lmc_blend_decode_unified_lookup(const lmc_blend_frame *f, size_t n, uint32_t cs,
                                    lmc_blend_unified_lookup *out, char *err, size_t errlen);
void lmc_blend_unified_lookup_free(lmc_blend_unified_lookup *r);

/* CBMatchResult: old_ed - old_st == cur_ed - cur_st == the chunk size. */
typedef struct {
    uint64_t old_st, old_ed, cur_st, cur_ed;
    uint8_t hash[LMC_BLEND_HASH_BYTES];
    bool has_predecessor;           /* false: nil or absent (unknown) */
    uint8_t predecessor[LMC_BLEND_HASH_BYTES];
} lmc_blend_match;

/* CB_RETRIEVE_PRE_COMPUTED (27). */
typedef struct {
    lmc_ipc_key key;                /* has_worker: the caller's rank */
    size_t n_matches;
    lmc_blend_match *matches;
    uint32_t n_groups;              /* block tables, one per engine group */
    uint32_t *group_len;            /* block ids of group g */
    uint32_t **blocks;              /* blocks[g][i], each <= INT32_MAX */
    int64_t instance_id;
    size_t event_len;               /* 0 or LMC_BLEND_EVENT_BYTES */
    uint8_t event[LMC_BLEND_EVENT_BYTES];
} lmc_blend_retrieve;

int lmc_blend_decode_retrieve(const lmc_blend_frame *f, size_t n, uint32_t cs,
                              lmc_blend_retrieve *out, char *err, size_t errlen);
void lmc_blend_retrieve_free(lmc_blend_retrieve *r);

/* Replies.  0, or -1 when the packer failed (memory). */
int lmc_blend_encode_match(msgpack_packer *pk, const lmc_blend_match *m);
/* CBUnifiedLookupResult; segmented_prefix_segments is always sent. */
int lmc_blend_encode_lookup_result(msgpack_packer *pk, uint64_t prefix_coverage_tokens,
                                   const lmc_blend_match *non_prefix, size_t n_non_prefix,
                                   const lmc_blend_match *segmented, size_t n_segmented);
/* [event_handle, scatter_ran]: the handle is LMC_BLEND_EVENT_BYTES, or 0
 * bytes on the CPU path. */
int lmc_blend_encode_retrieve_reply(msgpack_packer *pk, const uint8_t *event, size_t event_len,
                                    bool scatter_ran);

#endif
