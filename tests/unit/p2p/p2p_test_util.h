/* Shared by the transfer channel's tests: a deterministic arena, so that two
 * processes agree on every byte, and a clock. */
#ifndef LMC_P2P_TEST_UTIL_H
#define LMC_P2P_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#define ARENA_SIZE (64ull << 20)

static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte i of the arena is byte i%8 of mix64(i/8). */
static inline uint8_t *make_arena(void)
{
    uint64_t *a = malloc(ARENA_SIZE);
    for (uint64_t i = 0; a && i < ARENA_SIZE / 8; i++)
        a[i] = mix64(i);
    return (uint8_t *)a;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void sleep_ms(long ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000}, NULL);
}

/* Forks a child that runs start(arg), which starts a server and returns its
 * port (-1: failed), sends that port to the parent and waits to be killed
 * (by the parent, or with it).  The child's pid; *port is -1 when it
 * failed. */
static inline pid_t spawn_port_child(int (*start)(void *), void *arg, int *port)
{
    int p[2];
    *port = -1;
    if (pipe(p))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        int pt = start(arg);
        if (write(p[1], &pt, sizeof pt) != sizeof pt)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    if (pid > 0 && read(p[0], port, sizeof *port) != sizeof *port)
        *port = -1;
    close(p[0]);
    return pid;
}

#endif
