/* master.c: the master process: owns the listening sockets, runs N workers, replaces one
 * that dies, reloads on SIGHUP without losing a connection, stops gracefully on SIGTERM. */
#include "master.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

/* A worker that dies sooner than this after starting is not restarted at once: a broken
 * app would otherwise fork in a tight loop. */
#define MS_RESPAWN_DELAY_MS 1000
#define MS_QUICK_DEATH_MS   1000

typedef struct worker_s worker_t;

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
    uv_pipe_t ready;           /* the worker writes a byte here once it listens */
    uv_timer_t start_deadline; /* until it is ready */
    slot_t *slot;
    uint64_t started;
    int is_ready, exited, handles;
};

typedef struct master_s {
    uv_loop_t *loop;
    const ms_master_opts_t *o;
    slot_t *slots;
    uv_signal_t sig[5];
    uv_timer_t kill_timer;
    int stopping, live, code;
} master_t;

static master_t M;

/* -- Workers ------------------------------------------------------------------------------- */

static void worker_handle_closed(uv_handle_t *h)
{
    worker_t *w = h->data;
    if (--w->handles == 0)
        free(w);
}

static void worker_release(worker_t *w)
{
    if (!uv_is_closing((uv_handle_t *)&w->ready))
        uv_close((uv_handle_t *)&w->ready, worker_handle_closed);
    uv_close((uv_handle_t *)&w->start_deadline, worker_handle_closed);
    uv_close((uv_handle_t *)&w->proc, worker_handle_closed);
}

static void spawn(slot_t *s);

static void respawn_cb(uv_timer_t *t)
{
    slot_t *s = t->data;
    if (!M.stopping && s->current == NULL)
        spawn(s);
}

static void maybe_done(void)
{
    if (M.stopping && M.live == 0) {
        for (int i = 0; i < 5; i++)
            uv_close((uv_handle_t *)&M.sig[i], NULL);
        uv_close((uv_handle_t *)&M.kill_timer, NULL);
        for (int i = 0; i < M.o->workers; i++)
            uv_close((uv_handle_t *)&M.slots[i].respawn, NULL);
    }
}

static void exit_cb(uv_process_t *p, int64_t status, int sig)
{
    worker_t *w = p->data;
    slot_t *s = w->slot;
    M.live--;
    w->exited = 1;
    uint64_t lived = uv_now(M.loop) - w->started;
    if (w == s->next) {
        /* A new worker died before it was ready: the reload failed; the old one stays. */
        ms_log(MS_LOG_ERR,
               "worker %d (pid %d) exited (status %lld, signal %d) before it was "
               "ready: reload failed, the old worker keeps serving",
               s->index, p->pid, (long long)status, sig);
        s->next = NULL;
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

static void ready_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char b[16];
    buf->base = b;
    buf->len = sizeof(b);
}

static void ready_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    worker_t *w = st->data;
    slot_t *s = w->slot;
    if (nread <= 0) {
        uv_read_stop(st);
        return;
    }
    if (w->is_ready)
        return;
    w->is_ready = 1;
    uv_timer_stop(&w->start_deadline);
    if (w == s->next) {
        /* Reload: the new worker accepts from the slot's sockets now; the old drains. */
        worker_t *old = s->current;
        s->current = w;
        s->next = NULL;
        if (old != NULL && !old->exited)
            uv_process_kill(&old->proc, SIGTERM);
        ms_log(MS_LOG_INFO, "worker %d (pid %d) took over", s->index, w->proc.pid);
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
    uv_pipe_init(M.loop, &w->ready, 0);
    w->ready.data = w;
    w->proc.data = w;
    uv_timer_init(M.loop, &w->start_deadline);
    w->start_deadline.data = w;
    w->handles = 3;

    int nstdio = 4 + o->nlisten + o->npass;
    uv_stdio_container_t *stdio = calloc((size_t)nstdio, sizeof(*stdio));
    if (stdio == NULL)
        abort();
    stdio[0].flags = stdio[1].flags = stdio[2].flags = UV_INHERIT_FD;
    stdio[0].data.fd = 0;
    stdio[1].data.fd = 1;
    stdio[2].data.fd = 2;
    stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[3].data.stream = (uv_stream_t *)&w->ready;
    for (int i = 0; i < o->nlisten; i++) {
        stdio[4 + i].flags = UV_INHERIT_FD;
        stdio[4 + i].data.fd = s->fds[i];
    }
    for (int i = 0; i < o->npass; i++) {
        stdio[4 + o->nlisten + i].flags = UV_INHERIT_FD;
        stdio[4 + o->nlisten + i].data.fd = o->pass_fds[i];
    }

    /* The environment, plus who the worker is and where its sockets are. */
    extern char **environ;
    int n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc((size_t)n + 5, sizeof(char *)); /* (the four below, and NULL) */
    char id[64], fds[64], count[64];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strncmp(environ[i], "MOONSERVE_WORKER=", 17) != 0 &&
            strncmp(environ[i], "MOONSERVE_LISTEN_FDS=", 21) != 0 &&
            strncmp(environ[i], "MOONSERVE_WORKERS=", 18) != 0 &&
            strncmp(environ[i], "MOONSERVE_SHARED=", 17) != 0)
            env[k++] = environ[i];
    snprintf(id, sizeof(id), "MOONSERVE_WORKER=%d", s->index);
    snprintf(fds, sizeof(fds), "MOONSERVE_LISTEN_FDS=%d", o->nlisten);
    snprintf(count, sizeof(count), "MOONSERVE_WORKERS=%d", o->workers);
    env[k++] = id;
    env[k++] = fds;
    env[k++] = count;
    if (o->pass_env != NULL)
        env[k++] = (char *)o->pass_env;
    env[k] = NULL;

    uv_process_options_t po;
    memset(&po, 0, sizeof(po));
    po.file = o->argv[0];
    po.args = o->argv;
    po.env = env;
    po.exit_cb = exit_cb;
    po.stdio = stdio;
    po.stdio_count = nstdio;
    int rc = uv_spawn(M.loop, &w->proc, &po);
    free(env);
    free(stdio);
    if (rc < 0) {
        ms_log(MS_LOG_ERR, "worker %d: cannot start %s: %s", s->index, o->argv[0], uv_strerror(rc));
        w->handles = 2;
        uv_close((uv_handle_t *)&w->ready, worker_handle_closed);
        uv_close((uv_handle_t *)&w->start_deadline, worker_handle_closed);
        uv_timer_start(&s->respawn, respawn_cb, MS_RESPAWN_DELAY_MS, 0);
        return;
    }
    M.live++;
    uv_read_start((uv_stream_t *)&w->ready, ready_alloc, ready_read);
    uv_timer_start(&w->start_deadline, start_deadline_cb, (uint64_t)(start_timeout() * 1000), 0);
    *where = w;
}

