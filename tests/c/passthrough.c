/* Socket calls a C program makes, the fortified (_chk) variants included
 * (built with -O2 -D_FORTIFY_SOURCE=2). It prints what it observes; the
 * output must be the same with and without the preload. With an argument
 * it also tries socket(AF_INET_SDP = 27, ...) and prints the outcome. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "failed: %s (line %d): %s\n", #x, __LINE__, strerror(errno)); exit(1); } } while (0)

int main(int argc, char **argv) {
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof sa;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    CHECK(bind(l, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(l, 4) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&sa, &len) == 0);

    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&sa, sizeof sa);
    printf("nonblocking connect: %s\n", r == 0 || errno == EINPROGRESS ? "in progress or done" : strerror(errno));
    struct pollfd pw[1] = { { .fd = c, .events = POLLOUT } };
    volatile nfds_t one_fd = 1;
    int ready = poll(pw, one_fd, 5000);
    printf("poll writable: %d %d\n", ready, (pw[0].revents & POLLOUT) != 0);
    int err = -1;
    len = sizeof err;
    CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0);
    printf("SO_ERROR: %d\n", err);
    int a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    CHECK(a >= 0);
    CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK) == 0);
    int one = 1;
    CHECK(setsockopt(c, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof one) == 0);

    CHECK(write(c, "hello world", 11) == 11);
    struct pollfd pr[1] = { { .fd = a, .events = POLLIN } };
    struct timespec ts = { 5, 0 };
    printf("ppoll readable: %d\n", ppoll(pr, one_fd, &ts, NULL));
    int avail = -1;
    CHECK(ioctl(a, FIONREAD, &avail) == 0);
    printf("FIONREAD: %d\n", avail);
    char buf[64];
    /* Lengths the compiler cannot see make glibc use __recv_chk,
     * __read_chk and __recvfrom_chk. */
    volatile size_t five = 5, six = 6;
    ssize_t n = recv(a, buf, five, MSG_PEEK);
    printf("peek: %.*s\n", (int)n, buf);
    n = read(a, buf, five);
    printf("read: %.*s\n", (int)n, buf);
    n = recvfrom(a, buf, six, MSG_WAITALL, NULL, NULL);
    printf("recvfrom: %.*s\n", (int)n, buf);

    struct iovec out[2] = { { "ab", 2 }, { "cd", 2 } };
    CHECK(writev(c, out, 2) == 4);
    char x[2], y[2];
    struct iovec in[2] = { { x, 2 }, { y, 2 } };
    n = readv(a, in, 2);
    printf("readv: %zd %.2s %.2s\n", n, x, y);

    struct msghdr mh = { .msg_iov = out, .msg_iovlen = 2 };
    CHECK(sendmsg(c, &mh, MSG_NOSIGNAL) == 4);
    struct msghdr mr = { .msg_iov = in, .msg_iovlen = 2 };
    n = recvmsg(a, &mr, MSG_WAITALL);
    printf("recvmsg: %zd %.2s %.2s\n", n, x, y);

    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(a, &rs);
    CHECK(send(c, "s", 1, 0) == 1);
    struct timeval tv = { 5, 0 };
    ready = select(a + 1, &rs, NULL, NULL, &tv);
    printf("select: %d %d\n", ready, FD_ISSET(a, &rs));
    CHECK(recv(a, buf, 1, 0) == 1);
    FD_ZERO(&rs);
    FD_SET(a, &rs);
    CHECK(sendto(c, "p", 1, 0, NULL, 0) == 1);
    printf("pselect: %d\n", pselect(a + 1, &rs, NULL, NULL, &ts, NULL));
    CHECK(recv(a, buf, 1, 0) == 1);

    int e = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 42 };
    CHECK(epoll_ctl(e, EPOLL_CTL_ADD, a, &ev) == 0);
    CHECK(write(c, "e", 1) == 1);
    struct epoll_event got[4];
    int k = epoll_pwait(e, got, 4, 5000, NULL);
    printf("epoll_pwait: %d %llu\n", k, (unsigned long long)got[0].data.u64);
    CHECK(read(a, buf, 1) == 1);
    k = epoll_wait(e, got, 4, 0);
    printf("epoll_wait drained: %d\n", k);

    int d3 = dup3(c, 50, O_CLOEXEC);
    int dfd = fcntl(c, F_DUPFD_CLOEXEC, 60);
    int d2 = dup2(c, 70);
    printf("dups: %d %d %d\n", d3, dfd, d2);
    char path[] = "/tmp/sdp-passthrough-XXXXXX";
    int f = mkstemp(path);
    CHECK(f >= 0);
    CHECK(write(f, "file-bytes", 10) == 10);
    unlink(path);
    off_t off = 0;
    printf("sendfile: %zd\n", sendfile(dfd, f, &off, 10));
    n = recv(a, buf, 10, MSG_WAITALL);
    printf("after sendfile: %.*s\n", (int)n, buf);

    CHECK(close(c) == 0 && close(d3) == 0 && close(dfd) == 0);
    CHECK(shutdown(d2, SHUT_WR) == 0);
    printf("eof: %zd\n", read(a, buf, sizeof buf));
    CHECK(close(d2) == 0 && close(a) == 0 && close(l) == 0 && close(e) == 0 && close(f) == 0);

    if (argc > 1) {
        int s = socket(27, SOCK_STREAM, 0);
        if (s < 0) {
            printf("AF_INET_SDP: %s\n", strerror(errno));
        } else {
            struct sockaddr_in sdp = sa;
            int l2 = socket(AF_INET, SOCK_STREAM, 0);
            sdp.sin_port = 0;
            len = sizeof sdp;
            CHECK(bind(l2, (struct sockaddr *)&sdp, sizeof sdp) == 0 && listen(l2, 1) == 0);
            CHECK(getsockname(l2, (struct sockaddr *)&sdp, &len) == 0);
            /* libsdp programs may also put AF_INET_SDP in the address. */
            sdp.sin_family = 27;
            CHECK(connect(s, (struct sockaddr *)&sdp, sizeof sdp) == 0);
            struct sockaddr_in peer;
            len = sizeof peer;
            CHECK(getpeername(s, (struct sockaddr *)&peer, &len) == 0);
            printf("AF_INET_SDP: connected, peer family %d\n", peer.sin_family);
        }
    }
    printf("done\n");
    return 0;
}
