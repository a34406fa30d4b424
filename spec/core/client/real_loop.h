/* real_loop.h: what the client tests that run on a real loop share: a worker on it, a guard
 * that aborts a wait of over 10 s, a teardown that proves every handle closed and every byte
 * freed, and libuv's thread pool at two threads, which a test can hold (lookups then wait). */
#ifndef MS_TEST_REAL_LOOP_H
#define MS_TEST_REAL_LOOP_H

#include <stdio.h>
#include <stdlib.h>

__attribute__((constructor)) static void small_pool(void)
{
    setenv("UV_THREADPOOL_SIZE", "2", 1);
}

static uv_loop_t loop;
static ms_server_t *srv;
static uv_timer_t guard;
static ms_mem_stats_t mem_before;

static void on_guard(uv_timer_t *t)
{
    (void)t;
    fprintf(stderr, "  %s: a wait took over 10 s\n", __FILE__);
    abort();
}

static void setup(void)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    mem_before = ms_mem_stats;
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
    uv_timer_init(&loop, &guard);
}

static void run_once(void)
{
    uv_timer_start(&guard, on_guard, 10000, 0);
    uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&guard);
}

/* Every handle closed, the worker's sockets state gone, and no byte left allocated. */
static int teardown(void)
{
    uv_close((uv_handle_t *)&guard, NULL);
    if (srv != NULL)
        ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) {
        uv_print_all_handles(&loop, stderr);
        return 0;
    }
    return ms_mem_stats.allocs - mem_before.allocs == ms_mem_stats.frees - mem_before.frees;
}

/* Holds both of the thread pool's threads, so that lookups wait, until pool_release. */
static uv_sem_t hold;
static uv_work_t holders[2];
static int holders_done;

static void hold_work(uv_work_t *w)
{
    (void)w;
    uv_sem_wait(&hold);
}

static void hold_done(uv_work_t *w, int status)
{
    (void)w;
    (void)status;
    holders_done++;
}

static void pool_hold(void)
{
    uv_sem_init(&hold, 0);
    holders_done = 0;
    for (int i = 0; i < 2; i++)
        uv_queue_work(&loop, &holders[i], hold_work, hold_done);
}

static void pool_release(void)
{
    for (int i = 0; i < 2; i++)
        uv_sem_post(&hold);
    while (holders_done < 2)
        run_once();
    uv_sem_destroy(&hold);
}

#endif
