/* Whole-file reads and atomic writes (temporary name, fsync, rename, fsync of the directory),
 * and small parsing helpers. */
#include "granary/core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int gr_read_file(const char *path, char **out, size_t *len_out)
{
    /* Opened without blocking and checked to be a regular file of bounded size before a byte
     * is read: a FIFO or a device named as a config or secret file must fail, not hang the
     * process or fill its memory (the same rules as checkpoint metadata, docs/operations.md). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return gr_seterr(errno == ENOENT ? GR_ENOENT : GR_EIO, "cannot open %s: %s", path,
                         strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return gr_seterr(GR_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return gr_seterr(GR_EINVAL, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > GR_READ_FILE_MAX) {
        close(fd);
        return gr_seterr(GR_ETOOBIG, "%s has %lld bytes; files read whole may have at most %llu",
                         path, (long long)st.st_size, (unsigned long long)GR_READ_FILE_MAX);
    }
    size_t sz = (size_t)st.st_size;
    char *buf = malloc(sz + 1);
    if (!buf) {
        close(fd);
        return gr_seterr(GR_ENOMEM, "cannot allocate %zu bytes for %s", sz, path);
    }
    size_t got = 0;
    while (got < sz) {
        ssize_t r = read(fd, buf + got, sz - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != sz) {
        free(buf);
        return gr_seterr(GR_EIO, "short read on %s", path);
    }
    buf[sz] = '\0';
    *out = buf;
    if (len_out) *len_out = sz;
    return GR_OK;
}

int gr_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return gr_seterr(GR_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return gr_seterr(GR_EIO, "fsync of directory %s failed: %s", dir, strerror(errno));
    return GR_OK;
}

int gr_write_file_atomic(const char *path, const void *data, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    char *dcopy = strdup(path);
    if (!tmp || !dcopy) {
        free(tmp);
        free(dcopy);
        return gr_seterr(GR_ENOMEM, "out of memory writing %s", path);
    }
    snprintf(tmp, plen + 32, "%s.tmp.%d", path, (int)getpid());
    int rc = GR_OK;
    /* A fresh file, never whatever already has the name (a FIFO there would block the open). */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = gr_seterr(GR_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            rc = gr_seterr(GR_EIO, "write to %s failed: %s", tmp, strerror(errno));
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (rc == GR_OK && fsync(fd) != 0)
        rc = gr_seterr(GR_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
    close(fd);
    if (rc == GR_OK && rename(tmp, path) != 0)
        rc = gr_seterr(GR_EIO, "rename %s -> %s failed: %s", tmp, path, strerror(errno));
    if (rc != GR_OK) unlink(tmp);
    else rc = gr_fsync_dir(dirname(dcopy));
out:
    free(tmp);
    free(dcopy);
    return rc;
}

int gr_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return gr_seterr(GR_EINVAL, "empty size");
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return gr_seterr(GR_EINVAL, "bad size '%s'", s);
    uint64_t mul = 1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    case 't': case 'T': mul = 1ull << 40; end++; break;
    default: return gr_seterr(GR_EINVAL, "bad size suffix in '%s' (use k, M, G or T)", s);
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return gr_seterr(GR_EINVAL, "trailing characters in size '%s'", s);
    if (v > UINT64_MAX / mul) return gr_seterr(GR_EINVAL, "size '%s' overflows", s);
    *out = v * mul;
    return GR_OK;
}
