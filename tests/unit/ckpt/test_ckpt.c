/* Unit tests for ckpt: bitwise round trips of every optimizer's state, M->N restores, refusal
 * of truncated, corrupted, incomplete and mismatched checkpoints, delta chains (including
 * deleted rows and failed saves), a save killed mid-way, retention, exports, verify and the
 * manifest parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "granary/ckpt.h"

/* ---- helpers ---- */

static char g_tmp[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/gr-ckpt-test-XXXXXX");
    assert_non_null(mkdtemp(g_tmp));
    return 0;
}

static int teardown_tmp(void **state)
{
    (void)state;
    ck_rmtree(g_tmp);
    return 0;
}

static void pathf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pathf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void spec_for(gr_table_spec *sp, const char *name, uint32_t dim, gr_opt_kind opt,
                     gr_dtype dtype)
{
    gr_table_spec_default(sp, name, dim);
    sp->dtype = dtype;
    sp->seed = 11;
    sp->init.kind = GR_INIT_UNIFORM;
    sp->init.low = -0.05f;
    sp->init.high = 0.05f;
    sp->opt.kind = opt;
    sp->opt.lr = 0.05f;
    sp->opt.initial_accumulator = 0.1f;
    sp->opt.l1 = 0.01f;
    sp->opt.l2 = 0.02f;
    sp->partitions = 16;
}

static gr_table *make_table(const gr_table_spec *sp)
{
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(sp, &t), GR_OK);
    return t;
}

/* Creates keys (lookups) and applies `rounds` random gradients to each. */
static void train(gr_table *t, const uint64_t *keys, size_t n, int rounds, uint64_t seed)
{
    uint32_t dim = gr_table_get_spec(t)->dim;
    float *buf = malloc(n * dim * sizeof *buf);
    gr_rng r;
    gr_rng_seed(&r, seed);
    assert_int_equal(gr_table_lookup(t, keys, n, buf, 0), GR_OK);
    for (int k = 0; k < rounds; k++) {
        for (size_t i = 0; i < n * dim; i++) buf[i] = (float)(gr_rng_uniform(&r) - 0.5);
        assert_int_equal(gr_table_apply(t, keys, n, buf), GR_OK);
    }
    free(buf);
}

typedef struct rowcopy {
    size_t n, cap;
    uint64_t *keys;
    float *w, *s;
    gr_row_meta *m;
    uint32_t dim, sf;
} rowcopy;

static int copy_cb(void *ctx, uint64_t key, const float *w, const float *s, const gr_row_meta *m)
{
    rowcopy *c = ctx;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->keys = realloc(c->keys, c->cap * 8);
        c->w = realloc(c->w, c->cap * c->dim * 4);
        c->m = realloc(c->m, c->cap * sizeof *c->m);
        if (c->sf) c->s = realloc(c->s, c->cap * c->sf * 4);
    }
    c->keys[c->n] = key;
    memcpy(c->w + c->n * c->dim, w, c->dim * 4);
    if (c->sf) memcpy(c->s + c->n * c->sf, s, c->sf * 4);
    c->m[c->n] = *m;
    c->n++;
    return 0;
}

/* Every row of t, as the scan sees it. */
static rowcopy snapshot(gr_table *t)
{
    rowcopy c = {0};
    c.dim = gr_table_get_spec(t)->dim;
    c.sf = gr_table_state_floats(gr_table_get_spec(t));
    assert_int_equal(gr_table_scan(t, copy_cb, &c), 0);
    return c;
}

static void rowcopy_free(rowcopy *c)
{
    free(c->keys);
    free(c->w);
    free(c->s);
    free(c->m);
    memset(c, 0, sizeof *c);
}

/* Asserts that every row of the snapshot is in t, bitwise equal (weights, state, meta). With
 * with_state false only weights are compared (exports). */
static void expect_rows(gr_table *t, const rowcopy *c, bool with_state)
{
    size_t n = c->n;
    if (!n) return;
    float *w = malloc(n * c->dim * 4);
    float *s = c->sf ? malloc(n * c->sf * 4) : NULL;
    gr_row_meta *m = malloc(n * sizeof *m);
    bool *found = malloc(n);
    assert_int_equal(gr_table_get(t, c->keys, n, w, with_state ? s : NULL, m, found), GR_OK);
    for (size_t i = 0; i < n; i++) {
        if (!found[i]) fail_msg("key %llu missing after restore", (unsigned long long)c->keys[i]);
        if (memcmp(w + i * c->dim, c->w + i * c->dim, c->dim * 4) != 0)
            fail_msg("key %llu: weights differ", (unsigned long long)c->keys[i]);
        if (with_state) {
            if (c->sf && memcmp(s + i * c->sf, c->s + i * c->sf, c->sf * 4) != 0)
                fail_msg("key %llu: optimizer state differs", (unsigned long long)c->keys[i]);
            if (memcmp(&m[i], &c->m[i], sizeof m[i]) != 0)
                fail_msg("key %llu: metadata differs", (unsigned long long)c->keys[i]);
        }
    }
    free(w);
    free(s);
    free(m);
    free(found);
}

static uint64_t rows_of(gr_table *t)
{
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    return st.rows;
}

static uint64_t *seq_keys(size_t n, uint64_t start, uint64_t stride)
{
    uint64_t *k = malloc(n * 8);
    for (size_t i = 0; i < n; i++) k[i] = start + i * stride;
    return k;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* Offset of the payload of the idx-th section of the given type in a shard file. */
static uint64_t section_payload(const char *path, uint16_t type, int idx)
{
    ck_reader r;
    assert_int_equal(ck_reader_open(&r, path, 0), GR_OK);
    ck_section s;
    uint64_t off = 0;
    unsigned char *buf = NULL;
    size_t cap = 0;
    int n;
    while ((n = ck_reader_next(&r, &s)) == 1) {
        if (s.type == CK_SEC_TABLE) {
            assert_int_equal(ck_reader_payload(&r, &s, &buf, &cap), GR_OK);
            assert_int_equal(ck_reader_table(&r, &s, buf), GR_OK);
        }
        if (s.type == type && idx-- == 0) {
            off = r.payload_off;
            break;
        }
    }
    free(buf);
    ck_reader_close(&r);
    assert_true(off > 0);
    return off;
}

/* ---- tests ---- */

static void test_f16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gr_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(gr_f16_to_f32(gr_f32_to_f16(f))));
            continue;
        }
        assert_int_equal(gr_f32_to_f16(f), h);
    }
    assert_true(gr_f16_to_f32(gr_f32_to_f16(1.0f)) == 1.0f);
    assert_true(gr_f16_to_f32(gr_f32_to_f16(65520.0f)) == INFINITY); /* rounds up to inf */
    assert_true(gr_f16_to_f32(gr_f32_to_f16(1.0f + 1.0f / 4096)) == 1.0f); /* tie to even */
    assert_true(gr_f16_to_f32(gr_f32_to_f16(1e-8f)) == 0.0f);
}

