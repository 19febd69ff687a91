/* gr_ckpt_verify: reads every byte of a checkpoint (and its chain) and checks it against the
 * manifest: sizes, whole-file checksums, every section checksum, decompression, table specs
 * and row counts. The first failure's message says which file and what is wrong. */
#include "ckpt/ckpt_internal.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include <xxhash.h>

static int verify_file(const char *dir, const gr_ckpt_manifest *m, uint32_t fi,
                       gr_ckpt_verify_stats *st)
{
    ck_reader r;
    int rc = ck_open_checked(&r, dir, m, fi);
    if (rc != GR_OK) return rc;
    XXH3_state_t *hs = XXH3_createState();
    uint64_t *rows = calloc(m->ntables ? m->ntables : 1, sizeof *rows);
    uint64_t *keys = calloc(m->ntables ? m->ntables : 1, sizeof *keys);
    unsigned char *buf = NULL;
    size_t cap = 0;
    char *endj = NULL;
    ck_end_table *et = NULL;
    if (!hs || !rows || !keys) {
        rc = gr_seterr(GR_ENOMEM, "out of memory");
        goto out;
    }
    XXH3_64bits_reset(hs);
    XXH3_64bits_update(hs, &r.hdr, sizeof r.hdr);
    r.hash = hs;
    ck_section s;
    int n;
    while ((n = ck_reader_next(&r, &s)) == 1) {
        rc = ck_reader_payload(&r, &s, &buf, &cap);
        if (rc != GR_OK) goto out;
        st->sections++;
        if (s.type == CK_SEC_TABLE) {
            rc = ck_reader_table(&r, &s, buf);
            if (rc != GR_OK) goto out;
            const gr_table_spec *fs = &r.tables[s.table].spec;
            if (!gr_table_spec_equal(&m->tables[s.table], fs)) {
                char d[512];
                ck_spec_diff(&m->tables[s.table], fs, d, sizeof d);
                rc = gr_seterr(GR_ECORRUPT, "%s: table %u ('%s') differs from the manifest: %s",
                               r.path, s.table, fs->name, d);
                goto out;
            }
        } else if (s.type == CK_SEC_ROWS) {
            rows[s.table] += s.count;
            st->rows += s.count;
        } else if (s.type == CK_SEC_KEYS) {
            keys[s.table] += s.count;
            st->keys += s.count;
        } else if (s.type == CK_SEC_END) {
            endj = malloc(s.raw_len + 1);
            if (!endj) {
                rc = gr_seterr(GR_ENOMEM, "out of memory");
                goto out;
            }
            memcpy(endj, buf, s.raw_len);
            endj[s.raw_len] = '\0';
        }
    }
    if (n < 0) {
        rc = n;
        goto out;
    }
    if (XXH3_64bits_digest(hs) != r.tail.content_checksum) {
        rc = gr_seterr(GR_ECORRUPT, "%s: whole-file checksum mismatch (corrupt data)", r.path);
        goto out;
    }
    rc = endj ? ck_end_parse(endj, m->ntables, &et) : gr_seterr(GR_ECORRUPT, "no end section");
    if (rc != GR_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        rc = gr_seterr(rc, "%s: %s", r.path, msg);
        goto out;
    }
    for (size_t t = 0; t < m->ntables; t++) {
        const gr_ckpt_manifest_file *f = &m->files[fi];
        if (rows[t] != f->rows[t] || rows[t] != et[t].rows || keys[t] != f->keys[t] ||
            keys[t] != et[t].keys) {
            rc = gr_seterr(GR_ECORRUPT, "%s: table '%s' holds %llu rows and %llu keys, the "
                           "manifest says %llu and %llu", r.path, m->tables[t].name,
                           (unsigned long long)rows[t], (unsigned long long)keys[t],
                           (unsigned long long)f->rows[t], (unsigned long long)f->keys[t]);
            goto out;
        }
    }
    st->files++;
    st->bytes += r.size;
out:
    XXH3_freeState(hs);
    free(rows);
    free(keys);
    free(buf);
    free(endj);
    free(et);
    ck_reader_close(&r);
    return rc;
}

/* The metadata files beside a manifest (the servers' user.json and dense.json) are read whole
 * too, with the loader's size and regular-file checks, so one the loader would refuse fails
 * here rather than at load. */
static int verify_side_files(const char *dir, gr_ckpt_verify_stats *st)
{
    DIR *d = opendir(dir);
    if (!d) return gr_seterr(GR_EIO, "cannot list %s", dir);
    int rc = GR_OK;
    struct dirent *e;
    while (rc == GR_OK && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".json") || !strcmp(e->d_name, "manifest.json"))
            continue;
        char fp[4096], *txt = NULL;
        size_t len = 0;
        rc = ck_path(fp, sizeof fp, dir, e->d_name);
        if (rc == GR_OK) rc = gr_ckpt_read_small(fp, GR_CKPT_META_MAX, &txt, &len);
        if (rc == GR_OK) {
            st->files++;
            st->bytes += len;
        }
        free(txt);
    }
    closedir(d);
    return rc;
}

/* A part (e.g. a shard's dense parameters) is a checkpoint of its own in a subdirectory,
 * verified like the main one. A missing part is an incomplete checkpoint. */
static int verify_part(const char *dir, const char *part, gr_ckpt_verify_stats *st)
{
    char sub[4096];
    int rc = ck_path(sub, sizeof sub, dir, part);
    if (rc != GR_OK) return rc;
    struct stat sb;
    if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return gr_seterr(GR_ENOENT, "%s: incomplete checkpoint: part %s is missing", dir, part);
    gr_ckpt_verify_stats ps;
    rc = gr_ckpt_verify(sub, false, &ps);
    if (rc != GR_OK) return rc;
    st->files += ps.files;
    st->bytes += ps.bytes;
    st->sections += ps.sections;
    st->rows += ps.rows;
    st->keys += ps.keys;
    return GR_OK;
}

int gr_ckpt_verify(const char *dir, bool chain, gr_ckpt_verify_stats *stats)
{
    gr_ckpt_verify_stats local;
    gr_ckpt_verify_stats *st = stats ? stats : &local;
    memset(st, 0, sizeof *st);
    ck_chain *c;
    int rc = ck_chain_read(dir, chain, &c);
    if (rc != GR_OK) return rc;
    for (size_t k = 0; k < c->len && rc == GR_OK; k++) {
        for (uint32_t f = 0; f < c->m[k]->map.shards && rc == GR_OK; f++)
            rc = verify_file(c->dir[k], c->m[k], f, st);
        for (size_t p = 0; p < c->m[k]->nparts && rc == GR_OK; p++)
            rc = verify_part(c->dir[k], c->m[k]->parts[p], st);
        if (rc == GR_OK) rc = verify_side_files(c->dir[k], st);
        if (rc == GR_OK) st->checkpoints++;
    }
    ck_chain_free(c);
    return rc;
}
