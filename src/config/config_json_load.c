/* Loading the JSON text of a flag, telling "out of memory" from "bad JSON".
 *
 * jansson does not always say which it was: a failed allocation in its
 * lexer or parser can come back as a syntax error near some token, or as an
 * error with no text at all (docs/testing.md, "Allocation-failure testing").
 * An operator told that valid JSON is invalid goes looking for a typo that
 * is not there, so when jansson fails on text that is well-formed JSON by
 * the check below (which allocates nothing), the failure is memory. */
#include "config/config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* jansson's JSON_PARSER_MAX_DEPTH. */
#define MAX_DEPTH 2048

static const unsigned char *skip_ws(const unsigned char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static int hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* One UTF-8 sequence at p (first byte >= 0x80), as jansson accepts it: no
 * overlong forms, no surrogates, nothing above U+10FFFF.  Its length, or 0. */
static size_t utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    size_t n = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    uint32_t v = n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    if (n == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)))
        return 0;
    if (n == 4 && (v < 0x10000 || v > 0x10FFFF))
        return 0;
    return n;
}

/* A string at *pp (on its opening quote); moves past the closing quote. */
static bool string_ok(const unsigned char **pp, size_t flags)
{
    const unsigned char *p = *pp + 1;
    for (;;) {
        unsigned c = *p;
        if (c == '"')
            break;
        if (c < 0x20) /* a control character, or the end of the text */
            return false;
        if (c >= 0x80) {
            size_t n = utf8_len(p);
            if (!n)
                return false;
            p += n;
            continue;
        }
        p++;
        if (c != '\\')
            continue;
        c = *p++;
        if (c != 'u') {
            if (!c || !strchr("\"\\/bfnrt", (int)c))
                return false;
            continue;
        }
        int v = hex4(p);
        if (v < 0 || (v == 0 && !(flags & JSON_ALLOW_NUL)) || (v >= 0xDC00 && v <= 0xDFFF))
            return false;
        p += 4;
        if (v >= 0xD800 && v <= 0xDBFF) { /* needs its low surrogate */
            int lo = p[0] == '\\' && p[1] == 'u' ? hex4(p + 2) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return false;
            p += 6;
        }
    }
    *pp = p + 1;
    return true;
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static bool is_alpha(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at *pp. */
static bool number_ok(const unsigned char **pp)
{
    const unsigned char *p = *pp;
    p += *p == '-';
    if (*p == '0') {
        p++;
        if (is_digit(*p))
            return false;
    } else if (is_digit(*p)) {
        while (is_digit(*p))
            p++;
    } else {
        return false;
    }
    if (*p == '.') {
        if (!is_digit(*++p))
            return false;
        while (is_digit(*p))
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        p += *p == '+' || *p == '-';
        if (!is_digit(*p))
            return false;
        while (is_digit(*p))
            p++;
    }
    *pp = p;
    return true;
}

/* true, false or null, as a whole word (jansson reads letters up to the
 * first non-letter and then compares the word). */
static bool literal_ok(const unsigned char **pp)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (strncmp((const char *)*pp, words[i], n) == 0 && !is_alpha((*pp)[n])) {
            *pp += n;
            return true;
        }
    }
    return false;
}

bool lmc_cfg_json_syntax_ok(const char *text, size_t flags)
{
    unsigned char is_object[MAX_DEPTH + 1]; /* per open container */
    size_t depth = 0;
    const unsigned char *p = skip_ws((const unsigned char *)text);
    if (!(flags & JSON_DECODE_ANY) && *p != '{' && *p != '[')
        return false;
    for (;;) {
        /* A value at p. */
        p = skip_ws(p);
        if (*p == '{' || *p == '[') {
            if (depth == MAX_DEPTH)
                return false;
            bool obj = *p == '{';
            is_object[depth++] = obj;
            p = skip_ws(p + 1);
            if (*p == (obj ? '}' : ']')) {
                p++;
                depth--;
            } else if (obj) {
                if (*p != '"' || !string_ok(&p, flags))
                    return false;
                p = skip_ws(p);
                if (*p++ != ':')
                    return false;
                continue;
            } else {
                continue;
            }
        } else if (*p == '"') {
            if (!string_ok(&p, flags))
                return false;
        } else if (*p == '-' || is_digit(*p)) {
            if (!number_ok(&p))
                return false;
        } else if (!literal_ok(&p)) {
            return false;
        }
        /* After a complete value: close containers, or go on to the next. */
        for (;;) {
            p = skip_ws(p);
            if (depth == 0)
                return *p == '\0';
            bool obj = is_object[depth - 1];
            if (*p == (obj ? '}' : ']')) {
                p++;
                depth--;
                continue;
            }
            if (*p++ != ',')
                return false;
            if (obj) {
                p = skip_ws(p);
                if (*p != '"' || !string_ok(&p, flags))
                    return false;
                p = skip_ws(p);
                if (*p++ != ':')
                    return false;
            }
            break;
        }
    }
}

json_t *lmc_cfg_json_load(const char *text, size_t flags, bool *oom, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *v = json_loads(text, flags, &jerr);
    *oom = false;
    if (v)
        return v;
    enum json_error_code code = json_error_code(&jerr);
    /* These are only ever reported for what the text says. */
    bool text_fault = code == json_error_duplicate_key || code == json_error_numeric_overflow ||
                      code == json_error_null_character || code == json_error_invalid_utf8 ||
                      code == json_error_null_byte_in_key || code == json_error_stack_overflow;
    *oom = code == json_error_out_of_memory ||
           (!text_fault && lmc_cfg_json_syntax_ok(text, flags));
    snprintf(why, whylen, "%s", *oom ? "out of memory" : jerr.text[0] ? jerr.text : "bad JSON");
    return NULL;
}
