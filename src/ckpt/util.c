/* Small helpers of the ckpt part: names, slot maps, paths and directory
 * removal. Kept apart so the writer, reader and loader stay about the format itself. */
#include "ckpt/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

const char *gr_ckpt_kind_name(gr_ckpt_kind kind)
{
    switch (kind) {
    case GR_CKPT_FULL: return "full";
    case GR_CKPT_DELTA: return "delta";
    case GR_CKPT_EXPORT: return "export";
    }
    return "unknown";
}

int gr_ckpt_slot_map_default(gr_ckpt_slot_map *map, uint32_t shards)
{
    if (shards == 0 || shards > GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_EINVAL, "shard count %u is out of range 1..%u", shards,
                         GR_CKPT_SHARDS_MAX);
    map->shards = shards;
    for (uint32_t s = 0; s < GR_SLOTS; s++)
        map->owner[s] = gr_slot_shard(s, shards);
    return GR_OK;
}

int gr_ckpt_slot_map_validate(const gr_ckpt_slot_map *map)
{
    if (map->shards == 0 || map->shards > GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_EINVAL, "slot map has %u shards (1..%u allowed)", map->shards,
                         GR_CKPT_SHARDS_MAX);
    uint8_t *seen = calloc(map->shards, 1);
    if (!seen) return gr_seterr(GR_ENOMEM, "out of memory checking a slot map");
    for (uint32_t s = 0; s < GR_SLOTS; s++) {
        if (map->owner[s] >= map->shards) {
            free(seen);
            return gr_seterr(GR_EINVAL, "slot %u belongs to shard %u of a %u-shard map", s,
                             map->owner[s], map->shards);
        }
        seen[map->owner[s]] = 1;
    }
    for (uint32_t i = 0; i < map->shards; i++)
        if (!seen[i]) {
            free(seen);
            return gr_seterr(GR_EINVAL, "shard %u owns no slot in the slot map", i);
        }
    free(seen);
    return GR_OK;
}

void gr_ckpt_name(uint64_t step, char *out)
{
    snprintf(out, GR_CKPT_NAME_MAX, "step-%012" PRIu64, step);
}

void gr_ckpt_shard_file_name(uint32_t shard, uint32_t shards, char *out)
{
    snprintf(out, GR_CKPT_NAME_MAX, "shard-%05u-of-%05u.gck", shard, shards);
}

bool ck_parse_name(const char *name, uint64_t *step)
{
    if (strncmp(name, "step-", 5) != 0) return false;
    const char *p = name + 5;
    if (!*p || strlen(p) > 19) return false;
    uint64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (step) *step = v;
    return true;
}

int ck_path(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return gr_seterr(GR_EINVAL, "path %s/%s is too long", dir, name);
    return GR_OK;
}

void ck_dirname(const char *dir, char *buf, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    while (n > 0 && dir[n - 1] != '/') n--;
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0) {
        snprintf(buf, cap, ".");
        return;
    }
    snprintf(buf, cap, "%.*s", (int)n, dir);
}

int ck_mkdir(const char *dir)
{
    if (mkdir(dir, 0755) == 0) return GR_OK;
    if (errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return GR_OK;
        return gr_seterr(GR_EEXIST, "%s exists and is not a directory", dir);
    }
    return gr_seterr(GR_EIO, "cannot create directory %s: %s", dir, strerror(errno));
}

int ck_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return GR_OK;
        return gr_seterr(GR_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    }
    int rc = GR_OK;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (ck_path(path, sizeof path, dir, e->d_name) != GR_OK) {
            rc = GR_EINVAL;
            continue;
        }
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            int r = ck_rmtree(path);
            if (r != GR_OK) rc = r;
        } else if (unlink(path) != 0 && errno != ENOENT) {
            rc = gr_seterr(GR_EIO, "cannot remove %s: %s", path, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(dir) != 0 && errno != ENOENT && rc == GR_OK)
        rc = gr_seterr(GR_EIO, "cannot remove directory %s: %s", dir, strerror(errno));
    return rc;
}

/* Names the first top-level field whose JSON differs, so a refused restore says what to fix
 * ("field 'dim': checkpoint 16, table 32") rather than only "specs differ". */
