/* master.c: the master process: owns the listening sockets, runs N workers, replaces one
 * that dies, reloads on SIGHUP without losing a connection, stops gracefully on SIGTERM. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* getresuid, getresgid */
#endif
#include "process/master.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "process/agent.h"
#include "process/channel.h"
#include "base/util.h"
#include "process/log_file.h"
#include "process/metrics.h"
#include "process/shdict.h"
#include "process/tickets.h"

/* A worker that dies sooner than this after starting is not restarted at once: a broken
 * app would otherwise fork in a tight loop. */
#define MS_RESPAWN_DELAY_MS 1000
#define MS_QUICK_DEATH_MS   1000

/* The signals the master handles: TERM, INT, HUP, USR1, CHLD, USR2, QUIT. */
#define MS_MASTER_NSIG 7

typedef struct worker_s worker_t;

static void upgrade_release(void);
static void master_started(void);

/* Each slot has its own SO_REUSEPORT sockets, one per address, and runs one worker on them
 * (two during a reload: the old one drains while the new one accepts from the same
 * sockets, so a connection queued at the switch is never lost). */
typedef struct slot_s {
    int index;
    int *fds;
    worker_t *current; /* serving */
    worker_t *next;    /* starting, during a reload */
    uv_timer_t respawn;
} slot_t;

struct worker_s {
    uv_process_t proc;
    char *failed;              /* why it could not start, as it said (MS_CHAN_FAILED), or NULL */
    int quiet;                 /* its exit needs no line of its own (a reload already failed) */
    int chan;                  /* the master's end of the worker's channel (channel.h) */
    uv_poll_t chan_poll;       /* reading it */
    uv_timer_t start_deadline; /* until it is ready */
    slot_t *slot;
    uint64_t started;
    int is_ready, exited, handles;
    int mslot; /* its slot in the metrics zone, or -1 */
    int replaced;    /* it asked to be replaced (MS_CHAN_REPLACE), and another is starting */
    int replacement; /* it starts to replace one that asked */
};

/* A shared dictionary's zone, made the first time a worker asks for it and kept, with its
 * values, for as long as the master runs: across reloads, and through a reload whose app
 * no longer declares it (a later one may again). */
typedef struct zone_s {
    char name[MS_SHDICT_NAME_MAX + 1];
    uint64_t size;
    int fd;
    ms_shdict_t *dict; /* the master's own mapping: to free the lock of a worker that died */
} zone_t;

/* A log the operator named, opened by the master at the start and on USR1: the directory
 * it is in, resolved once at the start and kept, and the file as last opened there. */
typedef struct named_log_s {
    const char *path; /* as named: what a worker asks for */
    char *base;       /* its last component */
    int dir, fd;
} named_log_t;

typedef struct master_s {
    uv_loop_t *loop;
    const ms_master_opts_t *o;
    slot_t *slots;
    zone_t *zones;
    int nzones;
    int metrics_fd;              /* the metrics zone, made at the first ask; -1 until then */
    ms_metrics_zone_t *metrics;  /* the master's mapping: it clears a dead writer's gauges */
    worker_t **metrics_writer;   /* by slot: the live worker that writes it, or NULL */
    uv_signal_t sig[MS_MASTER_NSIG];
    uv_timer_t kill_timer;
    int stopping, live, code;
    int activated;            /* the listening sockets came from systemd (LISTEN_FDS) */
    int notify_fd;            /* systemd's notification socket, or -1 */
    struct sockaddr_un notify_addr;
    socklen_t notify_len;
    int told_ready, reloading; /* what systemd was last told */
    int tickets_fd;            /* the TLS ticket keys' zone, made at the first ask, or -1 */
    ms_tickets_t *tickets;     /* the master's mapping, the one that may write */
    uv_timer_t tickets_timer;  /* a new key every ticket_rotate seconds */
    named_log_t *logs;         /* o->nlogs of them */
    int started;               /* every slot has had a ready worker: the start is over */
    int config_fd;             /* the configuration's sealed memfd (MS_CHAN_CONFIG), or -1 */
    uv_timer_t drain_timer;    /* the drain delay of a TERM or QUIT (drain_begin) */
    ms_agent_t *agent;         /* HAProxy's agent-check responder, or NULL */
} master_t;

static master_t M;

/* -- systemd -------------------------------------------------------------------------------
 * Under a unit with Type=notify, systemd gives the master NOTIFY_SOCKET and waits for
 * READY=1. The master says READY=1 once every worker is ready, RELOADING=1 on a HUP and
 * READY=1 again when the new workers have taken over (or the reload failed and the old ones
 * serve on), STOPPING=1 on TERM. The workers do not get the variable: only the master speaks
 * for the service. */

static void notify_open(void)
{
    M.notify_fd = -1;
    const char *path = getenv("NOTIFY_SOCKET");
    size_t len = path ? strlen(path) : 0;
    if (len == 0 || len >= sizeof(M.notify_addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
        unsetenv("NOTIFY_SOCKET");
        return;
    }
    M.notify_addr.sun_family = AF_UNIX;
    memcpy(M.notify_addr.sun_path, path, len);
    if (path[0] == '@')
        M.notify_addr.sun_path[0] = '\0'; /* an abstract socket */
    M.notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    M.notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    unsetenv("NOTIFY_SOCKET");
}

static void notify(const char *msg)
{
    if (M.notify_fd < 0)
        return;
    if (sendto(M.notify_fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&M.notify_addr,
               M.notify_len) < 0)
        ms_log(MS_LOG_WARN, "cannot notify systemd: %s", strerror(errno));
}

/* Tells systemd the service is ready when every slot's worker is, the first time and after a
 * reload has settled. */
static void notify_if_settled(void)
{
    for (int i = 0; i < M.o->workers; i++) {
        slot_t *s = &M.slots[i];
        if (s->next != NULL || s->current == NULL || !s->current->is_ready)
            return;
    }
    if (!M.told_ready || M.reloading) {
        char msg[96];
        snprintf(msg, sizeof(msg), "READY=1\nSTATUS=serving with %d workers", M.o->workers);
        notify(msg);
        M.told_ready = 1;
        M.reloading = 0;
    }
}

/* Socket activation: systemd bound the listening sockets and passed them from fd 3 on, one per
 * address in the order of --listen. Every worker then accepts from the same sockets. Returns
 * the number taken (0 when not activated), or a negative code. */
static int activated_sockets(const ms_master_opts_t *o)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (pid == NULL || fds == NULL || strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    int n = (int)strtol(fds, NULL, 10);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (n != o->nlisten) {
        ms_log(MS_LOG_ERR, "systemd passed %d listening sockets for %d --listen addresses", n,
               o->nlisten);
        return UV_EINVAL;
    }
    for (int j = 0; j < n; j++) {
        int fd = 3 + j;
        /* Out of the way of the workers' channel, which spawning puts at fd 3. */
        int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3 + n);
        if (moved < 0)
            return uv_translate_sys_error(errno);
        close(fd);
        for (int i = 0; i < o->workers; i++)
            M.slots[i].fds[j] = moved;
        o->ports[j] = ms_fd_port(moved);
    }
    return n;
}

/* -- CPUs ---------------------------------------------------------------------------------- */

int ms__cpus_of_quota(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    return (int)((quota + period - 1) / period);
}

/* Reads "QUOTA PERIOD" (cgroup v2, "max" for none) from `dir`/cpu.max, or the two files of
 * cgroup v1. Returns the CPUs, 0 when there is no limit or no such file. */
static int quota_in(const char *dir)
{
    char path[512], word[32];
    long long quota = -1, period = 0;
    snprintf(path, sizeof(path), "%s/cpu.max", dir);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%31s %lld", word, &period) == 2 && strcmp(word, "max") != 0)
            quota = strtoll(word, NULL, 10);
        fclose(f);
        return ms__cpus_of_quota(quota, period);
    }
    snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    if (fscanf(f, "%lld", &quota) != 1)
        quota = -1;
    fclose(f);
    snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
    if ((f = fopen(path, "r")) != NULL) {
        if (fscanf(f, "%lld", &period) != 1)
            period = 0;
        fclose(f);
    }
    return ms__cpus_of_quota(quota, period);
}

/* The quota of this process's cgroup: its own directory, as /proc/self/cgroup names it under
 * the usual mount points, or the root of its cgroup namespace (a container's view). */
static int cgroup_cpus(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[512];
    int cpus = 0;
    while (f != NULL && cpus == 0 && fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (path == NULL)
            continue;
        *path++ = '\0';
        ctl++;
        char dir[512];
        if (*ctl == '\0') { /* v2: "0::/path" */
            snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", path);
            cpus = quota_in(dir);
        } else if (strstr(ctl, "cpu") != NULL && strcmp(ctl, "cpuset") != 0 &&
                   strcmp(ctl, "cpuacct") != 0) { /* v1: "N:cpu,cpuacct:/path" */
            snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s%s", ctl, path);
            cpus = quota_in(dir);
            if (cpus == 0) {
                snprintf(dir, sizeof(dir), "/sys/fs/cgroup/cpu%s", path);
                cpus = quota_in(dir);
            }
        }
    }
    if (f != NULL)
        fclose(f);
    if (cpus == 0)
        cpus = quota_in("/sys/fs/cgroup");
    if (cpus == 0)
        cpus = quota_in("/sys/fs/cgroup/cpu");
    return cpus;
}

