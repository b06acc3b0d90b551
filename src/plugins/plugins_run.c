/* Launching plugins and watching them: one thread polls every plugin's
 * output pipe (stdout and stderr merged), logs it line by line as
 * "[<path>] <line>", reaps exited plugins and logs their status.  At stop
 * it sends SIGTERM to each plugin's process group, SIGKILL after the grace
 * period, and drains what is left.  That thread is the only one that reaps
 * or signals, so a pid is never signalled after it was reaped. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "obs/log.h"
#include "plugins/plugins_internal.h"

#define LINE_MAX_BYTES 4096
#define POLL_MS 100

typedef struct {
    char *path;
    pid_t pid;
    int fd;       /* read end of the output pipe; -1 after EOF */
    bool exited;  /* reaped */
    size_t len;
    char buf[LINE_MAX_BYTES];
} plugin_proc;

struct lmc_plugins {
    plugin_proc *procs;
    size_t n;
    int stop_fd;  /* eventfd: written by lmc_plugins_stop() */
    pthread_t thread;
};

/* ---- spawning ------------------------------------------------------------- */

static int spawn_attrs(posix_spawnattr_t *attr)
{
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    /* The server blocks SIGINT/SIGTERM and ignores SIGPIPE: undo both. */
    const int sigs[] = {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(&dfl, sigs[i]);
    if (posix_spawnattr_init(attr) != 0)
        return -1;
    posix_spawnattr_setsigmask(attr, &none);
    posix_spawnattr_setsigdefault(attr, &dfl);
    posix_spawnattr_setpgroup(attr, 0); /* own group: SIGTERM reaches its children */
    return posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                              POSIX_SPAWN_SETPGROUP);
}

static int spawn_actions(posix_spawn_file_actions_t *fa, int out_fd)
{
    if (posix_spawn_file_actions_init(fa) != 0)
        return -1;
    if (posix_spawn_file_actions_addopen(fa, 0, "/dev/null", O_RDONLY, 0) != 0 ||
        posix_spawn_file_actions_adddup2(fa, out_fd, 1) != 0 ||
        posix_spawn_file_actions_adddup2(fa, out_fd, 2) != 0 ||
        posix_spawn_file_actions_addclosefrom_np(fa, 3) != 0) {
        posix_spawn_file_actions_destroy(fa);
        return -1;
    }
    return 0;
}

/* Starts `interp path`; fills pid and the pipe's read end. */
static int spawn_one(plugin_proc *p, const char *interp, char **env)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0)
        return errno;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t fa;
    int rc = spawn_attrs(&attr) != 0 ? ENOMEM : 0;
    if (rc == 0 && spawn_actions(&fa, pipefd[1]) != 0) {
        posix_spawnattr_destroy(&attr);
        rc = ENOMEM;
    }
    if (rc == 0) {
        char *argv[] = {(char *)interp, p->path, NULL};
        rc = posix_spawnp(&p->pid, interp, &fa, &attr, argv, env);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
    }
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return rc;
    }
    fcntl(pipefd[0], F_SETFL, fcntl(pipefd[0], F_GETFL) | O_NONBLOCK);
    p->fd = pipefd[0];
    return 0;
}

/* Launches one discovered file, or logs why not.  Returns true if started. */
static bool launch(plugin_proc *p, const char *path, char **env)
{
    char interp[4096];
    if (lmc_plugins_interpreter(path, lmc_plugins_env_get(env, "PATH"), interp,
                                sizeof interp) != 0) {
        LMC_ERROR("runtime plugin %s: unsupported file type (want .py or .sh, or a "
                  "shebang naming an executable)", path);
        return false;
    }
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->path = strdup(path);
    if (!p->path)
        return false;
    int rc = spawn_one(p, interp, env);
    if (rc != 0) {
        LMC_ERROR("runtime plugin %s: cannot start %s: %s", path, interp, strerror(rc));
        free(p->path);
        return false;
    }
    LMC_INFO("runtime plugin %s started (pid %d, interpreter %s)", path, (int)p->pid, interp);
    return true;
}

/* ---- output and exit status ----------------------------------------------- */

static void emit_line(plugin_proc *p)
{
    size_t n = p->len;
    if (n > 0 && p->buf[n - 1] == '\r')
        n--;
    LMC_INFO("[%s] %.*s", p->path, (int)n, p->buf);
    p->len = 0;
}

static void take_bytes(plugin_proc *p, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            emit_line(p);
            continue;
        }
        if (p->len == sizeof p->buf)
            emit_line(p); /* an over-long line is logged in pieces */
        p->buf[p->len++] = data[i];
    }
}

static void close_output(plugin_proc *p)
{
    if (p->len > 0)
        emit_line(p);
    close(p->fd);
    p->fd = -1;
}

/* Reads what is available; closes the pipe at EOF or on error. */
static void read_output(plugin_proc *p)
{
    char chunk[4096];
    for (;;) {
        ssize_t r = read(p->fd, chunk, sizeof chunk);
        if (r > 0) {
            take_bytes(p, chunk, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        close_output(p);
        return;
    }
}

static void log_status(const plugin_proc *p, int status, bool stopping)
{
    if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        LMC_LOG(code == 0 ? LMC_LOG_INFO : LMC_LOG_WARNING,
                "runtime plugin %s exited with code %d", p->path, code);
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        bool expected = stopping && (sig == SIGTERM || sig == SIGKILL);
        LMC_LOG(expected ? LMC_LOG_INFO : LMC_LOG_WARNING,
                "runtime plugin %s terminated by signal %d (%s)", p->path, sig, strsignal(sig));
    }
}

/* Reaps exited plugins; returns how many are still running. */
static size_t reap(lmc_plugins *ps, bool stopping)
{
    size_t running = 0;
    for (size_t i = 0; i < ps->n; i++) {
        plugin_proc *p = &ps->procs[i];
        if (p->exited)
            continue;
        int status;
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid || (r < 0 && errno == ECHILD)) {
            p->exited = true;
            if (r == p->pid)
                log_status(p, status, stopping);
        } else {
            running++;
        }
    }
    return running;
}

