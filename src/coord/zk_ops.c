/* The zookeeper backend's operations: members (list and read each record), the layout (read
 * with its version, compare-and-set), and the election (ZooKeeper's recipe: the smallest
 * sequence leads, every other candidate watches only its predecessor). Each call read-holds
 * zk.lock so that an expiry cannot swap the handle underneath it. */
#include "coord/zk_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEMBER_DATA_MAX 4096

/* Reads one record znode (a member or a candidate); GR_ENOENT when it vanished. */
static int read_record(coord_zk *z, const char *path, gr_coord_member *out)
{
    char buf[MEMBER_DATA_MAX];
    int len = sizeof buf;
    int zrc = zoo_get(z->zh, path, 0, buf, &len, NULL);
    if (zrc != ZOK) return zk_err(zrc, "read", path);
    if (len < 0) len = 0;
    int rc = coord_member_decode(buf, (size_t)len, out);
    if (rc) return gr_seterr(GR_ECORRUPT, "coord: %s: %s", path, gr_errmsg());
    return 0;
}

static int cmp_seq(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    long long sx = coord_seq_of(x), sy = coord_seq_of(y);
    if (sx != sy) return sx < sy ? -1 : 1;
    return strcmp(x, y);
}

int zk_list_members(gr_coord *c, bool watch, gr_coord_member **out, size_t *n)
{
    coord_zk *z = c->zk;
    *out = NULL;
    *n = 0;
    struct String_vector kids = {0, NULL};
    pthread_rwlock_rdlock(&z->lock);
    int zrc = zoo_get_children(z->zh, z->members_dir, watch, &kids);
    int rc = zrc == ZOK ? 0 : zk_err(zrc, "list", z->members_dir);
    gr_coord_member *m = rc ? NULL : calloc((size_t)kids.count + 1, sizeof *m);
    if (!rc && !m) rc = gr_seterr(GR_ENOMEM, "coord: out of memory");
    size_t k = 0;
    for (int32_t i = 0; !rc && i < kids.count; i++) {
        char path[ZK_PATH_MAX];
        int r = zk_child_path(path, sizeof path, z->members_dir, kids.data[i]);
        if (!r) r = read_record(z, path, &m[k]);
        if (r == GR_ENOENT) continue; /* left between the list and the read */
        if (r == GR_ECORRUPT) {       /* not ours to judge: skip it, loudly */
            GR_LOGW("%s", gr_errmsg());
            continue;
        }
        if (r) rc = r;
        else snprintf(m[k].id, sizeof m[k].id, "%s", kids.data[i]), k++;
    }
    pthread_rwlock_unlock(&z->lock);
    deallocate_String_vector(&kids);
    if (rc) {
        free(m);
        return rc;
    }
    coord_members_sort(m, k);
    *out = m;
    *n = k;
    return 0;
}

int zk_layout_get(gr_coord *c, bool watch, gr_coord_layout *out)
{
    coord_zk *z = c->zk;
    memset(out, 0, sizeof *out);
    gr_clearerr();
    int rc = GR_EAGAIN;
    pthread_rwlock_rdlock(&z->lock);
    /* The size first, then the data; a write in between that grew it makes us read again. */
    for (int attempt = 0; attempt < 5 && rc == GR_EAGAIN; attempt++) {
        struct Stat st;
        int zrc = zoo_exists(z->zh, z->layout_path, watch, &st);
        if (zrc == ZNONODE) {
            rc = gr_seterr(GR_ENOENT, "coord: no layout at %s yet", z->layout_path);
            break;
        }
        if (zrc != ZOK) {
            rc = zk_err(zrc, "read", z->layout_path);
            break;
        }
        int cap = st.dataLength + 1, len = cap;
        char *buf = malloc((size_t)cap);
        if (!buf) {
            rc = gr_seterr(GR_ENOMEM, "coord: out of memory");
            break;
        }
        zrc = zoo_get(z->zh, z->layout_path, watch, buf, &len, &st);
        if (zrc == ZOK && st.dataLength < cap) {
            rc = gr_coord_layout_decode(buf, len > 0 ? (size_t)len : 0, out);
            if (rc) rc = gr_seterr(GR_ECORRUPT, "coord: %s: %s", z->layout_path, gr_errmsg());
            else out->version = st.version;
        } else if (zrc != ZOK && zrc != ZNONODE) {
            rc = zk_err(zrc, "read", z->layout_path);
        }
        free(buf);
    }
    pthread_rwlock_unlock(&z->lock);
    if (rc == GR_EAGAIN && !gr_errmsg()[0])
        rc = gr_seterr(GR_EAGAIN, "coord: %s kept changing while read", z->layout_path);
    return rc;
}

