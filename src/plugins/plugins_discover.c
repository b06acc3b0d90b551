/* Plugin discovery, the worker-id name filter and the interpreter choice
 * (docs/plugins.md, "Which files run").  Pure functions of the file
 * system and their arguments. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "obs/log.h"
#include "plugins/plugins.h"

#define MAX_SCAN_DEPTH 32

static int list_push(lmc_strlist *list, const char *path)
{
    char **items = realloc(list->items, (list->count + 1) * sizeof *items);
    if (!items)
        return -1;
    list->items = items;
    items[list->count] = strdup(path);
    if (!items[list->count])
        return -1;
    list->count++;
    return 0;
}

void lmc_plugins_free_list(lmc_strlist *list)
{
    for (size_t i = 0; i < list->count; i++)
        free(list->items[i]);
    free(list->items);
    list->items = NULL;
    list->count = 0;
}

static const char *extension(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    return dot && dot != base ? dot : "";
}

static bool is_plugin_name(const char *name)
{
    const char *ext = extension(name);
    return strcmp(ext, ".py") == 0 || strcmp(ext, ".sh") == 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of `dir` except "." and "..", sorted. */
static int read_sorted(const char *dir, lmc_strlist *names)
{
    DIR *d = opendir(dir);
    if (!d) {
        LMC_WARN("runtime plugins: cannot read directory %s: %s", dir, strerror(errno));
        return 0;
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            rc = list_push(names, e->d_name);
    closedir(d);
    if (names->count > 1)
        qsort(names->items, names->count, sizeof names->items[0], cmp_names);
    return rc;
}

static int scan_dir(const char *dir, int depth, lmc_strlist *out)
{
    if (depth > MAX_SCAN_DEPTH) {
        LMC_WARN("runtime plugins: %s is nested too deeply; not scanned", dir);
        return 0;
    }
    lmc_strlist names = {0};
    int rc = read_sorted(dir, &names);
    for (size_t i = 0; rc == 0 && i < names.count; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, names.items[i]) >= (int)sizeof path)
            continue;
        struct stat st;
        if (lstat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            rc = scan_dir(path, depth + 1, out);
        else if (is_plugin_name(names.items[i]) && stat(path, &st) == 0 && S_ISREG(st.st_mode))
            rc = list_push(out, path);
    }
    lmc_plugins_free_list(&names);
    return rc;
}

int lmc_plugins_discover(const lmc_strlist *locations, lmc_strlist *out)
{
    for (size_t i = 0; i < locations->count; i++) {
        const char *loc = locations->items[i];
        struct stat st;
        if (stat(loc, &st) != 0) {
            LMC_WARN("runtime plugin location %s does not exist; skipped", loc);
            continue;
        }
        int rc = S_ISDIR(st.st_mode) ? scan_dir(loc, 0, out) : list_push(out, loc);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- worker-id filter ---------------------------------------------------- */

static bool all_digits(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return false;
    return true;
}

/* Value of the all-digit field s[0..n), or -1 when it does not fit an int. */
static long field_value(const char *s, size_t n)
{
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        v = v * 10 + (s[i] - '0');
        if (v > 1000000000L)
            return -1;
    }
    return v;
}

bool lmc_plugins_selected(const char *path, int worker_id)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t stem_len = strlen(base) - strlen(extension(base));
    /* parts: [0, u1), [u1+1, u2), [u2+1, ...) -- needs two '_' in the stem */
    const char *u1 = memchr(base, '_', stem_len);
    if (!u1)
        return true;
    const char *second = u1 + 1;
    const char *u2 = memchr(second, '_', stem_len - (size_t)(second - base));
    if (!u2)
        return true;
    size_t n = (size_t)(u2 - second);
    if (!all_digits(second, n))  /* digits have no case: lowercasing is moot */
        return true;
    return field_value(second, n) == worker_id;
}

/* ---- interpreter ---------------------------------------------------------- */

static bool is_executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Like shutil.which(name): a name with '/' is checked as a path, otherwise
 * each PATH directory is tried. */
static bool which(const char *name, const char *path_env, char *out, size_t cap)
{
    if (name[0] == '\0')
        return false;
    if (strchr(name, '/')) {
        if (!is_executable_file(name))
            return false;
        return snprintf(out, cap, "%s", name) < (int)cap;
    }
    for (const char *p = path_env ? path_env : ""; *p;) {
        size_t n = strcspn(p, ":");
        char cand[4096];
        int w = snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? p : ".", name);
        if (w < (int)sizeof cand && is_executable_file(cand))
            return snprintf(out, cap, "%s", cand) < (int)cap;
        p += n + (p[n] == ':');
    }
    return false;
}

/* The text after "#!" on the first line, trimmed; "" when there is none. */
static void read_shebang(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    if (fgets(line, sizeof line, f) && strncmp(line, "#!", 2) == 0) {
        char *s = line + 2;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strcspn(s, "\r\n");
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        snprintf(out, cap, "%.*s", (int)n, s);
    }
    fclose(f);
}

int lmc_plugins_interpreter(const char *path, const char *path_env, char *out, size_t cap)
{
    char shebang[1024];
    read_shebang(path, shebang, sizeof shebang);
    if (shebang[0] && which(shebang, path_env, out, cap))
        return 0;
    const char *ext = extension(path);
    const char *fallback = strcmp(ext, ".py") == 0 ? "python3"
                           : strcmp(ext, ".sh") == 0 ? "bash"
                                                     : NULL;
    if (!fallback)
        return -1;
    snprintf(out, cap, "%s", fallback);
    return 0;
}
