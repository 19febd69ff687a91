/* A small blocking HTTP/1.1 client (one request per connection, "Connection: close") for the
 * command line, tests and benchmarks; and the address parser the server shares. */
#include "granary/http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http_int.h"

int gr_http_resolve(const char *hostport, int passive, struct sockaddr_storage *out,
                    socklen_t *len)
{
    char host[256];
    const char *port;
    if (hostport[0] == '[') {
        const char *end = strchr(hostport, ']');
        if (!end || end[1] != ':' || (size_t)(end - hostport - 1) >= sizeof host)
            return gr_seterr(GR_EINVAL, "bad address '%s': expected [V6]:PORT", hostport);
        memcpy(host, hostport + 1, (size_t)(end - hostport - 1));
        host[end - hostport - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(hostport, ':');
        if (!colon || (size_t)(colon - hostport) >= sizeof host)
            return gr_seterr(GR_EINVAL, "bad address '%s': expected HOST:PORT", hostport);
        memcpy(host, hostport, (size_t)(colon - hostport));
        host[colon - hostport] = '\0';
        port = colon + 1;
    }
    char *endp;
    long pn = strtol(port, &endp, 10);
    if (!*port || *endp || pn < 0 || pn > 65535)
        return gr_seterr(GR_EINVAL, "bad port in '%s': expected 0..65535", hostport);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    if (passive) hints.ai_flags = AI_PASSIVE;
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (gai != 0 || !res)
        return gr_seterr(GR_EINVAL, "cannot resolve '%s': %s", hostport, gai_strerror(gai));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = gr_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now) / 1000000u;
    return ms ? (int)(ms > 1u << 30 ? 1u << 30 : ms) : 1;
}

static int wait_fd(int fd, short events, uint64_t deadline_ns, const char *url)
{
    for (;;) {
        int left = ms_left(deadline_ns);
        if (!left) return gr_seterr(GR_ETIMEDOUT, "http: no reply from %s in time", url);
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return gr_seterr(GR_EIO, "http: poll: %s", strerror(errno));
    }
}

static int connect_to(const struct sockaddr_storage *addr, socklen_t len, uint64_t deadline,
                      const char *url, int *fd_out)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return gr_seterr(GR_EIO, "http: socket: %s", strerror(errno));
    if (connect(fd, (const struct sockaddr *)addr, len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return gr_seterr(GR_ECONN, "http: cannot connect to %s: %s", url, strerror(e));
    }
    int rc = wait_fd(fd, POLLOUT, deadline, url);
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (!rc && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr))
        rc = gr_seterr(GR_ECONN, "http: cannot connect to %s: %s", url, strerror(soerr));
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

static int send_all(int fd, const char *p, size_t n, uint64_t deadline, const char *url)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            int rc = wait_fd(fd, POLLOUT, deadline, url);
            if (rc) return rc;
        } else {
            /* The peer may have answered (413) and closed before reading the whole body:
             * what it said is still worth reading. */
            return 1;
        }
    }
    return 0;
}

/* Reads until the peer closes. */
static int recv_all(int fd, uint64_t deadline, const char *url, char **buf, size_t *len)
{
    size_t cap = 16384, n = 0;
    char *b = malloc(cap);
    if (!b) return gr_seterr(GR_ENOMEM, "http: out of memory");
    for (;;) {
        if (n + 4096 > cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return gr_seterr(GR_ENOMEM, "http: out of memory");
            }
            b = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, b + n, cap - n - 1, 0);
        if (r > 0) {
            n += (size_t)r;
        } else if (r == 0 || (r < 0 && errno == ECONNRESET && n > 0)) {
            break;
        } else if (errno == EAGAIN || errno == EINTR) {
            int rc = wait_fd(fd, POLLIN, deadline, url);
            if (rc) {
                free(b);
                return rc;
            }
        } else {
            int e = errno;
            free(b);
            return gr_seterr(GR_ECONN, "http: reading from %s: %s", url, strerror(e));
        }
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* Decodes a chunked body in place; returns its length or -1. */
static long dechunk(char *body, size_t len)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *endp;
        unsigned long size = strtoul(body + in, &endp, 16);
        char *eol = strstr(body + in, "\r\n");
        if (!eol || endp == body + in) return -1;
        in = (size_t)(eol - body) + 2;
        if (size == 0) break;
        if (in + size > len) return -1;
        memmove(body + out, body + in, size);
        out += size;
        in += size + 2;
        if (in > len) return -1;
    }
    body[out] = '\0';
    return (long)out;
}

