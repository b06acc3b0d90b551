/* A whitelisting reader for the small pickles a client sends as msgpack
 * ext type 1: a tensor wrapper object whose state is a dict of tuples,
 * ints, bytes, strings and torch dtypes (docs/protocol.md, "Shared tensor
 * handles").
 *
 * A pickle is a program for a stack machine that can call anything it
 * names.  This reader never calls anything: it runs only the opcodes that
 * build data (the subset protocol 2-5 pickles of such objects use), turns
 * the one object construction they contain (a class global, NEWOBJ with no
 * arguments, BUILD with a state dict) into a plain node, and refuses every
 * global the caller's whitelist does not name, every other opcode (REDUCE,
 * INST, OBJ, EXT*, PERSID, ...), every length past the end of the input or
 * of its FRAME, a truncated input, and inputs larger than the limits below.
 * Strings and bytes point into the input, which must outlive the result. */
#ifndef LMC_RPC_PICKLE_H
#define LMC_RPC_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMC_PICKLE_MAX_BYTES (1u << 20)   /* a wrapper pickle is ~0.5 KiB */
#define LMC_PICKLE_MAX_NODES 4096
#define LMC_PICKLE_MAX_STACK 256
#define LMC_PICKLE_MAX_ITEMS 256         /* per tuple or dict */

typedef enum lmc_pv_kind {
    LMC_PV_NONE,
    LMC_PV_BOOL,
    LMC_PV_INT,      /* i: any int that fits int64 */
    LMC_PV_BYTES,    /* data, len */
    LMC_PV_STR,      /* data, len: UTF-8 as pickled, not NUL-terminated */
    LMC_PV_TUPLE,    /* items[0..n) */
    LMC_PV_DICT,     /* items[2k] = key, items[2k+1] = value, in pickled order */
    LMC_PV_GLOBAL,   /* data, len = module; name, name_len = attribute */
    LMC_PV_OBJECT,   /* cls (a GLOBAL the whitelist lets be instantiated),
                      * state (a DICT, or NULL before BUILD) */
} lmc_pv_kind;

typedef struct lmc_pv lmc_pv;
struct lmc_pv {
    lmc_pv_kind kind;
    int64_t i;
    const uint8_t *data;
    size_t len;
    const uint8_t *name;
    size_t name_len;
    lmc_pv **items;
    uint32_t n, cap;
    const lmc_pv *cls;
    lmc_pv *state;
};

/* Which globals may appear: true to allow module.name at all; *instantiable
 * says whether NEWOBJ may make an object of it (a class), or it may only be
 * referred to (a value such as torch.float16). */
typedef bool (*lmc_pickle_allow_fn)(const uint8_t *module, size_t module_len,
                                    const uint8_t *name, size_t name_len, bool *instantiable);

typedef struct lmc_pickle lmc_pickle;

/* Reads one pickle; NULL with a one-line reason in `err` when it is refused
 * or memory ran out (*oom tells which; may be NULL). */
lmc_pickle *lmc_pickle_read(const uint8_t *data, size_t len, lmc_pickle_allow_fn allow,
                            char *err, size_t errlen, bool *oom);
/* The value STOP returned. */
const lmc_pv *lmc_pickle_root(const lmc_pickle *p);
void lmc_pickle_free(lmc_pickle *p);

/* Lookups on the tree (NULL when absent or of another kind). */
const lmc_pv *lmc_pv_dict_get(const lmc_pv *dict, const char *key);
bool lmc_pv_str_eq(const lmc_pv *v, const char *s);

#endif
