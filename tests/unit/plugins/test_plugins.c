/* Runtime plugins: discovery, the worker-id filter, the interpreter
 * choice, the environment, and a start/stop round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plugins/plugins.h"
#include "plugins/plugins_internal.h"

extern char **environ;

typedef struct {
    char root[64];
} tmp_tree;

static void write_file(const char *root, const char *rel, const char *text, mode_t mode)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static void make_dir(const char *root, const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    assert_int_equal(mkdir(path, 0755), 0);
}

static int setup(void **state)
{
    tmp_tree *t = calloc(1, sizeof *t);
    snprintf(t->root, sizeof t->root, "/tmp/lmc-plugins-XXXXXX");
    if (!mkdtemp(t->root))
        return -1;
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    tmp_tree *t = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->root);
    int rc = system(cmd);
    free(t);
    return rc == 0 ? 0 : -1;
}

static const char *tail_of(const char *path, const tmp_tree *t)
{
    return path + strlen(t->root);
}

static void test_discover(void **state)
{
    tmp_tree *t = *state;
    make_dir(t->root, "d");
    make_dir(t->root, "d/sub");
    write_file(t->root, "d/b.sh", "echo\n", 0644);
    write_file(t->root, "d/a.py", "print()\n", 0644);
    write_file(t->root, "d/notes.txt", "x\n", 0644);
    write_file(t->root, "d/sub/c.sh", "echo\n", 0644);
    write_file(t->root, "d/sub/z.PY", "x\n", 0644); /* case matters, as glob */
    write_file(t->root, "single.txt", "x\n", 0644);  /* a file: taken as-is */
    char dir[256], file[256], missing[256];
    snprintf(dir, sizeof dir, "%s/d", t->root);
    snprintf(file, sizeof file, "%s/single.txt", t->root);
    snprintf(missing, sizeof missing, "%s/nope", t->root);
    char *items[] = {dir, missing, file};
    lmc_strlist locs = {items, 3}, out = {0};
    assert_int_equal(lmc_plugins_discover(&locs, &out), 0);
    assert_int_equal(out.count, 4);
    assert_string_equal(tail_of(out.items[0], t), "/d/a.py");
    assert_string_equal(tail_of(out.items[1], t), "/d/b.sh");
    assert_string_equal(tail_of(out.items[2], t), "/d/sub/c.sh");
    assert_string_equal(tail_of(out.items[3], t), "/single.txt");
    lmc_plugins_free_list(&out);
    assert_null(out.items);
}

static void test_selected(void **state)
{
    (void)state;
    assert_true(lmc_plugins_selected("/x/plugin.py", 0));
    assert_true(lmc_plugins_selected("/x/my_plugin.sh", 0));      /* 2 parts */
    assert_true(lmc_plugins_selected("/x/x_0_name.py", 0));
    assert_false(lmc_plugins_selected("/x/x_1_name.py", 0));
    assert_true(lmc_plugins_selected("/x/x_1_name.py", 1));
    assert_true(lmc_plugins_selected("/x/X_00_Name.PY", 0));      /* int("00") == 0 */
    assert_true(lmc_plugins_selected("/x/x_ab_name.py", 0));      /* not digits */
    assert_true(lmc_plugins_selected("/x/x__name.py", 0));        /* empty part */
    assert_true(lmc_plugins_selected("/x/x_1.py", 0));            /* 2 parts */
    assert_false(lmc_plugins_selected("/x/a_2_b_c.sh", 0));
    assert_false(lmc_plugins_selected("/x/a_99999999999999_b.sh", 0));
    assert_true(lmc_plugins_selected("/dir_1_x/plain.sh", 0));    /* directory ignored */
    assert_false(lmc_plugins_selected("noslash_7_x", 0));         /* no extension */
}