static void test_names_and_maps(void **state)
{
    (void)state;
    char n[GR_CKPT_NAME_MAX];
    gr_ckpt_name(42, n);
    assert_string_equal(n, "step-000000000042");
    gr_ckpt_shard_file_name(1, 4, n);
    assert_string_equal(n, "shard-00001-of-00004.gck");
    gr_ckpt_slot_map m;
    assert_int_equal(gr_ckpt_slot_map_default(&m, 3), GR_OK);
    assert_int_equal(m.owner[0], 0);
    assert_int_equal(m.owner[5461], 0); /* 5461*3/16384 = 0.99 */
    assert_int_equal(m.owner[5462], 1);
    assert_int_equal(m.owner[GR_SLOTS - 1], 2);
    assert_int_equal(gr_ckpt_slot_map_validate(&m), GR_OK);
    m.owner[7] = 3;
    assert_int_equal(gr_ckpt_slot_map_validate(&m), GR_EINVAL);
    assert_int_equal(gr_ckpt_slot_map_default(&m, 0), GR_EINVAL);
}

/* Full save and restore of one table per optimizer and dtype: every byte comes back. */
static void roundtrip_one(gr_opt_kind opt, gr_dtype dtype, uint32_t dim, int zstd)
{
    gr_table_spec sp;
    spec_for(&sp, "emb", dim, opt, dtype);
    gr_table *t = make_table(&sp);
    size_t n = 1500;
    uint64_t *keys = seq_keys(n, 1000, 7919);
    train(t, keys, n, 3, 5 + (uint64_t)opt);
    gr_table_set_clock(t, 77); /* metadata must come back as it was */
    train(t, keys, 100, 1, 9);
    rowcopy before = snapshot(t);
    assert_int_equal(before.n, n);

    char root[512];
    pathf(root, sizeof root, "%s/rt-%d-%d-%d", g_tmp, (int)opt, (int)dtype, zstd);
    gr_ckpt_saver_opts so = {0, 1, false, 0, zstd, 0};
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &sv), GR_OK);
    char name[GR_CKPT_NAME_MAX];
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 10, &t, 1, name, &fi), GR_OK);
    assert_string_equal(name, "step-000000000010");
    assert_int_equal(fi.rows, n);
    assert_int_equal(fi.kind, GR_CKPT_FULL);

    char dir[600];
    pathf(dir, sizeof dir, "%s/%s", root, name);
    gr_table *u = make_table(&sp);
    gr_ckpt_load_stats ls;
    assert_int_equal(gr_ckpt_load(dir, &u, 1, NULL, &ls), GR_OK);
    assert_int_equal(ls.rows_loaded, n);
    assert_int_equal(ls.checkpoints, 1);
    assert_int_equal(rows_of(u), n);
    expect_rows(u, &before, true);

    /* The manifest's checksum is XXH3-64 (gr_checksum) of the file before its trailer. */
    gr_ckpt_manifest *m;
    assert_int_equal(gr_ckpt_manifest_read(dir, &m), GR_OK);
    char fp[700];
    pathf(fp, sizeof fp, "%s/%s", dir, m->files[0].name);
    char *bytes;
    size_t len;
    assert_int_equal(gr_read_file(fp, &bytes, &len), GR_OK);
    assert_int_equal(len, m->files[0].size);
    assert_true(gr_checksum(bytes, len - CK_TAIL_SIZE) == m->files[0].checksum);
    free(bytes);
    assert_string_equal(m->compression, zstd ? "zstd" : "none");
    gr_ckpt_manifest_destroy(m);
    gr_ckpt_verify_stats vs;
    assert_int_equal(gr_ckpt_verify(dir, true, &vs), GR_OK);
    assert_int_equal(vs.rows, n);

    gr_ckpt_saver_destroy(sv);
    rowcopy_free(&before);
    gr_table_destroy(t);
    gr_table_destroy(u);
    free(keys);
}

static void test_roundtrip_every_optimizer(void **state)
{
    (void)state;
    const gr_opt_kind opts[] = {GR_OPT_SGD, GR_OPT_ADAGRAD, GR_OPT_ROWWISE_ADAGRAD, GR_OPT_ADAM,
                                GR_OPT_FTRL};
    for (size_t i = 0; i < 5; i++) {
        roundtrip_one(opts[i], GR_DTYPE_F32, 8, 0);
        roundtrip_one(opts[i], GR_DTYPE_F16, 6, 0); /* even: see the note in docs/checkpoints.md */
    }
    roundtrip_one(GR_OPT_ADAM, GR_DTYPE_F32, 16, 3);
    roundtrip_one(GR_OPT_ADAGRAD, GR_DTYPE_F16, 10, 1);
}

static void test_several_tables_and_empty(void **state)
{
    (void)state;
    gr_table_spec a, b, c;
    spec_for(&a, "user", 4, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    spec_for(&b, "item", 12, GR_OPT_FTRL, GR_DTYPE_F32);
    spec_for(&c, "empty", 3, GR_OPT_SGD, GR_DTYPE_F32);
    a.id = 1;
    b.id = 2;
    c.id = 3;
    gr_table *t[3] = {make_table(&a), make_table(&b), make_table(&c)};
    uint64_t *k1 = seq_keys(500, 1, 1), *k2 = seq_keys(300, 1u << 20, 3);
    train(t[0], k1, 500, 2, 1);
    train(t[1], k2, 300, 2, 2);
    rowcopy s0 = snapshot(t[0]), s1 = snapshot(t[1]);
    char dir[512];
    pathf(dir, sizeof dir, "%s/multi", g_tmp);
    gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = 0, .shards = 1, .step = 3};
    assert_int_equal(gr_ckpt_write_shard(dir, t, 3, &wo, NULL), GR_OK);
    /* Not committed yet: it does not exist for readers. */
    gr_table **u;
    size_t n;
    assert_int_equal(gr_ckpt_load_new(dir, NULL, &u, &n, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "incomplete checkpoint"));
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(dir, &co), GR_OK);
    assert_int_equal(gr_ckpt_commit(dir, &co), GR_EEXIST);
    assert_int_equal(gr_ckpt_load_new(dir, NULL, &u, &n, NULL), GR_OK);
    assert_int_equal(n, 3);
    assert_string_equal(gr_table_get_spec(u[1])->name, "item");
    assert_true(gr_table_spec_equal(gr_table_get_spec(u[1]), &b));
    expect_rows(u[0], &s0, true);
    expect_rows(u[1], &s1, true);
    assert_int_equal(rows_of(u[2]), 0);
    /* A subset of the tables loads too; an unknown target is refused. */
    gr_table *only = make_table(&b);
    assert_int_equal(gr_ckpt_load(dir, &only, 1, NULL, NULL), GR_OK);
    expect_rows(only, &s1, true);
    gr_table_spec x;
    spec_for(&x, "nosuch", 4, GR_OPT_SGD, GR_DTYPE_F32);
    gr_table *xt = make_table(&x);
    assert_int_equal(gr_ckpt_load(dir, &xt, 1, NULL, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no table 'nosuch'"));
    gr_ckpt_manifest *m;
    assert_int_equal(gr_ckpt_manifest_read(dir, &m), GR_OK);
    assert_int_equal(m->files[0].rows[0], 500);
    assert_int_equal(m->files[0].rows[1], 300);
    assert_int_equal(m->files[0].rows[2], 0);
    assert_int_equal(m->step, 3);
    gr_ckpt_manifest_destroy(m);
    for (size_t i = 0; i < n; i++) gr_table_destroy(u[i]);
    free(u);
    for (int i = 0; i < 3; i++) gr_table_destroy(t[i]);
    gr_table_destroy(only);
    gr_table_destroy(xt);
    rowcopy_free(&s0);
    rowcopy_free(&s1);
    free(k1);
    free(k2);
}

/* Writes an M-shard checkpoint of `total` keys (each on its slot's owner) into dir and returns
 * the snapshot of all rows. */
static rowcopy write_sharded(const char *dir, const gr_table_spec *sp, uint32_t M, size_t total,
                             int zstd)
{
    gr_ckpt_slot_map map;
    gr_ckpt_slot_map_default(&map, M);
    gr_table **src = calloc(M, sizeof *src);
    for (uint32_t i = 0; i < M; i++) src[i] = make_table(sp);
    uint64_t *keys = seq_keys(total, 17, 104729);
    for (size_t i = 0; i < total; i++) {
        gr_table *t = src[map.owner[gr_slot_of(keys[i])]];
        train(t, &keys[i], 1, 2, keys[i]);
    }
    rowcopy all = {0};
    all.dim = sp->dim;
    all.sf = gr_table_state_floats(sp);
    for (uint32_t i = 0; i < M; i++) {
        assert_int_equal(gr_table_scan(src[i], copy_cb, &all), 0);
        gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = i, .shards = M, .step = 100,
                                 .zstd_level = zstd};
        assert_int_equal(gr_ckpt_write_shard(dir, &src[i], 1, &wo, NULL), GR_OK);
        gr_table_destroy(src[i]);
    }
    gr_ckpt_commit_opts co = {M, &map, NULL};
    assert_int_equal(gr_ckpt_commit(dir, &co), GR_OK);
    free(src);
    free(keys);
    assert_int_equal(all.n, total);
    return all;
}

