/* Bearer tokens: "TOKEN USER ROLE" lines. A presented token is compared with every entry in
 * constant time (CRYPTO_memcmp over a fixed width), so the time taken says nothing about
 * which entry, or how much of one, matched. Tokens never appear in logs or replies. */
#include "platform/platform_int.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *role_name(role r)
{
    switch (r) {
    case ROLE_ADMIN: return "admin";
    case ROLE_USER: return "user";
    case ROLE_VIEWER: return "viewer";
    default: return "none";
    }
}

static role role_parse(const char *w)
{
    if (!strcmp(w, "admin")) return ROLE_ADMIN;
    if (!strcmp(w, "user")) return ROLE_USER;
    if (!strcmp(w, "viewer")) return ROLE_VIEWER;
    return ROLE_NONE;
}

int tokens_parse(const char *text, tokens *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    int lineno = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        lineno++;
        char buf[512];
        if (len >= sizeof buf) {
            tokens_free(out);
            return gr_seterr(GR_EINVAL, "tokens line %d is too long", lineno);
        }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = end ? end + 1 : NULL;
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        char tok[256], user[256], rl[256], extra[8];
        int n = sscanf(buf, "%255s %255s %255s %7s", tok, user, rl, extra);
        if (n <= 0) continue;
        if (n != 3) {
            tokens_free(out);
            return gr_seterr(GR_EINVAL, "tokens line %d: expected TOKEN USER ROLE", lineno);
        }
        role r = role_parse(rl);
        if (r == ROLE_NONE) {
            tokens_free(out);
            return gr_seterr(GR_EINVAL, "tokens line %d: role must be admin, user or viewer",
                             lineno);
        }
        if (strlen(tok) < 8 || strlen(tok) >= sizeof out->v->token ||
            strlen(user) >= sizeof out->v->user) {
            tokens_free(out);
            return gr_seterr(GR_EINVAL, "tokens line %d: a token has 8 to 127 characters and a "
                             "user at most 63", lineno);
        }
        for (size_t i = 0; i < out->n; i++)
            if (!strcmp(out->v[i].token, tok)) {
                tokens_free(out);
                return gr_seterr(GR_EINVAL, "tokens line %d: the token of line %zu again",
                                 lineno, i + 1);
            }
        if (out->n == cap) {
            cap = cap ? cap * 2 : 8;
            token_entry *nv = realloc(out->v, cap * sizeof *nv);
            if (!nv) {
                tokens_free(out);
                return gr_seterr(GR_ENOMEM, "tokens: out of memory");
            }
            out->v = nv;
        }
        token_entry *e = &out->v[out->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->token, sizeof e->token, "%s", tok);
        snprintf(e->user, sizeof e->user, "%s", user);
        e->role = r;
    }
    if (!out->n) return gr_seterr(GR_EINVAL, "the tokens file has no TOKEN USER ROLE line");
    return 0;
}

int tokens_load(const char *path, tokens *out)
{
    char *text = NULL;
    size_t len = 0;
    int rc = gr_read_file(path, &text, &len);
    if (rc) return gr_seterr(rc, "cannot read the tokens file: %s", gr_errmsg());
    rc = tokens_parse(text, out);
    OPENSSL_cleanse(text, len);
    free(text);
    if (rc) return gr_seterr(rc, "%s: %s", path, gr_errmsg());
    return 0;
}

void tokens_free(tokens *t)
{
    if (t->v) OPENSSL_cleanse(t->v, t->n * sizeof *t->v);
    free(t->v);
    memset(t, 0, sizeof *t);
}

const token_entry *tokens_find(const tokens *t, const char *bearer)
{
    if (!bearer) return NULL;
    char given[sizeof t->v->token];
    size_t len = strlen(bearer);
    if (len >= sizeof given) return NULL;
    memset(given, 0, sizeof given);
    memcpy(given, bearer, len);
    const token_entry *found = NULL;
    for (size_t i = 0; i < t->n; i++) {
        /* Whole fixed-width buffers, every entry: no early exit on a match or a length. */
        int same = CRYPTO_memcmp(given, t->v[i].token, sizeof given) == 0;
        if (same && !found) found = &t->v[i];
    }
    OPENSSL_cleanse(given, sizeof given);
    return found;
}
