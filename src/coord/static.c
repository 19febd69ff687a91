/* The static backend: today's behaviour with nothing running. The layout comes from the spec
 * (a server list or a cluster file) or, for the embedded cluster, from whoever starts it
 * (gr_coord_layout_cas); membership and the election are this handle's own registration. */
#include "coord/coord_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A job value held by the handle (static: nobody else shares it). */
typedef struct st_value {
    struct st_value *next;
    char name[64];
    char *text;
    int64_t version;
} st_value;

struct coord_static {
    bool have_layout;
    gr_coord_layout layout; /* under c->mu */
    st_value *values;       /* under c->mu */
};

static bool is_file_spec(const char *spec, const char **path)
{
    if (!strncmp(spec, "file:", 5)) {
        *path = spec + 5;
        return true;
    }
    size_t n = strlen(spec);
    *path = spec;
    return strchr(spec, '/') || (n >= 5 && !strcmp(spec + n - 5, ".json"));
}

static int layout_from_list(const char *list, gr_coord_layout *out)
{
    uint32_t n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    int rc = gr_coord_layout_init(out, n);
    if (rc) return rc;
    const char *p = list;
    for (uint32_t i = 0; i < n; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        if (!len || !colon || colon == p || colon == p + len - 1 || len >= GR_COORD_ADDR_MAX) {
            gr_coord_layout_fini(out);
            return gr_seterr(GR_EINVAL, "coord: server %u of '%s' is not HOST:PORT", i, list);
        }
        memcpy(out->shards[i].address, p, len);
        out->shards[i].address[len] = '\0';
        p = e ? e + 1 : p + len;
    }
    out->version = 0;
    return 0;
}

int coord_static_layout_from_spec(const char *spec, gr_coord_layout *out, bool *embedded)
{
    memset(out, 0, sizeof *out);
    *embedded = !spec || !*spec || !strcmp(spec, "embedded");
    if (*embedded) return gr_seterr(GR_ENOENT, "coord: the embedded cluster has no layout yet");
    const char *path;
    if (!is_file_spec(spec, &path)) return layout_from_list(spec, out);
    char *text;
    size_t len;
    int rc = gr_read_file(path, &text, &len);
    if (rc) return gr_seterr(rc, "coord: cluster file %s: %s", path, gr_errmsg());
    rc = gr_coord_layout_decode(text, len, out);
    free(text);
    if (rc) return gr_seterr(rc, "coord: cluster file %s: %s", path, gr_errmsg());
    out->version = 0;
    return 0;
}

static int st_start(gr_coord *c)
{
    c->st = calloc(1, sizeof *c->st);
    if (!c->st) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    bool embedded;
    int rc = coord_static_layout_from_spec(c->spec, &c->st->layout, &embedded);
    if (rc && !embedded) {
        free(c->st);
        c->st = NULL;
        return rc;
    }
    c->st->have_layout = !embedded;
    return 0;
}

static void st_stop(gr_coord *c)
{
    if (!c->st) return;
    gr_coord_layout_fini(&c->st->layout);
    for (st_value *v = c->st->values, *next; v; v = next) {
        next = v->next;
        free(v->text);
        free(v);
    }
    free(c->st);
    c->st = NULL;
}

static int st_register(gr_coord *c)
{
    pthread_mutex_lock(&c->mu);
    strcpy(c->self.id, "local-0");
    c->registered = true;
    pthread_mutex_unlock(&c->mu);
    coord_mark(c, COORD_DIRTY_MEMBERS);
    return 0;
}

static int st_update(gr_coord *c)
{
    coord_mark(c, COORD_DIRTY_MEMBERS);
    return 0;
}

static int st_unregister(gr_coord *c)
{
    (void)c; /* gr_coord_unregister clears the fields the listing reads, then wakes it */
    return 0;
}