/* Restores onto N shards: every row lands exactly once, on its slot's owner, bitwise equal. */
static void check_restore_n(const char *dir, const gr_table_spec *sp, const rowcopy *all,
                            uint32_t N)
{
    gr_ckpt_slot_map map;
    gr_ckpt_slot_map_default(&map, N);
    uint64_t sum = 0;
    for (uint32_t j = 0; j < N; j++) {
        gr_table *t = make_table(sp);
        gr_ckpt_load_opts lo = {j, N, NULL, 0};
        assert_int_equal(gr_ckpt_load(dir, &t, 1, &lo, NULL), GR_OK);
        rowcopy mine = {0};
        mine.dim = all->dim;
        mine.sf = all->sf;
        for (size_t i = 0; i < all->n; i++) {
            if (map.owner[gr_slot_of(all->keys[i])] != j) continue;
            /* append row i */
            rowcopy one = {1, 1, &all->keys[i], &all->w[i * all->dim],
                           all->sf ? &all->s[i * all->sf] : NULL, &all->m[i], all->dim, all->sf};
            expect_rows(t, &one, true);
            mine.n++;
        }
        assert_int_equal(rows_of(t), mine.n); /* nothing else landed here */
        sum += rows_of(t);
        gr_table_destroy(t);
    }
    assert_int_equal(sum, all->n);
}

static void test_restore_m_to_n(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 6, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    const uint32_t pairs[][2] = {{1, 3}, {4, 2}, {3, 5}, {2, 2}, {5, 1}, {3, 7}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        char dir[512];
        pathf(dir, sizeof dir, "%s/mn-%u-%u", g_tmp, pairs[p][0], pairs[p][1]);
        rowcopy all = write_sharded(dir, &sp, pairs[p][0], 2000, p % 2);
        check_restore_n(dir, &sp, &all, pairs[p][1]);
        rowcopy_free(&all);
    }
}

static void test_reshard(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 6, GR_OPT_ADAM, GR_DTYPE_F16);
    sp.capacity = 100000; /* staging tables must not evict whatever the caps */
    char src[512], dst[512];
    pathf(src, sizeof src, "%s/rs-src", g_tmp);
    pathf(dst, sizeof dst, "%s/rs-dst", g_tmp);
    rowcopy all = write_sharded(src, &sp, 3, 1500, 0);
    assert_int_equal(gr_ckpt_reshard(src, dst, 5, 1), GR_OK);
    gr_ckpt_manifest *m;
    assert_int_equal(gr_ckpt_manifest_read(dst, &m), GR_OK);
    assert_int_equal(m->map.shards, 5);
    assert_int_equal(m->kind, GR_CKPT_FULL);
    assert_int_equal(m->step, 100);
    assert_true(gr_table_spec_equal(&m->tables[0], &sp));
    /* Each output file holds exactly its own slots' rows. */
    gr_ckpt_slot_map map5;
    gr_ckpt_slot_map_default(&map5, 5);
    for (uint32_t j = 0; j < 5; j++) {
        uint64_t want = 0;
        for (size_t i = 0; i < all.n; i++) want += map5.owner[gr_slot_of(all.keys[i])] == j;
        assert_int_equal(m->files[j].rows[0], want);
    }
    gr_ckpt_manifest_destroy(m);
    assert_int_equal(gr_ckpt_verify(dst, true, NULL), GR_OK);
    check_restore_n(dst, &sp, &all, 1);
    check_restore_n(dst, &sp, &all, 2);
    assert_int_equal(gr_ckpt_reshard(src, dst, 2, 0), GR_EEXIST);
    rowcopy_free(&all);
}