void ck_spec_diff(const gr_table_spec *ckpt, const gr_table_spec *table, char *buf, size_t cap)
{
    snprintf(buf, cap, "specs differ");
    char *ja = gr_table_spec_to_json(ckpt), *jb = gr_table_spec_to_json(table);
    cJSON *a = ja ? cJSON_Parse(ja) : NULL, *b = jb ? cJSON_Parse(jb) : NULL;
    if (a && b) {
        bool found = false;
        const cJSON *ia;
        cJSON_ArrayForEach(ia, a)
        {
            const cJSON *ib = cJSON_GetObjectItemCaseSensitive(b, ia->string);
            char *pa = cJSON_PrintUnformatted(ia);
            char *pb = ib ? cJSON_PrintUnformatted(ib) : NULL;
            if (pa && (!pb || strcmp(pa, pb) != 0)) {
                snprintf(buf, cap, "field '%s': checkpoint %s, table %s", ia->string, pa,
                         pb ? pb : "(absent)");
                found = true;
            }
            free(pa);
            free(pb);
            if (found) break;
        }
        if (!found) {
            /* Identical JSON but gr_table_spec_equal said no: print both for the record. */
            snprintf(buf, cap, "checkpoint %s, table %s", ja, jb);
        }
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(ja);
    free(jb);
}

/* ---- opening files of a checkpoint directory ---- */

int gr_ckpt_open_regular(const char *path, int *fd_out, uint64_t *size)
{
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
     * changes nothing for a regular file, which is all this returns. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT) return gr_seterr(GR_ENOENT, "%s: missing", path);
        return gr_seterr(GR_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return gr_seterr(GR_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return gr_seterr(GR_ECORRUPT, "%s is not a regular file (a FIFO, device or directory "
                         "cannot be part of a checkpoint)", path);
    }
    *fd_out = fd;
    *size = (uint64_t)st.st_size;
    return GR_OK;
}

int gr_ckpt_read_small(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    int fd;
    uint64_t size;
    int rc = gr_ckpt_open_regular(path, &fd, &size);
    if (rc) return rc;
    if (size > max) {
        close(fd);
        return gr_seterr(GR_ETOOBIG, "%s is %" PRIu64 " bytes, over the %zu-byte limit for it",
                         path, size, max);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        return gr_seterr(GR_ENOMEM, "cannot allocate %" PRIu64 " bytes for %s", size, path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, (size_t)size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(buf);
        return gr_seterr(GR_EIO, "short read on %s (%zu of %" PRIu64 " bytes)", path, got, size);
    }
    buf[got] = '\0';
    *out = buf;
    if (len) *len = got;
    return GR_OK;
}

/* ---- the row check the writer and the loader share ---- */

int ck_check_row(const char *where, const char *table, uint64_t key, const float *w,
                 uint32_t dim, bool f16, const float *state, uint32_t nstate)
{
    /* 65520 is the smallest float that rounds to an f16 inf. Branch-free first pass. */
    const float wlimit = f16 ? 65520.0f : INFINITY;
    uint32_t ok = 1;
    for (uint32_t i = 0; i < dim; i++) ok &= (uint32_t)(fabsf(w[i]) < wlimit);
    for (uint32_t i = 0; i < nstate; i++) ok &= (uint32_t)isfinite(state[i]);
    if (ok) return GR_OK;
    for (uint32_t i = 0; i < dim; i++)
        if (!(fabsf(w[i]) < wlimit))
            return gr_seterr(GR_ECORRUPT,
                             "%s: table '%s', row of key %" PRIu64 ": weight element %u is %g, "
                             "not finite%s", where, table, key, i, (double)w[i],
                             f16 && isfinite(w[i]) ? " in half precision" : "");
    for (uint32_t i = 0; i < nstate; i++)
        if (!isfinite(state[i]))
            return gr_seterr(GR_ECORRUPT,
                             "%s: table '%s', row of key %" PRIu64 ": optimizer state element %u "
                             "is %g, not finite", where, table, key, i, (double)state[i]);
    return GR_OK;
}

uint32_t ck_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : n > 1024 ? 1024u : (uint32_t)n;
}
