/* Test helper shared by the storage_l2 tests that start real servers. */
#ifndef LMC_TEST_PORTS_H
#define LMC_TEST_PORTS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Ports the kernel says are free now; `bus` also requires port+10000 free
 * (Redis Cluster's bus), so those come from a range that leaves room. */
static inline bool port_free(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    if (s >= 0)
        close(s);
    return ok;
}

/* Seeded once per process: two picks in one second must differ.  Bases
 * stay under 32768, where Linux starts handing out ephemeral ports, so an
 * outgoing connection of another test cannot take a port between the
 * check and the server's bind. */
static inline int pick_ports(int n, bool bus)
{
    static bool seeded;
    if (!seeded) {
        srand((unsigned)getpid() ^ (unsigned)time(NULL));
        seeded = true;
    }
    for (int attempt = 0; attempt < 1000; attempt++) {
        int base = bus ? 20000 + rand() % 2700 : 20000 + rand() % 12000;
        bool ok = true;
        for (int i = 0; ok && i < n; i++)
            ok = port_free(base + i) && (!bus || port_free(base + i + 10000));
        if (ok)
            return base;
    }
    return -1;
}

#endif