static void test_refuse_damaged(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 16, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    char dir[512], fp[700], mp[700];
    pathf(dir, sizeof dir, "%s/bad", g_tmp);
    /* 40000 rows x 264 bytes: about ten 1 MiB sections. */
    rowcopy all = write_sharded(dir, &sp, 2, 40000, 0);
    pathf(fp, sizeof fp, "%s/shard-00001-of-00002.gck", dir);
    pathf(mp, sizeof mp, "%s/manifest.json", dir);
    char keep[700];
    pathf(keep, sizeof keep, "%s.orig", fp);
    char cmd[2000];
    pathf(cmd, sizeof cmd, "cp %s %s", fp, keep);
    assert_int_equal(system(cmd), 0);
    gr_table *t = make_table(&sp);

    /* Corrupted: a byte flipped inside the third rows section. Rows are never inserted from
     * a section whose checksum fails: whatever was loaded before the failure is exact. */
    flip_byte(fp, section_payload(fp, CK_SEC_ROWS, 2) + 1000);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "shard-00001-of-00002.gck"));
    assert_non_null(strstr(gr_errmsg(), "payload checksum mismatch"));
    {
        /* every row present in t equals its source */
        size_t n = all.n;
        bool *found = malloc(n);
        float *w = malloc(n * all.dim * 4);
        assert_int_equal(gr_table_get(t, all.keys, n, w, NULL, NULL, found), GR_OK);
        size_t present = 0;
        for (size_t i = 0; i < n; i++) {
            if (!found[i]) continue;
            present++;
            assert_memory_equal(w + i * all.dim, all.w + i * all.dim, all.dim * 4);
        }
        assert_true(present < n);
        free(found);
        free(w);
    }
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "shard-00001-of-00002.gck"));

    /* A flipped byte in a section header. */
    pathf(cmd, sizeof cmd, "cp %s %s", keep, fp);
    assert_int_equal(system(cmd), 0);
    flip_byte(fp, section_payload(fp, CK_SEC_ROWS, 1) - 20);
    gr_table_destroy(t);
    t = make_table(&sp);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "section header checksum mismatch"));

    /* Truncated. */
    pathf(cmd, sizeof cmd, "cp %s %s", keep, fp);
    assert_int_equal(system(cmd), 0);
    uint64_t size = file_size(fp);
    assert_int_equal(truncate(fp, (off_t)(size - 5000)), 0);
    gr_table_destroy(t);
    t = make_table(&sp);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "shard-00001-of-00002.gck"));
    assert_non_null(strstr(gr_errmsg(), "truncated"));
    assert_int_equal(rows_of(t), 0); /* refused before anything was inserted */
    assert_int_equal(gr_ckpt_verify(dir, false, NULL), GR_ECORRUPT);

    /* A shard file missing. */
    assert_int_equal(unlink(fp), 0);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "shard-00001-of-00002.gck: missing"));
    assert_int_equal(rows_of(t), 0);
    /* ... but a target shard whose slots live only in the present file still loads (a restore
     * reads only the files it needs), and a restored file works again. */
    gr_table *half = make_table(&sp);
    gr_ckpt_load_opts lo0 = {0, 2, NULL, 0};
    assert_int_equal(gr_ckpt_load(dir, &half, 1, &lo0, NULL), GR_OK);
    assert_true(rows_of(half) > 0 && rows_of(half) < all.n);
    gr_table_destroy(half);
    pathf(cmd, sizeof cmd, "cp %s %s", keep, fp);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_OK);
    expect_rows(t, &all, true);

    /* A file replaced by another valid one (the manifest's checksum catches it). */
    char other[512], ofp[700];
    pathf(other, sizeof other, "%s/bad-other", g_tmp);
    rowcopy all2 = write_sharded(other, &sp, 2, 100, 0);
    pathf(ofp, sizeof ofp, "%s/shard-00001-of-00002.gck", other);
    pathf(cmd, sizeof cmd, "cp %s %s", ofp, fp);
    assert_int_equal(system(cmd), 0);
    gr_table_destroy(t);
    t = make_table(&sp);
    assert_true(gr_ckpt_load(dir, &t, 1, NULL, NULL) < 0);
    assert_non_null(strstr(gr_errmsg(), "shard-00001-of-00002.gck"));
    assert_int_equal(rows_of(t), 0);
    pathf(cmd, sizeof cmd, "cp %s %s", keep, fp);
    assert_int_equal(system(cmd), 0);

    /* Incomplete: no manifest. */
    char msave[720];
    pathf(msave, sizeof msave, "%s.bak", mp);
    assert_int_equal(rename(mp, msave), 0);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "incomplete checkpoint (no manifest.json)"));
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), GR_ENOENT);
    assert_int_equal(rename(msave, mp), 0);

    /* Mismatched spec: the message names the table and the field. */
    gr_table_spec s2 = sp;
    s2.dim = 8;
    gr_table *t2 = make_table(&s2);
    assert_int_equal(gr_ckpt_load(dir, &t2, 1, NULL, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "table 'emb'"));
    assert_non_null(strstr(gr_errmsg(), "field 'dim': checkpoint 16, table 8"));
    gr_table_destroy(t2);
    s2 = sp;
    s2.opt.kind = GR_OPT_ADAM;
    t2 = make_table(&s2);
    assert_int_equal(gr_ckpt_load(dir, &t2, 1, NULL, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "field 'optimizer'"));
    assert_int_equal(rows_of(t2), 0);
    gr_table_destroy(t2);

    /* A manifest edited by hand: garbage is refused with the field. */
    assert_int_equal(gr_write_file_atomic(mp, "{\"format\":\"granary-checkpoint\"}", 31), GR_OK);
    assert_int_equal(gr_ckpt_load(dir, &t, 1, NULL, NULL), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "manifest.json"));
    assert_non_null(strstr(gr_errmsg(), "'version'"));

    gr_table_destroy(t);
    rowcopy_free(&all);
    rowcopy_free(&all2);
}

