/* Internals shared by the HTTP server and client. */
#ifndef GRANARY_HTTP_INT_H
#define GRANARY_HTTP_INT_H

#include <sys/socket.h>

/* "HOST:PORT" (or "[V6]:PORT") to a socket address. passive: an empty host means any
 * address. GR_EINVAL with a message for anything else. */
int gr_http_resolve(const char *hostport, int passive, struct sockaddr_storage *out,
                    socklen_t *len);

#endif
