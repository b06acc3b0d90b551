/* The fault-injecting allocator and the driver of alloc_fault.h
 * (docs/testing.md, "Allocation-failure testing"). */
#include "alloc_fault.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The linker binds these to the C library's functions (--wrap). */
void *__real_malloc(size_t n);
void *__real_calloc(size_t count, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t count, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t max);
json_t *__real_json_loads(const char *input, size_t flags, json_error_t *error);
json_t *__real_json_loadb(const char *buffer, size_t len, size_t flags, json_error_t *error);
json_t *__wrap_json_loads(const char *input, size_t flags, json_error_t *error);
json_t *__wrap_json_loadb(const char *buffer, size_t len, size_t flags, json_error_t *error);

/* ---- arming -------------------------------------------------------------- */

static atomic_bool g_armed;
static atomic_long g_fail_at;    /* <= 0: count only */
static atomic_bool g_persistent;
static atomic_long g_count;
static atomic_bool g_fired;
static _Atomic(const void *) g_fired_at; /* caller of the allocation made to fail */
/* Its stack, for reports: the failing call may be deep inside a library. */
enum { STACK_MAX = 24 };
static void *g_fired_stack[STACK_MAX];
static int g_fired_depth;

void lmc_fault_arm(long n, bool persistent)
{
    atomic_store(&g_armed, false);
    atomic_store(&g_fail_at, n);
    atomic_store(&g_persistent, persistent);
    atomic_store(&g_count, 0);
    atomic_store(&g_fired, false);
    atomic_store(&g_fired_at, NULL);
    atomic_store(&g_armed, true);
}

void lmc_fault_disarm(void)
{
    atomic_store(&g_armed, false);
}

bool lmc_fault_fired(void)
{
    return atomic_load(&g_fired);
}

long lmc_fault_count(void)
{
    return atomic_load(&g_count);
}

/* Per thread: > 0 while allocations are neither counted nor failed. */
static _Thread_local int t_paused;

void lmc_fault_pause(void)
{
    t_paused++;
}

void lmc_fault_resume(void)
{
    if (t_paused > 0)
        t_paused--;
}

/* Counts one allocation call; true when it is to fail.  *ordinal gets its
 * number in the current count (0 when nothing is armed), which leak reports
 * print so a leaked block can be matched with the run that made it. */
static bool next_fails(long *ordinal, const void *caller)
{
    *ordinal = 0;
    if (t_paused || !atomic_load_explicit(&g_armed, memory_order_acquire))
        return false;
    long c = atomic_fetch_add(&g_count, 1) + 1;
    long at = atomic_load(&g_fail_at);
    *ordinal = c;
    if (at <= 0 || c < at || (c > at && !atomic_load(&g_persistent)))
        return false;
    if (!atomic_exchange(&g_fired, true)) {
        g_fired_depth = backtrace(g_fired_stack, STACK_MAX);
        atomic_store(&g_fired_at, caller);
    }
    return true;
}

/* ---- the set of live blocks ---------------------------------------------- */

/* Open addressing, linear probing, backward-shift deletion.  Pointers are
 * stored XORed with a constant: LeakSanitizer would otherwise find every
 * leaked block still referenced from this table and stay silent, and its
 * report at exit (with the allocation stack) is the best clue to a leak
 * the driver found. */
#define PTR_MASK ((uintptr_t)0xa5a5a5a5a5a5a5a5ull)

typedef struct {
    uintptr_t key;        /* masked pointer; 0 = empty slot */
    size_t size;
    long seq;             /* order among all tracked allocations */
    long ordinal;         /* number in the count it was made under, or 0 */
    const void *caller;
} block;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static block *g_tab;
static size_t g_cap, g_used;
static long g_seq;        /* guarded by g_mu */

static size_t slot_of(uintptr_t key, size_t cap)
{
    uint64_t h = (uint64_t)key;
    h ^= h >> 29;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
    return (size_t)h & (cap - 1);
}

