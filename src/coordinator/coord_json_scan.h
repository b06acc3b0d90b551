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
#include <string.h>

typedef enum { JS_STRING, JS_NUMBER, JS_OBJECT, JS_ARRAY, JS_TRUE, JS_FALSE, JS_NULL, JS_BAD } coordinator_json_kind;

typedef struct {
    char *p;
    const char *start, *end;
    size_t str_len;   /* bytes of the last string coordinator_json_string returned */
    char err[160];    /* the first syntax error */
} coordinator_json_scanner;

/* text: len bytes, writable, owned by the caller; strings are unescaped
 * into it. */
void coordinator_json_init(coordinator_json_scanner *s, char *text, size_t len);

static inline void coordinator_json_blanks(coordinator_json_scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* The kind of the next value (blanks skipped); nothing consumed. */
static inline coordinator_json_kind coordinator_json_peek(coordinator_json_scanner *s)
{
    coordinator_json_blanks(s);
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
static inline bool coordinator_json_take(coordinator_json_scanner *s, char c)
{
    coordinator_json_blanks(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* Records the first error (err) and ends the scan; false. */
bool coordinator_json_fail(coordinator_json_scanner *s, const char *what);
/* The general cases of coordinator_json_string and coordinator_json_number below (escapes, UTF-8,
 * fractions, long integers). */
const char *coordinator_json_string_any(coordinator_json_scanner *s);
bool coordinator_json_number_any(coordinator_json_scanner *s, bool *is_int, int64_t *i, double *d);

/* Where the run of bytes from p that a string may hold as they are
 * (printable ASCII but '"' and '\\') ends.  Eight bytes at a time: the
 * lowest flagged byte of a word is the first such one (the borrow of the
 * subtractions only runs upwards from a true hit). */
static inline const char *coordinator_json_plain_run(const char *p, const char *end)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t w, q, b;
        memcpy(&w, p, 8);
        q = w ^ (ones * '"');
        b = w ^ (ones * '\\');
        uint64_t hit = (w | ((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b)) &
                       highs;
        if (hit)
            return p + (__builtin_ctzll(hit) >> 3);
        p += 8;
    }
#endif
    while (p < end && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x80 && *p != '"' &&
           *p != '\\')
        p++;
    return p;
}

/* A string value, unescaped, NUL-terminated, its length in s->str_len;
 * NULL (err set) when malformed.  A plain string is taken here, inline,
 * its closing quote overwritten by the NUL. */
static inline const char *coordinator_json_string(coordinator_json_scanner *s)
{
    coordinator_json_blanks(s);
    if (s->p < s->end && *s->p == '"') {
        char *from = s->p + 1, *stop = (char *)coordinator_json_plain_run(from, s->end);
        if (stop < s->end && *stop == '"') {
            *stop = '\0';
            s->str_len = (size_t)(stop - from);
            s->p = stop + 1;
            return from;
        }
    }
    return coordinator_json_string_any(s);
}

static inline bool coordinator_json_is_digit(const char *p, const char *end)
{
    return p < end && *p >= '0' && *p <= '9';
}

/* A number: *is_int when it has no fraction or exponent (and then *i
 * holds it); *d always.  False (err set) when malformed or an integer
 * out of int64.  Integers of up to 18 digits are read here, inline. */
static inline bool coordinator_json_number(coordinator_json_scanner *s, bool *is_int, int64_t *i, double *d)
{
    coordinator_json_blanks(s);
    const char *end = s->end, *q = s->p;
    bool neg = q < end && *q == '-';
    q += neg;
    if (coordinator_json_is_digit(q, end) && (*q != '0' || !coordinator_json_is_digit(q + 1, end))) {
        int64_t v = 0;
        const char *first = q;
        while (coordinator_json_is_digit(q, end) && q - first < 18)
            v = v * 10 + (*q++ - '0');
        if (!coordinator_json_is_digit(q, end) && !(q < end && (*q == '.' || *q == 'e' || *q == 'E'))) {
            s->p = (char *)q;
            *is_int = true;
            *i = neg ? -v : v;
            *d = (double)*i;
            return true;
        }
    }
    return coordinator_json_number_any(s, is_int, i, d);
}

/* Skips any value. */
bool coordinator_json_skip(coordinator_json_scanner *s);
/* Object iteration: call after '{' was taken.  Returns the next member's
 * key (its length in s->str_len) with ':' consumed, or NULL at '}'
 * (consumed) or on error (err set). */
static inline const char *coordinator_json_member(coordinator_json_scanner *s, bool *first)
{
    if (coordinator_json_take(s, '}'))
        return NULL;
    if (!*first && !coordinator_json_take(s, ','))
        return coordinator_json_fail(s, "',' or '}' expected"), NULL;
    *first = false;
    const char *key = coordinator_json_string(s);
    if (key && !coordinator_json_take(s, ':'))
        return coordinator_json_fail(s, "':' expected"), NULL;
    return key;
}

/* Array iteration: after '[' was taken: true while an element follows
 * (',' consumed), false at ']' (consumed) or on error (err set). */
static inline bool coordinator_json_element(coordinator_json_scanner *s, bool *first)
{
    if (coordinator_json_take(s, ']'))
        return false;
    if (!*first && !coordinator_json_take(s, ','))
        return coordinator_json_fail(s, "',' or ']' expected");
    *first = false;
    return s->err[0] == '\0';
}

/* True once the whole text was consumed (trailing blanks allowed). */
bool coordinator_json_at_end(coordinator_json_scanner *s);
bool coordinator_json_failed(const coordinator_json_scanner *s);

#endif