int ms_cpus(void)
{
    int n = (int)uv_available_parallelism(), quota = cgroup_cpus();
    return quota > 0 && quota < n ? quota : n;
}

/* -- Workers ------------------------------------------------------------------------------- */

static void worker_handle_closed(uv_handle_t *h)
{
    worker_t *w = h->data;
    if (--w->handles == 0) {
        close(w->chan);
        free(w->failed);
        free(w);
    }
}

static void worker_release(worker_t *w)
{
    uv_close((uv_handle_t *)&w->chan_poll, worker_handle_closed);
    uv_close((uv_handle_t *)&w->start_deadline, worker_handle_closed);
    uv_close((uv_handle_t *)&w->proc, worker_handle_closed);
}

static void spawn(slot_t *s);
static void spawn_into(slot_t *s, worker_t **where);

static void respawn_cb(uv_timer_t *t)
{
    slot_t *s = t->data;
    if (!M.stopping && s->current == NULL)
        spawn(s);
}

static void drain_end(void);

static void maybe_done(void)
{
    if (M.stopping && M.live == 0) {
        for (int i = 0; i < MS_MASTER_NSIG; i++)
            uv_close((uv_handle_t *)&M.sig[i], NULL);
        upgrade_release();
        uv_close((uv_handle_t *)&M.kill_timer, NULL);
        uv_close((uv_handle_t *)&M.tickets_timer, NULL);
        drain_end();
        for (int i = 0; i < M.o->workers; i++)
            uv_close((uv_handle_t *)&M.slots[i].respawn, NULL);
    }
}

static void kill_all(int sig);
static void kill_timer_cb(uv_timer_t *t);
static void notify(const char *msg);

static void exit_cb(uv_process_t *p, int64_t status, int sig)
{
    worker_t *w = p->data;
    slot_t *s = w->slot;
    M.live--;
    w->exited = 1;
    if (w->mslot >= 0) {
        ms_metrics_forsake(M.metrics, w->mslot);
        if (M.metrics_writer[w->mslot] == w)
            M.metrics_writer[w->mslot] = NULL;
    }
    /* Before any other process starts, so that no new one can have its pid meanwhile. */
    for (int i = 0; i < M.nzones; i++)
        if (ms_shdict_forsake(M.zones[i].dict, p->pid))
            ms_log(MS_LOG_WARN, "worker %d (pid %d) died holding shared dictionary '%s': its "
                   "lock is free again", s->index, p->pid, M.zones[i].name);
    uint64_t lived = uv_now(M.loop) - w->started;
    char why[1200];
    if (w->failed != NULL)
        snprintf(why, sizeof(why), "worker %d (pid %d) could not start: %s", s->index, p->pid,
                 w->failed);
    else
        snprintf(why, sizeof(why),
                 "worker %d (pid %d) exited (status %lld, signal %d) before it was ready", s->index,
                 p->pid, (long long)status, sig);
    if (w == s->next && M.stopping) {
        s->next = NULL; /* (stopped with the others: no reload to fail any more) */
    } else if (w == s->next && w->replacement) {
        ms_log(MS_LOG_ERR, "%s: its replacement failed, the old worker keeps serving", why);
        s->next = NULL;
        if (s->current != NULL)
            s->current->replaced = 0; /* (it may ask again) */
    } else if (w == s->next) {
        /* A new worker died before it was ready: the reload failed; the old ones stay, and the
         * reload's other new workers go too (they would fail alike, or serve another app). */
        if (!w->quiet)
            ms_log(MS_LOG_ERR, "%s: reload failed, the old worker%s serving", why,
                   M.o->workers > 1 ? "s keep" : " keeps");
        s->next = NULL;
        for (int i = 0; i < M.o->workers; i++) {
            worker_t *n = M.slots[i].next;
            if (n != NULL && !n->exited && !n->quiet) {
                n->quiet = 1;
                uv_process_kill(&n->proc, SIGKILL);
            }
        }
        notify_if_settled();
    } else if (w == s->current && !M.started && !w->is_ready && !M.stopping) {
        /* The start failed: a worker refused the configuration (or its start hooks did not
         * return in time). Stop, and say why, rather than start it again and again. */
        s->current = NULL;
        ms_log(MS_LOG_ERR, "%s: stopping", why);
        if (M.o->why != NULL)
            snprintf(M.o->why, M.o->why_len, "%s", why);
        M.code = UV_ECANCELED;
        M.stopping = 1;
        notify("STOPPING=1");
        kill_all(SIGTERM);
        uv_timer_start(&M.kill_timer, kill_timer_cb, (uint64_t)(M.o->stop_timeout * 1000), 0);
    } else if (w == s->current) {
        s->current = NULL;
        if (!M.stopping) {
            ms_log(MS_LOG_ERR, "worker %d (pid %d) died (status %lld, signal %d); replacing it",
                   s->index, p->pid, (long long)status, sig);
            uv_timer_start(&s->respawn, respawn_cb,
                           lived < MS_QUICK_DEATH_MS ? MS_RESPAWN_DELAY_MS : 0, 0);
        }
    } else {
        ms_log(MS_LOG_INFO, "worker %d (pid %d) finished draining", s->index, p->pid);
    }
    worker_release(w);
    maybe_done();
}

/* -- The files the operator named ------------------------------------------------------------
 * The master opens files as root for workers that run as another user: the logs they append
 * to, the TLS files they read. A worker may be able to change what a name means: replace a
 * log, in a directory its user may write, by a symbolic link into one only root enters; rename
 * a directory and put another in its place; make a hard link to another file. So the master
 * never lets the kernel follow a name it was given: it walks it itself, a component at a time
 * (openat with O_NOFOLLOW), follows a symbolic link only where the workers' user could not
 * have made it (a directory that user may not write), and in a directory that user may write
 * opens only a file with no other name. A log's directory is resolved once, at the start, and
 * kept: a later open happens in that directory, whatever its name points to by then. */

#define MS_LINKS_MAX 16 /* links followed in one name, as the kernel's own 40 bounds a loop */

/* Whether the workers' user may change the entries of the directory `st`: it owns it (it may
 * chmod it), or may write it through its group or as anyone. The workers have no
 * supplementary group (ms_user_check). With no user of their own they are the master's, and
 * nothing they could do is guarded against. */
static int workers_write(const struct stat *st)
{
    if (M.o->uid < 0)
        return 0;
    return st->st_uid == (uid_t)M.o->uid ||
           ((st->st_mode & S_IWGRP) && st->st_gid == (gid_t)M.o->gid) || (st->st_mode & S_IWOTH);
}

static int walk(int at, const char *path, int flags, int *links, const char **why);

/* Follows the link `lfd` (an O_PATH descriptor of the link itself) found in the directory
 * `dir`, as walk does with `flags`. Closes `lfd`. */
static int follow(int dir, int lfd, int flags, int *links, const char **why)
{
    struct stat st;
    char target[4096];
    ssize_t n = -1;
    if (fstat(dir, &st) < 0) {
        /* Who may write there is unknown: refused, as where the workers' user may. */
        *why = "a symbolic link in a directory that cannot be checked";
        errno = ELOOP;
    } else if (workers_write(&st)) {
        *why = "a symbolic link in a directory the workers' user may write";
        errno = ELOOP;
    } else if (++*links > MS_LINKS_MAX) {
        errno = ELOOP;
    } else {
        n = readlinkat(lfd, "", target, sizeof(target) - 1);
    }
    close(lfd);
    if (n < 0 || n >= (ssize_t)sizeof(target) - 1)
        return n < 0 ? -errno : -ENAMETOOLONG;
    target[n] = '\0';
    return walk(dir, target, flags, links, why);
}

/* Opens `path` from the directory `at` (AT_FDCWD: the current one) with `flags` (O_PATH |
 * O_DIRECTORY: the directory itself; else O_RDONLY, or O_WRONLY | O_APPEND | O_CREAT for a
 * log, made 0644), as the comment above says: a file is a regular file (a log may also be a
 * character device in a directory the workers' user may not write). Returns a close-on-exec
 * descriptor, or -errno, with `*why` set when the name was refused rather than missing. */