static size_t find_locked(uintptr_t key)
{
    size_t i = slot_of(key, g_cap);
    while (g_tab[i].key && g_tab[i].key != key)
        i = (i + 1) & (g_cap - 1);
    return i;
}

static bool grow_locked(void)
{
    size_t cap = g_cap ? 2 * g_cap : 1024;
    block *tab = __real_calloc(cap, sizeof *tab);
    if (!tab)
        return false;
    for (size_t i = 0; i < g_cap; i++) {
        if (!g_tab[i].key)
            continue;
        size_t j = slot_of(g_tab[i].key, cap);
        while (tab[j].key)
            j = (j + 1) & (cap - 1);
        tab[j] = g_tab[i];
    }
    __real_free(g_tab);
    g_tab = tab;
    g_cap = cap;
    return true;
}

/* Records a block.  If the table cannot grow, the block goes untracked: a
 * missed leak is better than failing an allocation nobody armed. */
static void track(void *p, size_t size, long seq, long ordinal, const void *caller)
{
    uintptr_t key = (uintptr_t)p ^ PTR_MASK;
    pthread_mutex_lock(&g_mu);
    if ((g_used + 1) * 2 > g_cap && !grow_locked()) {
        pthread_mutex_unlock(&g_mu);
        return;
    }
    size_t i = find_locked(key);
    if (!g_tab[i].key)
        g_used++;
    g_tab[i] = (block){key, size, seq ? seq : ++g_seq, ordinal, caller};
    pthread_mutex_unlock(&g_mu);
}

