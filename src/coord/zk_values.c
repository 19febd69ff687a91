/* The zookeeper backend's job values: one persistent znode PATH/NAME per value, read with its
 * version and changed only by compare-and-set on it (zoo_set2 with a version; the first write
 * creates the znode), exactly as the layout is. */
#include "coord/zk_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int value_path(coord_zk *z, const char *name, char *out, size_t cap)
{
    return zk_child_path(out, cap, z->root, name);
}

int zk_value_get(gr_coord *c, const char *name, char **out, int64_t *version)
{
    coord_zk *z = c->zk;
    char path[ZK_PATH_MAX];
    int rc = value_path(z, name, path, sizeof path);
    if (rc) return rc;
    gr_clearerr();
    rc = GR_EAGAIN;
    pthread_rwlock_rdlock(&z->lock);
    /* The size first, then the data; a write in between that grew it makes us read again. */
    for (int attempt = 0; attempt < 5 && rc == GR_EAGAIN; attempt++) {
        struct Stat st;
        int zrc = zoo_exists(z->zh, path, 0, &st);
        if (zrc == ZNONODE) {
            rc = gr_seterr(GR_ENOENT, "coord: no value at %s", path);
            break;
        }
        if (zrc != ZOK) {
            rc = zk_err(zrc, "read", path);
            break;
        }
        int cap = st.dataLength + 1, len = cap;
        char *buf = malloc((size_t)cap + 1);
        if (!buf) {
            rc = gr_seterr(GR_ENOMEM, "coord: out of memory");
            break;
        }
        zrc = zoo_get(z->zh, path, 0, buf, &len, &st);
        if (zrc == ZOK && st.dataLength < cap) {
            buf[len > 0 ? len : 0] = '\0';
            *out = buf;
            *version = st.version;
            buf = NULL;
            rc = 0;
        } else if (zrc == ZNONODE) {
            rc = gr_seterr(GR_ENOENT, "coord: no value at %s", path);
        } else if (zrc != ZOK) {
            rc = zk_err(zrc, "read", path);
        }
        free(buf);
    }
    pthread_rwlock_unlock(&z->lock);
    if (rc == GR_EAGAIN && !gr_errmsg()[0])
        rc = gr_seterr(GR_EAGAIN, "coord: %s kept changing while read", path);
    return rc;
}

int zk_value_cas(gr_coord *c, const char *name, const char *text, int64_t *version)
{
    coord_zk *z = c->zk;
    char path[ZK_PATH_MAX];
    int rc = value_path(z, name, path, sizeof path);
    if (rc) return rc;
    int len = (int)strlen(text);
    pthread_rwlock_rdlock(&z->lock);
    if (*version < 0) {
        int zrc = zoo_create(z->zh, path, text, len, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
        if (zrc == ZOK) *version = 0;
        rc = zrc == ZOK ? 0
             : zrc == ZNODEEXISTS ? gr_seterr(GR_ESTALE, "coord: a value exists at %s already", path)
                                  : zk_err(zrc, "create", path);
    } else {
        struct Stat st;
        int zrc = zoo_set2(z->zh, path, text, len, (int)*version, &st);
        if (zrc == ZOK) *version = st.version;
        rc = zrc == ZOK ? 0
             : zrc == ZBADVERSION || zrc == ZNONODE
                 ? gr_seterr(GR_ESTALE, "coord: the value at %s is no longer version %lld", path,
                             (long long)*version)
                 : zk_err(zrc, "write", path);
    }
    pthread_rwlock_unlock(&z->lock);
    return rc;
}