static int walk(int at, const char *path, int flags, int *links, const char **why)
{
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof(buf))
        return len == 0 ? -ENOENT : -ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    int cur = path[0] == '/'   ? open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)
              : at == AT_FDCWD ? open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)
                               : fcntl(at, F_DUPFD_CLOEXEC, 0);
    if (cur < 0)
        return -errno;
    int want_dir = (flags & O_DIRECTORY) != 0;
    char *save = NULL;
    for (char *c = strtok_r(buf, "/", &save); c != NULL;) {
        char *next = strtok_r(NULL, "/", &save);
        if (strcmp(c, ".") == 0) {
            c = next;
            continue;
        }
        int fd;
        struct stat st;
        if (next != NULL || want_dir) {
            fd = openat(cur, c, O_PATH | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 && fstat(fd, &st) < 0) {
                close(fd);
                fd = -1;
            } else if (fd >= 0 && S_ISLNK(st.st_mode)) {
                fd = follow(cur, fd, O_PATH | O_DIRECTORY, links, why);
                if (fd < 0)
                    errno = -fd;
            } else if (fd >= 0 && !S_ISDIR(st.st_mode)) {
                close(fd);
                fd = -1;
                errno = ENOTDIR;
            }
        } else {
            /* (O_NONBLOCK: a FIFO put in a log's place must not hang the master.) */
            fd = openat(cur, c, flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
            if (fd < 0 && errno == ELOOP) {
                int lfd = openat(cur, c, O_PATH | O_NOFOLLOW | O_CLOEXEC);
                if (lfd >= 0 && fstat(lfd, &st) == 0 && S_ISLNK(st.st_mode)) {
                    fd = follow(cur, lfd, flags, links, why);
                    if (fd < 0)
                        errno = -fd;
                } else {
                    if (lfd >= 0)
                        close(lfd);
                    errno = ELOOP;
                }
            } else if (fd >= 0) {
                struct stat ds;
                if (fstat(fd, &st) < 0 || fstat(cur, &ds) < 0) {
                    close(fd);
                    fd = -1;
                } else if (!S_ISREG(st.st_mode) &&
                           !((S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) &&
                             (flags & O_WRONLY) && !workers_write(&ds))) {
                    /* A FIFO a worker put in a log's place, and reads from without reading,
                     * would block every write to the log once full; a socket, a directory or
                     * a device is no file to read a TLS key from. Only a log may be a
                     * character device (/dev/null, a terminal) or a FIFO (a log reader's), and
                     * only where the workers' user cannot have put it. */
                    close(fd);
                    fd = -1;
                    *why = "not a regular file";
                    errno = EINVAL;
                } else if (workers_write(&ds) && st.st_nlink > 1 && st.st_uid != (uid_t)M.o->uid) {
                    /* A hard link the workers' user made, in a directory it may write, to a
                     * file it could not open. */
                    close(fd);
                    fd = -1;
                    *why = "a file with other names (hard links) in a directory the workers' "
                           "user may write";
                    errno = EPERM;
                } else {
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
                }
            }
        }
        close(cur);
        if (fd < 0)
            return -errno;
        cur = fd;
        c = next;
    }
    if (!want_dir) {
        /* The name ended in a directory ("/", "logs/."): not a file. */
        struct stat st;
        if (fstat(cur, &st) == 0 && S_ISDIR(st.st_mode)) {
            close(cur);
            return -EISDIR;
        }
    }
    return cur;
}

#define LOG_FLAGS (O_WRONLY | O_APPEND | O_CREAT)

/* Opens the named log `l` in its directory, resolved at the start. Returns the descriptor
 * or -errno, with the sentence in `why`. */
static int log_open(named_log_t *l, char *why, size_t why_len)
{
    int links = 0;
    const char *refused = NULL;
    int fd = walk(l->dir, l->base, LOG_FLAGS, &links, &refused);
    if (fd < 0)
        snprintf(why, why_len, "cannot open the log %.300s: %s", l->path,
                 refused ? refused : strerror(-fd));
    return fd;
}

/* Resolves each log's directory and opens the log, once, before any worker runs: a bad one
 * stops the start, not every worker in turn. Returns 0 or a negative code. */
static int logs_open(void)
{
    M.logs = calloc((size_t)M.o->nlogs + 1, sizeof(named_log_t));
    if (M.logs == NULL)
        abort();
    for (int i = 0; i < M.o->nlogs; i++) {
        named_log_t *l = &M.logs[i];
        l->path = M.o->logs[i];
        l->dir = l->fd = -1;
        const char *slash = strrchr(l->path, '/');
        char dir[4096];
        int dlen = slash == NULL || slash == l->path ? 1 : (int)(slash - l->path);
        snprintf(dir, sizeof(dir), "%.*s", dlen, slash == NULL ? "." : l->path);
        l->base = strdup(slash ? slash + 1 : l->path);
        int links = 0, rc;
        const char *refused = NULL;
        char why[512];
        l->dir = rc = walk(AT_FDCWD, dir, O_PATH | O_DIRECTORY, &links, &refused);
        if (rc < 0) {
            snprintf(why, sizeof(why), "cannot open the log %.300s: its directory: %s", l->path,
                     refused ? refused : strerror(-rc));
        } else if (l->base[0] == '\0' || strcmp(l->base, ".") == 0 || strcmp(l->base, "..") == 0) {
            snprintf(why, sizeof(why), "cannot open the log %.300s: not a file name", l->path);
            rc = UV_EINVAL;
        } else {
            l->fd = rc = log_open(l, why, sizeof(why));
        }
        if (rc < 0) {
            ms_log(MS_LOG_ERR, "%s", why);
            if (M.o->why != NULL)
                snprintf(M.o->why, M.o->why_len, "%s", why);
            return rc;
        }
    }
    return 0;
}

/* USR1: each log opened anew in its directory (after a rotation, a new file); one that
 * cannot be keeps the old. */
static void logs_reopen(void)
{
    for (int i = 0; i < M.o->nlogs; i++) {
        named_log_t *l = &M.logs[i];
        char why[512];
        int fd = log_open(l, why, sizeof(why));
        if (fd < 0) {
            ms_log(MS_LOG_WARN, "%s; writing to the old file", why);
            continue;
        }
        close(l->fd);
        l->fd = fd;
    }
}

static named_log_t *named_log(const char *path)
{
    for (int i = 0; i < M.o->nlogs; i++)
        if (strcmp(M.logs[i].path, path) == 0)
            return &M.logs[i];
    return NULL;
}

/* The master's own log (ms__log_opener): its named log's descriptor. */
static int master_log(const char *path)
{
    named_log_t *l = named_log(path);
    if (l == NULL)
        return -ENOENT;
    int fd = fcntl(l->fd, F_DUPFD_CLOEXEC, 0);
    return fd < 0 ? -errno : fd;
}

static void logs_close(void)
{
    for (int i = 0; M.logs != NULL && i < M.o->nlogs; i++) {
        if (M.logs[i].fd >= 0)
            close(M.logs[i].fd);
        if (M.logs[i].dir >= 0)
            close(M.logs[i].dir);
        free(M.logs[i].base);
    }
    free(M.logs);
    M.logs = NULL;
    ms__log_opener = NULL;
}

/* -- The channel: what a worker asks ---------------------------------------------------- */

/* Tells a ready worker to serve (the OK to its READY): it has listened, but accepts nothing
 * until its loop runs, which it lets happen only after this answer. */
static void worker_go(worker_t *w)
{
    int rc = ms_chan_send(w->chan, MS_CHAN_OK, NULL, 0, -1);
    if (rc < 0)
        ms_log(MS_LOG_WARN, "worker %d (pid %d): cannot tell it to serve: %s", w->slot->index,
               w->proc.pid, strerror(-rc));
}

/* A reload takes over only when every new worker of it is ready: one that fails then kills
 * the others before any of them has served (exit_cb), and the old workers all serve on, never
 * a mix of the old app and the new. */
static void reload_take_over(void)
{
    for (int i = 0; i < M.o->workers; i++) {
        worker_t *n = M.slots[i].next;
        if (n != NULL && (!n->is_ready || n->quiet || n->exited))
            return;
    }
    for (int i = 0; i < M.o->workers; i++) {
        slot_t *s = &M.slots[i];
        worker_t *w = s->next, *old = s->current;
        if (w == NULL)
            continue;
        /* The new worker accepts from the slot's sockets now; the old drains. */
        s->current = w;
        s->next = NULL;
        if (old != NULL && !old->exited)
            uv_process_kill(&old->proc, SIGUSR2); /* drain: a handover, the service stays up */
        worker_go(w);
        ms_log(MS_LOG_INFO, "worker %d (pid %d) took over", s->index, w->proc.pid);
    }
}

static void worker_ready(worker_t *w)
{
    slot_t *s = w->slot;
    if (w->is_ready || w->quiet)
        return; /* (quiet: its reload failed, and it is being killed) */
    w->is_ready = 1;
    uv_timer_stop(&w->start_deadline);
    if (M.stopping) {
        /* It was told to stop while it started: it hears that once it runs (its signals
         * wait until then), and stops at once, having served nothing new. */
        worker_go(w);
        return;
    }
    if (w == s->next)
        reload_take_over();
    else
        worker_go(w);
    int all = 1;
    for (int i = 0; i < M.o->workers; i++)
        all = all && M.slots[i].current != NULL && M.slots[i].current->is_ready;
    if (all && !M.started) {
        M.started = 1;
        master_started();
    }
    notify_if_settled();
}

/* ZONE: the zone of a shared dictionary, made the first time one is asked for, and only one
 * the app declared at the start, with its declared size (a worker cannot have the master
 * make others: memory for every name it thinks of). Its size is fixed from then on: a reload
 * whose app declares another size, or a new dictionary, is told so, and fails. */
