#include "rpc/pickle.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 16   /* tuples and dicts inside each other */

struct lmc_pickle {
    lmc_pv *nodes;
    size_t n_nodes, cap_nodes;
    const lmc_pv *root;
};

typedef struct {
    lmc_pickle *p;
    const uint8_t *start, *cur, *end;
    const uint8_t *frame_end;    /* NULL outside a FRAME */
    lmc_pv *stack[LMC_PICKLE_MAX_STACK];
    size_t sp;
    size_t marks[LMC_PICKLE_MAX_STACK];
    size_t n_marks;
    lmc_pv **memo;               /* LMC_PICKLE_MAX_NODES slots */
    size_t memo_count;
    lmc_pickle_allow_fn allow;
    char *err;
    size_t errlen;
    bool oom;
} vm;

static int refuse(vm *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(vm *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, m->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int out_of_memory(vm *m)
{
    m->oom = true;
    return refuse(m, "out of memory reading the pickle");
}

/* ---- input -------------------------------------------------------------- */

/* The next n bytes, which must lie inside the input and inside the current
 * FRAME; NULL (and the reason) otherwise. */
static const uint8_t *take(vm *m, uint64_t n)
{
    const uint8_t *limit = m->frame_end ? m->frame_end : m->end;
    if (n > (uint64_t)(limit - m->cur)) {
        refuse(m, m->frame_end ? "a length runs past the end of its frame"
                               : "truncated: a length runs past the end of the pickle");
        return NULL;
    }
    const uint8_t *at = m->cur;
    m->cur += n;
    if (m->frame_end && m->cur == m->frame_end)
        m->frame_end = NULL;
    return at;
}

static bool take_le(vm *m, size_t width, uint64_t *out)
{
    const uint8_t *b = take(m, width);
    if (!b)
        return false;
    uint64_t v = 0;
    for (size_t i = width; i-- > 0;)
        v = v << 8 | b[i];
    *out = v;
    return true;
}

/* ---- nodes and the stack ------------------------------------------------ */

static lmc_pv *new_node(vm *m, lmc_pv_kind kind)
{
    lmc_pickle *p = m->p;
    if (p->n_nodes == p->cap_nodes) {
        refuse(m, "more than %d values", LMC_PICKLE_MAX_NODES);
        return NULL;
    }
    lmc_pv *v = &p->nodes[p->n_nodes++];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    return v;
}

static int push(vm *m, lmc_pv *v)
{
    if (!v)
        return -1;
    if (m->sp == LMC_PICKLE_MAX_STACK)
        return refuse(m, "the stack grows past %d values", LMC_PICKLE_MAX_STACK);
    m->stack[m->sp++] = v;
    return 0;
}

static lmc_pv *pop(vm *m)
{
    size_t floor = m->n_marks ? m->marks[m->n_marks - 1] : 0;
    if (m->sp == floor) {
        refuse(m, "stack underflow");
        return NULL;
    }
    return m->stack[--m->sp];
}

static lmc_pv *top(vm *m)
{
    size_t floor = m->n_marks ? m->marks[m->n_marks - 1] : 0;
    if (m->sp == floor) {
        refuse(m, "stack underflow");
        return NULL;
    }
    return m->stack[m->sp - 1];
}

/* Pops the values above the last MARK and the MARK itself; *first, *n. */
static int pop_mark(vm *m, size_t *first, size_t *n)
{
    if (m->n_marks == 0)
        return refuse(m, "no MARK to pop to");
    *first = m->marks[--m->n_marks];
    *n = m->sp - *first;
    m->sp = *first;
    return 0;
}

static uint32_t depth_of(const lmc_pv *v)
{
    return v->kind == LMC_PV_TUPLE || v->kind == LMC_PV_DICT ? (uint32_t)v->i : 0;
}

/* Appends to a tuple's or dict's items (its `i` keeps the nesting depth). */
static int add_item(vm *m, lmc_pv *c, lmc_pv *item)
{
    if (c->n == LMC_PICKLE_MAX_ITEMS)
        return refuse(m, "a tuple or dict has more than %d items", LMC_PICKLE_MAX_ITEMS);
    if (depth_of(item) + 1 > MAX_DEPTH)
        return refuse(m, "values nest deeper than %d", MAX_DEPTH);
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 8;
        lmc_pv **grown = realloc(c->items, cap * sizeof *grown);
        if (!grown)
            return out_of_memory(m);
        c->items = grown;
        c->cap = cap;
    }
    c->items[c->n++] = item;
    if (depth_of(item) + 1 > (uint32_t)c->i)
        c->i = depth_of(item) + 1;
    return 0;
}

/* ---- opcodes ------------------------------------------------------------ */

static int op_int(vm *m, size_t width, bool is_signed)
{
    uint64_t u;
    if (!take_le(m, width, &u))
        return -1;
    lmc_pv *v = new_node(m, LMC_PV_INT);
    if (v)
        v->i = is_signed && width == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
    return push(m, v);
}

/* LONG1 / LONG4: little-endian two's complement; only what fits int64. */
static int op_long(vm *m, size_t len_width)
{
    uint64_t n;
    if (!take_le(m, len_width, &n))
        return -1;
    if (n > 8)
        return refuse(m, "an integer of %llu bytes is too large", (unsigned long long)n);
    const uint8_t *b = take(m, n);
    if (!b)
        return -1;
    uint64_t u = 0;
    for (size_t i = n; i-- > 0;)
        u = u << 8 | b[i];
    if (n > 0 && n < 8 && (b[n - 1] & 0x80))
        u |= ~UINT64_C(0) << (8 * n);   /* sign-extend */
    lmc_pv *v = new_node(m, LMC_PV_INT);
    if (v)
        v->i = (int64_t)u;
    return push(m, v);
}

static int op_blob(vm *m, size_t len_width, lmc_pv_kind kind)
{
    uint64_t n;
    if (!take_le(m, len_width, &n))
        return -1;
    const uint8_t *b = take(m, n);
    if (!b)
        return -1;
    lmc_pv *v = new_node(m, kind);
    if (v) {
        v->data = b;
        v->len = (size_t)n;
    }
    return push(m, v);
}

static int push_global(vm *m, const uint8_t *mod, size_t mod_len, const uint8_t *name,
                       size_t name_len)
{
    bool instantiable = false;
    if (!m->allow(mod, mod_len, name, name_len, &instantiable))
        return refuse(m, "global %.*s.%.*s is not allowed", (int)(mod_len > 80 ? 80 : mod_len),
                      (const char *)mod, (int)(name_len > 80 ? 80 : name_len),
                      (const char *)name);
    lmc_pv *v = new_node(m, LMC_PV_GLOBAL);
    if (v) {
        v->data = mod;
        v->len = mod_len;
        v->name = name;
        v->name_len = name_len;
        v->i = instantiable;
    }
    return push(m, v);
}

static int op_stack_global(vm *m)
{
    lmc_pv *name = pop(m), *mod = name ? pop(m) : NULL;
    if (!mod)
        return -1;
    if (mod->kind != LMC_PV_STR || name->kind != LMC_PV_STR)
        return refuse(m, "STACK_GLOBAL needs two strings");
    return push_global(m, mod->data, mod->len, name->data, name->len);
}

/* GLOBAL: "module\nname\n" inline. */
static int op_global(vm *m)
{
    const uint8_t *limit = m->frame_end ? m->frame_end : m->end;
    const uint8_t *parts[2];
    size_t lens[2];
    for (int k = 0; k < 2; k++) {
        const uint8_t *nl = memchr(m->cur, '\n', (size_t)(limit - m->cur));
        if (!nl)
            return refuse(m, "truncated GLOBAL");
        parts[k] = m->cur;
        lens[k] = (size_t)(nl - m->cur);
        if (!take(m, lens[k] + 1))
            return -1;
    }
    return push_global(m, parts[0], lens[0], parts[1], lens[1]);
}

static int op_tuple(vm *m, size_t first, size_t n)
{
    lmc_pv *t = new_node(m, LMC_PV_TUPLE);
    if (!t)
        return -1;
    t->i = 1;
    for (size_t k = 0; k < n; k++)
        if (add_item(m, t, m->stack[first + k]) != 0)
            return -1;
    return push(m, t);
}

static int op_tuple_n(vm *m, size_t n)
{
    size_t floor = m->n_marks ? m->marks[m->n_marks - 1] : 0;
    if (m->sp - floor < n)
        return refuse(m, "stack underflow");
    m->sp -= n;
    return op_tuple(m, m->sp, n);
}

static int set_items(vm *m, lmc_pv *dict, lmc_pv **pairs, size_t n)
{
    if (!dict || dict->kind != LMC_PV_DICT)
        return refuse(m, "SETITEM(S) on something that is not a dict");
    if (n % 2)
        return refuse(m, "SETITEMS with an odd number of values");
    for (size_t k = 0; k < n; k += 2) {
        if (pairs[k]->kind != LMC_PV_STR)
            return refuse(m, "dict keys must be strings");
        if (add_item(m, dict, pairs[k]) != 0 || add_item(m, dict, pairs[k + 1]) != 0)
            return -1;
    }
    return 0;
}

static int op_setitems(vm *m)
{
    size_t first = 0, n = 0;
    if (pop_mark(m, &first, &n) != 0)
        return -1;
    lmc_pv *dict = top(m);
    return dict ? set_items(m, dict, &m->stack[first], n) : -1;
}

static int op_setitem(vm *m)
{
    lmc_pv *pair[2];
    pair[1] = pop(m);
    pair[0] = pair[1] ? pop(m) : NULL;
    lmc_pv *dict = pair[0] ? top(m) : NULL;
    return dict ? set_items(m, dict, pair, 2) : -1;
}

/* NEWOBJ: cls.__new__(cls) of a whitelisted class, with no arguments. */
static int op_newobj(vm *m)
{
    lmc_pv *args = pop(m), *cls = args ? pop(m) : NULL;
    if (!cls)
        return -1;
    if (cls->kind != LMC_PV_GLOBAL || !cls->i)
        return refuse(m, "NEWOBJ of something that is not an allowed class");
    if (args->kind != LMC_PV_TUPLE || args->n != 0)
        return refuse(m, "NEWOBJ with arguments");
    lmc_pv *o = new_node(m, LMC_PV_OBJECT);
    if (o)
        o->cls = cls;
    return push(m, o);
}

/* BUILD: the object's state, a dict, set once. */
static int op_build(vm *m)
{
    lmc_pv *state = pop(m), *obj = state ? top(m) : NULL;
    if (!obj)
        return -1;
    if (obj->kind != LMC_PV_OBJECT || obj->state)
        return refuse(m, "BUILD on something that is not a fresh object");
    if (state->kind != LMC_PV_DICT)
        return refuse(m, "BUILD with a state that is not a dict");
    obj->state = state;
    return 0;
}

static int memo_put(vm *m, uint64_t index)
{
    lmc_pv *v = top(m);
    if (!v)
        return -1;
    if (index >= LMC_PICKLE_MAX_NODES)
        return refuse(m, "memo index %llu out of range", (unsigned long long)index);
    if (!m->memo[index])
        m->memo_count++;
    m->memo[index] = v;
    return 0;
}

/* A memoized dict or object fetched again could be put inside itself;
 * the wrappers never share them, so only values that cannot change are. */
static int memo_get(vm *m, uint64_t index)
{
    lmc_pv *v = index < LMC_PICKLE_MAX_NODES ? m->memo[index] : NULL;
    if (!v)
        return refuse(m, "memo index %llu was never set", (unsigned long long)index);
    if (v->kind == LMC_PV_DICT || v->kind == LMC_PV_OBJECT)
        return refuse(m, "a dict or object referred to twice");
    return push(m, v);
}

static int memo_op(vm *m, uint8_t op)
{
    uint64_t index;
    switch (op) {
    case 0x94: return memo_put(m, m->memo_count);               /* MEMOIZE */
    case 'q': return take_le(m, 1, &index) ? memo_put(m, index) : -1;   /* BINPUT */
    case 'r': return take_le(m, 4, &index) ? memo_put(m, index) : -1;   /* LONG_BINPUT */
    case 'h': return take_le(m, 1, &index) ? memo_get(m, index) : -1;   /* BINGET */
    default: return take_le(m, 4, &index) ? memo_get(m, index) : -1;    /* LONG_BINGET */
    }
}

static int op_frame(vm *m)
{
    uint64_t n;
    if (!take_le(m, 8, &n))
        return -1;
    if (n > (uint64_t)(m->end - m->cur))
        return refuse(m, "a FRAME of %llu bytes runs past the end of the pickle",
                      (unsigned long long)n);
    m->frame_end = n ? m->cur + n : NULL;
    return 0;
}

static int op_mark(vm *m)
{
    if (m->n_marks == LMC_PICKLE_MAX_STACK)
        return refuse(m, "too many MARKs");
    m->marks[m->n_marks++] = m->sp;
    return 0;
}

static int op_proto(vm *m)
{
    uint64_t version;
    if (!take_le(m, 1, &version))
        return -1;
    return version >= 2 && version <= 5
               ? 0
               : refuse(m, "pickle protocol %llu is not 2..5", (unsigned long long)version);
}

/* One opcode; 1 at STOP, 0 to go on, -1 refused. */
static int step(vm *m)
{
    const uint8_t *at = take(m, 1);
    if (!at)
        return -1;
    uint8_t op = *at;
    size_t first = 0, n = 0;
    switch (op) {
    case 0x80: return op_proto(m);
    case 0x95: return op_frame(m);
    case '.': return 1;                                         /* STOP */
    case '(': return op_mark(m);
    case 'N': return push(m, new_node(m, LMC_PV_NONE));
    case 0x88: case 0x89: {                                     /* NEWTRUE, NEWFALSE */
        lmc_pv *v = new_node(m, LMC_PV_BOOL);
        if (v)
            v->i = op == 0x88;
        return push(m, v);
    }
    case 'K': return op_int(m, 1, false);                       /* BININT1 */
    case 'M': return op_int(m, 2, false);                       /* BININT2 */
    case 'J': return op_int(m, 4, true);                        /* BININT */
    case 0x8a: return op_long(m, 1);                            /* LONG1 */
    case 0x8b: return op_long(m, 4);                            /* LONG4 */
    case 0x8c: return op_blob(m, 1, LMC_PV_STR);                /* SHORT_BINUNICODE */
    case 'X': return op_blob(m, 4, LMC_PV_STR);                 /* BINUNICODE */
    case 0x8d: return op_blob(m, 8, LMC_PV_STR);                /* BINUNICODE8 */
    case 'C': return op_blob(m, 1, LMC_PV_BYTES);               /* SHORT_BINBYTES */
    case 'B': return op_blob(m, 4, LMC_PV_BYTES);               /* BINBYTES */
    case 0x8e: return op_blob(m, 8, LMC_PV_BYTES);              /* BINBYTES8 */
    case ')': return op_tuple(m, m->sp, 0);                     /* EMPTY_TUPLE */
    case 't': return pop_mark(m, &first, &n) ? -1 : op_tuple(m, first, n);
    case 0x85: case 0x86: case 0x87: return op_tuple_n(m, (size_t)(op - 0x84));
    case '}': return push(m, new_node(m, LMC_PV_DICT));         /* EMPTY_DICT */
    case 's': return op_setitem(m);
    case 'u': return op_setitems(m);
    case 0x93: return op_stack_global(m);
    case 'c': return op_global(m);
    case 0x81: return op_newobj(m);
    case 'b': return op_build(m);
    case 0x94: case 'q': case 'r': case 'h': case 'j': return memo_op(m, op);
    default:
        return refuse(m, "opcode 0x%02x at byte %zu is not allowed", op,
                      (size_t)(at - m->start));
    }
}

static int run(vm *m)
{
    for (;;) {
        int rc = step(m);
        if (rc < 0)
            return -1;
        if (rc == 0)
            continue;
        if (m->cur != m->end)
            return refuse(m, "%zu bytes after STOP", (size_t)(m->end - m->cur));
        if (m->sp != 1 || m->n_marks != 0)
            return refuse(m, "STOP with %zu values on the stack", m->sp);
        m->p->root = m->stack[0];
        return 0;
    }
}

lmc_pickle *lmc_pickle_read(const uint8_t *data, size_t len, lmc_pickle_allow_fn allow,
                            char *err, size_t errlen, bool *oom)
{
    vm m = {.start = data, .cur = data, .end = data + len, .allow = allow, .err = err,
            .errlen = errlen};
    if (oom)
        *oom = false;
    if (!data || len == 0) {
        refuse(&m, "empty pickle");
        return NULL;
    }
    if (len > LMC_PICKLE_MAX_BYTES) {
        refuse(&m, "a pickle of %zu bytes is larger than %u", len, LMC_PICKLE_MAX_BYTES);
        return NULL;
    }
    m.p = calloc(1, sizeof *m.p);
    size_t cap = len + 1 < LMC_PICKLE_MAX_NODES ? len + 1 : LMC_PICKLE_MAX_NODES;
    m.memo = calloc(LMC_PICKLE_MAX_NODES, sizeof *m.memo);
    if (m.p)
        m.p->nodes = malloc(cap * sizeof *m.p->nodes);
    if (!m.p || !m.memo || !m.p->nodes) {
        out_of_memory(&m);
    } else {
        m.p->cap_nodes = cap;
        if (run(&m) == 0) {
            free(m.memo);
            return m.p;
        }
    }
    if (oom)
        *oom = m.oom;
    free(m.memo);
    lmc_pickle_free(m.p);
    return NULL;
}

const lmc_pv *lmc_pickle_root(const lmc_pickle *p)
{
    return p->root;
}

void lmc_pickle_free(lmc_pickle *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->nodes && i < p->n_nodes; i++)
        free(p->nodes[i].items);
    free(p->nodes);
    free(p);
}

bool lmc_pv_str_eq(const lmc_pv *v, const char *s)
{
    size_t n = strlen(s);
    return v && v->kind == LMC_PV_STR && v->len == n && memcmp(v->data, s, n) == 0;
}

const lmc_pv *lmc_pv_dict_get(const lmc_pv *dict, const char *key)
{
    if (!dict || dict->kind != LMC_PV_DICT)
        return NULL;
    const lmc_pv *found = NULL;   /* a repeated key: the last one wins, as in Python */
    for (uint32_t k = 0; k + 1 < dict->n; k += 2)
        if (lmc_pv_str_eq(dict->items[k], key))
            found = dict->items[k + 1];
    return found;
}