static void test_deltas(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 4, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(3000, 5, 31);
    train(t, keys, 3000, 1, 1);
    char root[512];
    pathf(root, sizeof root, "%s/deltas", g_tmp);
    gr_ckpt_saver_opts so = {0, 1, true, 0, 0, 0};
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &sv), GR_OK);
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &t, 1, NULL, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_FULL);
    assert_int_equal(gr_table_dirty_count(t, 0), 0);

    /* Step 2: key 5 changes, 10 new keys, 1 deleted. */
    uint64_t k5 = keys[0], newk[10], gone = keys[1];
    for (int i = 0; i < 10; i++) newk[i] = 1000000 + (uint64_t)i;
    train(t, &k5, 1, 1, 2);
    train(t, newk, 10, 1, 3);
    size_t del;
    assert_int_equal(gr_table_delete(t, &gone, 1, &del), GR_OK);
    assert_int_equal(del, 1);
    rowcopy at2 = snapshot(t);
    float w5_2[4];
    assert_int_equal(gr_table_get(t, &k5, 1, w5_2, NULL, NULL, NULL), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 2, &t, 1, NULL, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    assert_int_equal(fi.rows, 11);   /* only the changed rows */
    assert_int_equal(fi.keys, 3009); /* and every live key */

    /* Step 3: key 5 changes again, another key deleted, one re-created. */
    train(t, &k5, 1, 1, 4);
    uint64_t gone2 = keys[2];
    assert_int_equal(gr_table_delete(t, &gone2, 1, &del), GR_OK);
    train(t, &gone, 1, 1, 5);
    rowcopy at3 = snapshot(t);
    assert_int_equal(gr_ckpt_saver_save(sv, 3, &t, 1, NULL, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    assert_int_equal(fi.rows, 2);

    char d1[600], d2[600], d3[600];
    pathf(d1, sizeof d1, "%s/step-000000000001", root);
    pathf(d2, sizeof d2, "%s/step-000000000002", root);
    pathf(d3, sizeof d3, "%s/step-000000000003", root);
    gr_ckpt_manifest *m;
    assert_int_equal(gr_ckpt_manifest_read(d3, &m), GR_OK);
    assert_int_equal(m->kind, GR_CKPT_DELTA);
    assert_string_equal(m->parent, "step-000000000002");
    gr_ckpt_manifest_destroy(m);

    /* Restore step 3: the chain full -> 2 -> 3 in order; key 5 has its step-3 value. */
    gr_table *u = make_table(&sp);
    gr_ckpt_load_stats ls;
    assert_int_equal(gr_ckpt_load(d3, &u, 1, NULL, &ls), GR_OK);
    assert_int_equal(ls.checkpoints, 3);
    assert_int_equal(rows_of(u), at3.n);
    expect_rows(u, &at3, true);
    bool found;
    float w[4];
    assert_int_equal(gr_table_get(u, &gone2, 1, w, NULL, NULL, &found), GR_OK);
    assert_false(found); /* deleted between 2 and 3: dropped by the live key set */
    assert_true(ls.rows_dropped >= 1);
    assert_int_equal(gr_table_get(u, &k5, 1, w, NULL, NULL, &found), GR_OK);
    assert_true(found);
    assert_true(memcmp(w, w5_2, sizeof w) != 0); /* not the step-2 value */
    gr_table_destroy(u);

    /* Restore step 2: the intermediate state. */
    u = make_table(&sp);
    assert_int_equal(gr_ckpt_load(d2, &u, 1, NULL, NULL), GR_OK);
    assert_int_equal(rows_of(u), at2.n);
    expect_rows(u, &at2, true);
    gr_table_destroy(u);

    /* A delta restores onto 3 shards too. */
    uint64_t sum = 0;
    for (uint32_t j = 0; j < 3; j++) {
        u = make_table(&sp);
        gr_ckpt_load_opts lo = {j, 3, NULL, 0};
        assert_int_equal(gr_ckpt_load(d3, &u, 1, &lo, NULL), GR_OK);
        sum += rows_of(u);
        gr_table_destroy(u);
    }
    assert_int_equal(sum, at3.n);

    /* Flattening the chain with reshard gives the same rows. */
    char flat[600];
    pathf(flat, sizeof flat, "%s/flat", g_tmp);
    assert_int_equal(gr_ckpt_reshard(d3, flat, 2, 0), GR_OK);
    u = make_table(&sp);
    assert_int_equal(gr_ckpt_load(flat, &u, 1, NULL, &ls), GR_OK);
    assert_int_equal(ls.checkpoints, 1);
    assert_int_equal(rows_of(u), at3.n);
    expect_rows(u, &at3, true);
    gr_table_destroy(u);

    /* Verify walks the chain; a missing parent is named. */
    gr_ckpt_verify_stats vs;
    assert_int_equal(gr_ckpt_verify(d3, true, &vs), GR_OK);
    assert_int_equal(vs.checkpoints, 3);
    assert_int_equal(vs.keys, 3009 + 3009);
    char d2b[620];
    pathf(d2b, sizeof d2b, "%s.moved", d2);
    assert_int_equal(rename(d2, d2b), 0);
    u = make_table(&sp);
    assert_int_equal(gr_ckpt_load(d3, &u, 1, NULL, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "needs its parent step-000000000002"));
    assert_int_equal(rows_of(u), 0);
    assert_int_equal(rename(d2b, d2), 0);
    gr_table_destroy(u);

    /* full_every bounds the chain. */
    gr_ckpt_saver_destroy(sv);
    rowcopy_free(&at2);
    rowcopy_free(&at3);
    gr_table_destroy(t);
    free(keys);
}

static void test_failed_save_forces_full(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 4, GR_OPT_ROWWISE_ADAGRAD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(2000, 1, 1);
    train(t, keys, 2000, 1, 1);
    char root[512];
    pathf(root, sizeof root, "%s/failsave", g_tmp);
    gr_ckpt_saver_opts so = {0, 1, true, 0, 0, 0};
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &sv), GR_OK);
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &t, 1, NULL, &fi), GR_OK);
    train(t, keys, 500, 1, 2); /* 500 dirty rows */
    assert_int_equal(gr_table_dirty_count(t, 0), 500);
    gr_ckpt_saver_set_fault(sv, 100);
    assert_int_equal(gr_ckpt_saver_save(sv, 2, &t, 1, NULL, &fi), GR_EIO);
    assert_non_null(strstr(gr_errmsg(), "injected failure"));
    assert_true(gr_table_dirty_count(t, 0) < 500); /* marks were consumed */
    char d2[600];
    pathf(d2, sizeof d2, "%s/step-000000000002", root);
    char latest[GR_CKPT_NAME_MAX];
    assert_int_equal(gr_ckpt_latest(root, latest, NULL), GR_OK);
    assert_string_equal(latest, "step-000000000001");
    train(t, keys + 1000, 10, 1, 3);
    rowcopy now = snapshot(t);
    /* The next save must be full, and it is. */
    assert_int_equal(gr_ckpt_saver_save(sv, 3, &t, 1, NULL, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_FULL);
    assert_int_equal(fi.rows, 2000);
    char d3[600];
    pathf(d3, sizeof d3, "%s/step-000000000003", root);
    gr_table *u = make_table(&sp);
    assert_int_equal(gr_ckpt_load(d3, &u, 1, NULL, NULL), GR_OK);
    expect_rows(u, &now, true);
    gr_table_destroy(u);
    /* And then deltas again. */
    train(t, keys, 3, 1, 4);
    assert_int_equal(gr_ckpt_saver_save(sv, 4, &t, 1, NULL, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    assert_int_equal(fi.rows, 3);

    /* A shard file written but never committed (another shard failed): the next write of
     * this shard is full, because the parent does not list our file. */
    gr_ckpt_saver_opts so2 = {0, 2, true, 0, 0, 0};
    gr_ckpt_saver *s2;
    assert_int_equal(gr_ckpt_saver_create(root, &so2, &s2), GR_OK);
    assert_int_equal(gr_ckpt_saver_write(s2, "step-000000000010", NULL, 10, &t, 1, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_FULL);
    train(t, keys, 3, 1, 5);
    assert_int_equal(gr_ckpt_saver_write(s2, "step-000000000011", "step-000000000010", 11, &t,
                                         1, &fi),
                     GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_FULL);
    /* Committed this time (with a partner shard file): the next one is a delta. */
    gr_table *other = make_table(&sp);
    gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = 1, .shards = 2, .step = 11};
    char d11[600];
    pathf(d11, sizeof d11, "%s/step-000000000011", root);
    assert_int_equal(gr_ckpt_write_shard(d11, &other, 1, &wo, NULL), GR_OK);
    gr_ckpt_commit_opts co = {2, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(d11, &co), GR_OK);
    train(t, keys, 3, 1, 6);
    assert_int_equal(gr_ckpt_saver_write(s2, "step-000000000012", "step-000000000011", 12, &t,
                                         1, &fi),
                     GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    assert_int_equal(fi.rows, 3);
    /* A delta file needs a parent at commit. */
    char d12[600];
    pathf(d12, sizeof d12, "%s/step-000000000012", root);
    wo.step = 12;
    assert_int_equal(gr_ckpt_write_shard(d12, &other, 1, &wo, NULL), GR_OK);
    assert_int_equal(gr_ckpt_commit(d12, &co), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "no parent"));
    co.parent = "step-000000000011";
    assert_int_equal(gr_ckpt_commit(d12, &co), GR_OK);
    gr_ckpt_saver_destroy(s2);
    gr_table_destroy(other);

    gr_ckpt_saver_destroy(sv);
    rowcopy_free(&now);
    gr_table_destroy(t);
    free(keys);
}

static int count_entries(const char *dir, const char *substr)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strstr(e->d_name, substr)) n++;
    closedir(d);
    return n;
}

