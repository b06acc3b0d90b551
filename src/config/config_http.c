/* HTTP frontend rules that need more than a range: the bearer token
 * (docs/http.md, "Authentication"), given once, from the flag, its
 * environment variable or a file.  No message ever shows the token. */
#include "config/config_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Long enough for any generated secret, short enough for one header. */
#define MAX_TOKEN 4096

/* RFC 6750 bearer tokens are visible ASCII; a blank or a control byte
 * could not be sent in the Authorization header as given. */
static bool token_ok(const char *t)
{
    size_t n = strlen(t);
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0x21 || t[i] > 0x7e)
            return false;
    return n > 0 && n <= MAX_TOKEN;
}

/* The file's text, one trailing "\n" or "\r\n" dropped, or "" plus
 * *too_long when it holds more than a token could; NULL with the error
 * written when it cannot be read. */
static char *read_token_file(const char *path, bool *too_long, unsigned *mode,
                             lmc_cfg_err *e)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        lmc_cfg_fail(e, "--http-auth-token-file: cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    *mode = fstat(fileno(f), &st) == 0 ? (unsigned)(st.st_mode & 07777) : 0;
    char *buf = malloc(MAX_TOKEN + 3);
    size_t n = buf ? fread(buf, 1, MAX_TOKEN + 3, f) : 0;
    int why = errno;
    bool unreadable = buf && ferror(f);
    fclose(f);
    if (!buf || unreadable) {
        free(buf);
        lmc_cfg_fail(e, "--http-auth-token-file: cannot read '%s': %s", path,
                     unreadable ? strerror(why) : "out of memory");
        return NULL;
    }
    *too_long = n > MAX_TOKEN + 2;
    if (*too_long)
        n = 0;
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    buf[n] = '\0';
    return buf;
}

static int check_token_file(lmc_config *cfg, lmc_cfg_err *e)
{
    const char *path = cfg->http.auth_token_file;
    if (cfg->http.auth_token)
        return lmc_cfg_fail(e, "--http-auth-token-file: cannot be combined with "
                               "--http-auth-token (or LMCACHE_HTTP_AUTH_TOKEN): give the "
                               "token one way");
    bool too_long;
    unsigned mode;
    char *token = read_token_file(path, &too_long, &mode, e);
    if (!token)
        return -1;
    if (too_long || !token_ok(token)) {
        int rc = lmc_cfg_fail(e, "--http-auth-token-file: '%s' %s", path,
                              *token || too_long ? "must hold one line of at most 4096 visible "
                                                   "ASCII characters (no blanks)"
                                                 : "is empty");
        free(token);
        return rc;
    }
    cfg->http.auth_token = token;
    /* Logged at start, not refused: a Kubernetes Secret is mounted 0644
     * unless its defaultMode says otherwise (docs/http.md). */
    cfg->http.auth_token_file_mode = mode;
    return 0;
}

int lmc_cfg_check_http(lmc_config *cfg, lmc_cfg_err *e)
{
    if (cfg->http.auth_token_file)
        return check_token_file(cfg, e);
    const char *t = cfg->http.auth_token;
    if (t && !*t)
        return lmc_cfg_fail(e, "--http-auth-token (or LMCACHE_HTTP_AUTH_TOKEN): must not be "
                               "empty");
    if (t && !token_ok(t))
        return lmc_cfg_fail(e, "--http-auth-token (or LMCACHE_HTTP_AUTH_TOKEN): must be at "
                               "most 4096 visible ASCII characters (no blanks)");
    /* The coordinator's token goes out in the same header (docs/fleet.md). */
    const char *ct = cfg->coordinator.auth_token;
    if (ct && !token_ok(ct))
        return lmc_cfg_fail(e, "--coordinator-auth-token (or LMCACHE_COORDINATOR_AUTH_TOKEN): "
                               "must be 1 to 4096 visible ASCII characters (no blanks)");
    return 0;
}
