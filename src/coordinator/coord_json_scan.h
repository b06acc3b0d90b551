/* A small pull parser over JSON text, for the one body the coordinator
 * must take fast (POST /events, docs/coordinator.md "Cache events"):
 * no document tree, strings unescaped in place (an unescaped string is
 * never longer than its JSON form, and its closing quote is where its NUL
 * goes), so the text must be writable and is consumed.  Strict RFC 8259:
 * UTF-8 checked, no NUL in strings, integers must fit int64, nesting of
 * skipped values at most 64 deep. */
#ifndef LMC_COORDINATOR_COORD_JSON_SCAN_H
#define LMC_COORDINATOR_COORD_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { JS_STRING, JS_NUMBER, JS_OBJECT, JS_ARRAY, JS_TRUE, JS_FALSE, JS_NULL, JS_BAD } js_kind;

typedef struct {
    char *p;
    const char *start, *end;
    size_t str_len;   /* bytes of the last string js_string returned */
    char err[160];    /* the first syntax error */
} js_scanner;

/* text: len bytes, writable, owned by the caller; strings are unescaped
 * into it. */
void js_init(js_scanner *s, char *text, size_t len);

static inline void js_blanks(js_scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* The kind of the next value (blanks skipped); nothing consumed. */
static inline js_kind js_peek(js_scanner *s)
{
    js_blanks(s);
    if (s->p >= s->end)
        return JS_BAD;
    switch (*s->p) {
    case '"': return JS_STRING;
    case '{': return JS_OBJECT;
    case '[': return JS_ARRAY;
    case 't': return JS_TRUE;
    case 'f': return JS_FALSE;
    case 'n': return JS_NULL;
    default: return (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) ? JS_NUMBER : JS_BAD;
    }
}

/* Consumes c (after blanks); false when the next character is not c. */
static inline bool js_take(js_scanner *s, char c)
{
    js_blanks(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* A string value, unescaped, NUL-terminated, its length in s->str_len;
 * NULL (err set) when malformed. */
const char *js_string(js_scanner *s);
/* A number: *is_int when it has no fraction or exponent (and then *i
 * holds it); *d always.  False (err set) when malformed or an integer
 * out of int64. */
bool js_number(js_scanner *s, bool *is_int, int64_t *i, double *d);
/* Skips any value. */
bool js_skip(js_scanner *s);
/* Object iteration: call after '{' was taken.  Returns the next member's
 * key (its length in s->str_len) with ':' consumed, or NULL at '}'
 * (consumed) or on error (err set). */
const char *js_member(js_scanner *s, bool *first);
/* Array iteration: after '[' was taken: true while an element follows
 * (',' consumed), false at ']' (consumed) or on error (err set). */
bool js_element(js_scanner *s, bool *first);
/* True once the whole text was consumed (trailing blanks allowed). */
bool js_at_end(js_scanner *s);
bool js_failed(const js_scanner *s);

#endif
