/* Test helper shared by the storage_l2 tests that use a real fs directory. */
#ifndef LMC_TEST_SCRATCH_DIR_H
#define LMC_TEST_SCRATCH_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

/* Removes a flat scratch directory and the files in it (no subdirectories:
 * the fs adapter keeps one flat directory). */
static inline void scratch_dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

#endif
