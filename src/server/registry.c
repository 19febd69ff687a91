/* The shard's table registry: tables by name and wire id, dense parameters by name. A
 * read-write lock guards the list; entries are reference counted so a table dropped while a
 * worker uses it is freed by whoever releases it last. */
#include "server/server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_registry_init(srv_registry *r, uint32_t max)
{
    memset(r, 0, sizeof *r);
    r->max = max;
    if (pthread_rwlock_init(&r->lock, NULL) != 0)
        return gr_seterr(GR_EINTERNAL, "cannot create the registry lock");
    return GR_OK;
}

void srv_registry_fini(srv_registry *r)
{
    for (size_t i = 0; i < r->n; i++) srv_entry_put(r->items[i]);
    free(r->items);
    pthread_rwlock_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}

static srv_entry *find_locked(srv_registry *r, bool dense, const char *name, uint32_t id)
{
    for (size_t i = 0; i < r->n; i++) {
        srv_entry *e = r->items[i];
        if (e->dense != dense) continue;
        if (name ? !strcmp(e->name, name) : e->id == id) return e;
    }
    return NULL;
}

srv_entry *srv_registry_get(srv_registry *r, bool dense, const char *name, uint32_t id)
{
    pthread_rwlock_rdlock(&r->lock);
    srv_entry *e = find_locked(r, dense, name, id);
    if (e) atomic_fetch_add(&e->refs, 1);
    pthread_rwlock_unlock(&r->lock);
    return e;
}

void srv_entry_put(srv_entry *e)
{
    if (!e) return;
    if (atomic_fetch_sub(&e->refs, 1) == 1) {
        gr_table_destroy(e->table);
        free(e);
    }
}

int srv_registry_add(srv_registry *r, const gr_table_spec *spec, bool dense, uint64_t dense_size,
                     bool *created)
{
    if (created) *created = false;
    int rc = gr_table_spec_validate(spec);
    if (rc) return rc;
    const char *what = dense ? "dense parameter" : "table";
    pthread_rwlock_wrlock(&r->lock);
    srv_entry *same = find_locked(r, dense, spec->name, 0);
    if (same) {
        bool eq = gr_table_spec_equal(gr_table_get_spec(same->table), spec) &&
                  (!dense || same->dense_size == dense_size);
        pthread_rwlock_unlock(&r->lock);
        if (eq) return GR_OK;
        return gr_seterr(GR_EEXIST, "%s '%s' already exists with a different spec", what,
                         spec->name);
    }
    if (!dense) {
        srv_entry *byid = find_locked(r, false, NULL, spec->id);
        if (byid) {
            pthread_rwlock_unlock(&r->lock);
            return gr_seterr(GR_EEXIST, "table id %u is already used by table '%s'", spec->id,
                             byid->name);
        }
    }
    if (r->n >= r->max) {
        pthread_rwlock_unlock(&r->lock);
        return gr_seterr(GR_ETOOBIG, "this shard already holds %u tables and dense parameters "
                         "(the limit)", r->max);
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        srv_entry **items = realloc(r->items, cap * sizeof *items);
        if (!items) {
            pthread_rwlock_unlock(&r->lock);
            return gr_seterr(GR_ENOMEM, "cannot grow the table registry");
        }
        r->items = items;
        r->cap = cap;
    }
    srv_entry *e = calloc(1, sizeof *e);
    if (!e) {
        pthread_rwlock_unlock(&r->lock);
        return gr_seterr(GR_ENOMEM, "cannot allocate a registry entry");
    }
    rc = gr_table_create(spec, &e->table);
    if (rc) {
        pthread_rwlock_unlock(&r->lock);
        free(e);
        return rc;
    }
    if (!dense && r->huge_rows) gr_table_set_huge_rows(e->table, r->huge_rows);
    snprintf(e->name, sizeof e->name, "%s", spec->name);
    e->id = spec->id;
    e->dense = dense;
    e->dense_size = dense_size;
    e->chunk = spec->dim;
    atomic_init(&e->refs, 1);
    r->items[r->n++] = e;
    pthread_rwlock_unlock(&r->lock);
    if (created) *created = true;
    return GR_OK;
}

int srv_registry_drop(srv_registry *r, bool dense, const char *name)
{
    pthread_rwlock_wrlock(&r->lock);
    for (size_t i = 0; i < r->n; i++) {
        srv_entry *e = r->items[i];
        if (e->dense == dense && !strcmp(e->name, name)) {
            r->items[i] = r->items[--r->n];
            pthread_rwlock_unlock(&r->lock);
            srv_entry_put(e);
            return GR_OK;
        }
    }
    pthread_rwlock_unlock(&r->lock);
    return gr_seterr(GR_ENOENT, "no %s named '%s' on this shard", dense ? "dense parameter" : "table",
                     name);
}

int srv_registry_snapshot(srv_registry *r, srv_entry ***out, size_t *n)
{
    pthread_rwlock_rdlock(&r->lock);
    srv_entry **items = malloc((r->n ? r->n : 1) * sizeof *items);
    if (!items) {
        pthread_rwlock_unlock(&r->lock);
        return gr_seterr(GR_ENOMEM, "cannot snapshot the table registry");
    }
    for (size_t i = 0; i < r->n; i++) {
        items[i] = r->items[i];
        atomic_fetch_add(&items[i]->refs, 1);
    }
    *n = r->n;
    pthread_rwlock_unlock(&r->lock);
    *out = items;
    return GR_OK;
}

void srv_registry_release(srv_entry **items, size_t n)
{
    for (size_t i = 0; i < n; i++) srv_entry_put(items[i]);
    free(items);
}

int srv_registry_replace(srv_registry *r, const gr_table_spec *spec, gr_table *t, bool dense,
                         uint64_t dense_size)
{
    srv_entry *e = calloc(1, sizeof *e);
    if (!e) return gr_seterr(GR_ENOMEM, "cannot allocate a registry entry");
    snprintf(e->name, sizeof e->name, "%s", spec->name);
    e->id = spec->id;
    e->dense = dense;
    e->dense_size = dense_size;
    e->chunk = spec->dim;
    e->table = t;
    atomic_init(&e->refs, 1);
    pthread_rwlock_wrlock(&r->lock);
    srv_entry *old = find_locked(r, dense, spec->name, 0);
    int rc = GR_OK;
    if (!old && !dense) {
        srv_entry *byid = find_locked(r, false, NULL, spec->id);
        if (byid)
            rc = gr_seterr(GR_EEXIST, "table id %u is already used by table '%s'", spec->id,
                           byid->name);
    }
    if (!rc && old) {
        for (size_t i = 0; i < r->n; i++)
            if (r->items[i] == old) r->items[i] = e;
    } else if (!rc) {
        if (r->n >= r->max) {
            rc = gr_seterr(GR_ETOOBIG, "this shard already holds %u tables and dense parameters "
                           "(the limit)", r->max);
        } else if (r->n == r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 16;
            srv_entry **items = realloc(r->items, cap * sizeof *items);
            if (!items) rc = gr_seterr(GR_ENOMEM, "cannot grow the table registry");
            else {
                r->items = items;
                r->cap = cap;
            }
        }
        if (!rc) r->items[r->n++] = e;
    }
    pthread_rwlock_unlock(&r->lock);
    if (rc) {
        free(e); /* the caller still owns t */
        return rc;
    }
    srv_entry_put(old); /* freed when its last user releases it */
    return GR_OK;
}
