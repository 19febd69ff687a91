/* gr_ckpt_verify: reads every byte of a checkpoint (and its chain) and checks it against the
 * manifest: sizes, whole-file checksums, every section checksum, decompression, table specs
 * and row counts. The first failure's message says which file and what is wrong. */
#include "ckpt/ckpt_internal.h"

#include <stdlib.h>
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
        if (rc == GR_OK) st->checkpoints++;
    }
    ck_chain_free(c);
    return rc;
}
