/* JSON pull parser (coord_json_scan.h). */
#include "coordinator/coord_json_scan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

void coordinator_json_init(coordinator_json_scanner *s, char *text, size_t len)
{
    memset(s, 0, sizeof *s);
    s->p = text;
    s->start = text;
    s->end = text + len;
}

bool coordinator_json_fail(coordinator_json_scanner *s, const char *what)
{
    if (!s->err[0])
        snprintf(s->err, sizeof s->err, "malformed JSON at byte %zu: %s",
                 (size_t)(s->p - s->start), what);
    s->p = (char *)s->end;
    return false;
}

bool coordinator_json_failed(const coordinator_json_scanner *s)
{
    return s->err[0] != '\0';
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

static void put_utf8(char **o, uint32_t cp)
{
    char *q = *o;
    if (cp < 0x80) {
        *q++ = (char)cp;
    } else if (cp < 0x800) {
        *q++ = (char)(0xc0 | cp >> 6);
        *q++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *q++ = (char)(0xe0 | cp >> 12);
        *q++ = (char)(0x80 | (cp >> 6 & 0x3f));
        *q++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *q++ = (char)(0xf0 | cp >> 18);
        *q++ = (char)(0x80 | (cp >> 12 & 0x3f));
        *q++ = (char)(0x80 | (cp >> 6 & 0x3f));
        *q++ = (char)(0x80 | (cp & 0x3f));
    }
    *o = q;
}

/* Length of the UTF-8 sequence at p (< end), or 0 when invalid. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
             : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || (size_t)(end - p) < n)
        return 0;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* One escape after '\\' at s->p into *o. */
static bool escape(coordinator_json_scanner *s, char **o)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *hit = s->p < s->end ? strchr(from, *s->p) : NULL;
    if (hit && *s->p) {
        *(*o)++ = to[hit - from];
        s->p++;
        return true;
    }
    if (s->end - s->p < 5 || *s->p != 'u')
        return coordinator_json_fail(s, "bad escape");
    int cp = hex4(s->p + 1);
    s->p += 5;
    if (cp < 0)
        return coordinator_json_fail(s, "bad \\u escape");
    uint32_t code = (uint32_t)cp;
    if (cp >= 0xd800 && cp <= 0xdbff) {
        int lo = s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' ? hex4(s->p + 2) : -1;
        if (lo < 0xdc00 || lo > 0xdfff)
            return coordinator_json_fail(s, "lone surrogate");
        code = 0x10000 + (((uint32_t)cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
        s->p += 6;
    } else if ((cp >= 0xdc00 && cp <= 0xdfff) || cp == 0) {
        return coordinator_json_fail(s, cp ? "lone surrogate" : "NUL in a string");
    }
    put_utf8(o, code);
    return true;
}

const char *coordinator_json_string_any(coordinator_json_scanner *s)
{
    if (!coordinator_json_take(s, '"'))
        return coordinator_json_fail(s, "a string expected"), NULL;
    char *out = s->p, *o = out; /* o never passes s->p: unescaping only shrinks */
    for (;;) {
        char *run = s->p;
        s->p = (char *)coordinator_json_plain_run(run, s->end);
        if (o != run)
            memmove(o, run, (size_t)(s->p - run));
        o += s->p - run;
        if (s->p >= s->end)
            return coordinator_json_fail(s, "unterminated string"), NULL;
        unsigned char c = (unsigned char)*s->p;
        if (c == '"')
            break;
        if (c < 0x20)
            return coordinator_json_fail(s, "a control character in a string"), NULL;
        if (c == '\\') {
            s->p++;
            if (!escape(s, &o))
                return NULL;
            continue;
        }
        size_t n = utf8_len((const unsigned char *)s->p, (const unsigned char *)s->end);
        if (!n)
            return coordinator_json_fail(s, "invalid UTF-8"), NULL;
        memmove(o, s->p, n);
        o += n;
        s->p += n;
    }
    s->p++;     /* the closing quote, now behind us, */
    *o = '\0';  /* is where the NUL may go */
    s->str_len = (size_t)(o - out);
    return out;
}

static bool digits(coordinator_json_scanner *s)
{
    const char *from = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > from;
}

bool coordinator_json_number_any(coordinator_json_scanner *s, bool *is_int, int64_t *i, double *d)
{
    coordinator_json_blanks(s);
    const char *from = s->p;
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p < s->end && *s->p == '0')
        s->p++;
    else if (!digits(s))
        return coordinator_json_fail(s, "bad number");
    *is_int = true;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        *is_int = false;
        if (!digits(s))
            return coordinator_json_fail(s, "bad number");
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        *is_int = false;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (!digits(s))
            return coordinator_json_fail(s, "bad number");
    }
    size_t n = (size_t)(s->p - from);
    if (*is_int && n <= 18) { /* fits int64 whatever the digits: no strtoll */
        bool neg = *from == '-';
        int64_t v = 0;
        for (const char *q = from + neg; q < s->p; q++)
            v = v * 10 + (*q - '0');
        *i = neg ? -v : v;
        *d = (double)*i;
        return true;
    }
    if (*is_int && n > 20) /* JSON has no leading zeros: past 19 digits it cannot fit */
        return coordinator_json_fail(s, "integer out of range");
    /* A real may be long (0.000...1 is valid JSON); one past the stack
     * buffer is rare enough to go to the heap. */
    char buf[64], *text = n < sizeof buf ? buf : malloc(n + 1);
    if (!text)
        return coordinator_json_fail(s, "out of memory");
    memcpy(text, from, n);
    text[n] = '\0';
    errno = 0;
    bool ok = true;
    if (*is_int) {
        long long v = strtoll(text, NULL, 10);
        ok = errno != ERANGE || coordinator_json_fail(s, "integer out of range");
        *i = v;
        *d = (double)v;
    } else {
        *d = strtod(text, NULL);
        ok = !(errno == ERANGE && (*d > 1 || *d < -1)) || coordinator_json_fail(s, "real number overflow");
    }
    if (text != buf)
        free(text);
    return ok;
}

static bool word(coordinator_json_scanner *s, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
        return coordinator_json_fail(s, "bad literal");
    s->p += n;
    return true;
}

static bool skip_depth(coordinator_json_scanner *s, int depth)
{
    if (depth > MAX_DEPTH)
        return coordinator_json_fail(s, "nested too deep");
    bool first = true, is_int;
    int64_t i;
    double d;
    switch (coordinator_json_peek(s)) {
    case JS_STRING: return coordinator_json_string(s) != NULL;
    case JS_NUMBER: return coordinator_json_number(s, &is_int, &i, &d);
    case JS_TRUE: return word(s, "true");
    case JS_FALSE: return word(s, "false");
    case JS_NULL: return word(s, "null");
    case JS_OBJECT:
        s->p++;
        while (coordinator_json_member(s, &first))
            if (!skip_depth(s, depth + 1))
                return false;
        return !coordinator_json_failed(s);
    case JS_ARRAY:
        s->p++;
        while (coordinator_json_element(s, &first))
            if (!skip_depth(s, depth + 1))
                return false;
        return !coordinator_json_failed(s);
    default: return coordinator_json_fail(s, "a value expected");
    }
}

bool coordinator_json_skip(coordinator_json_scanner *s)
{
    return skip_depth(s, 0);
}

bool coordinator_json_at_end(coordinator_json_scanner *s)
{
    coordinator_json_blanks(s);
    return s->p == s->end;
}