/* A child saving a large table is killed with SIGKILL mid-save: the previous checkpoint stays
 * the newest complete one and restores exactly; the leftovers are ignored, then cleaned. */
static void test_crash_mid_save(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 32, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    sp.partitions = 64;
    gr_table *t = make_table(&sp);
    size_t n = 150000;
    uint64_t *keys = seq_keys(n, 1, 1);
    train(t, keys, n, 1, 1);
    char root[512];
    pathf(root, sizeof root, "%s/crash", g_tmp);
    gr_ckpt_saver_opts so = {0, 1, false, 0, 0, 2};
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &sv), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &t, 1, NULL, NULL), GR_OK);
    rowcopy at1 = snapshot(t);
    train(t, keys, 1000, 1, 2);

    char d2[600];
    pathf(d2, sizeof d2, "%s/step-000000000002", root);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* zstd level 19 makes this save take seconds: it is killed long before it ends. */
        gr_ckpt_saver_opts co = {0, 1, false, 0, 19, 0};
        gr_ckpt_saver *cs;
        if (gr_ckpt_saver_create(root, &co, &cs) != GR_OK) _exit(2);
        gr_ckpt_saver_save(cs, 2, &t, 1, NULL, NULL);
        _exit(0);
    }
    /* Wait (bounded) until the child's temporary file has data, then kill it. */
    bool seen = false;
    for (int i = 0; i < 20000 && !seen; i++) {
        DIR *d = opendir(d2);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                if (!strstr(e->d_name, ".tmp.")) continue;
                char p[900];
                pathf(p, sizeof p, "%s/%s", d2, e->d_name);
                struct stat st;
                if (stat(p, &st) == 0 && st.st_size > 64 * 1024) seen = true;
            }
            closedir(d);
        }
        if (!seen) usleep(1000);
    }
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(seen);
    assert_true(WIFSIGNALED(status));

    char mp[700];
    pathf(mp, sizeof mp, "%s/manifest.json", d2);
    assert_false(exists(mp));
    assert_int_equal(count_entries(d2, ".tmp."), 1);
    char latest[GR_CKPT_NAME_MAX];
    uint64_t step;
    assert_int_equal(gr_ckpt_latest(root, latest, &step), GR_OK);
    assert_string_equal(latest, "step-000000000001");
    assert_int_equal(step, 1);
    gr_table *u = make_table(&sp);
    char d1[600];
    pathf(d1, sizeof d1, "%s/%s", root, latest);
    assert_int_equal(gr_ckpt_load(d1, &u, 1, NULL, NULL), GR_OK);
    assert_int_equal(rows_of(u), n);
    expect_rows(u, &at1, true);
    gr_table_destroy(u);
    assert_int_equal(gr_ckpt_load(d2, &t, 1, NULL, NULL), GR_ENOENT);

    /* Saving step 2 again starts over; a later save's retention removes what is left. */
    assert_int_equal(gr_ckpt_saver_save(sv, 2, &t, 1, NULL, NULL), GR_OK);
    assert_int_equal(count_entries(d2, ".tmp."), 0);
    char d3[600];
    pathf(d3, sizeof d3, "%s/step-000000000003", root);
    assert_int_equal(ck_mkdir(d3), GR_OK);
    char junk[700];
    pathf(junk, sizeof junk, "%s/shard-00000-of-00001.gck.tmp.999", d3);
    assert_int_equal(gr_write_file_atomic(junk, "x", 1), GR_OK);
    pathf(junk, sizeof junk, "%s/manifest.json.tmp.999", d2);
    assert_int_equal(gr_write_file_atomic(junk, "x", 1), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 4, &t, 1, NULL, NULL), GR_OK);
    /* keep 2: step 4 and 2 remain; 1 and the incomplete 3 are gone; 2's temp file too. */
    assert_false(exists(d1));
    assert_false(exists(d3));
    assert_true(exists(d2));
    assert_int_equal(count_entries(d2, ".tmp."), 0);
    gr_ckpt_saver_destroy(sv);
    rowcopy_free(&at1);
    gr_table_destroy(t);
    free(keys);
}

static void test_retention(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 2, GR_OPT_SGD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(100, 1, 1);
    char root[512];
    pathf(root, sizeof root, "%s/retain", g_tmp);
    gr_ckpt_saver_opts so = {0, 1, true, 3, 0, 2}; /* F D D F D D F ..., keep 2 */
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &sv), GR_OK);
    /* expected survivors after each step (bit i = step i+1) */
    const gr_ckpt_kind kinds[] = {GR_CKPT_FULL, GR_CKPT_DELTA, GR_CKPT_DELTA, GR_CKPT_FULL,
                                  GR_CKPT_DELTA, GR_CKPT_DELTA, GR_CKPT_FULL};
    const unsigned alive[] = {0x1, 0x3, 0x7, 0xf, 0x18, 0x38, 0x78};
    for (int s = 1; s <= 7; s++) {
        train(t, keys, 10 * (size_t)s, 1, (uint64_t)s);
        gr_ckpt_file_info fi;
        assert_int_equal(gr_ckpt_saver_save(sv, (uint64_t)s, &t, 1, NULL, &fi), GR_OK);
        assert_int_equal(fi.kind, kinds[s - 1]);
        for (int k = 1; k <= 7; k++) {
            char d[600];
            pathf(d, sizeof d, "%s/step-%012d", root, k);
            if (exists(d) != !!(alive[s - 1] & (1u << (k - 1))))
                fail_msg("after step %d: step %d %s", s, k, exists(d) ? "kept" : "deleted");
        }
        /* whatever is kept restores */
        char latest[GR_CKPT_NAME_MAX], d[600];
        assert_int_equal(gr_ckpt_latest(root, latest, NULL), GR_OK);
        pathf(d, sizeof d, "%s/%s", root, latest);
        rowcopy now = snapshot(t);
        gr_table *u = make_table(&sp);
        assert_int_equal(gr_ckpt_load(d, &u, 1, NULL, NULL), GR_OK);
        expect_rows(u, &now, true);
        gr_table_destroy(u);
        rowcopy_free(&now);
    }
    uint32_t deleted;
    assert_int_equal(gr_ckpt_retain(root, 1, &deleted), GR_OK);
    assert_int_equal(deleted, 3); /* steps 4..6: step 7 is full and needs none of them */
    gr_ckpt_saver_destroy(sv);
    gr_table_destroy(t);
    free(keys);
}

