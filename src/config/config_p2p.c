/* Validation of the native RDMA ("verbs") P2P transfer engine flags.  They
 * are only meaningful, and only checked, with --p2p-transfer-engine verbs. */
#include "config/config_internal.h"

#include <ctype.h>
#include <limits.h>
#include <string.h>

#define MAX_DEVICES 64
#define MAX_ITEM 128

typedef struct {
    char item[MAX_DEVICES][MAX_ITEM];
    size_t count;
} csv_list;

/* Splits "a, b,c" into trimmed items; empty items are kept (as "") so the
 * caller can reject them.  Returns false if there are too many or too long. */
static bool split_csv(const char *text, csv_list *out)
{
    out->count = 0;
    for (const char *p = text;; p++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && isspace((unsigned char)*p))
            p++, len--;
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        if (out->count == MAX_DEVICES || len >= MAX_ITEM)
            return false;
        memcpy(out->item[out->count], p, len);
        out->item[out->count++][len] = '\0';
        if (!end)
            return true;
        p = end;
    }
}

static int check_devices(const char *text, csv_list *dev, lmc_cfg_err *e)
{
    if (!*text)
        return lmc_cfg_fail(e, "--p2p-rdma-device: required with --p2p-transfer-engine verbs");
    if (!split_csv(text, dev))
        return lmc_cfg_fail(e, "--p2p-rdma-device: too many or too long names in '%s'", text);
    for (size_t i = 0; i < dev->count; i++) {
        if (!dev->item[i][0])
            return lmc_cfg_fail(e, "--p2p-rdma-device: empty device name in '%s'", text);
        for (size_t j = 0; j < i; j++)
            if (strcmp(dev->item[i], dev->item[j]) == 0)
                return lmc_cfg_fail(e, "--p2p-rdma-device: duplicate device '%s' in '%s'",
                                    dev->item[i], text);
    }
    return 0;
}

static int check_gid_indices(const char *text, size_t devices, lmc_cfg_err *e)
{
    csv_list gids;
    if (!*text)
        return 0; /* unset: every device uses --p2p-rdma-gid-index */
    if (!split_csv(text, &gids))
        return lmc_cfg_fail(e, "--p2p-rdma-gid-indices: too many entries in '%s'", text);
    for (size_t i = 0; i < gids.count; i++) {
        int64_t v;
        if (!lmc_cfg_parse_i64(gids.item[i], &v) || v < -1 || v > 255)
            return lmc_cfg_fail(e, "--p2p-rdma-gid-indices: each entry must be an integer in "
                                   "-1..255, got '%s' in '%s'", gids.item[i], text);
    }
    if (gids.count != devices)
        return lmc_cfg_fail(e, "--p2p-rdma-gid-indices: need one entry per device (%zu), got "
                               "%zu in '%s'", devices, gids.count, text);
    return 0;
}

int lmc_cfg_check_verbs(const lmc_config *cfg, lmc_cfg_err *e)
{
    const lmc_p2p_config *p = &cfg->p2p;
    if (strcmp(p->transfer_engine, "verbs") != 0)
        return 0;
    csv_list dev;
    if (check_devices(p->rdma_device, &dev, e) != 0)
        return -1;
    if (p->rdma_port < 1 || p->rdma_port > 255)
        return lmc_cfg_fail(e, "--p2p-rdma-port: must be in 1..255, got %d", p->rdma_port);
    if (p->rdma_gid_index < -1 || p->rdma_gid_index > 255)
        return lmc_cfg_fail(e, "--p2p-rdma-gid-index: must be in -1..255, got %d",
                            p->rdma_gid_index);
    if (check_gid_indices(p->rdma_gid_indices, dev.count, e) != 0)
        return -1;
    if (p->rdma_queue_depth < 1 || p->rdma_queue_depth > (int64_t)UINT32_MAX)
        return lmc_cfg_fail(e, "--p2p-rdma-queue-depth: must be in 1..4294967295, got %lld",
                            (long long)p->rdma_queue_depth);
    if (p->rdma_handshake_timeout_ms < 1 || p->rdma_handshake_timeout_ms > INT_MAX)
        return lmc_cfg_fail(e, "--p2p-rdma-handshake-timeout-ms: must be in 1..%d, got %lld",
                            INT_MAX, (long long)p->rdma_handshake_timeout_ms);
    return 0;
}