static int ask_zone(const ms_chan_msg_t *m, char *why, size_t why_len)
{
    uint64_t size;
    if (m->len <= sizeof(size) || m->len - sizeof(size) > MS_SHDICT_NAME_MAX) {
        snprintf(why, why_len, "a malformed ask for a shared dictionary");
        return -1;
    }
    memcpy(&size, m->body, sizeof(size));
    char name[MS_SHDICT_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%.*s", (int)(m->len - sizeof(size)), m->body + sizeof(size));
    for (int i = 0; i < M.nzones; i++) {
        zone_t *z = &M.zones[i];
        if (strcmp(z->name, name) != 0)
            continue;
        if (z->size != size) {
            snprintf(why, why_len,
                     "shared dictionary '%s' was made with %llu bytes; the app now declares "
                     "%llu (its size can change only with a restart)",
                     name, (unsigned long long)z->size, (unsigned long long)size);
            return -1;
        }
        return z->fd;
    }
    int declared = -1;
    for (int i = 0; i < M.o->nzones; i++)
        if (strcmp(M.o->zone_names[i], name) == 0)
            declared = i;
    if (declared < 0) {
        snprintf(why, why_len,
                 "shared dictionary '%s' was not declared when the server started (a new "
                 "dictionary needs a restart)",
                 name);
        return -1;
    }
    if (M.o->zone_sizes[declared] != size) {
        snprintf(why, why_len,
                 "shared dictionary '%s' was declared with %llu bytes at the start; the app "
                 "now declares %llu (its size can change only with a restart)",
                 name, (unsigned long long)M.o->zone_sizes[declared], (unsigned long long)size);
        return -1;
    }
    int fd = ms_shdict_create(name, (size_t)size);
    ms_shdict_t *dict = NULL;
    int rc = fd < 0 ? fd : ms_shdict_attach(fd, name, (size_t)size, &dict);
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        snprintf(why, why_len, "shared dictionary '%s': %s", name, ms_shdict_strerror(rc));
        return -1;
    }
    M.zones = realloc(M.zones, (size_t)(M.nzones + 1) * sizeof(zone_t));
    if (M.zones == NULL)
        abort();
    zone_t *z = &M.zones[M.nzones++];
    snprintf(z->name, sizeof(z->name), "%s", name);
    z->size = size;
    z->fd = fd;
    z->dict = dict;
    ms_log(MS_LOG_INFO, "shared dictionary '%s' made (%llu bytes)", name,
           (unsigned long long)size);
    return fd;
}

/* METRICS: the metrics zone, made at the first ask with room for twice the routes the app
 * has then (a reload may add some), and a slot of the worker's index that no live worker
 * writes: its old self may still be draining in another. */
static int ask_metrics(worker_t *w, const ms_chan_msg_t *m, char *why, size_t why_len)
{
    uint32_t routes;
    if (m->len != sizeof(routes)) {
        snprintf(why, why_len, "a malformed ask for the metrics zone");
        return -1;
    }
    memcpy(&routes, m->body, sizeof(routes));
    if (M.metrics_fd < 0) {
        uint64_t room = (uint64_t)routes * 2 < 1024 ? 1024 : (uint64_t)routes * 2;
        int fd = ms_metrics_create(M.o->workers,
                                   room > MS_METRICS_ROUTES_MAX ? MS_METRICS_ROUTES_MAX : (int)room);
        ms_metrics_zone_t *z = fd < 0 ? NULL : ms_metrics_map(fd);
        if (z == NULL) {
            if (fd >= 0)
                close(fd);
            snprintf(why, why_len, "cannot make the metrics zone: %s",
                     fd < 0 ? ms_strerror(fd) : "cannot map it");
            return -1;
        }
        M.metrics_fd = fd;
        M.metrics = z;
        M.metrics_writer = calloc((size_t)z->nslots, sizeof(worker_t *));
        if (M.metrics_writer == NULL)
            abort();
    }
    int base = w->slot->index * MS_METRICS_GENERATIONS, pick = base;
    for (int j = 0; j < MS_METRICS_GENERATIONS; j++)
        if (M.metrics_writer[base + j] == NULL || M.metrics_writer[base + j] == w) {
            pick = base + j;
            break;
        }
    if (M.metrics_writer[pick] != NULL && M.metrics_writer[pick] != w)
        ms_log(MS_LOG_WARN, "worker %d: %d generations drain at once; two share a metrics slot",
               w->slot->index, MS_METRICS_GENERATIONS);
    M.metrics_writer[pick] = w;
    w->mslot = pick;
    snprintf(why, why_len, "%d", pick);
    return M.metrics_fd;
}

/* Whether `path` is one of the `n` in `list`: the operator named it. */
static int named(const char *path, const char **list, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], path) == 0)
            return 1;
    return 0;
}

/* OPEN and APPEND: a file the worker cannot open itself (a TLS key readable by the master's
 * user alone, a log in a directory only it may write), handed over: only a file the
 * operator named, never any path a worker asks for. APPEND hands the log the master opened
 * (at the start or the last USR1): a worker's ask opens nothing. OPEN reads a TLS file
 * anew (a reload takes a renewed certificate), walked as "The files the operator named"
 * says, and only a regular file. */
