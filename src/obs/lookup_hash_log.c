/* Lookup hash log: JSON lines with size/age rotation (lookup_hash_log.h). */
#include "obs/lookup_hash_log.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "obs/events.h"
#include "obs/json_dump.h"
#include "obs/log.h"

struct lmc_lookup_hash_log {
    char *dir;
    double interval;
    int64_t max_size;
    int max_files;
    FILE *f;            /* NULL until the first line */
    double opened_at;   /* event time of the file's first line */
    int64_t size;
    unsigned seq;
    bool error_logged;
};

static int make_dirs(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

lmc_lookup_hash_log *lmc_lookup_hash_log_open(const lmc_lookup_hash_log_options *o, char *err,
                                              size_t errlen)
{
    if (!o->dir || !*o->dir || o->rotation_interval <= 0 || o->max_size <= 0 ||
        o->max_files < 1) {
        snprintf(err, errlen, "lookup hash log: invalid options");
        return NULL;
    }
    if (make_dirs(o->dir) != 0) {
        snprintf(err, errlen, "lookup hash log: cannot create %s: %s", o->dir, strerror(errno));
        return NULL;
    }
    lmc_lookup_hash_log *log = calloc(1, sizeof *log);
    if (!log || !(log->dir = strdup(o->dir))) {
        free(log);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    log->interval = o->rotation_interval;
    log->max_size = o->max_size;
    log->max_files = o->max_files;
    return log;
}

static int is_log_file(const struct dirent *e)
{
    size_t n = strlen(e->d_name), np = strlen(LMC_LOOKUP_HASH_LOG_PREFIX),
           ns = strlen(LMC_LOOKUP_HASH_LOG_SUFFIX);
    return n > np + ns && strncmp(e->d_name, LMC_LOOKUP_HASH_LOG_PREFIX, np) == 0 &&
           strcmp(e->d_name + n - ns, LMC_LOOKUP_HASH_LOG_SUFFIX) == 0;
}

/* Deletes the oldest files (names sort by creation) beyond max_files. */
static void prune(lmc_lookup_hash_log *log)
{
    struct dirent **names;
    int n = scandir(log->dir, &names, is_log_file, alphasort);
    if (n < 0)
        return;
    for (int i = 0; i < n; i++) {
        if (i < n - log->max_files) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", log->dir, names[i]->d_name);
            if (unlink(path) != 0)
                LMC_WARN("lookup hash log: cannot delete %s: %s", path, strerror(errno));
        }
        free(names[i]);
    }
    free(names);
}

static int start_file(lmc_lookup_hash_log *log, double now)
{
    if (log->f)
        fclose(log->f);
    time_t secs = (time_t)now;
    struct tm tm;
    gmtime_r(&secs, &tm);
    char stamp[32], path[4096];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    long usec = (long)((now - (double)secs) * 1e6);
    snprintf(path, sizeof path, "%s/%s%s.%06ld_%06u%s", log->dir, LMC_LOOKUP_HASH_LOG_PREFIX,
             stamp, usec < 0 ? 0 : usec % 1000000, ++log->seq, LMC_LOOKUP_HASH_LOG_SUFFIX);
    log->f = fopen(path, "w");
    log->size = 0;
    log->opened_at = now;
    log->error_logged = false;
    if (!log->f) {
        LMC_WARN("lookup hash log: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    prune(log);
    return 0;
}

static char *format_line(const lmc_event *ev)
{
    const json_t *m = ev->metadata;
    json_t *hashes = json_object_get(m, "chunk_hashes");
    hashes = json_is_array(hashes) ? json_incref(hashes) : json_array();
    json_t *line = json_pack(
        "{s:f, s:s, s:s, s:s, s:s, s:I, s:I, s:o}", "timestamp", ev->timestamp, "session_id",
        ev->session_id, "request_id", lmc_event_str(m, "request_id"), "model_name",
        lmc_event_str(m, "model_name"), "cache_salt", lmc_event_str(m, "cache_salt"),
        "requested_chunks", (json_int_t)lmc_event_num(m, "requested_chunks"), "hit_chunks",
        (json_int_t)lmc_event_num(m, "hit_chunks"), "hashes",
        hashes);
    char *text = line ? lmc_json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    return text;
}

int lmc_lookup_hash_log_write(lmc_lookup_hash_log *log, const lmc_event *ev)
{
    bool due = !log->f || log->size >= log->max_size ||
               ev->timestamp - log->opened_at >= log->interval;
    if (due && start_file(log, ev->timestamp) != 0)
        return -1;
    char *text = format_line(ev);
    if (!text)
        return -1;
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, log->f) == n && fputc('\n', log->f) != EOF &&
              fflush(log->f) == 0;
    free(text);
    if (!ok && !log->error_logged) {
        LMC_WARN("lookup hash log: write failed: %s", strerror(errno));
        log->error_logged = true;
    }
    log->size += (int64_t)n + 1;
    return ok ? 0 : -1;
}

static void on_lookup_end(const lmc_event *ev, void *user)
{
    lmc_lookup_hash_log_write(user, ev);
}

int lmc_lookup_hash_log_attach(lmc_lookup_hash_log *log, lmc_event_bus *bus)
{
    return lmc_event_bus_subscribe(bus, LMC_EVENT_LOOKUP_END, on_lookup_end, log);
}

void lmc_lookup_hash_log_close(lmc_lookup_hash_log *log)
{
    if (!log)
        return;
    if (log->f)
        fclose(log->f);
    free(log->dir);
    free(log);
}
