/* Checks of a command's paths before it starts, the clean stop on SIGINT/SIGTERM, and the
 * command line that continues a run (see guard.h). */
#include "cli/guard.h"
#include "granary/http.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t cap, const char *flag, const char *path, const char *why)
{
    snprintf(err, cap, "%s %s: %s", flag, path, why);
    return -1;
}

int gr_cli_check_input(const char *flag, const char *path, char *err, size_t cap)
{
    /* Without blocking: a FIFO named as the training file must not hang the check. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return fail(err, cap, flag, path, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st);
    close(fd);
    if (rc != 0) return fail(err, cap, flag, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return fail(err, cap, flag, path, "is a directory, not a file");
    if (!S_ISREG(st.st_mode)) return fail(err, cap, flag, path, "is not a regular file");
    return 0;
}

/* Creates and removes a file in dir: the only test of writability that holds for root and
 * for read-only or pseudo filesystems. */
static int probe_dir(const char *flag, const char *path, const char *dir, char *err, size_t cap)
{
    char probe[4096];
    int n = snprintf(probe, sizeof probe, "%s/.granary-probe.%d", dir, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof probe) return fail(err, cap, flag, path, "path too long");
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        char why[4400];
        snprintf(why, sizeof why, "cannot create a file in %s: %s", dir, strerror(errno));
        return fail(err, cap, flag, path, why);
    }
    close(fd);
    unlink(probe);
    return 0;
}

int gr_cli_check_output_file(const char *flag, const char *path, char *err, size_t cap)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return fail(err, cap, flag, path, "is a directory; name a file");
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0) {
        char why[4400];
        snprintf(why, sizeof why, "its directory %s does not exist", dir);
        return fail(err, cap, flag, path, why);
    }
    if (!S_ISDIR(st.st_mode)) {
        char why[4400];
        snprintf(why, sizeof why, "%s is not a directory", dir);
        return fail(err, cap, flag, path, why);
    }
    return probe_dir(flag, path, dir, err, cap);
}

int gr_cli_check_output_dir(const char *flag, const char *path, char *err, size_t cap)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s", path);
    if (n <= 0 || (size_t)n >= sizeof tmp) return fail(err, cap, flag, path, "path too long");
    /* mkdir -p, each level's error kept for the message. */
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        struct stat st;
        if (stat(tmp, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                char why[4400];
                snprintf(why, sizeof why, "%s is not a directory", tmp);
                return fail(err, cap, flag, path, why);
            }
        } else if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            char why[4400];
            snprintf(why, sizeof why, "cannot create %s: %s", tmp, strerror(errno));
            return fail(err, cap, flag, path, why);
        }
        if (c == '\0') break;
        *p = c;
    }
    return probe_dir(flag, path, path, err, cap);
}

bool gr_cli_path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- stop signals ---- */

/* Lock-free, so the handler may touch it. */
static atomic_int stop_signo;
static struct sigaction old_int, old_term;
static bool installed;
static char stop_msg[256];
static size_t stop_msg_len;

static void on_stop_signal(int sig)
{
    int errno_saved = errno;
    if (atomic_exchange(&stop_signo, sig) != 0) {
        /* The second signal: end now, as the signal would have without a handler. */
        signal(sig, SIG_DFL);
        raise(sig);
        errno = errno_saved;
        return;
    }
    ssize_t w = write(STDERR_FILENO, stop_msg, stop_msg_len);
    (void)w;
    errno = errno_saved;
}

void gr_cli_stop_signals_install(const char *command)
{
    int n = snprintf(stop_msg, sizeof stop_msg,
                     "\ngranary %s: stopping at the next step boundary (the checkpoint and the "
                     "metrics follow); a second Ctrl-C or SIGTERM aborts at once\n", command);
    stop_msg_len = n > 0 && (size_t)n < sizeof stop_msg ? (size_t)n : 0;
    atomic_store(&stop_signo, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* Restart interrupted system calls: the servers' and the client's threads block in
     * them, and the stop is a flag the trainer polls, not an interruption. */
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    installed = true;
}

void gr_cli_stop_signals_restore(void)
{
    if (!installed) return;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    installed = false;
}

int gr_cli_stop_signal(void) { return atomic_load(&stop_signo); }

bool gr_cli_stop_requested(void *ctx)
{
    (void)ctx;
    return atomic_load(&stop_signo) != 0;
}

int gr_cli_signal_status(int sig) { return 128 + sig; }

const char *gr_cli_signal_name(int sig)
{
    static char other[32];
    if (sig == SIGINT) return "SIGINT";
    if (sig == SIGTERM) return "SIGTERM";
    snprintf(other, sizeof other, "signal %d", sig);
    return other;
}

/* ---- a peer that is not a granary server ---- */

void gr_cli_explain_no_reply(const char *command, const char *errmsg)
{
    const char *end = strstr(errmsg, "): no reply to the handshake");
    if (!end) return;
    const char *open_paren = end;
    while (open_paren > errmsg && *open_paren != '(') open_paren--;
    if (*open_paren != '(' || end - open_paren - 1 <= 0 || end - open_paren - 1 > 200) return;
    char addr[256], url[300];
    snprintf(addr, sizeof addr, "%.*s", (int)(end - open_paren - 1), open_paren + 1);
    snprintf(url, sizeof url, "http://%s/", addr);
    gr_http_result r;
    memset(&r, 0, sizeof r);
    if (gr_http_fetch("GET", url, NULL, NULL, 0, 3000, &r) == GR_OK)
        fprintf(stderr, "granary %s: %s is not a granary server: it answered in HTTP (status %d); "
                        "is this the HTTP port?\n", command, addr, r.status);
    gr_http_result_free(&r);
}

/* ---- the command that continues a run ---- */

static void print_quoted(FILE *out, const char *a)
{
    bool plain = *a != '\0';
    for (const char *p = a; *p && plain; p++)
        plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-@%",
                       *p) != NULL;
    if (plain) {
        fputs(a, out);
        return;
    }
    fputc('\'', out);
    for (const char *p = a; *p; p++) {
        if (*p == '\'') fputs("'\\''", out);
        else fputc(*p, out);
    }
    fputc('\'', out);
}

void gr_cli_print_command(FILE *out, int argc, char **argv, const char *flag, const char *value)
{
    fprintf(out, "granary %s", argv[0]);
    size_t fl = flag ? strlen(flag) : 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (flag && a[0] == '-' && a[1] == '-' && !strncmp(a + 2, flag, fl)) {
            if (a[2 + fl] == '\0') {
                i++; /* and its value */
                continue;
            }
            if (a[2 + fl] == '=') continue;
        }
        fputc(' ', out);
        print_quoted(out, a);
    }
    if (flag && value) {
        fprintf(out, " --%s ", flag);
        print_quoted(out, value);
    }
    fputc('\n', out);
}