static int ask_open(const ms_chan_msg_t *m, int append, char *why, size_t why_len)
{
    char path[MS_CHAN_MAX + 1];
    snprintf(path, sizeof(path), "%.*s", (int)m->len, m->body);
    named_log_t *l = append ? named_log(path) : NULL;
    if (append ? l == NULL : !named(path, M.o->files, M.o->nfiles)) {
        snprintf(why, why_len,
                 "cannot open %.300s: not a %s the server was started with, and the workers' "
                 "user may not open it (a restart opens a new one)",
                 path, append ? "log file" : "TLS file");
        return -1;
    }
    if (append) {
        int fd = fcntl(l->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            snprintf(why, why_len, "cannot hand over the log %.300s: %s", path, strerror(errno));
        return fd;
    }
    int links = 0;
    const char *refused = NULL;
    int fd = walk(AT_FDCWD, path, O_RDONLY, &links, &refused); /* (a regular file only) */
    if (fd < 0) {
        snprintf(why, why_len, "cannot open %.300s: %s", path, refused ? refused : strerror(-fd));
        return -1;
    }
    return fd;
}

static void tickets_rotate_cb(uv_timer_t *t)
{
    (void)t;
    int rc = ms_tickets_rotate(M.tickets);
    if (rc < 0)
        ms_log(MS_LOG_ERR, "cannot make a new TLS ticket key: %s (the old one serves on)",
               uv_strerror(rc));
}

/* TICKETS: the zone of the session ticket keys, made at the first ask (by the first worker
 * with a TLS listener) and rotated from then on. */
static int ask_tickets(char *why, size_t why_len)
{
    if (M.tickets_fd < 0) {
        int fd = ms_tickets_create(&M.tickets);
        if (fd < 0) {
            snprintf(why, why_len, "cannot make TLS ticket keys: %s", uv_strerror(fd));
            return -1;
        }
        M.tickets_fd = fd;
        uint64_t every = (uint64_t)((M.o->ticket_rotate > 0 ? M.o->ticket_rotate
                                                             : MS_TLS_TICKET_ROTATE) * 1000);
        uv_timer_start(&M.tickets_timer, tickets_rotate_cb, every, every);
    }
    return M.tickets_fd;
}

/* -- The configuration ------------------------------------------------------------------ */

int ms_master_config(const char *bytes, size_t len)
{
    /* Sealed against writes: a worker maps or reads it, and no process can change what the
     * others read. A new one for each reload; a worker that has its descriptor keeps it. */
    int fd = memfd_create("moonserve:config", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, bytes + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            close(fd);
            return -err;
        }
        off += (size_t)n;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    if (M.config_fd >= 0)
        close(M.config_fd);
    M.config_fd = fd;
    return 0;
}

/* CONFIG: the configuration's memfd, the same for every worker of a generation. */
static int ask_config(char *why, size_t why_len)
{
    if (M.config_fd < 0)
        snprintf(why, why_len, "the master has no configuration to hand over");
    return M.config_fd;
}

/* REPLACE: a worker whose Lua heap stays past its cap after a collection asks to go. Another
 * starts in its slot and, once ready, takes over as in a reload; the old one drains, so what
 * it has in flight finishes. Ignored during a stop and while the slot has a worker starting
 * (a reload, or a replacement already under way). */
static void replace(worker_t *w, const ms_chan_msg_t *m)
{
    slot_t *s = w->slot;
    if (M.stopping || w != s->current || !w->is_ready || w->replaced || s->next != NULL)
        return;
    w->replaced = 1;
    ms_log(MS_LOG_WARN, "worker %d (pid %d) asks to be replaced (%.*s): starting another",
           s->index, w->proc.pid, (int)(m->len < 1000 ? m->len : 1000), m->body);
    spawn_into(s, &s->next);
    if (s->next != NULL)
        s->next->replacement = 1;
    else
        w->replaced = 0; /* (it could not start: the worker may ask again) */
}

static void answer(worker_t *w, const ms_chan_msg_t *m)
{
    char why[512];
    int fd = -1, keep = 0;
    const char *body = NULL;
    switch (m->type) {
    case MS_CHAN_READY: worker_ready(w); return;
    case MS_CHAN_REPLACE: replace(w, m); return;
    case MS_CHAN_FAILED:
        /* Said once, before it exits: exit_cb names it. */
        if (w->failed == NULL && !w->is_ready)
            w->failed = strndup(m->body, m->len < 1000 ? m->len : 1000);
        return;
    case MS_CHAN_ZONE:
        fd = ask_zone(m, why, sizeof(why));
        keep = 1; /* the master's own, for every later worker */
        break;
    case MS_CHAN_OPEN: fd = ask_open(m, 0, why, sizeof(why)); break;
    case MS_CHAN_APPEND: fd = ask_open(m, 1, why, sizeof(why)); break;
    case MS_CHAN_TICKETS:
        fd = ask_tickets(why, sizeof(why));
        keep = 1;
        break;
    case MS_CHAN_METRICS:
        fd = ask_metrics(w, m, why, sizeof(why));
        keep = 1;
        body = why;
        break;
    case MS_CHAN_CONFIG:
        fd = ask_config(why, sizeof(why));
        keep = 1;
        break;
    default: snprintf(why, sizeof(why), "unknown message %u", m->type); break;
    }
    int rc = fd >= 0 ? ms_chan_send(w->chan, MS_CHAN_OK, body, body ? strlen(body) : 0, fd)
                     : ms_chan_send(w->chan, MS_CHAN_ERROR, why, strlen(why), -1);
    if (rc < 0)
        ms_log(MS_LOG_WARN, "worker %d (pid %d): cannot answer on its channel: %s",
               w->slot->index, w->proc.pid, strerror(-rc));
    if (fd >= 0 && !keep)
        close(fd);
}

static void chan_readable(uv_poll_t *p, int status, int events)
{
    worker_t *w = p->data;
    static ms_chan_msg_t m;
    /* A worker asks one thing at a time and waits: a few messages at most are queued. */
    for (;;) {
        int fd = -1, rc = status < 0 ? status : ms_chan_recv(w->chan, &m, &fd);
        if (fd >= 0)
            close(fd); /* a worker hands the master nothing */
        if (rc == -EAGAIN)
            return;
        if (rc < 0 || m.type == 0) {
            /* Its end is closed (it exited, exit_cb follows) or it spoke nonsense. */
            if (rc < 0 && rc != -ECONNRESET)
                ms_log(MS_LOG_WARN, "worker %d (pid %d): its channel failed: %s",
                       w->slot->index, w->proc.pid, strerror(-rc));
            uv_poll_stop(p);
            return;
        }
        answer(w, &m);
    }
}

static double start_timeout(void)
{
    return M.o->start_timeout > 0 ? M.o->start_timeout : MS_START_TIMEOUT;
}

/* A worker that is not ready in time (its on_worker_start hooks have not returned) is
 * killed; exit_cb then says what that means (a reload failed, or a start to retry). */
static void start_deadline_cb(uv_timer_t *t)
{
    worker_t *w = t->data;
    if (w->is_ready || w->exited)
        return;
    ms_log(MS_LOG_ERR,
           "worker %d (pid %d) not ready after %.14g s (its on_worker_start hooks have not "
           "returned): killing it",
           w->slot->index, w->proc.pid, start_timeout());
    uv_process_kill(&w->proc, SIGKILL);
}

static void spawn_into(slot_t *s, worker_t **where)
{
    const ms_master_opts_t *o = M.o;
    worker_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        abort();
    w->slot = s;
    w->started = uv_now(M.loop);
    int pair[2];
    if (ms_chan_pair(pair) < 0)
        abort(); /* out of descriptors in the master: nothing sensible is left to do */
    w->chan = pair[0];
    w->mslot = -1;
    fcntl(w->chan, F_SETFL, fcntl(w->chan, F_GETFL) | O_NONBLOCK);
    uv_poll_init(M.loop, &w->chan_poll, w->chan);
    w->chan_poll.data = w;
    w->proc.data = w;
    uv_timer_init(M.loop, &w->start_deadline);
    w->start_deadline.data = w;
    w->handles = 3;

    int nstdio = 4 + o->nlisten;
    uv_stdio_container_t *stdio = calloc((size_t)nstdio, sizeof(*stdio));
    if (stdio == NULL)
        abort();
    stdio[0].flags = stdio[1].flags = stdio[2].flags = UV_INHERIT_FD;
    stdio[0].data.fd = 0;
    stdio[1].data.fd = 1;
    stdio[2].data.fd = 2;
    stdio[MS_CHAN_WORKER_FD].flags = UV_INHERIT_FD;
    stdio[MS_CHAN_WORKER_FD].data.fd = pair[1];
    for (int i = 0; i < o->nlisten; i++) {
        stdio[4 + i].flags = UV_INHERIT_FD;
        stdio[4 + i].data.fd = s->fds[i];
    }

    /* The environment, plus who the worker is and where its sockets are. */
    extern char **environ;
    int n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc((size_t)n + 5, sizeof(char *)); /* (the four below, and NULL) */
    char id[64], fds[64], count[64], ids[64];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strncmp(environ[i], "MOONSERVE_WORKER=", 17) != 0 &&
            strncmp(environ[i], "MOONSERVE_LISTEN_FDS=", 21) != 0 &&
            strncmp(environ[i], "MOONSERVE_WORKER_COUNT=", 23) != 0 &&
            strncmp(environ[i], "MOONSERVE_WORKER_IDS=", 21) != 0)
            env[k++] = environ[i];
    snprintf(id, sizeof(id), "MOONSERVE_WORKER=%d", s->index);
    snprintf(fds, sizeof(fds), "MOONSERVE_LISTEN_FDS=%d", o->nlisten);
    snprintf(count, sizeof(count), "MOONSERVE_WORKER_COUNT=%d", o->workers);
    env[k++] = id;
    env[k++] = fds;
    env[k++] = count;
    if (o->uid >= 0) { /* the ids it runs as, which it checks (ms_user_check) */
        snprintf(ids, sizeof(ids), "MOONSERVE_WORKER_IDS=%d:%d", o->uid, o->gid);
        env[k++] = ids;
    }
    env[k] = NULL;

    uv_process_options_t po;
    memset(&po, 0, sizeof(po));
    po.file = o->argv[0];
    po.args = o->argv;
    po.env = env;
    po.exit_cb = exit_cb;
    po.stdio = stdio;
    po.stdio_count = nstdio;
    if (o->uid >= 0) {
        /* libuv's child drops the supplementary groups (setgroups to none), then calls setgid
         * and setuid, in that order, before it execs: no code of the worker's runs as root.
         * The worker checks the result (ms_user_check) before it serves. */
        po.flags |= UV_PROCESS_SETUID | UV_PROCESS_SETGID;
        po.uid = (uv_uid_t)o->uid;
        po.gid = (uv_gid_t)o->gid;
    }
    int rc = uv_spawn(M.loop, &w->proc, &po);
    free(env);
    free(stdio);
    close(pair[1]);
    if (rc < 0) {
        ms_log(MS_LOG_ERR, "worker %d: cannot start %s: %s", s->index, o->argv[0], uv_strerror(rc));
        w->handles = 2;
        uv_close((uv_handle_t *)&w->chan_poll, worker_handle_closed);
        uv_close((uv_handle_t *)&w->start_deadline, worker_handle_closed);
        uv_timer_start(&s->respawn, respawn_cb, MS_RESPAWN_DELAY_MS, 0);
        return;
    }
    M.live++;
    uv_poll_start(&w->chan_poll, UV_READABLE, chan_readable);
    uv_timer_start(&w->start_deadline, start_deadline_cb, (uint64_t)(start_timeout() * 1000), 0);
    *where = w;
}

static void spawn(slot_t *s)
{
    spawn_into(s, &s->current);
}

/* -- Upgrades -------------------------------------------------------------------------------
 * USR2 starts a new master, as nginx's binary upgrade does: the command this one was started
 * with (so the moonserve and the app as installed now), which inherits this master's
 * listening sockets instead of binding its own. Both sets of workers accept from the same
 * sockets until the operator QUITs the old master (its workers hand over, as a reload's old
 * ones do: upgrade_finish) or TERMs the new one (the upgrade is undone): the sockets are
 * never closed, so no connection is refused.
 * The new master finds them from fd 4 on (MOONSERVE_UPGRADE_FDS: how many, one set of
 * --listen addresses per worker slot of the old master, or one set every slot shares) and
 * says it is ready (every worker of it ready) with a byte on the pipe at fd 3. The old master
 * renames its pid file (FILE.oldbin) and puts it back if the new one exits: before it was
 * ready (a failed start: its app did not load, its workers did not become ready, or it was
 * not ready within upgrade_deadline()), or after (the operator undid the upgrade). */

typedef struct upgrade_s {
    int pid;     /* the new master, while it runs; 0: no upgrade under way */
    int ready;   /* it said it is ready */
    int handles; /* of proc, poll and timer, not yet closed */
    uv_process_t proc;
    int ready_fd; /* the read end of its ready pipe, or -1 */
    uv_poll_t poll;
    uv_timer_t deadline;
    int quit;    /* QUIT came before the new master was ready: the handover waits for it */
    int parent;  /* in a new master: the old master that started it, or 0 */
    int tell_fd; /* in a new master: the write end of the ready pipe (kept open once ready:
                  * the old master closes the read end when it stops), or -1 */
} upgrade_t;

static upgrade_t U = {.ready_fd = -1, .tell_fd = -1};

/* The pid file (o->pid_file): written when every worker is ready, so that a script that
 * waits for it knows the master serves; FILE.oldbin while an upgrade is under way. */
static void pid_file_name(char *out, size_t len, int oldbin)
{
    snprintf(out, len, "%s%s", M.o->pid_file, oldbin ? ".oldbin" : "");
}

