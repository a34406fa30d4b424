/* ms_thread_ffi.c: thread pools for CPU work off the loop: each thread has a LuaJIT state of
 * its own; jobs go in as bytes, results come back as bytes (lua/moonserve/host/core/threads.lua
 * encodes them) and the loop is told through a uv_async_t, then wakes the parked caller. */
#include <assert.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <uv.h>

#include "moonserve.h"

#define MS_FFI MS_EXPORT

/* Threads of our own rather than libuv's pool (uv_queue_work): that pool is shared with the
 * resolver and file I/O, so a long hash there would hold DNS answers up. */

typedef struct ms_thread_job_s ms_thread_job_t;
typedef struct ms_thread_pool_s ms_thread_pool_t;
typedef struct ms_thread_hub_s ms_thread_hub_t;

/* One per server (loop): where finished jobs go back to the loop. */
struct ms_thread_hub_s {
    uv_async_t async;
    ms_server_t *srv;
    uv_mutex_t lock;
    ms_thread_job_t *done; /* finished, not yet handed to the loop */
    ms_thread_hub_t *next;
    int jobs;    /* the loop's thread's: submitted and not yet taken back from `done` */
    int closing; /* its server is gone: no wakes; freed when `jobs` is back to 0 */
};

struct ms_thread_job_s {
    ms_thread_hub_t *hub;
    int32_t slot;
    /* Both are the loop's thread's alone (written and read there, never by a pool's thread):
     * done is set in hub_async, abandoned by ms_ffi_thread_free. */
    int done;
    int abandoned;
    int ok;
    char *in, *out;
    size_t in_len, out_len;
    ms_thread_job_t *next;
};

struct ms_thread_pool_s {
    uv_mutex_t lock;
    uv_cond_t cond;
    int max_threads, nthreads;
    int idle;     /* threads waiting for a job */
    int starting; /* threads made that have not yet come to take a job */
    int max_queue, queued, running;
    int stopping;
    ms_thread_job_t *head, **tail;
    uv_thread_t *threads;
    char *path, *cpath, *runner;
};

static ms_thread_hub_t *hubs;

static void hub_closed(uv_handle_t *a)
{
    ms_thread_hub_t *h = a->data;
    uv_mutex_destroy(&h->lock);
    free(h);
}

/* Takes the finished jobs back on the loop's thread: each caller still there is woken (unless
 * its server is gone: then the job is left, done, to the caller that holds it); a job whose
 * caller is gone is freed. A closing hub goes once its last job is back: a job in a thread
 * still points at it. */
static void hand_over(ms_thread_hub_t *h)
{
    uv_mutex_lock(&h->lock);
    ms_thread_job_t *j = h->done;
    h->done = NULL;
    uv_mutex_unlock(&h->lock);
    while (j != NULL) {
        ms_thread_job_t *next = j->next;
        j->next = NULL;
        h->jobs--;
        if (j->abandoned) { /* its caller is gone: nobody reads the result */
            free(j->in);
            free(j->out);
            free(j);
        } else {
            j->done = 1;
            if (!h->closing)
                ms_wake(h->srv, j->slot, 0);
        }
        j = next;
    }
    assert(h->jobs >= 0);
    if (h->closing && h->jobs == 0 && !uv_is_closing((uv_handle_t *)&h->async))
        uv_close((uv_handle_t *)&h->async, hub_closed);
}

static void hub_async(uv_async_t *a)
{
    hand_over(a->data);
}

static ms_thread_hub_t *hub_for(ms_server_t *srv)
{
    for (ms_thread_hub_t *h = hubs; h != NULL; h = h->next)
        if (h->srv == srv && !h->closing)
            return h;
    ms_thread_hub_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->srv = srv;
    if (uv_mutex_init(&h->lock) != 0 || uv_async_init(ms_server_loop(srv), &h->async, hub_async)) {
        free(h);
        return NULL;
    }
    h->async.data = h;
    uv_unref((uv_handle_t *)&h->async); /* a pool alone does not keep the worker's loop up */
    h->next = hubs;
    hubs = h;
    return h;
}

/* Runs one job in the thread's state: the runner module's function takes the encoded call and
 * returns ok and the encoded results (or the error's text). */
static void run_job(lua_State *L, int runner_ref, ms_thread_job_t *j)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, runner_ref);
    lua_pushlstring(L, j->in, j->in_len);
    int rc = lua_pcall(L, 1, 2, 0);
    size_t n = 0;
    const char *p;
    if (rc != 0) {
        j->ok = 0;
        p = lua_tolstring(L, -1, &n);
        if (p == NULL)
            p = "error in the thread", n = strlen(p);
    } else {
        j->ok = lua_toboolean(L, -2);
        p = lua_tolstring(L, -1, &n);
        if (p == NULL)
            p = "", n = 0;
    }
    j->out = malloc(n ? n : 1);
    if (j->out != NULL) {
        memcpy(j->out, p, n);
        j->out_len = n;
    } else {
        j->ok = 0;
    }
    lua_settop(L, 0);
    lua_gc(L, LUA_GCSTEP, 0);
}

