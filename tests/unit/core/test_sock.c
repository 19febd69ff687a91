/* gr_sock_unpaced_loopback: a TCP connection to a loopback peer ends up with a congestion
 * control that does not pace (cubic, or reno where cubic is not allowed), on both ends; Unix
 * sockets and unconnected sockets are left alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "granary/core.h"

static void congestion_of(int fd, char name[16])
{
    socklen_t len = 16;
    memset(name, 0, 16);
    assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
}

/* A connected pair over 127.0.0.1: *client and *server. */
static void loopback_pair(int *client, int *server)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(lfd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 1), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    *client = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*client >= 0);
    assert_int_equal(connect(*client, (struct sockaddr *)&a, sizeof a), 0);
    *server = accept(lfd, NULL, NULL);
    assert_true(*server >= 0);
    close(lfd);
}

static void test_loopback_tcp_is_unpaced(void **state)
{
    (void)state;
    int c, s;
    loopback_pair(&c, &s);
    int fds[2] = {c, s};
    for (int i = 0; i < 2; i++) {
        assert_true(gr_sock_unpaced_loopback(fds[i]));
        char name[16];
        congestion_of(fds[i], name);
        assert_true(!strcmp(name, "cubic") || !strcmp(name, "reno"));
    }
    /* Data still flows after the switch. */
    assert_int_equal(send(c, "ping", 4, 0), 4);
    char buf[4];
    assert_int_equal(recv(s, buf, 4, MSG_WAITALL), 4);
    assert_memory_equal(buf, "ping", 4);
    close(c);
    close(s);
}

static void test_other_sockets_left_alone(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_false(gr_sock_unpaced_loopback(sv[0]));
    close(sv[0]);
    close(sv[1]);
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* not connected: no peer */
    assert_true(fd >= 0);
    char before[16], after[16];
    congestion_of(fd, before);
    assert_false(gr_sock_unpaced_loopback(fd));
    congestion_of(fd, after);
    assert_string_equal(before, after);
    close(fd);
    assert_false(gr_sock_unpaced_loopback(-1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loopback_tcp_is_unpaced),
        cmocka_unit_test(test_other_sockets_left_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