static void spawn(slot_t *s)
{
    spawn_into(s, &s->current);
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
    switch (signum) {
    case SIGTERM:
    case SIGINT:
        if (M.stopping)
            return;
        ms_log(MS_LOG_INFO, "signal %d: stopping %d workers", signum, M.live);
        M.stopping = 1;
        kill_all(SIGTERM);
        uv_timer_start(&M.kill_timer, kill_timer_cb, (uint64_t)(M.o->stop_timeout * 1000), 0);
        maybe_done();
        break;
    case SIGHUP:
        if (M.stopping)
            return;
        ms_log(MS_LOG_INFO, "SIGHUP: starting new workers");
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
        ms_log_reopen();
        kill_all(SIGUSR1);
        break;
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
    M.slots = calloc((size_t)o->workers, sizeof(slot_t));
    int port = -1;
    for (int i = 0; i < o->workers; i++) {
        slot_t *s = &M.slots[i];
        s->index = i;
        s->fds = calloc((size_t)o->nlisten, sizeof(int));
        uv_timer_init(M.loop, &s->respawn);
        s->respawn.data = s;
        for (int j = 0; j < o->nlisten; j++) {
            /* Port 0: the first socket picks a port and the others share it. */
            int fd = ms_listen_fd(o->listen[j], o->backlog, i > 0 ? o->ports[j] : -1);
            if (fd < 0)
                return fd;
            s->fds[j] = fd;
            if (i == 0)
                o->ports[j] = ms_fd_port(fd);
        }
    }
    (void)port;
    int sigs[5] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGCHLD};
    for (int i = 0; i < 5; i++) {
        uv_signal_init(M.loop, &M.sig[i]);
        uv_signal_start(&M.sig[i], on_signal, sigs[i]);
    }
    uv_timer_init(M.loop, &M.kill_timer);
    if (o->on_listen != NULL)
        o->on_listen(o);
    for (int i = 0; i < o->workers; i++)
        spawn(&M.slots[i]);
    uv_run(M.loop, UV_RUN_DEFAULT);
    for (int i = 0; i < o->workers; i++) {
        for (int j = 0; j < o->nlisten; j++)
            close(M.slots[i].fds[j]);
        free(M.slots[i].fds);
    }
    free(M.slots);
    return 0;
}