static void test_interpreter(void **state)
{
    tmp_tree *t = *state;
    char out[256], path[256], bindir[256];
    make_dir(t->root, "bin");
    write_file(t->root, "bin/myinterp", "#!/bin/sh\n", 0755);
    snprintf(bindir, sizeof bindir, "/nonexistent:%s/bin", t->root);

    write_file(t->root, "p.py", "print(1)\n", 0644);
    snprintf(path, sizeof path, "%s/p.py", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(out, "python3");

    write_file(t->root, "p.sh", "#!/usr/bin/env bash\necho\n", 0644); /* 2 words: falls through */
    snprintf(path, sizeof path, "%s/p.sh", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(out, "bash");

    write_file(t->root, "q.sh", "#! myinterp \necho\n", 0644); /* name on PATH */
    snprintf(path, sizeof path, "%s/q.sh", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(tail_of(out, t), "/bin/myinterp");

    write_file(t->root, "r.py", "#!/bin/sh\n", 0644); /* absolute path */
    snprintf(path, sizeof path, "%s/r.py", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(out, "/bin/sh");

    write_file(t->root, "s.py", "#!nosuchinterp\n", 0644);
    snprintf(path, sizeof path, "%s/s.py", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(out, "python3");

    strcpy(out, "untouched");
    write_file(t->root, "t.rb", "puts 1\n", 0644);
    snprintf(path, sizeof path, "%s/t.rb", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), -1);
    assert_string_equal(out, "untouched");

    write_file(t->root, "u", "#!/bin/sh\n", 0644); /* no extension, usable shebang */
    snprintf(path, sizeof path, "%s/u", t->root);
    assert_int_equal(lmc_plugins_interpreter(path, bindir, out, sizeof out), 0);
    assert_string_equal(out, "/bin/sh");
}

/* argv[0] is the program; the L1 flags every configuration needs are added. */
static lmc_config *make_config(const char *const *argv, int argc)
{
    const char *all[16] = {argv[0], "--l1-size-gb", "0.01", "--eviction-policy", "LRU"};
    int n = 5;
    for (int i = 1; i < argc && n < 16; i++)
        all[n++] = argv[i];
    lmc_config *cfg = calloc(1, sizeof *cfg);
    char err[256];
    lmc_config_status st = lmc_config_parse(cfg, n, (char *const *)all, NULL, NULL, err,
                                            sizeof err);
    if (st != LMC_CONFIG_OK)
        fail_msg("config: %s", err);
    return cfg;
}

static void free_config(lmc_config *cfg)
{
    lmc_config_free(cfg);
    free(cfg);
}

static void test_config_json(void **state)
{
    (void)state;
    const char *argv[] = {"lmcached", "--port", "6001", "--runtime-plugin-config",
                          "{\"plugin.frontend.heartbeat_url\":\"http://x\"}"};
    lmc_config *cfg = make_config(argv, 5);
    char *text = lmc_plugins_config_json(cfg);
    json_t *j = json_loads(text, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "mp_config"), "port")),
                     6001);
    assert_non_null(json_object_get(j, "storage_manager_config"));
    assert_non_null(json_object_get(j, "obs_config"));
    assert_non_null(json_object_get(j, "http_config"));
    assert_null(json_object_get(j, "p2p_config"));
    json_t *extra = json_object_get(j, "runtime_plugin_extra_config");
    assert_string_equal(json_string_value(json_object_get(extra, "plugin.frontend.heartbeat_url")),
                        "http://x");
    json_decref(j);
    free(text);
    free_config(cfg);

    const char *argv2[] = {"lmcached", "--no-http"};
    cfg = make_config(argv2, 2);
    text = lmc_plugins_config_json(cfg);
    j = json_loads(text, 0, NULL);
    assert_null(json_object_get(j, "http_config"));
    assert_null(json_object_get(j, "runtime_plugin_extra_config")); /* "{}" */
    json_decref(j);
    free(text);
    free_config(cfg);
}

static void test_build_env(void **state)
{
    (void)state;
    char *const envp[] = {"PATH=/usr/bin", "LMCACHE_PLUGIN_ROLE=old", "HOME=/root", NULL};
    char **env = lmc_plugins_build_env(envp, "{\"a\":1}");
    assert_non_null(env);
    assert_string_equal(lmc_plugins_env_get(env, "PATH"), "/usr/bin");
    assert_string_equal(lmc_plugins_env_get(env, "HOME"), "/root");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_PLUGIN_ROLE"), "");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_RUNTIME_PLUGIN_ROLE"), "");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_RUNTIME_PLUGIN_CONFIG"), "{\"a\":1}");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_PLUGIN_CONFIG"), "{\"a\":1}");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_RUNTIME_PLUGIN_WORKER_COUNT"), "1");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_RUNTIME_PLUGIN_WORKER_ID"), "0");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_PLUGIN_WORKER_COUNT"), "1");
    assert_string_equal(lmc_plugins_env_get(env, "LMCACHE_PLUGIN_WORKER_ID"), "0");
    assert_string_equal(lmc_plugins_env_get(env, "PYTHONUNBUFFERED"), "1");
    size_t n = 0, roles = 0;
    for (; env[n]; n++)
        roles += strncmp(env[n], "LMCACHE_PLUGIN_ROLE=", 20) == 0;
    assert_int_equal(n, 2 + 9);
    assert_int_equal(roles, 1);
    lmc_plugins_free_env(env);
}

