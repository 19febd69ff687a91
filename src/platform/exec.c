/* The local executor: each job process runs under a small shim (`granary job exec`) that
 * forwards signals to the job and writes its exit status to a file. The shim is what the
 * controller starts and watches; a controller restarted after kill -9 is no longer its
 * parent, and finds out that the job ended, and how, from /proc and that file. */
#include "platform/platform_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Field 22 of /proc/PID/stat (start time in clock ticks) and the state letter; 0 when the
 * process is gone. */
static uint64_t proc_stat(int pid, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2;
    if (state) *state = *p;
    /* p is at field 3 (state); field 22 is 19 further. */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

uint64_t exec_start_ticks(int pid) { return proc_stat(pid, NULL); }

int exec_start(const char *granary_bin, const char *job_dir, const char *cwd, char **argv,
               job_proc *p)
{
    char log_path[4200], exit_path[4200];
    snprintf(log_path, sizeof log_path, "%s/log", job_dir);
    snprintf(exit_path, sizeof exit_path, "%s/exit", job_dir);
    unlink(exit_path);
    int argc = 0;
    while (argv[argc]) argc++;
    char **full = calloc((size_t)argc + 6, sizeof *full);
    if (!full) return gr_seterr(GR_ENOMEM, "executor: out of memory");
    full[0] = (char *)"granary";
    full[1] = (char *)"job";
    full[2] = (char *)"exec";
    full[3] = exit_path;
    full[4] = (char *)"--";
    for (int i = 0; i < argc; i++) full[5 + i] = argv[i];
    int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        free(full);
        return gr_seterr(GR_EIO, "executor: cannot open %s: %s", log_path, strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(logfd);
        free(full);
        return gr_seterr(GR_EIO, "executor: fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* Its own session: a terminal's Ctrl-C at the controller does not reach jobs, and the
         * job survives the controller. */
        setsid();
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        if (chdir(cwd) != 0) _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(granary_bin, full);
        dprintf(2, "controller: cannot run %s: %s\n", granary_bin, strerror(errno));
        _exit(127);
    }
    close(logfd);
    free(full);
    p->pid = pid;
    p->child = 1;
    p->stopping = STOP_NONE;
    p->stop_sent = 0;
    /* The child may not have reached /proc yet on a loaded machine; try a few times. */
    for (int i = 0; i < 100 && !(p->start_ticks = exec_start_ticks(pid)); i++) usleep(1000);
    return 0;
}

static int read_exit_file(const char *job_dir)
{
    char path[4200], buf[32] = "";
    snprintf(path, sizeof path, "%s/exit", job_dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *end;
    long v = strtol(buf, &end, 10);
    return end == buf ? -1 : (int)v;
}

bool exec_alive(const char *job_dir, job_proc *p, int *exit_code)
{
    *exit_code = -1;
    if (!p->pid) return false;
    if (p->child) {
        int status;
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == 0) return true;
        if (r == p->pid) {
            int file = read_exit_file(job_dir);
            if (file >= 0) *exit_code = file;
            else if (WIFEXITED(status)) *exit_code = WEXITSTATUS(status);
            else if (WIFSIGNALED(status)) *exit_code = 128 + WTERMSIG(status);
            return false;
        }
        p->child = 0; /* not ours after all (ECHILD): watch it through /proc */
    }
    char state = 0;
    uint64_t ticks = proc_stat(p->pid, &state);
    if (ticks && ticks == p->start_ticks && state != 'Z') return true;
    *exit_code = read_exit_file(job_dir);
    return false;
}

void exec_signal(job_proc *p, int sig)
{
    if (!p->pid) return;
    char state = 0;
    uint64_t ticks = proc_stat(p->pid, &state);
    /* Only the process we started: a recycled pid belongs to someone else. */
    if (ticks && ticks == p->start_ticks) kill(p->pid, sig);
}

/* ---- the shim ------------------------------------------------------------------------------ */

static volatile sig_atomic_t shim_child;

static void forward(int sig)
{
    if (shim_child > 0) kill(shim_child, sig);
}

int gr_platform_shim(const char *exit_file, char **argv)
{
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "job exec: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execv(argv[0], argv);
        fprintf(stderr, "job exec: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    shim_child = pid;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    int code = WIFEXITED(status) ? WEXITSTATUS(status)
               : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", exit_file);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d\n", code);
        fflush(f);
        fsync(fileno(f));
        fclose(f);
        rename(tmp, exit_file);
    }
    return code;
}