/* Removes p; false (and *out untouched) when p is not ours. */
static bool untrack(void *p, block *out)
{
    uintptr_t key = (uintptr_t)p ^ PTR_MASK;
    bool found = false;
    pthread_mutex_lock(&g_mu);
    if (g_cap) {
        size_t i = find_locked(key);
        if (g_tab[i].key) {
            found = true;
            if (out)
                *out = g_tab[i];
            g_used--;
            /* Backward shift: pull later members of the probe run into the
             * hole unless that would move them before their home slot. */
            size_t hole = i, j = i;
            for (;;) {
                j = (j + 1) & (g_cap - 1);
                if (!g_tab[j].key)
                    break;
                size_t home = slot_of(g_tab[j].key, g_cap);
                bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
                if (movable) {
                    g_tab[hole] = g_tab[j];
                    hole = j;
                }
            }
            g_tab[hole].key = 0;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

long lmc_fault_live_blocks(void)
{
    pthread_mutex_lock(&g_mu);
    long n = (long)g_used;
    pthread_mutex_unlock(&g_mu);
    return n;
}

static long current_seq(void)
{
    pthread_mutex_lock(&g_mu);
    long s = g_seq;
    pthread_mutex_unlock(&g_mu);
    return s;
}

/* Blocks allocated after `mark` and still live: count, bytes, and the
 * first `max` of them (lowest ordinal first is not promised). */
static long collect_since(long mark, size_t *bytes, block *first, size_t max)
{
    long n = 0;
    *bytes = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_cap; i++) {
        if (!g_tab[i].key || g_tab[i].seq <= mark)
            continue;
        if ((size_t)n < max)
            first[n] = g_tab[i];
        n++;
        *bytes += g_tab[i].size;
    }
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* ---- the wrappers -------------------------------------------------------- */

static void *alloc_common(size_t n, bool zero, const void *caller)
{
    long ordinal;
    if (next_fails(&ordinal, caller)) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = zero ? __real_calloc(1, n) : __real_malloc(n);
    if (p)
        track(p, n, 0, ordinal, caller);
    return p;
}

void *__wrap_malloc(size_t n)
{
    return alloc_common(n, false, __builtin_return_address(0));
}

void *__wrap_calloc(size_t count, size_t n)
{
    if (n && count > SIZE_MAX / n) {
        long ordinal; /* still an allocation call: counted, maybe the one to fail */
        (void)next_fails(&ordinal, __builtin_return_address(0));
        errno = ENOMEM;
        return NULL;
    }
    return alloc_common(count * n, true, __builtin_return_address(0));
}

void *__wrap_realloc(void *p, size_t n)
{
    const void *caller = __builtin_return_address(0);
    if (!p)
        return alloc_common(n, false, caller);
    block old = {0};
    if (n == 0) { /* glibc frees here: not an allocation */
        untrack(p, NULL);
        return __real_realloc(p, 0);
    }
    long ordinal;
    if (next_fails(&ordinal, caller)) {
        errno = ENOMEM;
        return NULL;
    }
    /* Untracked before the call: once realloc has freed p, another thread
     * may get the address back and track it as its own. */
    bool mine = untrack(p, &old);
    void *q = __real_realloc(p, n);
    if (!q) {
        if (mine)
            track(p, old.size, old.seq, old.ordinal, old.caller);
        return NULL;
    }
    /* A grown block keeps its age: a fixture made before a run and grown
     * during it is not that run's leak.  Library memory stays untracked. */
    if (mine)
        track(q, n, old.seq, old.ordinal, old.caller);
    return q;
}

void __wrap_free(void *p)
{
    if (!p)
        return;
    untrack(p, NULL);
    __real_free(p);
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = alloc_common(n, false, __builtin_return_address(0));
    if (p)
        memcpy(p, s, n);
    return p;
}

char *__wrap_strndup(const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    char *p = alloc_common(n + 1, false, __builtin_return_address(0));
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static void *json_alloc(size_t n)
{
    return alloc_common(n, false, __builtin_return_address(0));
}

static void json_release(void *p)
{
    __wrap_free(p);
}

/* jansson's loader is one failure point per call, failing as a whole with
 * an out-of-memory error, and nothing fails inside it: its lexer drops a
 * byte when its token buffer cannot grow and parses on, so a failure there
 * yields a wrong document or a made-up syntax error (docs/testing.md).
 * That tests jansson, not the code that calls it.  LMC_ALLOC_FAULT_JANSSON=
 * internal fails the loader's own allocations instead. */
static bool loader_atomic(void)
{
    const char *v = getenv("LMC_ALLOC_FAULT_JANSSON");
    return !v || strcmp(v, "internal") != 0;
}

static bool loader_fails(json_error_t *error, const void *caller)
{
    long ordinal;
    if (!next_fails(&ordinal, caller))
        return false;
    if (error) {
        memset(error, 0, sizeof *error);
        error->line = error->column = -1;
        snprintf(error->source, sizeof error->source, "<string>");
        snprintf(error->text, sizeof error->text, "out of memory");
        /* Where json_error_code() reads the code (jansson.h). */
        error->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
    }
    return true;
}

json_t *__wrap_json_loads(const char *input, size_t flags, json_error_t *error)
{
    if (!loader_atomic())
        return __real_json_loads(input, flags, error);
    if (loader_fails(error, __builtin_return_address(0)))
        return NULL;
    lmc_fault_pause();
    json_t *v = __real_json_loads(input, flags, error);
    lmc_fault_resume();
    return v;
}

json_t *__wrap_json_loadb(const char *buffer, size_t len, size_t flags, json_error_t *error)
{
    if (!loader_atomic())
        return __real_json_loadb(buffer, len, flags, error);
    if (loader_fails(error, __builtin_return_address(0)))
        return NULL;
    lmc_fault_pause();
    json_t *v = __real_json_loadb(buffer, len, flags, error);
    lmc_fault_resume();
    return v;
}

/* Before main, so that no JSON value of the process was made by the plain
 * allocator: jansson would then free it with ours, which is harmless, but a
 * value made before the switch could not be counted. */
__attribute__((constructor)) static void route_jansson(void)
{
    json_set_alloc_funcs(json_alloc, json_release);
    /* backtrace() loads its unwinder on first use, allocating: not in a run. */
    void *frames[2];
    (void)backtrace(frames, 2);
}

/* ---- crash context ------------------------------------------------------- */

/* A crash (a signal, or a sanitizer report) says which failure point it
 * happened at, preformatted because the handlers may only write(). */
static char g_where[384];
static volatile sig_atomic_t g_in_run;

static void say_where(void)
{
    if (g_in_run) {
        g_in_run = 0; /* once, also when a sanitizer death leads to SIGABRT */
        ssize_t w = write(STDERR_FILENO, g_where, strlen(g_where));
        (void)w;
    }
}

void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* The sanitizer reports SEGV & co itself (then dies through the callback);
 * a handler of ours would replace its report. */
static const int fatal_signals[] = {SIGABRT};
#else
static const int fatal_signals[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#endif
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction g_prev[N_FATAL];
static bool g_hooks_on; /* a scenario's cmocka assertion skips hooks_remove() */

/* Prints the context, then hands the signal to whoever had it before
 * (cmocka turns it into a failed test and goes on with the next one). */
static void on_fatal(int sig, siginfo_t *info, void *uctx)
{
    say_where();
    for (size_t i = 0; i < N_FATAL; i++) {
        if (fatal_signals[i] != sig)
            continue;
        sigaction(sig, &g_prev[i], NULL);
        if (g_prev[i].sa_flags & SA_SIGINFO) {
            g_prev[i].sa_sigaction(sig, info, uctx);
        } else if (g_prev[i].sa_handler != SIG_DFL && g_prev[i].sa_handler != SIG_IGN) {
            g_prev[i].sa_handler(sig);
        } else {
            raise(sig);
        }
        return;
    }
}

static void hooks_install(void)
{
    if (g_hooks_on)
        return;
    g_hooks_on = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++)
        sigaction(fatal_signals[i], &sa, &g_prev[i]);
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(say_where);
}

static void hooks_remove(void)
{
    g_hooks_on = false;
    for (size_t i = 0; i < N_FATAL; i++)
        sigaction(fatal_signals[i], &g_prev[i], NULL);
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(NULL);
}

/* ---- the driver ---------------------------------------------------------- */

static char g_reason[512];

int lmc_fault_violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_reason, sizeof g_reason, fmt, ap);
    va_end(ap);
    return LMC_FAULT_VIOLATION;
}

typedef struct {
    long runs, injected, errors, absorbed, problems;
} run_stats;

enum { MAX_PROBLEM_LINES = 20, MAX_LEAKS_SHOWN = 4 };

/* LMC_ALLOC_FAULT_VERBOSE=1: every problem line, not the first 20. */
static bool verbose(void)
{
    const char *v = getenv("LMC_ALLOC_FAULT_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static const char *mode_name(long n, bool persistent)
{
    return n <= 0 ? "no failure" : persistent ? "persistent" : "transient";
}

/* "fn+0x12 (module+0x3456)": enough for addr2line -f -e module 0x3456. */
static void describe_caller(const void *caller, char *out, size_t len)
{
    Dl_info di;
    if (!caller || !dladdr(caller, &di) || !di.dli_fname) {
        snprintf(out, len, "%p", caller);
        return;
    }
    const char *mod = strrchr(di.dli_fname, '/');
    mod = mod ? mod + 1 : di.dli_fname;
    uintptr_t off = (uintptr_t)caller - (uintptr_t)di.dli_fbase;
    if (di.dli_sname)
        snprintf(out, len, "%s+0x%lx (%s+0x%lx)", di.dli_sname,
                 (unsigned long)((uintptr_t)caller - (uintptr_t)di.dli_saddr), mod,
                 (unsigned long)off);
    else
        snprintf(out, len, "%s+0x%lx", mod, (unsigned long)off);
}

/* ", in f+0x.. (module+0x..) <- g+0x.. <- ..." for the allocation that
 * failed (its caller and a few frames above), or "". */
static void fired_site(long n, char *out, size_t len)
{
    enum { FRAMES_SHOWN = 4 };
    const void *site = atomic_load(&g_fired_at);
    out[0] = '\0';
    if (n <= 0 || !site)
        return;
    int from = 0;
    while (from < g_fired_depth && g_fired_stack[from] != site)
        from++;
    if (from == g_fired_depth) { /* no stack: the caller alone */
        g_fired_stack[0] = (void *)site;
        from = 0;
        g_fired_depth = 1;
    }
    size_t used = (size_t)snprintf(out, len, ", in ");
    for (int i = from; i < g_fired_depth && i < from + FRAMES_SHOWN && used < len; i++) {
        char where[256];
        describe_caller(g_fired_stack[i], where, sizeof where);
        used += (size_t)snprintf(out + used, len - used, "%s%s", i > from ? " <- " : "", where);
    }
}

static void report(const lmc_fault_spec *s, long n, bool persistent, run_stats *st,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void report(const lmc_fault_spec *s, long n, bool persistent, run_stats *st,
                   const char *fmt, ...)
{
    if (st->problems++ >= MAX_PROBLEM_LINES && !verbose())
        return;
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char at[1100];
    fired_site(n, at, sizeof at);
    if (n > 0)
        printf("alloc_fault: %s: allocation %ld%s failing (%s): %s\n", s->name, n, at,
               mode_name(n, persistent), msg);
    else
        printf("alloc_fault: %s: run with no failure: %s\n", s->name, msg);
    fflush(stdout);
}

static void report_leaks(const lmc_fault_spec *s, long n, bool persistent, run_stats *st,
                         long mark)
{
    block first[MAX_LEAKS_SHOWN];
    size_t bytes;
    long leaked = collect_since(mark, &bytes, first, MAX_LEAKS_SHOWN);
    if (leaked == 0)
        return;
    char list[768] = "";
    size_t used = 0;
    for (long i = 0; i < leaked && i < MAX_LEAKS_SHOWN && used < sizeof list; i++) {
        char where[256];
        describe_caller(first[i].caller, where, sizeof where);
        used += (size_t)snprintf(list + used, sizeof list - used,
                                 "%s%zu bytes from allocation #%ld at %s", i ? "; " : "",
                                 first[i].size, first[i].ordinal, where);
    }
    report(s, n, persistent, st, "leaked %ld block%s (%zu bytes): %s%s", leaked,
           leaked == 1 ? "" : "s", bytes, list, leaked > MAX_LEAKS_SHOWN ? "; ..." : "");
}

/* One run with allocation n failing (n <= 0: none); counts what happened. */
static void one_run(const lmc_fault_spec *s, long n, bool persistent, run_stats *st,
                    long *allocs)
{
    snprintf(g_where, sizeof g_where,
             "alloc_fault: %s: CRASHED in the run with allocation %ld failing (%s)\n", s->name,
             n, mode_name(n, persistent));
    g_reason[0] = '\0';
    long mark = current_seq();
    g_in_run = 1;
    lmc_fault_arm(n, persistent);
    int rc = s->scenario(s->arg);
    lmc_fault_disarm();
    g_in_run = 0;
    bool fired = lmc_fault_fired();
    *allocs = lmc_fault_count();
    st->runs++;
    st->injected += fired;

    if (rc == LMC_FAULT_VIOLATION)
        report(s, n, persistent, st, "%s", g_reason[0] ? g_reason : "violation (no reason given)");
    else if (rc != LMC_FAULT_OK && rc != LMC_FAULT_ERROR)
        report(s, n, persistent, st, "scenario returned %d, not an LMC_FAULT_* value", rc);
    else if (rc == LMC_FAULT_ERROR && !fired)
        report(s, n, persistent, st, "reported an error although no allocation failed");
    else if (rc == LMC_FAULT_ERROR)
        st->errors++;
    else if (fired) {
        st->absorbed++;
        if (verbose()) {
            char at[1100];
            fired_site(n, at, sizeof at);
            printf("alloc_fault: %s: allocation %ld%s failing (%s): absorbed, the scenario "
                   "succeeded\n", s->name, n, at, mode_name(n, persistent));
        }
    }
    /* n never exceeds the counting run's total. */
    if (n > 0 && !fired)
        report(s, n, persistent, st,
               "the run made only %ld allocations, fewer than the run that counted them: "
               "the scenario is not deterministic", *allocs);

    report_leaks(s, n, persistent, st, mark);

    if (s->check) {
        g_reason[0] = '\0';
        g_in_run = 1;
        int crc = s->check(s->arg);
        g_in_run = 0;
        if (crc != 0)
            report(s, n, persistent, st, "check failed: %s",
                   g_reason[0] ? g_reason : "(no reason given)");
    }
}

static long env_max_n(long fallback)
{
    const char *v = getenv("LMC_ALLOC_FAULT_MAX_N");
    if (!v || !*v)
        return fallback;
    char *end;
    long n = strtol(v, &end, 10);
    return *end == '\0' && n >= 0 ? n : fallback;
}

/* The i-th failure point to try (0-based) out of `budget` for `total`. */
static long point_at(long i, long budget, long total)
{
    if (total <= budget)
        return i + 1;
    long head = budget / 2, tail = budget - head;
    if (i < head)
        return i + 1;
    long j = i - head;
    if (tail == 1)
        return total;
    return head + 1 + j * (total - head - 1) / (tail - 1);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

int lmc_fault_run_spec(const lmc_fault_spec *s)
{
    /* A cmocka assertion inside an earlier scenario jumps out with the
     * injector still armed. */
    lmc_fault_disarm();
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_stats st = {0};
    hooks_install();

    long total = 0;
    one_run(s, 0, false, &st, &total);
    if (st.problems) {
        printf("alloc_fault: %s: the run with no failure must succeed cleanly; stopping\n",
               s->name);
        hooks_remove();
        return (int)st.problems;
    }

    long budget = env_max_n(s->max_n);
    if (budget <= 0 || budget > total)
        budget = total;
    for (long i = 0; i < budget; i++) {
        long n = point_at(i, budget, total), got;
        one_run(s, n, false, &st, &got);
        if (!s->transient_only)
            one_run(s, n, true, &st, &got);
    }
    hooks_remove();

    char points[96];
    if (budget == total)
        snprintf(points, sizeof points, "all %ld points", total);
    else
        snprintf(points, sizeof points, "%ld of %ld points", budget, total);
    char problems[32];
    snprintf(problems, sizeof problems, "%s%ld problem%s", st.problems ? "FAIL: " : "",
             st.problems, st.problems == 1 ? "" : "s");
    if (total == 0)
        printf("alloc_fault: %s: 0 allocations, nothing to fail; %s (%.0f ms)\n", s->name,
               problems, ms_since(&t0));
    else
        printf("alloc_fault: %s: %ld allocations; %s x %d modes = %ld runs; %ld failures "
               "injected: %ld reported as errors, %ld absorbed; %s (%.0f ms)\n",
               s->name, total, points, s->transient_only ? 1 : 2, st.runs - 1, st.injected,
               st.errors, st.absorbed, problems, ms_since(&t0));
    if (st.problems > MAX_PROBLEM_LINES && !verbose())
        printf("alloc_fault: %s: (%ld more problem lines not shown; LMC_ALLOC_FAULT_VERBOSE=1 "
               "shows them)\n", s->name,
               st.problems - MAX_PROBLEM_LINES);
    fflush(stdout);
    return (int)(st.problems > INT32_MAX ? INT32_MAX : st.problems);
}

int lmc_fault_run(const char *name, int (*scenario)(void *), void *arg, int (*check)(void *),
                  long max_n)
{
    lmc_fault_spec s = {.name = name, .scenario = scenario, .arg = arg, .check = check,
                        .max_n = max_n};
    return lmc_fault_run_spec(&s);
}