static void signal_running(lmc_plugins *ps, int sig)
{
    for (size_t i = 0; i < ps->n; i++)
        if (!ps->procs[i].exited)
            kill(-ps->procs[i].pid, sig);
}

/* ---- the watcher thread ----------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for output or the stop request; returns true when stop was asked. */
static bool wait_events(lmc_plugins *ps, struct pollfd *fds, bool stopping)
{
    size_t n = 0;
    fds[n++] = (struct pollfd){.fd = stopping ? -1 : ps->stop_fd, .events = POLLIN};
    for (size_t i = 0; i < ps->n; i++)
        fds[n++] = (struct pollfd){.fd = ps->procs[i].fd, .events = POLLIN};
    if (poll(fds, n, POLL_MS) <= 0)
        return false;
    for (size_t i = 0; i < ps->n; i++)
        if (ps->procs[i].fd >= 0 && fds[i + 1].revents)
            read_output(&ps->procs[i]);
    return !stopping && (fds[0].revents & POLLIN);
}

static bool all_outputs_closed(const lmc_plugins *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        if (ps->procs[i].fd >= 0)
            return false;
    return true;
}

static void drain_outputs(lmc_plugins *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        if (ps->procs[i].fd >= 0) {
            read_output(&ps->procs[i]);
            if (ps->procs[i].fd >= 0) /* a grandchild still holds it open */
                close_output(&ps->procs[i]);
        }
}

static void *watch(void *arg)
{
    lmc_plugins *ps = arg;
    struct pollfd *fds = calloc(ps->n + 1, sizeof *fds);
    bool stopping = false, killed = false;
    int64_t deadline = 0;
    while (fds) {
        if (wait_events(ps, fds, stopping)) {
            stopping = true;
            deadline = now_ms() + LMC_PLUGIN_STOP_GRACE_MS;
            signal_running(ps, SIGTERM);
        }
        size_t running = reap(ps, stopping);
        if (running == 0 && (stopping || all_outputs_closed(ps)))
            break;
        if (stopping && !killed && now_ms() >= deadline) {
            LMC_WARN("runtime plugins: %zu still running after SIGTERM; sending SIGKILL", running);
            signal_running(ps, SIGKILL);
            killed = true;
        }
    }
    drain_outputs(ps);
    free(fds);
    return NULL;
}

/* ---- public ----------------------------------------------------------------- */

static lmc_plugins *launch_all(const lmc_strlist *files, char **env)
{
    lmc_plugins *ps = calloc(1, sizeof *ps);
    if (!ps || !(ps->procs = calloc(files->count ? files->count : 1, sizeof *ps->procs))) {
        free(ps);
        return NULL;
    }
    ps->stop_fd = -1;
    for (size_t i = 0; i < files->count; i++) {
        const char *path = files->items[i];
        if (!lmc_plugins_selected(path, LMC_PLUGIN_WORKER_ID)) {
            LMC_INFO("runtime plugin %s is for another worker; not started", path);
            continue;
        }
        if (launch(&ps->procs[ps->n], path, env))
            ps->n++;
    }
    return ps;
}

static void free_plugins(lmc_plugins *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        if (ps->procs[i].fd >= 0)
            close(ps->procs[i].fd);
        free(ps->procs[i].path);
    }
    if (ps->stop_fd >= 0)
        close(ps->stop_fd);
    free(ps->procs);
    free(ps);
}

/* Starts the watcher; without it the plugins are killed at once. */
static lmc_plugins *start_watcher(lmc_plugins *ps)
{
    ps->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (ps->stop_fd >= 0 && pthread_create(&ps->thread, NULL, watch, ps) == 0)
        return ps;
    LMC_ERROR("runtime plugins: cannot start the output thread; stopping the plugins");
    signal_running(ps, SIGKILL);
    for (size_t i = 0; i < ps->n; i++)
        waitpid(ps->procs[i].pid, NULL, 0);
    free_plugins(ps);
    return NULL;
}

lmc_plugins *lmc_plugins_start(const lmc_config *cfg, char *const envp[])
{
    if (cfg->plugins.locations.count == 0)
        return NULL;
    lmc_strlist files = {0};
    char *json = NULL;
    char **env = NULL;
    lmc_plugins *ps = NULL;
    if (lmc_plugins_discover(&cfg->plugins.locations, &files) == 0 &&
        (json = lmc_plugins_config_json(cfg)) != NULL &&
        (env = lmc_plugins_build_env(envp, json)) != NULL)
        ps = launch_all(&files, env);
    else
        LMC_ERROR("runtime plugins: out of memory; none started");
    LMC_INFO("runtime plugins: %zu found, %zu started", files.count, ps ? ps->n : 0);
    lmc_plugins_free_env(env);
    free(json);
    lmc_plugins_free_list(&files);
    if (ps && ps->n == 0) {
        free_plugins(ps);
        return NULL;
    }
    return ps ? start_watcher(ps) : NULL;
}

size_t lmc_plugins_count(const lmc_plugins *p)
{
    return p ? p->n : 0;
}

void lmc_plugins_stop(lmc_plugins *p)
{
    if (!p)
        return;
    uint64_t one = 1;
    if (write(p->stop_fd, &one, sizeof one) != sizeof one)
        LMC_WARN("runtime plugins: cannot signal the output thread");
    pthread_join(p->thread, NULL);
    free_plugins(p);
}
