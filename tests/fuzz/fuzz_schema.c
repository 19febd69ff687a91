/* libFuzzer target for data schemas and the reader that follows them. The input is a schema
 * (JSON) and, after the first NUL byte, a data file. The schema must either be refused or
 * round-trip through gr_schema_to_json and gr_schema_clone unchanged; the file's lines go
 * through gr_schema_parse_line (its ids and bags must stay within the schema's bounds) and
 * the file through the streaming reader (small blocks, with and without parser threads),
 * which must return exactly the lines the line parser accepts. */
#include "granary/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t check_lines(const gr_schema *s, const uint8_t *data, size_t size)
{
    uint32_t nd = gr_schema_n_dense(s), ns = gr_schema_n_sparse(s), max = gr_schema_max_ids(s);
    float label, *dense = malloc((nd + 1) * sizeof *dense);
    uint64_t *ids = malloc((max + 1) * sizeof *ids);
    uint32_t *bags = malloc((ns + 1) * sizeof *bags);
    bool header = gr_schema_header(s);
    size_t good = 0, start = 0, line = 1;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n') continue;
        size_t len = i - start, n_ids = 0;
        const char *p = (const char *)data + start;
        bool skip = len == 0 || (len == 1 && p[0] == '\r') || (header && line == 1);
        if (!skip && gr_schema_parse_line(s, p, len, &label, dense, ids, bags, &n_ids) == GR_OK) {
            if (!(label == 0.0f || label == 1.0f) || n_ids > max) abort();
            size_t sum = 0;
            for (uint32_t k = 0; k < ns; k++) {
                if (bags[k] == 0) abort(); /* a bag is never empty */
                sum += bags[k];
            }
            if (sum != n_ids) abort();
            good++;
        }
        start = i + 1;
        line++;
    }
    free(dense);
    free(ids);
    free(bags);
    return good;
}

static void check_reader(const gr_schema *s, const uint8_t *data, size_t size, size_t good)
{
    int fd = memfd_create("fuzz_schema", 0);
    if (fd < 0) return;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    for (int mode = 0; mode < 2; mode++) {
        gr_criteo_opts o;
        gr_criteo_opts_default(&o);
        o.batch = 5;
        o.block_bytes = 64;
        o.threads = mode ? 2 : 0;
        o.schema = s;
        gr_criteo_reader *r;
        if (gr_criteo_open(path, &o, &r) != GR_OK) continue;
        gr_batch b;
        if (gr_batch_init_schema(&b, 5, s) != GR_OK) {
            gr_criteo_close(r);
            break;
        }
        size_t examples = 0;
        int rc;
        while ((rc = gr_criteo_next(r, &b)) == GR_OK && b.n > 0) {
            if (b.bag_off && b.bag_off[b.n * b.n_sparse] != b.n_ids) abort();
            examples += b.n;
        }
        if (rc == GR_OK && examples != good) abort();
        gr_batch_fini(&b);
        gr_criteo_close(r);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gr_log_set_level(GR_LOG_ERROR);
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    gr_schema *s = NULL;
    if (gr_schema_parse((const char *)data, jlen, &s) != GR_OK) return 0;
    char *txt = gr_schema_to_json(s);
    gr_schema *t = NULL, *c = NULL;
    if (!txt || gr_schema_parse(txt, strlen(txt), &t) != GR_OK || !gr_schema_equal(s, t)) abort();
    if (gr_schema_clone(s, &c) != GR_OK || !gr_schema_equal(s, c)) abort();
    free(txt);
    gr_schema_destroy(t);
    gr_schema_destroy(c);
    if (nul) {
        const uint8_t *file = nul + 1;
        size_t fsize = size - jlen - 1;
        check_reader(s, file, fsize, check_lines(s, file, fsize));
    }
    gr_schema_destroy(s);
    return 0;
}
