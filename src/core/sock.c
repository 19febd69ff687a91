/* Socket settings shared by the client and the server. */
#include "granary/core.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

static bool peer_is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false; /* a Unix socket has no congestion control */
}

/* A congestion control that paces (BBR, the default on some hosts) spreads a send over
 * timer-driven bursts, run in softirq on whichever thread the timer interrupts: on loopback,
 * where there is no link to pace for, that is only cost (a bench ps pull batch spent 0.4 ms
 * in such paced transmissions). CUBIC does not pace; an unprivileged process may only pick
 * what net.ipv4.tcp_allowed_congestion_control lists, so RENO (always allowed, no pacing)
 * is the fallback. Peers elsewhere keep the host's choice. */
bool gr_sock_unpaced_loopback(int fd)
{
    if (!peer_is_loopback(fd)) return false;
    static const char *const names[] = {"cubic", "reno"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, names[i], (socklen_t)strlen(names[i])) == 0)
            return true;
    return false;
}
