/* libFuzzer target for the Criteo TSV reader: the input is a whole file. Every line goes through
 * gr_criteo_parse_line, and the file through the streaming reader (small blocks, with and
 * without parser threads, lenient and strict); both must agree on how many examples are good. */
#include "granary/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t count_good_lines(const uint8_t *data, size_t size)
{
    float label, dense[GR_CRITEO_DENSE];
    uint64_t ids[GR_CRITEO_SPARSE];
    size_t good = 0, start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || data[i] == '\n') {
            size_t len = i - start;
            const char *line = (const char *)data + start;
            if (len > 0 && !(len == 1 && line[0] == '\r') &&
                gr_criteo_parse_line(line, len, &label, dense, ids) == GR_OK) {
                if (!(label == 0.0f || label == 1.0f)) abort();
                good++;
            }
            start = i + 1;
        }
    }
    return good;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t good = count_good_lines(data, size);
    int fd = memfd_create("fuzz_criteo", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    for (int mode = 0; mode < 3; mode++) {
        gr_criteo_opts o;
        gr_criteo_opts_default(&o);
        o.batch = 7;
        o.block_bytes = 64;
        o.threads = mode == 1 ? 2 : 0;
        o.strict = mode == 2;
        o.log_bad = 0;
        gr_log_set_level(GR_LOG_ERROR);
        gr_criteo_reader *r;
        if (gr_criteo_open(path, &o, &r) != GR_OK) continue;
        gr_batch b;
        if (gr_batch_init(&b, 7) != GR_OK) {
            gr_criteo_close(r);
            break;
        }
        size_t examples = 0;
        int rc;
        while ((rc = gr_criteo_next(r, &b)) == GR_OK && b.n > 0) examples += b.n;
        /* Lenient readers return exactly the lines the line parser accepts. */
        if (!o.strict && rc == GR_OK && examples != good) abort();
        if (o.strict && rc == GR_OK && examples != good) abort();
        gr_batch_fini(&b);
        gr_criteo_close(r);
    }
    close(fd);
    return 0;
}