static lua_State *state_new(ms_thread_pool_t *p, int *ref)
{
    lua_State *L = luaL_newstate();
    if (L == NULL)
        return NULL;
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushstring(L, p->path);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, p->cpath);
    lua_setfield(L, -2, "cpath");
    lua_settop(L, 0);
    lua_getglobal(L, "require");
    lua_pushstring(L, p->runner);
    if (lua_pcall(L, 1, 1, 0) != 0 || !lua_istable(L, -1)) {
        lua_close(L);
        return NULL;
    }
    lua_getfield(L, -1, "run");
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    return L;
}

static void finish(ms_thread_job_t *j)
{
    ms_thread_hub_t *h = j->hub;
    uv_mutex_lock(&h->lock);
    j->next = h->done;
    h->done = j;
    uv_mutex_unlock(&h->lock);
    uv_async_send(&h->async);
}

static void thread_main(void *arg)
{
    ms_thread_pool_t *p = arg;
    /* The loop answers requests; a pool's thread only computes. Ten steps below the loop,
     * a busy pool takes the CPU the loop leaves, and the loop's wake-ups preempt it (on
     * Linux a nice value is a thread's: 0 names the calling one). */
    (void)setpriority(PRIO_PROCESS, 0, 10);
    int ref = LUA_NOREF;
    lua_State *L = state_new(p, &ref);
    uv_mutex_lock(&p->lock);
    p->starting--;
    for (;;) {
        while (p->head == NULL && !p->stopping) {
            p->idle++;
            uv_cond_wait(&p->cond, &p->lock);
            p->idle--;
        }
        if (p->stopping && p->head == NULL)
            break;
        ms_thread_job_t *j = p->head;
        p->head = j->next;
        if (p->head == NULL)
            p->tail = &p->head;
        j->next = NULL;
        p->queued--;
        p->running++;
        uv_mutex_unlock(&p->lock);
        if (L == NULL) {
            static const char msg[] = "thread pool: cannot make the thread's Lua state";
            j->ok = 0;
            j->out = malloc(sizeof(msg));
            if (j->out != NULL) {
                memcpy(j->out, msg, sizeof(msg) - 1);
                j->out_len = sizeof(msg) - 1;
            }
        } else {
            run_job(L, ref, j);
        }
        finish(j);
        uv_mutex_lock(&p->lock);
        p->running--;
    }
    uv_mutex_unlock(&p->lock);
    if (L != NULL)
        lua_close(L);
}

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

/* Whether the pool, with its queue as it is now, should start a thread: one for each queued
 * job, up to the cap. An idle thread or one starting takes one job each, so a new one is
 * needed when the jobs outnumber them. (An idle thread woken for an earlier job may not have
 * taken it yet: that is the scheduler's choice, and `idle` counts it until it has.) */
static int needs_thread(const ms_thread_pool_t *p)
{
    return p->queued > p->idle + p->starting && p->nthreads < p->max_threads;
}

/* A pool of at most `threads` threads, each with a state whose package.path / cpath are these,
 * running `runner` (a module name) for each job; at most `max_queue` jobs wait. Threads start
 * when jobs come. NULL when out of memory. */
MS_FFI ms_thread_pool_t *ms_ffi_thread_pool_new(int threads, int max_queue, const char *path,
                                                const char *cpath, const char *runner)
{
    ms_thread_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->threads = calloc((size_t)(threads > 0 ? threads : 1), sizeof(uv_thread_t));
    p->path = str_dup(path);
    p->cpath = str_dup(cpath);
    p->runner = str_dup(runner);
    if (p->threads == NULL || p->path == NULL || p->cpath == NULL || p->runner == NULL ||
        uv_mutex_init(&p->lock) != 0) {
        free(p->threads), free(p->path), free(p->cpath), free(p->runner), free(p);
        return NULL;
    }
    uv_cond_init(&p->cond);
    p->max_threads = threads > 0 ? threads : 1;
    p->max_queue = max_queue;
    p->tail = &p->head;
    return p;
}

/* Queues the call `in` (copied) for the pool; its end wakes `slot` on `srv`. Returns the job,
 * or NULL with *err: UV_EAGAIN (the queue is full), UV_ENOMEM, UV_ECANCELED (stopping). */