static void test_export(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 9, GR_OPT_ADAM, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(700, 3, 3);
    train(t, keys, 700, 2, 1);
    rowcopy all = snapshot(t);
    assert_int_equal(gr_table_dirty_count(t, 0), 700);
    /* A serving table: same name and dim, another optimizer. */
    gr_table_spec serve;
    spec_for(&serve, "emb", 9, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    for (int f16 = 0; f16 <= 1; f16++) {
        char dir[512];
        pathf(dir, sizeof dir, "%s/export-%d", g_tmp, f16);
        gr_ckpt_file_info fi;
        assert_int_equal(gr_ckpt_export(dir, &t, 1, 9, f16, 0, &fi), GR_OK);
        assert_int_equal(fi.rows, 700);
        /* key + weights only */
        assert_true(fi.size < 700 * (8 + 9 * (f16 ? 2 : 4)) + 4096);
        assert_int_equal(gr_table_dirty_count(t, 0), 700); /* exports leave marks alone */
        gr_ckpt_manifest *m;
        assert_int_equal(gr_ckpt_manifest_read(dir, &m), GR_OK);
        assert_int_equal(m->kind, GR_CKPT_EXPORT);
        assert_int_equal(m->weights_f16, f16);
        assert_int_equal(m->step, 9);
        gr_ckpt_manifest_destroy(m);
        gr_table *u = make_table(&serve);
        assert_int_equal(gr_ckpt_load(dir, &u, 1, NULL, NULL), GR_OK);
        rowcopy want = all;
        float *w16 = NULL;
        if (f16) {
            w16 = malloc(all.n * all.dim * 4);
            for (size_t i = 0; i < all.n * all.dim; i++)
                w16[i] = gr_f16_to_f32(gr_f32_to_f16(all.w[i]));
            want.w = w16;
        }
        expect_rows(u, &want, false);
        /* optimizer state is the initial one */
        float st[9];
        assert_int_equal(gr_table_get(u, keys, 1, NULL, st, NULL, NULL), GR_OK);
        for (int d = 0; d < 9; d++) assert_true(st[d] == serve.opt.initial_accumulator);
        free(w16);
        gr_table_destroy(u);
        gr_table_spec bad = serve;
        bad.dim = 8;
        u = make_table(&bad);
        assert_int_equal(gr_ckpt_load(dir, &u, 1, NULL, NULL), GR_EINVAL);
        gr_table_destroy(u);
        assert_int_equal(gr_ckpt_verify(dir, true, NULL), GR_OK);
    }
    rowcopy_free(&all);
    gr_table_destroy(t);
    free(keys);
}

static void test_manifest_parse(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 3, GR_OPT_SGD, GR_DTYPE_F32);
    char dir[512];
    pathf(dir, sizeof dir, "%s/mparse", g_tmp);
    rowcopy all = write_sharded(dir, &sp, 3, 50, 0);
    gr_ckpt_manifest *m;
    assert_int_equal(gr_ckpt_manifest_read(dir, &m), GR_OK);
    char *j1 = gr_ckpt_manifest_to_json(m);
    gr_ckpt_manifest *m2;
    assert_int_equal(gr_ckpt_manifest_parse(j1, strlen(j1), &m2), GR_OK);
    char *j2 = gr_ckpt_manifest_to_json(m2);
    assert_string_equal(j1, j2);
    assert_non_null(strstr(j1, "\"slot_map\":\t[[0, 5461, 0], [5462, 10922, 1], [10923, 16383, 2]]"));
    gr_ckpt_manifest_destroy(m2);
    free(j2);
    /* Damaged variants. */
    struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"version\":\t1", "\"version\":\t2", "version 2"},
        {"\"kind\":\t\"full\"", "\"kind\":\t\"fast\"", "unknown kind"},
        {"[5462, 10922, 1]", "[5463, 10922, 1]", "slot_map"},
        {"[10923, 16383, 2]", "[10923, 16382, 2]", "covers 16383"},
        {"\"shards\":\t3", "\"shards\":\t4", "shard 3 owns no slot"},
        {"\"shard\":\t1", "\"shard\":\t2", "out of order"},
        {"\"name\":\t\"shard-00001-of-00003.gck\"", "\"name\":\t\"../x\"", "plain name"},
        {"\"step\":\t100", "\"step\":\t-1", "'step'"},
        {"\"step\":\t100", "\"step\":\t1.5", "'step'"},
        {"\"compression\":\t\"none\"", "\"compression\":\t\"lz4\"", "compression"},
        {"\"parent\":\tnull", "\"parent\":\t\"step-1\"", "cannot have"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(j1, cases[i].from);
        if (!at) fail_msg("case %zu: '%s' not in manifest", i, cases[i].from);
        size_t pre = (size_t)(at - j1);
        char *bad = malloc(strlen(j1) + 64);
        sprintf(bad, "%.*s%s%s", (int)pre, j1, cases[i].to, at + strlen(cases[i].from));
        gr_ckpt_manifest *x = NULL;
        int rc = gr_ckpt_manifest_parse(bad, strlen(bad), &x);
        if (rc >= 0 || !strstr(gr_errmsg(), cases[i].msg))
            fail_msg("case %zu: rc %d, message '%s'", i, rc, gr_errmsg());
        assert_null(x);
        free(bad);
    }
    /* checksum must be 16 hex digits */
    char *c = strstr(j1, "\"checksum\":\t\"");
    assert_non_null(c);
    c[13] = 'z';
    assert_int_equal(gr_ckpt_manifest_parse(j1, strlen(j1), &m2), GR_ECORRUPT);
    assert_int_equal(gr_ckpt_manifest_parse("[]", 2, &m2), GR_ECORRUPT);
    assert_int_equal(gr_ckpt_manifest_parse("{", 1, &m2), GR_ECORRUPT);
    free(j1);
    gr_ckpt_manifest_destroy(m);
    rowcopy_free(&all);
}

/* A lookup thread keeps running while a save writes the table, and the save holds every row.
 * The thread brackets each lookup with two looks at the shard file being written (its
 * temporary name, <final>.tmp.<pid>, renamed once complete): a lookup counts when the same
 * temporary file is there before and after it. This counts progress, not latency, so a slow
 * machine cannot fail it, and it stays 0 if lookups wait while the file is written. */
typedef struct lookup_ctx {
    gr_table *t;
    atomic_int stop;
    atomic_uint during; /* lookups done while the shard file was being written */
    _Atomic(const char *) tmp_path; /* the save in flight's temporary file, or NULL */
    atomic_ullong calls;
    atomic_int err;
} lookup_ctx;

static bool tmp_ino(const char *path, ino_t *ino)
{
    struct stat st;
    if (!path || stat(path, &st) != 0) return false;
    *ino = st.st_ino;
    return true;
}