static void pid_file_write(void)
{
    if (M.o->pid_file == NULL)
        return;
    char tmp[4200], line[32];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", M.o->pid_file, (int)getpid());
    int n = snprintf(line, sizeof(line), "%d\n", (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    /* Written whole, then renamed: a reader never sees half a number. */
    if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd) < 0 ||
        rename(tmp, M.o->pid_file) < 0) {
        ms_log(MS_LOG_WARN, "cannot write the pid file %s: %s", M.o->pid_file, strerror(errno));
        unlink(tmp);
    }
}

/* Whether the pid file `name` holds this process's pid. */
static int pid_file_ours(const char *name)
{
    char line[32] = "";
    int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, line, sizeof(line) - 1);
    close(fd);
    return n > 0 && strtol(line, NULL, 10) == (long)getpid();
}

/* At the end: removes the pid file this master wrote, under either name, and only if it is
 * still this master's (a new master wrote its own under the first name). */
static void pid_file_remove(void)
{
    if (M.o->pid_file == NULL)
        return;
    char name[4200];
    for (int oldbin = 0; oldbin < 2; oldbin++) {
        pid_file_name(name, sizeof(name), oldbin);
        if (pid_file_ours(name))
            unlink(name);
    }
}

/* Moves this master's pid file to FILE.oldbin (the upgrade starts) or back (it was undone). */
static void pid_file_move(int to_oldbin)
{
    if (M.o->pid_file == NULL)
        return;
    char from[4200], to[4200];
    pid_file_name(from, sizeof(from), !to_oldbin);
    pid_file_name(to, sizeof(to), to_oldbin);
    if (pid_file_ours(from) && rename(from, to) < 0)
        ms_log(MS_LOG_WARN, "cannot rename the pid file %s to %s: %s", from, to, strerror(errno));
}

/* How long a new master may take to be ready: its app's load and its workers' start each get
 * start_timeout, and a new master whose workers failed gets stop_timeout to stop them. */
static double upgrade_deadline(void)
{
    double start = M.o->start_timeout > 0 ? M.o->start_timeout : MS_START_TIMEOUT;
    return 2 * start + M.o->stop_timeout;
}

static void upgrade_handle_closed(uv_handle_t *h)
{
    U.handles--;
}

/* Lets go of the new master's handles: when it exited, and when this master stops (the new
 * one then serves on, no longer this one's to watch). */
static void upgrade_release(void)
{
    if (U.ready_fd >= 0) {
        uv_close((uv_handle_t *)&U.poll, upgrade_handle_closed);
        uv_close((uv_handle_t *)&U.deadline, upgrade_handle_closed);
        uv_close((uv_handle_t *)&U.proc, upgrade_handle_closed);
        close(U.ready_fd);
        U.ready_fd = -1;
    }
    U.pid = 0;
    U.ready = 0;
    U.quit = 0;
}

static void upgrade_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    if (M.stopping) {
        /* (This master is on its way out: the new one's exit changes nothing.) */
    } else if (!U.ready) {
        ms_log(MS_LOG_ERR,
               "upgrade failed: the new master (pid %d) exited (status %lld, signal "
               "%d) before it was ready; this master (pid %d) serves on%s",
               U.pid, (long long)status, sig, (int)getpid(),
               U.quit ? " (the QUIT that waited for it is dropped)" : "");
        pid_file_move(0);
    } else {
        ms_log(MS_LOG_WARN,
               "the new master (pid %d) exited (status %lld, signal %d): the "
               "upgrade is undone, this master (pid %d) serves on",
               U.pid, (long long)status, sig, (int)getpid());
        pid_file_move(0);
    }
    upgrade_release();
}

static int upgrade_finish(int signum);

static void upgrade_readable(uv_poll_t *p, int status, int events)
{
    char byte;
    ssize_t n = status < 0 ? -1 : read(U.ready_fd, &byte, 1);
    if (n < 0 && status >= 0 && (errno == EAGAIN || errno == EINTR))
        return;
    uv_poll_stop(p); /* one byte, or the end: its exit says the rest */
    if (n == 1 && !U.ready) {
        U.ready = 1;
        uv_timer_stop(&U.deadline);
        ms_log(MS_LOG_INFO,
               "upgrade: the new master (pid %d) is ready; QUIT this master (pid "
               "%d) to finish, or TERM the new one to undo it",
               U.pid, (int)getpid());
        if (U.quit)
            upgrade_finish(SIGQUIT);
    }
}

static void upgrade_deadline_cb(uv_timer_t *t)
{
    if (U.ready || U.pid == 0)
        return;
    ms_log(MS_LOG_ERR,
           "upgrade failed: the new master (pid %d) is not ready after %.14g s: "
           "stopping it; this master (pid %d) serves on%s",
           U.pid, upgrade_deadline(), (int)getpid(),
           U.quit ? " (the QUIT that waited for it is dropped)" : "");
    U.quit = 0;
    uv_process_kill(&U.proc, SIGKILL);
}

/* USR2: starts the new master, unless one is under way or this one is still the new master
 * of an upgrade (its old master has not been told QUIT). */
static void upgrade_start(void)
{
    const ms_master_opts_t *o = M.o;
    if (M.stopping)
        return;
    if (U.pid > 0) {
        ms_log(MS_LOG_WARN,
               "SIGUSR2: an upgrade is under way (the new master is pid %d): not "
               "starting another; QUIT this master (pid %d) to finish it, or TERM the new one "
               "to undo it",
               U.pid, (int)getpid());
        return;
    }
    if (U.parent > 0 && getppid() == U.parent) {
        ms_log(MS_LOG_WARN,
               "SIGUSR2: the old master (pid %d) still runs: not upgrading (QUIT "
               "it first)",
               U.parent);
        return;
    }
    if (!M.started) {
        ms_log(MS_LOG_WARN, "SIGUSR2: the workers are still starting: not upgrading");
        return;
    }
    if (U.handles > 0) { /* (the last upgrade's handles close at the end of this loop turn) */
        ms_log(MS_LOG_WARN, "SIGUSR2: the last upgrade is still ending: not upgrading (send "
                            "SIGUSR2 again)");
        return;
    }
    /* Every slot's sockets, or the one set they share (socket activation). */
    int groups = M.activated ? 1 : o->workers, nfds = groups * o->nlisten;
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0) {
        ms_log(MS_LOG_ERR, "SIGUSR2: cannot upgrade: %s", strerror(errno));
        return;
    }
    int nstdio = 4 + nfds;
    uv_stdio_container_t *stdio = calloc((size_t)nstdio, sizeof(*stdio));
    extern char **environ;
    int n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc((size_t)n + 2, sizeof(char *));
    if (stdio == NULL || env == NULL)
        abort();
    for (int i = 0; i < 3; i++) {
        stdio[i].flags = UV_INHERIT_FD;
        stdio[i].data.fd = i;
    }
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = pipefd[1];
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < o->nlisten; j++) {
            stdio[4 + g * o->nlisten + j].flags = UV_INHERIT_FD;
            stdio[4 + g * o->nlisten + j].data.fd = M.slots[g].fds[j];
        }
    char count[64];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strncmp(environ[i], "MOONSERVE_UPGRADE_FDS=", 22) != 0)
            env[k++] = environ[i];
    snprintf(count, sizeof(count), "MOONSERVE_UPGRADE_FDS=%d", nfds);
    env[k++] = count;
    env[k] = NULL;

    /* (Renamed first: the new master writes its own under the name once it is ready.) */
    pid_file_move(1);
    uv_process_options_t po;
    memset(&po, 0, sizeof(po));
    po.file = o->argv[0];
    po.args = o->argv;
    po.env = env;
    po.exit_cb = upgrade_exit_cb;
    po.stdio = stdio;
    po.stdio_count = nstdio;
    int rc = uv_spawn(M.loop, &U.proc, &po);
    free(env);
    free(stdio);
    close(pipefd[1]);
    if (rc < 0) {
        ms_log(MS_LOG_ERR, "SIGUSR2: cannot start %s: %s; this master serves on", o->argv[0],
               uv_strerror(rc));
        close(pipefd[0]);
        U.handles++;
        uv_close((uv_handle_t *)&U.proc, upgrade_handle_closed);
        pid_file_move(0);
        return;
    }
    U.pid = U.proc.pid;
    U.ready = 0;
    U.ready_fd = pipefd[0];
    fcntl(U.ready_fd, F_SETFL, fcntl(U.ready_fd, F_GETFL) | O_NONBLOCK);
    U.handles += 3;
    uv_poll_init(M.loop, &U.poll, U.ready_fd);
    uv_poll_start(&U.poll, UV_READABLE, upgrade_readable);
    uv_timer_init(M.loop, &U.deadline);
    uv_timer_start(&U.deadline, upgrade_deadline_cb, (uint64_t)(upgrade_deadline() * 1000), 0);
    ms_log(MS_LOG_INFO,
           "SIGUSR2: upgrading: started a new master (pid %d) on this master's %d "
           "listening socket%s",
           U.pid, nfds, nfds == 1 ? "" : "s");
}