static int parse_reply(char *raw, size_t len, const char *url, gr_http_result *out)
{
    char *head_end = strstr(raw, "\r\n\r\n");
    if (strncmp(raw, "HTTP/1.", 7) != 0 || !head_end)
        return gr_seterr(GR_EPROTO, "http: %s did not answer in HTTP", url);
    *head_end = '\0';
    out->status = atoi(raw + 9);
    int chunked = 0;
    long content_length = -1;
    for (char *line = strstr(raw, "\r\n"); line && line < head_end; line = strstr(line, "\r\n")) {
        line += 2;
        if (!strncasecmp(line, "Content-Type:", 13)) {
            const char *v = line + 13;
            while (*v == ' ') v++;
            size_t vl = strcspn(v, "\r");
            if (vl >= sizeof out->content_type) vl = sizeof out->content_type - 1;
            memcpy(out->content_type, v, vl);
            out->content_type[vl] = '\0';
        } else if (!strncasecmp(line, "Content-Length:", 15)) {
            content_length = atol(line + 15);
        } else if (!strncasecmp(line, "Transfer-Encoding:", 18) && strstr(line, "chunked")) {
            chunked = 1;
        }
    }
    char *body = head_end + 4;
    size_t blen = len - (size_t)(body - raw);
    if (chunked) {
        long n = dechunk(body, blen);
        if (n < 0) return gr_seterr(GR_EPROTO, "http: bad chunked body from %s", url);
        blen = (size_t)n;
    } else if (content_length >= 0 && (size_t)content_length < blen) {
        blen = (size_t)content_length;
    }
    out->body = malloc(blen + 1);
    if (!out->body) return gr_seterr(GR_ENOMEM, "http: out of memory");
    memcpy(out->body, body, blen);
    out->body[blen] = '\0';
    out->body_len = blen;
    return 0;
}

int gr_http_fetch(const char *method, const char *url, const char *headers, const void *body,
                  size_t body_len, int timeout_ms, gr_http_result *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(url, "http://", 7) != 0)
        return gr_seterr(GR_EINVAL, "http: '%s' is not an http:// URL", url);
    const char *hp = url + 7;
    const char *slash = strchr(hp, '/');
    const char *path = slash ? slash : "/";
    size_t hl = slash ? (size_t)(slash - hp) : strlen(hp);
    char hostport[300];
    if (hl == 0 || hl >= sizeof hostport)
        return gr_seterr(GR_EINVAL, "http: no host in '%s'", url);
    memcpy(hostport, hp, hl);
    hostport[hl] = '\0';
    struct sockaddr_storage addr;
    socklen_t alen;
    int rc = gr_http_resolve(hostport, 0, &addr, &alen);
    if (rc) return rc;
    uint64_t deadline = gr_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 30000) * 1000000u;
    int fd = -1;
    rc = connect_to(&addr, alen, deadline, url, &fd);
    if (rc) return rc;
    char *req = NULL;
    size_t req_len = 0;
    FILE *f = open_memstream(&req, &req_len);
    if (!f) {
        close(fd);
        return gr_seterr(GR_ENOMEM, "http: out of memory");
    }
    fprintf(f, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nUser-Agent: granary\r\n",
            method, path, hostport);
    if (body || !strcmp(method, "POST") || !strcmp(method, "PUT"))
        fprintf(f, "Content-Length: %zu\r\n", body_len);
    if (headers) fputs(headers, f);
    fputs("\r\n", f);
    fclose(f);
    rc = send_all(fd, req, req_len, deadline, url);
    free(req);
    if (rc == 0 && body_len) rc = send_all(fd, body, body_len, deadline, url);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    char *raw = NULL;
    size_t raw_len = 0;
    rc = recv_all(fd, deadline, url, &raw, &raw_len);
    close(fd);
    if (rc) return rc;
    rc = parse_reply(raw, raw_len, url, out);
    free(raw);
    return rc;
}

void gr_http_result_free(gr_http_result *r)
{
    if (!r) return;
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
}