static void *lookup_main(void *arg)
{
    lookup_ctx *c = arg;
    gr_rng r;
    gr_rng_seed(&r, 3);
    float out[16 * 16];
    uint64_t keys[16];
    while (!atomic_load(&c->stop)) {
        for (int i = 0; i < 16; i++) keys[i] = 1 + gr_rng_next(&r) % 60000;
        const char *path = atomic_load(&c->tmp_path);
        ino_t a = 0, b = 0;
        bool before = tmp_ino(path, &a);
        if (gr_table_lookup(c->t, keys, 16, out, GR_LOOKUP_READONLY) != 0) atomic_store(&c->err, 1);
        if (before && tmp_ino(path, &b) && a == b) atomic_fetch_add(&c->during, 1);
        atomic_fetch_add(&c->calls, 1);
    }
    return NULL;
}

static void test_save_while_serving(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 16, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(60000, 1, 1);
    train(t, keys, 60000, 1, 1);
    lookup_ctx lc = {.t = t};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lookup_main, &lc), 0);
    char file[GR_CKPT_NAME_MAX];
    gr_ckpt_shard_file_name(0, 1, file);
    /* Save until lookups were seen inside a save (normally the first does): a loaded machine
     * may keep the lookup thread off the CPU for one short save, not for many. */
    const unsigned want = 3, max_saves = 30;
    unsigned saves = 0;
    gr_ckpt_file_info fi;
    while (saves < max_saves && atomic_load(&lc.during) < want) {
        char dir[512], tmp[1024], done[1024];
        pathf(dir, sizeof dir, "%s/serving-%u", g_tmp, saves);
        pathf(tmp, sizeof tmp, "%s/%s.tmp.%d", dir, file, (int)getpid());
        pathf(done, sizeof done, "%s/%s", dir, file);
        /* Wait until the lookup thread runs, so the save has a chance to overlap it. */
        for (uint64_t c0 = atomic_load(&lc.calls); atomic_load(&lc.calls) == c0;) sched_yield();
        atomic_store(&lc.tmp_path, tmp);
        gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = 0, .shards = 1, .step = 1};
        assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, &fi), GR_OK);
        atomic_store(&lc.tmp_path, NULL);
        assert_int_equal(fi.rows, 60000);
        unlink(done);
        saves++;
    }
    atomic_store(&lc.stop, 1);
    pthread_join(th, NULL);
    print_message("%u save(s) of 60000 rows (the last %.1f ms); %u of %llu lookups ran while "
                  "the shard file was written\n",
                  saves, fi.seconds * 1e3, atomic_load(&lc.during),
                  (unsigned long long)atomic_load(&lc.calls));
    assert_int_equal(atomic_load(&lc.err), 0);
    assert_true(atomic_load(&lc.during) >= want);
    gr_table_destroy(t);
    free(keys);
}

/* A 1 MiB writer buffer: full saves wait for the writer between row batches, delta
 * saves stop and resume their dirty scan many times; nothing is lost or duplicated. */
static void test_small_buffer(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 16, GR_OPT_ADAGRAD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    uint64_t *keys = seq_keys(50000, 3, 5);
    train(t, keys, 50000, 1, 1);
    char d1[512], d2[512];
    pathf(d1, sizeof d1, "%s/smallbuf-1", g_tmp);
    pathf(d2, sizeof d2, "%s/smallbuf-2", g_tmp);
    gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shards = 1, .step = 1, .buffer_mib = 1};
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_write_shard(d1, &t, 1, &wo, &fi), GR_OK);
    assert_int_equal(fi.rows, 50000);
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(d1, &co), GR_OK);
    train(t, keys + 10000, 25000, 1, 2); /* 25000 x 144 bytes: 3.4 MiB of changed rows */
    rowcopy now = snapshot(t);
    wo.kind = GR_CKPT_DELTA;
    wo.step = 2;
    assert_int_equal(gr_ckpt_write_shard(d2, &t, 1, &wo, &fi), GR_OK);
    assert_int_equal(fi.rows, 25000);
    assert_int_equal(fi.keys, 50000);
    assert_int_equal(gr_table_dirty_count(t, 0), 0);
    co.parent = "smallbuf-1";
    assert_int_equal(gr_ckpt_commit(d2, &co), GR_OK);
    gr_table *u = make_table(&sp);
    assert_int_equal(gr_ckpt_load(d2, &u, 1, NULL, NULL), GR_OK);
    assert_int_equal(rows_of(u), 50000);
    expect_rows(u, &now, true);
    assert_int_equal(gr_ckpt_verify(d2, true, NULL), GR_OK);
    gr_table_destroy(u);
    gr_table_destroy(t);
    rowcopy_free(&now);
    free(keys);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    gr_table_spec sp;
    spec_for(&sp, "emb", 2, GR_OPT_SGD, GR_DTYPE_F32);
    gr_table *t = make_table(&sp);
    char dir[512];
    pathf(dir, sizeof dir, "%s/args", g_tmp);
    gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = 2, .shards = 2};
    assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, NULL), GR_EINVAL);
    wo.shard = 0;
    wo.export_f16 = true;
    assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, NULL), GR_EINVAL);
    wo.export_f16 = false;
    wo.zstd_level = 99;
    assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, NULL), GR_EINVAL);
    gr_table *two[2] = {t, t};
    wo.zstd_level = 0;
    assert_int_equal(gr_ckpt_write_shard(dir, two, 2, &wo, NULL), GR_EINVAL);
    gr_ckpt_commit_opts co = {2, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(dir, &co), GR_ENOENT); /* shard 0 of 2 never written */
    assert_non_null(strstr(gr_errmsg(), "shard-00000-of-00002.gck: missing"));
    gr_ckpt_saver *sv;
    gr_ckpt_saver_opts so = {0, 2, false, 0, 0, 0};
    assert_int_equal(gr_ckpt_saver_create(dir, &so, &sv), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &t, 1, NULL, NULL), GR_EINVAL);
    assert_int_equal(gr_ckpt_saver_write(sv, "../x", NULL, 1, &t, 1, NULL), GR_EINVAL);
    gr_ckpt_saver_destroy(sv);
    gr_ckpt_saver_destroy(NULL);
    gr_ckpt_manifest_destroy(NULL);
    char name[GR_CKPT_NAME_MAX];
    assert_int_equal(gr_ckpt_latest(dir, name, NULL), GR_ENOENT);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_names_and_maps),
        cmocka_unit_test(test_roundtrip_every_optimizer),
        cmocka_unit_test(test_several_tables_and_empty),
        cmocka_unit_test(test_restore_m_to_n),
        cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_refuse_damaged),
        cmocka_unit_test(test_deltas),
        cmocka_unit_test(test_failed_save_forces_full),
        cmocka_unit_test(test_crash_mid_save),
        cmocka_unit_test(test_retention),
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_manifest_parse),
        cmocka_unit_test(test_save_while_serving),
        cmocka_unit_test(test_small_buffer),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