static bool pid_alive(pid_t pid)
{
    return kill(pid, 0) == 0;
}

/* A plugin that records its pid (and its child's) and sleeps: stop must
 * end both, well before the sleep would. */
static void test_start_stop(void **state)
{
    tmp_tree *t = *state;
    char script[1024];
    snprintf(script, sizeof script,
             "echo $$ > %s/pid.tmp && mv %s/pid.tmp %s/pid\n"
             "echo \"worker=$LMCACHE_RUNTIME_PLUGIN_WORKER_ID\"\nsleep 60\n",
             t->root, t->root, t->root);
    write_file(t->root, "sleeper.sh", script, 0644);
    write_file(t->root, "skip_1_me.sh", "sleep 60\n", 0644);
    char *locs[] = {t->root};
    const char *argv[] = {"lmcached", "--no-http"};
    lmc_config *cfg = make_config(argv, 2);
    lmc_plugins_free_list(&cfg->plugins.locations);
    cfg->plugins.locations.items = malloc(sizeof(char *));
    cfg->plugins.locations.items[0] = strdup(locs[0]);
    cfg->plugins.locations.count = 1;
    lmc_plugins *p = lmc_plugins_start(cfg, environ);
    assert_int_equal(lmc_plugins_count(p), 1);
    char pidfile[256];
    snprintf(pidfile, sizeof pidfile, "%s/pid", t->root);
    FILE *f = NULL;
    for (int i = 0; i < 200 && !(f = fopen(pidfile, "r")); i++)
        usleep(10000);
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    assert_true(pid_alive(pid));
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    lmc_plugins_stop(p);
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_false(pid_alive(pid)); /* reaped, not a zombie */
    assert_true(b.tv_sec - a.tv_sec < LMC_PLUGIN_STOP_GRACE_MS / 1000);
    free_config(cfg);
}

static void test_nothing_to_start(void **state)
{
    tmp_tree *t = *state;
    const char *argv[] = {"lmcached"};
    lmc_config *cfg = make_config(argv, 1);
    assert_null(lmc_plugins_start(cfg, environ)); /* no locations */
    lmc_plugins_stop(NULL);
    assert_int_equal(lmc_plugins_count(NULL), 0);
    write_file(t->root, "bad.rb", "x\n", 0644);
    char path[256];
    snprintf(path, sizeof path, "%s/bad.rb", t->root);
    lmc_plugins_free_list(&cfg->plugins.locations);
    cfg->plugins.locations.items = malloc(sizeof(char *));
    cfg->plugins.locations.items[0] = strdup(path);
    cfg->plugins.locations.count = 1;
    assert_null(lmc_plugins_start(cfg, environ)); /* unsupported type: logged */
    free_config(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_discover, setup, teardown),
        cmocka_unit_test(test_selected),
        cmocka_unit_test_setup_teardown(test_interpreter, setup, teardown),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_build_env),
        cmocka_unit_test_setup_teardown(test_start_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_to_start, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