static int st_list_members(gr_coord *c, bool watch, gr_coord_member **out, size_t *n)
{
    (void)watch;
    *out = calloc(1, sizeof **out);
    *n = 0;
    if (!*out) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    pthread_mutex_lock(&c->mu);
    if (c->registered) (*out)[(*n)++] = c->self;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int st_layout_get(gr_coord *c, bool watch, gr_coord_layout *out)
{
    (void)watch;
    pthread_mutex_lock(&c->mu);
    int rc = c->st->have_layout ? gr_coord_layout_copy(out, &c->st->layout)
                                : gr_seterr(GR_ENOENT, "coord: no layout yet (embedded cluster "
                                            "not started)");
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int st_layout_cas(gr_coord *c, gr_coord_layout *l)
{
    gr_coord_layout copy;
    int rc = gr_coord_layout_copy(&copy, l);
    if (rc) return rc;
    pthread_mutex_lock(&c->mu);
    int64_t stored = c->st->have_layout ? c->st->layout.version : -1;
    if (stored != l->version) {
        pthread_mutex_unlock(&c->mu);
        gr_coord_layout_fini(&copy);
        return gr_seterr(GR_ESTALE, "coord: layout is at version %lld, not %lld",
                         (long long)stored, (long long)l->version);
    }
    copy.version = l->version = stored + 1;
    gr_coord_layout_fini(&c->st->layout);
    c->st->layout = copy;
    c->st->have_layout = true;
    pthread_mutex_unlock(&c->mu);
    coord_mark(c, COORD_DIRTY_LAYOUT);
    return 0;
}

static int st_elect(gr_coord *c)
{
    (void)c;
    return 0;
}

static int st_resign(gr_coord *c)
{
    (void)c;
    return 0;
}

/* Without discovery the chief is who it always was: the member of rank 0. */
static int st_election_check(gr_coord *c, bool *leading)
{
    pthread_mutex_lock(&c->mu);
    *leading = c->in_election && c->self.index <= 0;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int st_leader(gr_coord *c, gr_coord_member *out)
{
    pthread_mutex_lock(&c->mu);
    bool lead = c->in_election && c->self.index <= 0;
    if (lead) *out = c->self;
    pthread_mutex_unlock(&c->mu);
    return lead ? 0 : gr_seterr(GR_ENOENT, "coord: no leader (static: the member of rank 0)");
}

static st_value *st_find(gr_coord *c, const char *name)
{
    for (st_value *v = c->st->values; v; v = v->next)
        if (!strcmp(v->name, name)) return v;
    return NULL;
}

static int st_value_get(gr_coord *c, const char *name, char **out, int64_t *version)
{
    pthread_mutex_lock(&c->mu);
    st_value *v = st_find(c, name);
    int rc = !v ? gr_seterr(GR_ENOENT, "coord: no value %s", name)
           : (*out = strdup(v->text)) ? 0 : gr_seterr(GR_ENOMEM, "coord: out of memory");
    if (!rc) *version = v->version;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int st_value_cas(gr_coord *c, const char *name, const char *text, int64_t *version)
{
    char *copy = strdup(text);
    if (!copy) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    pthread_mutex_lock(&c->mu);
    st_value *v = st_find(c, name);
    int rc = 0;
    if (*version < 0 && v)
        rc = gr_seterr(GR_ESTALE, "coord: value %s exists already", name);
    else if (*version >= 0 && (!v || v->version != *version))
        rc = gr_seterr(GR_ESTALE, "coord: value %s is no longer version %lld", name,
                       (long long)*version);
    else if (!v && !(v = calloc(1, sizeof *v)))
        rc = gr_seterr(GR_ENOMEM, "coord: out of memory");
    else if (*version < 0) {
        snprintf(v->name, sizeof v->name, "%s", name);
        v->version = -1;
        v->next = c->st->values;
        c->st->values = v;
    }
    if (!rc) {
        free(v->text);
        v->text = copy;
        copy = NULL;
        *version = ++v->version;
    }
    pthread_mutex_unlock(&c->mu);
    free(copy);
    return rc;
}

static void st_session_step(gr_coord *c) { (void)c; }
static void st_tick(gr_coord *c) { (void)c; }

const coord_backend coord_static_backend = {
    .start = st_start,
    .stop = st_stop,
    .register_self = st_register,
    .update_self = st_update,
    .unregister_self = st_unregister,
    .list_members = st_list_members,
    .layout_get = st_layout_get,
    .layout_cas = st_layout_cas,
    .value_get = st_value_get,
    .value_cas = st_value_cas,
    .elect = st_elect,
    .resign = st_resign,
    .election_check = st_election_check,
    .leader = st_leader,
    .tick = st_tick,
    .session_step = st_session_step,
};