int zk_layout_cas(gr_coord *c, gr_coord_layout *l)
{
    coord_zk *z = c->zk;
    char *json = gr_coord_layout_encode(l);
    if (!json) return GR_ENOMEM;
    int len = (int)strlen(json), rc;
    pthread_rwlock_rdlock(&z->lock);
    if (l->version < 0) {
        int zrc = zoo_create(z->zh, z->layout_path, json, len, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
        if (zrc == ZOK) l->version = 0;
        rc = zrc == ZOK ? 0
             : zrc == ZNODEEXISTS
                 ? gr_seterr(GR_ESTALE, "coord: a layout exists at %s already", z->layout_path)
                 : zk_err(zrc, "create", z->layout_path);
    } else {
        struct Stat st;
        int zrc = zoo_set2(z->zh, z->layout_path, json, len, (int)l->version, &st);
        if (zrc == ZOK) l->version = st.version;
        rc = zrc == ZOK ? 0
             : zrc == ZBADVERSION || zrc == ZNONODE
                 ? gr_seterr(GR_ESTALE, "coord: the layout at %s is no longer version %lld",
                             z->layout_path, (long long)l->version)
                 : zk_err(zrc, "write", z->layout_path);
    }
    pthread_rwlock_unlock(&z->lock);
    free(json);
    return rc;
}

/* Our candidate znode, holding our record. reg_mu held by the caller. */
int zk_elect(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->mu);
    gr_coord_member self = c->self;
    pthread_mutex_unlock(&c->mu);
    char *json = coord_member_encode(&self);
    if (!json) return GR_ENOMEM;
    char prefix[64], path[ZK_PATH_MAX], made[ZK_PATH_MAX];
    pthread_rwlock_rdlock(&z->lock);
    zk_session_prefix(z, 'c', prefix, sizeof prefix);
    if (zk_child_path(path, sizeof path, z->election_dir, prefix)) {
        pthread_rwlock_unlock(&z->lock);
        free(json);
        return GR_ETOOBIG;
    }
    /* As registering: a candidate of this session is ours (its create may have lost only
     * its reply), so look before making another (which would stand behind it). */
    int rc = zk_find_child(z, z->election_dir, prefix, made, sizeof made);
    if (rc == GR_ENOENT) {
        int zrc = zoo_create(z->zh, path, json, (int)strlen(json), &ZOO_OPEN_ACL_UNSAFE,
                             ZOO_EPHEMERAL_SEQUENTIAL, made, sizeof made);
        rc = zrc == ZOK ? 0 : zk_err(zrc, "join the election at", path);
    }
    pthread_rwlock_unlock(&z->lock);
    free(json);
    if (!rc) snprintf(z->cand_path, sizeof z->cand_path, "%s", made);
    return rc;
}

int zk_resign(gr_coord *c)
{
    coord_zk *z = c->zk;
    if (!z->cand_path[0]) return 0;
    pthread_rwlock_rdlock(&z->lock);
    int zrc = zoo_delete(z->zh, z->cand_path, -1);
    pthread_rwlock_unlock(&z->lock);
    int rc = zrc == ZOK || zrc == ZNONODE ? 0 : zk_err(zrc, "delete", z->cand_path);
    z->cand_path[0] = '\0';
    return rc;
}

/* The candidates sorted by sequence; the caller frees with deallocate_String_vector. */
static int candidates(coord_zk *z, struct String_vector *kids)
{
    int zrc = zoo_get_children(z->zh, z->election_dir, 0, kids);
    if (zrc != ZOK) return zk_err(zrc, "list", z->election_dir);
    if (kids->count > 1) qsort(kids->data, (size_t)kids->count, sizeof *kids->data, cmp_seq);
    return 0;
}

/* reg_mu held by the caller (it may re-create our candidate). */
int zk_election_check(gr_coord *c, bool *leading)
{
    coord_zk *z = c->zk;
    *leading = false;
    for (int attempt = 0; attempt < 8; attempt++) {
        if (!z->cand_path[0]) {
            int rc = zk_elect(c); /* ours vanished (expiry): back of the line */
            if (rc) return rc;
        }
        const char *mine = strrchr(z->cand_path, '/') + 1;
        struct String_vector kids = {0, NULL};
        pthread_rwlock_rdlock(&z->lock);
        int rc = candidates(z, &kids);
        int pos = -1;
        for (int32_t i = 0; !rc && i < kids.count; i++)
            if (!strcmp(kids.data[i], mine)) pos = i;
        int zrc = ZOK;
        if (!rc && pos > 0) {
            /* Watch only the one just ahead of us: when it goes, we are next or it was not
             * the leader (no herd on every change). */
            char pred[ZK_PATH_MAX];
            rc = zk_child_path(pred, sizeof pred, z->election_dir, kids.data[pos - 1]);
            if (!rc) zrc = zoo_exists(z->zh, pred, 1, NULL);
            if (!rc && zrc != ZOK && zrc != ZNONODE) rc = zk_err(zrc, "watch", pred);
        }
        pthread_rwlock_unlock(&z->lock);
        deallocate_String_vector(&kids);
        if (rc) return rc;
        if (pos < 0) {
            z->cand_path[0] = '\0';
            continue;
        }
        if (pos == 0) {
            *leading = true;
            return 0;
        }
        if (zrc == ZOK) return 0; /* armed: we wait for the predecessor */
        /* It went between the list and the watch: look again. */
    }
    return gr_seterr(GR_EAGAIN, "coord: the election kept changing while read");
}

int zk_leader(gr_coord *c, gr_coord_member *out)
{
    coord_zk *z = c->zk;
    struct String_vector kids = {0, NULL};
    pthread_rwlock_rdlock(&z->lock);
    int rc = candidates(z, &kids);
    int found = GR_ENOENT;
    for (int32_t i = 0; !rc && found == GR_ENOENT && i < kids.count; i++) {
        char path[ZK_PATH_MAX];
        found = zk_child_path(path, sizeof path, z->election_dir, kids.data[i]);
        if (!found) found = read_record(z, path, out);
        if (found && found != GR_ENOENT) rc = found;
    }
    pthread_rwlock_unlock(&z->lock);
    deallocate_String_vector(&kids);
    if (rc) return rc;
    if (found) return gr_seterr(GR_ENOENT, "coord: nobody is in the election at %s",
                                z->election_dir);
    return 0;
}