/* In a new master: takes the old master's listening sockets (MOONSERVE_UPGRADE_FDS, from fd 4
 * on, a set of o->nlisten per slot of the old master) instead of binding. A slot gets the set
 * of the same index; when the old master had one set (socket activation), every slot shares
 * it; a slot beyond the old master's binds a set of its own beside them (SO_REUSEPORT). A set
 * no slot takes is closed (a warning: connections queued on it when the old master stops are
 * lost). Returns the number of sets taken (0: not an upgrade), or a negative code. */
static int inherited_sockets(const ms_master_opts_t *o)
{
    const char *v = getenv("MOONSERVE_UPGRADE_FDS");
    if (v == NULL)
        return 0;
    int n = (int)strtol(v, NULL, 10);
    unsetenv("MOONSERVE_UPGRADE_FDS");
    U.parent = (int)getppid();
    /* The ready pipe and the sockets, out of the way of the workers' channel (fd 3) and
     * sockets (fd 4 on). */
    U.tell_fd = fcntl(3, F_DUPFD_CLOEXEC, 4 + n);
    close(3);
    int *fds = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    for (int i = 0; i < n; i++) {
        fds[i] = fcntl(4 + i, F_DUPFD_CLOEXEC, 4 + n);
        close(4 + i);
    }
    if (n < o->nlisten || n % o->nlisten != 0 || U.tell_fd < 0) {
        ms_log(MS_LOG_ERR,
               "upgrade: the old master passed %d listening sockets for %d --listen "
               "addresses",
               n, o->nlisten);
        for (int i = 0; i < n; i++)
            close(fds[i]);
        free(fds);
        return UV_EINVAL;
    }
    int groups = n / o->nlisten;
    for (int j = 0; j < o->nlisten; j++) {
        const char *colon = strrchr(o->listen[j], ':');
        int want = colon ? (int)strtol(colon + 1, NULL, 10) : 0, got = ms_fd_port(fds[j]);
        if (want != 0 && want != got) {
            ms_log(MS_LOG_ERR, "upgrade: the old master's socket %d is on port %d, not %s", j + 1,
                   got, o->listen[j]);
            for (int i = 0; i < n; i++)
                close(fds[i]);
            free(fds);
            return UV_EINVAL;
        }
        o->ports[j] = got;
    }
    for (int i = 0; i < o->workers; i++)
        for (int j = 0; j < o->nlisten; j++) {
            if (i < groups)
                M.slots[i].fds[j] = fds[i * o->nlisten + j];
            else if (groups == 1)
                M.slots[i].fds[j] = fds[j];
            else {
                int fd = ms_listen_fd(o->listen[j], o->backlog, o->ports[j]);
                if (fd < 0) {
                    free(fds);
                    return fd;
                }
                M.slots[i].fds[j] = fd;
            }
        }
    if (groups > 1 && groups > o->workers) {
        ms_log(MS_LOG_WARN,
               "upgrade: the old master ran %d workers, this one runs %d: "
               "connections queued on the sockets of its other %d when it stops are lost",
               groups, o->workers, groups - o->workers);
        for (int i = o->workers * o->nlisten; i < n; i++)
            close(fds[i]);
    }
    free(fds);
    ms_log(MS_LOG_INFO, "upgrade: took %d listening socket%s from the old master (pid %d)", n,
           n == 1 ? "" : "s", U.parent);
    return groups;
}

/* Every worker is ready for the first time: the pid file, and in a new master, the word to
 * the old one. */
static void master_started(void)
{
    pid_file_write();
    if (U.tell_fd >= 0) {
        if (write(U.tell_fd, "1", 1) != 1)
            ms_log(MS_LOG_WARN,
                   "upgrade: cannot tell the old master (pid %d) this one is "
                   "ready: %s",
                   U.parent, strerror(errno));
        /* (tell_fd stays open: old_master_serves polls it) */
    }
}

/* In a new master: whether the old master still serves from the same sockets: it is still
 * this master's parent, and has not closed the read end of the ready pipe (it does once it
 * stops, upgrade_finish). */
static int old_master_serves(void)
{
    if (U.parent <= 0 || U.tell_fd < 0 || getppid() != U.parent)
        return 0;
    struct pollfd pf = {.fd = U.tell_fd, .events = POLLOUT};
    return poll(&pf, 1, 0) >= 0 && !(pf.revents & (POLLERR | POLLHUP | POLLNVAL));
}

/* TERM or QUIT while another master serves from the same sockets (an upgrade's new master
 * once it is ready, or in a new master, the old one, which a TERM to undo the upgrade leaves
 * serving): this master's workers stop as an old worker of a reload does (SIGUSR2: no delay,
 * readyz stays 200, as the service is still up, served by the other master), and the
 * agent-check still says ready (its port is shared, SO_REUSEPORT: a "drain" here would
 * alternate with the other's "ready"). A QUIT that comes while the new master is starting
 * waits for it to be ready (a drain now would answer readyz 503 beside its 200). Returns 1,
 * or 0 when no other master serves (the signal then drains as usual). */
static int upgrade_finish(int signum)
{
    if (M.stopping)
        return 0;
    const char *other;
    int pid;
    if (U.pid > 0 && U.ready) {
        other = "the new master";
        pid = U.pid;
    } else if (signum == SIGQUIT && U.pid > 0) {
        if (!U.quit)
            ms_log(MS_LOG_INFO,
                   "SIGQUIT: the new master (pid %d) is not ready yet: stopping "
                   "once it is",
                   U.pid);
        U.quit = 1;
        return 1;
    } else if (old_master_serves()) {
        other = "the old master";
        pid = U.parent;
    } else {
        return 0;
    }
    ms_log(MS_LOG_INFO, "signal %d: %s (pid %d) serves: stopping %d workers", signum, other, pid,
           M.live);
    M.stopping = 1;
    if (U.ready_fd >= 0) {
        /* The new master's old_master_serves: the read end closes (the number stays, on
         * /dev/null, for upgrade_release's handles). */
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, U.ready_fd);
            close(null);
        }
    }
    kill_all(SIGUSR2);
    uv_timer_start(&M.kill_timer, kill_timer_cb, (uint64_t)(M.o->stop_timeout * 1000), 0);
    maybe_done();
    return 1;
}

/* -- The drain -------------------------------------------------------------------------------
 * TERM or QUIT: the workers drain (ms_server_drain: readyz 503 at once, still accepting for
 * the drain delay, then their listeners close), and the agent-check says "drain". The
 * master holds a copy of every listening socket: it closes its copies when the delay is over,
 * so that the sockets really close then and a new connection is refused at once, rather than
 * queued on a socket that nobody accepts from any more. */

static void close_listening(void)
{
    for (int i = 0; i < M.o->workers; i++)
        for (int j = 0; j < M.o->nlisten; j++) {
            int fd = M.slots[i].fds[j];
            if (fd < 0)
                continue;
            close(fd);
            /* (activated: every slot has the same sockets) */
            for (int k = i; k < M.o->workers; k++)
                if (M.slots[k].fds[j] == fd)
                    M.slots[k].fds[j] = -1;
        }
}

static void drain_timer_cb(uv_timer_t *t)
{
    close_listening();
    ms_log(MS_LOG_INFO, "drain: the listening sockets are closed; %d worker%s finishing", M.live,
           M.live == 1 ? "" : "s");
}

/* Returns the delay in ms; the kill timer starts after it. */
static uint64_t drain_begin(int signum)
{
    uint64_t ms = (uint64_t)(M.o->drain_delay * 1000);
    ms_agent_drain(M.agent);
    if (ms == 0) {
        ms_log(MS_LOG_INFO, "signal %d: stopping %d workers", signum, M.live);
        close_listening();
        return 0;
    }
    ms_log(MS_LOG_INFO, "signal %d: draining %d workers: not ready, accepting for %.3g s more, "
           "then stopping", signum, M.live, M.o->drain_delay);
    uv_timer_start(&M.drain_timer, drain_timer_cb, ms, 0);
    return ms;
}

static void drain_end(void)
{
    uv_close((uv_handle_t *)&M.drain_timer, NULL);
    ms_agent_close(M.agent);
    M.agent = NULL;
}

static int drain_init(void)
{
    uv_timer_init(M.loop, &M.drain_timer);
    if (M.o->agent_check == NULL)
        return 0;
    int rc = ms_agent_start(M.loop, M.o->agent_check, M.o->agent_maint, &M.agent);
    if (rc < 0)
        ms_log(MS_LOG_ERR, "cannot listen on %s for the agent-check: %s", M.o->agent_check,
               uv_strerror(rc));
    return rc;
}

/* -- Signals -------------------------------------------------------------------------------- */

static void kill_all(int sig)
{
    for (int i = 0; i < M.o->workers; i++) {
        slot_t *s = &M.slots[i];
        if (s->current && !s->current->exited)
            uv_process_kill(&s->current->proc, sig);
        if (s->next && !s->next->exited)
            uv_process_kill(&s->next->proc, sig);
    }
}

static void kill_timer_cb(uv_timer_t *t)
{
    ms_log(MS_LOG_WARN, "workers still running after %.0f s: killing them", M.o->stop_timeout);
    kill_all(SIGKILL);
}