MS_FFI ms_thread_job_t *ms_ffi_thread_submit(ms_thread_pool_t *p, ms_server_t *srv, int32_t slot,
                                             const char *in, size_t len, int *err)
{
    ms_thread_hub_t *h = hub_for(srv);
    if (h == NULL) {
        *err = UV_ENOMEM;
        return NULL;
    }
    uv_mutex_lock(&p->lock);
    if (p->stopping) {
        uv_mutex_unlock(&p->lock);
        *err = UV_ECANCELED;
        return NULL;
    }
    /* Full: every thread busy and max_queue jobs waiting for one (a job queued for a thread
     * that has not taken it yet counts against that thread, not the queue). */
    int free_threads = p->max_threads - p->running;
    if (p->queued >= free_threads + p->max_queue) {
        uv_mutex_unlock(&p->lock);
        *err = UV_EAGAIN;
        return NULL;
    }
    ms_thread_job_t *j = calloc(1, sizeof(*j));
    if (j != NULL)
        j->in = malloc(len ? len : 1);
    if (j == NULL || j->in == NULL) {
        uv_mutex_unlock(&p->lock);
        free(j);
        *err = UV_ENOMEM;
        return NULL;
    }
    memcpy(j->in, in, len);
    j->in_len = len;
    j->hub = h;
    h->jobs++;
    j->slot = slot;
    *p->tail = j;
    p->tail = &j->next;
    p->queued++;
    if (needs_thread(p)) {
        if (uv_thread_create(&p->threads[p->nthreads], thread_main, p) == 0) {
            p->nthreads++;
            p->starting++;
        }
    }
    if (p->idle > 0)
        uv_cond_signal(&p->cond);
    if (p->nthreads == 0) { /* no thread could start: take the job back */
        p->head = NULL;
        p->tail = &p->head;
        p->queued--;
        uv_mutex_unlock(&p->lock);
        free(j->in);
        free(j);
        *err = UV_EAGAIN;
        return NULL;
    }
    uv_mutex_unlock(&p->lock);
    return j;
}

/* Whether the job is done (its result is there). */
MS_FFI int ms_ffi_thread_done(ms_thread_job_t *j)
{
    return j->done;
}

/* The done job's result: ok (1 or 0) and its bytes (valid until ms_ffi_thread_free). */
MS_FFI int ms_ffi_thread_result(ms_thread_job_t *j, const char **out, size_t *len)
{
    *out = j->out;
    *len = j->out_len;
    return j->ok;
}

/* The caller is done with the job, or gone: a done job is freed now, one still queued or
 * running when its thread hands it back (its result unread). */
MS_FFI void ms_ffi_thread_free(ms_thread_job_t *j)
{
    if (j->done) {
        free(j->in);
        free(j->out);
        free(j);
        return;
    }
    j->abandoned = 1; /* the loop's thread only: hub_async reads it there */
}

/* Stops and frees the pool: jobs still queued are dropped (their callers are woken with no
 * result: ok 0, "thread pool stopped"), the running ones are waited for, the threads joined. */
MS_FFI void ms_ffi_thread_pool_stop(ms_thread_pool_t *p)
{
    static const char msg[] = "thread pool stopped";
    uv_mutex_lock(&p->lock);
    p->stopping = 1;
    ms_thread_job_t *j = p->head;
    p->head = NULL;
    p->tail = &p->head;
    p->queued = 0;
    uv_cond_broadcast(&p->cond);
    uv_mutex_unlock(&p->lock);
    while (j != NULL) {
        ms_thread_job_t *next = j->next;
        j->ok = 0;
        j->out = malloc(sizeof(msg));
        if (j->out != NULL) {
            memcpy(j->out, msg, sizeof(msg) - 1);
            j->out_len = sizeof(msg) - 1;
        }
        finish(j);
        j = next;
    }
    for (int i = 0; i < p->nthreads; i++)
        uv_thread_join(&p->threads[i]);
    uv_cond_destroy(&p->cond);
    uv_mutex_destroy(&p->lock);
    free(p->threads), free(p->path), free(p->cpath), free(p->runner), free(p);
}

/* The server goes (before ms_server_free): nobody is woken for it any more. Jobs finished
 * and not yet handed over whose callers are gone are freed, the others left, done, to their
 * callers; the hub's handle is closed now if no job of it is in a pool, else when the last
 * one comes back (a worker's pools are stopped first; an in-process server's go on). */
MS_FFI void ms_ffi_thread_hub_close(ms_server_t *srv)
{
    for (ms_thread_hub_t **hp = &hubs; *hp != NULL;) {
        ms_thread_hub_t *h = *hp;
        if (h->srv != srv) {
            hp = &h->next;
            continue;
        }
        *hp = h->next;
        h->closing = 1;
        h->srv = NULL;
        hand_over(h);
    }
}
