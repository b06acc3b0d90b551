/* Fuzz target: a --config file (src/config/config_file.c, docs/configuration.md,
 * "Configuration file") with arbitrary bytes, through the whole parse and
 * validation as lmcached runs them.  Every input must end in a valid
 * configuration or one error line naming --config or a flag, never a crash
 * or a leak; a configuration that loads must print (--print-config) as JSON
 * that loads back to the same printout. */
#include "check.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/config.h"

/* The input as a file lmcached can open by name, without touching disk. */
static int as_file(const uint8_t *data, size_t len, char *path, size_t cap)
{
    int fd = memfd_create("lmc-config", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    if (len && write(fd, data, len) != (ssize_t)len) {
        close(fd);
        return -1;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* Parses argv into text printed by --print-config (NULL unless it loads). */
static char *printed(int argc, char *const argv[], lmc_config_status *status, char *err,
                     size_t errlen)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&buf, &size);
    if (!out)
        return NULL;
    lmc_config cfg;
    *status = lmc_config_parse(&cfg, argc, argv, NULL, out, err, errlen);
    fclose(out);
    if (*status == LMC_CONFIG_EXIT_OK)
        return buf;
    free(buf);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    char path[64], err[512];
    int fd = as_file(data, len, path, sizeof path);
    if (fd < 0)
        return 0;
    char *argv[] = {"lmcached", "--config", path, "--print-config", NULL};
    lmc_config_status status;
    char *text = printed(4, argv, &status, err, sizeof err);
    close(fd);
    if (status == LMC_CONFIG_ERROR) {
        CHECK(err[0] == '-' && strchr(err, '\n') == NULL);
        return 0;
    }
    CHECK(status == LMC_CONFIG_EXIT_OK && text);
    /* What --print-config wrote loads back as a --config file, unchanged. */
    json_t *first = json_loads(text, 0, NULL);
    CHECK(json_is_object(first));
    json_decref(first);
    fd = as_file((const uint8_t *)text, strlen(text), path, sizeof path);
    if (fd >= 0 && !strstr(text, "\"***\"")) {
        char *again = printed(4, argv, &status, err, sizeof err);
        CHECK(status == LMC_CONFIG_EXIT_OK && again && strcmp(again, text) == 0);
        free(again);
    }
    if (fd >= 0)
        close(fd);
    free(text);
    return 0;
}