static void on_signal(uv_signal_t *h, int signum)
{
    uint64_t drain_ms = 0;
    switch (signum) {
    case SIGTERM:
    case SIGQUIT:
        if (M.stopping)
            return;
        if (upgrade_finish(signum))
            break; /* (another master serves the same sockets: a handover, no drain) */
        drain_ms = drain_begin(signum);
        /* The workers hear INT, or TERM for TERM and QUIT (they drain alike, and TERM has
         * no core dump for its default action); INT stops without the delay. */
        /* fall through */
    case SIGINT:
        if (M.stopping && signum == SIGINT) {
            /* During a drain's delay: cut it short (the workers hear INT too). A second TERM
             * or QUIT, or INT once the delay is over, changes nothing. */
            if (uv_is_active((uv_handle_t *)&M.drain_timer)) {
                uv_timer_stop(&M.drain_timer);
                ms_log(MS_LOG_INFO,
                       "signal %d: the drain's delay is cut short: stopping %d "
                       "workers",
                       signum, M.live);
                close_listening();
                kill_all(SIGINT);
                uv_timer_start(&M.kill_timer, kill_timer_cb, (uint64_t)(M.o->stop_timeout * 1000),
                               0);
            }
            return;
        }
        if (M.stopping)
            return;
        if (signum == SIGINT)
            ms_log(MS_LOG_INFO, "signal %d: stopping %d workers", signum, M.live);
        M.stopping = 1;
        notify("STOPPING=1");
        kill_all(signum == SIGINT ? SIGINT : SIGTERM);
        uv_timer_start(&M.kill_timer, kill_timer_cb,
                       drain_ms + (uint64_t)(M.o->stop_timeout * 1000), 0);
        maybe_done();
        break;
    case SIGHUP:
        if (M.stopping)
            return;
        for (int i = 0; i < M.o->workers; i++)
            if (M.slots[i].next != NULL && M.slots[i].next->quiet) {
                /* (Its new workers would wait for these, which never become ready.) */
                ms_log(MS_LOG_WARN, "SIGHUP: the last reload failed and its new workers are "
                                    "still stopping; not reloading (send SIGHUP again)");
                return;
            }
        if (M.o->on_reload != NULL) {
            char why[1024] = "";
            if (M.o->on_reload(M.o, why, sizeof(why)) < 0) {
                ms_log(MS_LOG_ERR, "SIGHUP: not reloading, the old workers serve on: %s", why);
                return;
            }
        }
        ms_log(MS_LOG_INFO, "SIGHUP: starting new workers");
        M.reloading = 1;
        notify("RELOADING=1");
        for (int i = 0; i < M.o->workers; i++) {
            slot_t *s = &M.slots[i];
            if (s->next != NULL)
                continue; /* a reload of this slot is under way */
            if (s->current == NULL)
                spawn(s);
            else
                spawn_into(s, &s->next);
        }
        break;
    case SIGUSR1:
        /* The master opens the logs anew, itself, before the workers ask for them. */
        logs_reopen();
        ms_log_reopen();
        kill_all(SIGUSR1);
        break;
    case SIGUSR2: upgrade_start(); break;
    case SIGCHLD: break; /* libuv reaps; the handle is here so that nothing else does */
    }
}

/* -- Running -------------------------------------------------------------------------------- */

int ms_master_run(const ms_master_opts_t *o)
{
    memset(&M, 0, sizeof(M));
    M.loop = uv_default_loop();
    M.o = o;
    if (o->nlisten > 16 || o->nlisten < 1 || o->workers < 1)
        return UV_EINVAL;
    signal(SIGPIPE, SIG_IGN);
    notify_open();
    M.metrics_fd = -1;
    M.config_fd = -1;
    if (o->config != NULL) {
        int crc = ms_master_config(o->config, o->config_len);
        if (crc < 0)
            return crc;
    }
    M.slots = calloc((size_t)o->workers, sizeof(slot_t));
    for (int i = 0; i < o->workers; i++) {
        slot_t *s = &M.slots[i];
        s->index = i;
        s->fds = calloc((size_t)o->nlisten, sizeof(int));
        for (int j = 0; j < o->nlisten; j++)
            s->fds[j] = -1; /* (none yet: close_listening skips it) */
        uv_timer_init(M.loop, &s->respawn);
        s->respawn.data = s;
    }
    int rc = logs_open();
    if (rc < 0) {
        logs_close();
        return rc;
    }
    ms__log_opener = master_log;
    ms_log_reopen(); /* the master's own log, if it has one: the file just opened */
    rc = activated_sockets(o);
    M.activated = rc > 0;
    int bound = rc > 0;
    if (rc == 0) {
        rc = inherited_sockets(o); /* (an upgrade: the sockets of the master before it) */
        M.activated = rc == 1;      /* (one set, which every slot shares) */
        bound = rc > 0;
    }
    if (rc < 0)
        return rc;
    for (int i = 0; i < o->workers && !bound; i++) {
        slot_t *s = &M.slots[i];
        for (int j = 0; j < o->nlisten; j++) {
            /* Port 0: the first socket picks a port and the others share it. */
            int fd = ms_listen_fd(o->listen[j], o->backlog, i > 0 ? o->ports[j] : -1);
            if (fd < 0) {
                close_listening(); /* (those bound before it) */
                return fd;
            }
            s->fds[j] = fd;
            if (i == 0)
                o->ports[j] = ms_fd_port(fd);
        }
    }
    rc = drain_init();
    if (rc < 0) {
        close_listening(); /* (the sockets bound, or taken over, above) */
        return rc;
    }
    int sigs[MS_MASTER_NSIG] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGCHLD, SIGUSR2, SIGQUIT};
    for (int i = 0; i < MS_MASTER_NSIG; i++) {
        uv_signal_init(M.loop, &M.sig[i]);
        uv_signal_start(&M.sig[i], on_signal, sigs[i]);
    }
    uv_timer_init(M.loop, &M.kill_timer);
    M.tickets_fd = -1;
    uv_timer_init(M.loop, &M.tickets_timer);
    if (o->on_listen != NULL)
        o->on_listen(o);
    for (int i = 0; i < o->workers; i++)
        spawn(&M.slots[i]);
    uv_run(M.loop, UV_RUN_DEFAULT);
    for (int i = 0; i < o->workers; i++) {
        for (int j = 0; j < o->nlisten && (i == 0 || !M.activated); j++)
            if (M.slots[i].fds[j] >= 0) /* (-1: closed at the drain's end) */
                close(M.slots[i].fds[j]); /* (activated: every slot has the same sockets) */
        free(M.slots[i].fds);
    }
    if (M.notify_fd >= 0)
        close(M.notify_fd);
    free(M.slots);
    for (int i = 0; i < M.nzones; i++) {
        ms_shdict_detach(M.zones[i].dict);
        close(M.zones[i].fd);
    }
    free(M.zones);
    if (M.tickets_fd >= 0) {
        ms_tickets_detach(M.tickets);
        close(M.tickets_fd);
    }
    if (M.metrics_fd >= 0) {
        munmap(M.metrics, 4096 + (size_t)(M.metrics->nslots * M.metrics->slot_size));
        close(M.metrics_fd);
    }
    free(M.metrics_writer);
    if (M.config_fd >= 0)
        close(M.config_fd);
    if (U.tell_fd >= 0)
        close(U.tell_fd);
    pid_file_remove();
    logs_close();
    return M.code;
}

/* -- Users ---------------------------------------------------------------------------------- */

int ms_user_ids(const char *user, const char *group, int *uid, int *gid, char *why, size_t why_len)
{
    errno = 0;
    struct passwd *pw = getpwnam(user);
    if (pw == NULL) {
        snprintf(why, why_len, "unknown user %.200s (%s)", user,
                 errno ? strerror(errno) : "not in the system's user database");
        return -1;
    }
    *uid = (int)pw->pw_uid;
    *gid = (int)pw->pw_gid;
    if (group != NULL) {
        errno = 0;
        struct group *gr = getgrnam(group);
        if (gr == NULL) {
            snprintf(why, why_len, "unknown group %.200s (%s)", group,
                     errno ? strerror(errno) : "not in the system's group database");
            return -1;
        }
        *gid = (int)gr->gr_gid;
    }
    return 0;
}

int ms_user_check(int uid, int gid, char *why, size_t why_len)
{
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    gid_t groups[2];
    if (getresuid(&ruid, &euid, &suid) < 0 || getresgid(&rgid, &egid, &sgid) < 0) {
        snprintf(why, why_len, "cannot read this process's ids: %s", strerror(errno));
        return -1;
    }
    if (ruid != (uid_t)uid || euid != (uid_t)uid || suid != (uid_t)uid) {
        snprintf(why, why_len, "runs as user %d (effective %d, saved %d), not %d", (int)ruid,
                 (int)euid, (int)suid, uid);
        return -1;
    }
    if (rgid != (gid_t)gid || egid != (gid_t)gid || sgid != (gid_t)gid) {
        snprintf(why, why_len, "runs as group %d (effective %d, saved %d), not %d", (int)rgid,
                 (int)egid, (int)sgid, gid);
        return -1;
    }
    int n = getgroups(2, groups);
    if (n < 0 || n > 1 || (n == 1 && groups[0] != (gid_t)gid)) {
        snprintf(why, why_len, "keeps supplementary groups");
        return -1;
    }
    if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) {
        snprintf(why, why_len, "could become root again");
        return -1;
    }
    return 0;
}
