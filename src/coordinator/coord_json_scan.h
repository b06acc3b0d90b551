/* A small pull parser over JSON text, for the one body the coordinator
 * must take fast (POST /events, docs/coordinator.md "Cache events"):
 * no document tree, strings unescaped into one arena the size of the
 * text.  Strict RFC 8259: UTF-8 checked, no NUL in strings, integers must
 * fit int64, nesting of skipped values at most 64 deep. */
#ifndef LMC_COORDINATOR_COORD_JSON_SCAN_H
#define LMC_COORDINATOR_COORD_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { JS_STRING, JS_NUMBER, JS_OBJECT, JS_ARRAY, JS_TRUE, JS_FALSE, JS_NULL, JS_BAD } js_kind;

typedef struct {
    const char *p, *start, *end;
    char *arena;      /* strings land here, NUL-terminated */
    size_t arena_used, arena_cap;
    char err[160];    /* the first syntax error */
} js_scanner;

/* arena: at least len + 1 bytes, owned by the caller. */
void js_init(js_scanner *s, const char *text, size_t len, char *arena, size_t arena_cap);
/* The kind of the next value (blanks skipped); nothing consumed. */
js_kind js_peek(js_scanner *s);
/* Consumes c (after blanks); false when the next character is not c. */
bool js_take(js_scanner *s, char c);
/* A string value, unescaped; NULL (err set) when malformed. */
const char *js_string(js_scanner *s);
/* A number: *is_int when it has no fraction or exponent (and then *i
 * holds it); *d always.  False (err set) when malformed or an integer
 * out of int64. */
bool js_number(js_scanner *s, bool *is_int, int64_t *i, double *d);
/* Skips any value. */
bool js_skip(js_scanner *s);
/* Object iteration: call after '{' was taken.  Returns the next member's
 * key with ':' consumed, or NULL at '}' (consumed) or on error (err set). */
const char *js_member(js_scanner *s, bool *first);
/* Array iteration: after '[' was taken: true while an element follows
 * (',' consumed), false at ']' (consumed) or on error (err set). */
bool js_element(js_scanner *s, bool *first);
/* True once the whole text was consumed (trailing blanks allowed). */
bool js_at_end(js_scanner *s);
bool js_failed(const js_scanner *s);

#endif
