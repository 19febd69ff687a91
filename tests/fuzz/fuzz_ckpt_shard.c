/* libFuzzer target for the checkpoint shard file reader: the input is a whole shard file. It
 * runs through the restore path twice, once as restore runs it (every checksum checked) and
 * once with checksum checks off, so that mutations reach the header, section, table-spec,
 * decompression, row-view and END-summary decoders behind the checksums. Rows go into small
 * tables named like the seeds' ("user": dim 4 Adagrad, "item": dim 3 SGD f16). */
#include "ckpt/ckpt_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static gr_table *make(const char *name, uint32_t dim, gr_opt_kind opt, gr_dtype dtype)
{
    gr_table_spec sp;
    gr_table_spec_default(&sp, name, dim);
    sp.opt.kind = opt;
    sp.opt.lr = 0.05f;
    sp.dtype = dtype;
    sp.partitions = 4;
    sp.mem_limit = 8u << 20; /* a hostile file cannot make us allocate much */
    gr_table *t = NULL;
    if (gr_table_create(&sp, &t) != GR_OK) abort();
    return t;
}

static void run(int fd, size_t size, bool verify)
{
    ck_reader r;
    if (ck_reader_open_fd(&r, fd, size, "fuzz", verify) != GR_OK) return;
    /* Restore path: specs from the file must equal these tables' to load anything. */
    gr_table *t[2] = {make("user", 4, GR_OPT_ADAGRAD, GR_DTYPE_F32),
                      make("item", 3, GR_OPT_SGD, GR_DTYPE_F16)};
    gr_ckpt_load_stats st;
    memset(&st, 0, sizeof st);
    ck_apply_file(&r, t, 2, r.hdr.kind == GR_CKPT_EXPORT, &st);
    gr_table_destroy(t[0]);
    gr_table_destroy(t[1]);
    /* The summary commit and inspect read. */
    char *ej = NULL;
    if (ck_reader_end_json(&r, &ej) == GR_OK) {
        ck_end_table *et = NULL;
        if (ck_end_parse(ej, r.hdr.ntables, &et) == GR_OK) free(et);
        free(ej);
    }
    ck_reader_close(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) fd = memfd_create("fuzz_ckpt_shard", 0);
    if (fd < 0) abort();
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
    run(fd, size, true);
    run(fd, size, false);
    return 0;
}
