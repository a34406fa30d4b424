/* thread_ffi_test.c: the thread pools of modules/ms_thread_ffi.c on a real loop, with real
 * LuaJIT states in the threads: the queue and its bound, the cap on threads, a job's life,
 * a caller that leaves, the wake-up through the hub's uv_async_t, and a stop with jobs queued
 * and running. It runs in the sanitizer build (ASan and UBSan: leaks, use after free) as the
 * other C suites do; ThreadSanitizer by hand, in a build of its own:
 *   meson setup build-tsan -Db_sanitize=thread -Db_lundef=false -Dlua_tests=false
 *   ninja -C build-tsan spec/thread_ffi_test && build-tsan/spec/thread_ffi_test */
#include "test.h"

#include <unistd.h>

#include "../../../modules/ms_thread_ffi.c"

/* -- The runner the threads load ------------------------------------------------------- */

/* What a thread's state runs for each job: "op:arg" strings, so the tests need no encoding.
 * "gate:N" parks the thread in thread_test_gate(N) (below, through the FFI) until the test
 * opens gate N, so that a job stays running as long as a test needs. */
static const char runner_src[] =
    "local ffi = require 'ffi'\n"
    "ffi.cdef 'int thread_test_gate(int id);'\n"
    "local M = {}\n"
    "function M.run(job)\n"
    "    local op, arg = job:match('^(%w+):(.*)$')\n"
    "    if op == 'echo' then return true, arg end\n"
    "    if op == 'fail' then return false, arg end\n"
    "    if op == 'raise' then error(arg, 0) end\n"
    "    if op == 'raisetable' then error({}) end\n"
    "    if op == 'table' then return true, {} end\n"
    "    if op == 'len' then return true, tostring(#arg) end\n"
    "    if op == 'rep' then return true, string.rep(arg, 1000) end\n"
    "    if op == 'gate' then return true, 'gate ' .. ffi.C.thread_test_gate(tonumber(arg)) end\n"
    "    return false, 'unknown job ' .. job\n"
    "end\n"
    "return M\n";

static char dir[64], path[128];

__attribute__((constructor)) static void write_runner(void)
{
    strcpy(dir, "/tmp/ms-thread-test-XXXXXX");
    if (mkdtemp(dir) == NULL)
        abort();
    char file[128];
    snprintf(file, sizeof(file), "%s/thread_test_runner.lua", dir);
    FILE *f = fopen(file, "w");
    if (f == NULL || fputs(runner_src, f) < 0 || fclose(f) != 0)
        abort();
    snprintf(path, sizeof(path), "%s/?.lua", dir);
}

__attribute__((destructor)) static void remove_runner(void)
{
    char file[128];
    snprintf(file, sizeof(file), "%s/thread_test_runner.lua", dir);
    unlink(file);
    rmdir(dir);
}

/* -- Gates: jobs that run until the test lets them end --------------------------------- */

#define GATES 64
static uv_mutex_t gate_lock;
static uv_cond_t gate_cond;
static int gate_open[GATES];
static int running_now, running_max;

__attribute__((constructor)) static void gates_init(void)
{
    uv_mutex_init(&gate_lock);
    uv_cond_init(&gate_cond);
}

static void gates_reset(void)
{
    uv_mutex_lock(&gate_lock);
    memset(gate_open, 0, sizeof(gate_open));
    running_now = running_max = 0;
    uv_mutex_unlock(&gate_lock);
}

/* Called by a job's Lua in its thread: counts the job as running until gate `id` opens (or
 * 10 s pass: a test that forgot it must not hang). Returns id, or -1 on that timeout. */
MS_EXPORT int thread_test_gate(int id)
{
    int rc = id;
    uv_mutex_lock(&gate_lock);
    running_now++;
    if (running_now > running_max)
        running_max = running_now;
    uv_cond_broadcast(&gate_cond);
    while (!gate_open[id])
        if (uv_cond_timedwait(&gate_cond, &gate_lock, (uint64_t)10e9) != 0) {
            rc = -1;
            break;
        }
    running_now--;
    uv_mutex_unlock(&gate_lock);
    return rc;
}

static void gate_let(int id)
{
    uv_mutex_lock(&gate_lock);
    gate_open[id] = 1;
    uv_cond_broadcast(&gate_cond);
    uv_mutex_unlock(&gate_lock);
}

/* Waits (up to 5 s) until `n` gated jobs are running at once; returns how many are. */
static int wait_running(int n)
{
    uv_mutex_lock(&gate_lock);
    while (running_now < n)
        if (uv_cond_timedwait(&gate_cond, &gate_lock, (uint64_t)5e9) != 0)
            break;
    int now = running_now;
    uv_mutex_unlock(&gate_lock);
    return now;
}

static int max_running(void)
{
    uv_mutex_lock(&gate_lock);
    int n = running_max;
    uv_mutex_unlock(&gate_lock);
    return n;
}

/* -- A worker's loop and what it was woken with ---------------------------------------- */

static uv_loop_t loop;
static ms_server_t *srv;
static uv_timer_t tick; /* keeps uv_run turning while a test waits: the hub's async is unref'd */
static int32_t woken[256];
static int nwoken;

static void on_event(int32_t slot, int status, void *data)
{
    (void)data;
    (void)status;
    if (nwoken < 256)
        woken[nwoken] = slot;
    nwoken++;
}

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void setup(void)
{
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
    ms_server_on_event(srv, on_event);
    uv_timer_init(&loop, &tick);
    nwoken = 0;
    gates_reset();
}

/* Turns the loop until `n` wakes in all have come, or 5 s pass; returns the count. */
static int pump_until(int n)
{
    uint64_t end = uv_hrtime() + (uint64_t)5e9;
    uv_timer_start(&tick, on_tick, 1, 1);
    while (nwoken < n && uv_hrtime() < end)
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    return nwoken;
}

/* Turns the loop for `ms` milliseconds (to see that nothing more comes). */
static void pump_for(int ms)
{
    uint64_t end = uv_hrtime() + (uint64_t)ms * 1000000;
    uv_timer_start(&tick, on_tick, 1, 1);
    while (uv_hrtime() < end)
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
}

static int was_woken(int32_t slot)
{
    int n = 0;
    for (int i = 0; i < nwoken && i < 256; i++)
        n += woken[i] == slot;
    return n;
}

/* The hub closed, every handle gone, the loop closes (ASan then finds any job not freed). */
static int teardown(void)
{
    if (srv != NULL)
        ms_ffi_thread_hub_close(srv);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (srv != NULL)
        ms_server_free(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) {
        uv_print_all_handles(&loop, stderr);
        return 0;
    }
    return hubs == NULL;
}

/* How many of the pool's threads wait for work (read under its lock, as the threads write it). */
static int pool_idle(ms_thread_pool_t *p)
{
    uv_mutex_lock(&p->lock);
    int n = p->idle;
    uv_mutex_unlock(&p->lock);
    return n;
}

static ms_thread_pool_t *pool_new(int threads, int max_queue)
{
    return ms_ffi_thread_pool_new(threads, max_queue, path, "", "thread_test_runner");
}

static ms_thread_job_t *submit(ms_thread_pool_t *p, int32_t slot, const char *job, int *err)
{
    return ms_ffi_thread_submit(p, srv, slot, job, strlen(job), err);
}

/* The result of a done job as a string in `buf`; returns ok. */
static int result(ms_thread_job_t *j, char *buf, size_t cap)
{
    const char *out;
    size_t len;
    int ok = ms_ffi_thread_result(j, &out, &len);
    if (len >= cap)
        len = cap - 1;
    memcpy(buf, out, len);
    buf[len] = 0;
    return ok;
}

/* -- Tests ----------------------------------------------------------------------------- */

TEST(thread_job_runs_and_wakes_its_slot_with_its_result)
{
    setup();
    ms_thread_pool_t *p = pool_new(2, 8);
    ASSERT(p != NULL);
    int err = 0;
    ms_thread_job_t *j = submit(p, 7, "echo:hello", &err);
    ASSERT(j != NULL);
    ASSERT_EQ(0, ms_ffi_thread_done(j)); /* done only once the loop has it */
    ASSERT_EQ(1, pump_until(1));
    ASSERT_EQ(7, woken[0]);
    ASSERT_EQ(1, ms_ffi_thread_done(j));
    char buf[64];
    ASSERT_EQ(1, result(j, buf, sizeof(buf)));
    ASSERT_STR_EQ("hello", buf);
    ms_ffi_thread_free(j);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_job_errors_come_back_as_results_not_raised)
{
    setup();
    ms_thread_pool_t *p = pool_new(1, 8);
    int err = 0;
    static const struct {
        const char *job;
        int ok;
        const char *out;
    } cases[] = {
        {"fail:no such thing", 0, "no such thing"}, /* the runner says false */
        {"raise:boom", 0, "boom"},                  /* the runner raised: lua_pcall's message */
        {"raisetable:", 0, "error in the thread"},  /* raised a value with no text */
        {"table:", 1, ""},                          /* no text to hand back: empty */
        {"nonsense", 0, "unknown job nonsense"},
    };
    ms_thread_job_t *jobs[5];
    for (int i = 0; i < 5; i++) {
        jobs[i] = submit(p, i, cases[i].job, &err);
        ASSERT(jobs[i] != NULL);
    }
    ASSERT_EQ(5, pump_until(5));
    for (int i = 0; i < 5; i++) {
        char buf[128];
        ASSERT_EQ(1, ms_ffi_thread_done(jobs[i]));
        ASSERT_EQ(cases[i].ok, result(jobs[i], buf, sizeof(buf)));
        ASSERT_STR_EQ(cases[i].out, buf);
        ms_ffi_thread_free(jobs[i]);
    }
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_job_bytes_go_in_and_out_whole_with_nul_bytes)
{
    setup();
    ms_thread_pool_t *p = pool_new(1, 8);
    int err = 0;
    size_t n = 1 << 20;
    char *in = malloc(n + 4);
    memcpy(in, "len:", 4);
    memset(in + 4, 0, n); /* NUL bytes: lengths, never strlen */
    ms_thread_job_t *a = ms_ffi_thread_submit(p, srv, 1, in, n + 4, &err);
    free(in);                                                /* copied by the submit */
    ms_thread_job_t *b = submit(p, 2, "rep:\x01\x00", &err); /* strlen: "rep:\x01" */
    ASSERT(a != NULL && b != NULL);
    ASSERT_EQ(2, pump_until(2));
    char buf[64];
    ASSERT_EQ(1, result(a, buf, sizeof(buf)));
    ASSERT_STR_EQ("1048576", buf);
    const char *out;
    size_t len;
    ASSERT_EQ(1, ms_ffi_thread_result(b, &out, &len));
    ASSERT_EQ(1000, len);
    ASSERT_EQ(1, out[999]);
    ms_ffi_thread_free(a);
    ms_ffi_thread_free(b);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_pool_refuses_past_its_queue_and_takes_jobs_again_after)
{
    setup();
    ms_thread_pool_t *p = pool_new(1, 2);
    int err = 0;
    ms_thread_job_t *run = submit(p, 1, "gate:1", &err);
    ASSERT_EQ(1, wait_running(1));
    ms_thread_job_t *q1 = submit(p, 2, "echo:q1", &err);
    ms_thread_job_t *q2 = submit(p, 3, "echo:q2", &err);
    ASSERT(run != NULL && q1 != NULL && q2 != NULL);
    err = 0;
    ASSERT(submit(p, 4, "echo:no", &err) == NULL); /* one running, max_queue waiting: full */
    ASSERT_EQ(UV_EAGAIN, err);
    ASSERT_EQ(2, p->queued);
    gate_let(1);
    ASSERT_EQ(3, pump_until(3));
    ASSERT_EQ(0, was_woken(4));
    ms_thread_job_t *again = submit(p, 5, "echo:again", &err); /* room again */
    ASSERT(again != NULL);
    ASSERT_EQ(4, pump_until(4));
    ms_ffi_thread_free(run);
    ms_ffi_thread_free(q1);
    ms_ffi_thread_free(q2);
    ms_ffi_thread_free(again);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_pool_max_queue_zero_takes_only_what_a_free_thread_will_run)
{
    setup();
    ms_thread_pool_t *p = pool_new(2, 0);
    int err = 0;
    ms_thread_job_t *a = submit(p, 1, "gate:1", &err);
    ms_thread_job_t *b = submit(p, 2, "gate:2", &err);
    ASSERT(a != NULL && b != NULL);
    ASSERT(submit(p, 3, "echo:no", &err) == NULL);
    ASSERT_EQ(UV_EAGAIN, err);
    ASSERT_EQ(2, wait_running(2));
    gate_let(1);
    gate_let(2);
    ASSERT_EQ(2, pump_until(2));
    ms_ffi_thread_free(a);
    ms_ffi_thread_free(b);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_pool_runs_at_most_its_cap_of_threads_at_once)
{
    setup();
    ms_thread_pool_t *p = pool_new(3, 16);
    int err = 0;
    ms_thread_job_t *jobs[8];
    for (int i = 0; i < 8; i++) {
        char job[16];
        snprintf(job, sizeof(job), "gate:%d", i);
        jobs[i] = submit(p, i, job, &err);
        ASSERT(jobs[i] != NULL);
    }
    ASSERT_EQ(3, wait_running(3));
    usleep(50000); /* a fourth would have started by now */
    ASSERT_EQ(3, max_running());
    ASSERT_EQ(3, p->nthreads);
    for (int i = 0; i < 8; i++)
        gate_let(i);
    ASSERT_EQ(8, pump_until(8));
    ASSERT_EQ(3, max_running());
    ASSERT_EQ(3, p->nthreads); /* the threads were used again, not made anew */
    for (int i = 0; i < 8; i++)
        ms_ffi_thread_free(jobs[i]);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_pool_starts_a_thread_for_each_job_no_idle_or_starting_thread_will_take)
{
    static const struct {
        int queued, idle, starting, nthreads, max_threads, want;
    } cases[] = {
        {1, 0, 0, 0, 2, 1}, /* the first job */
        {1, 1, 0, 1, 2, 0}, /* an idle thread takes it */
        {2, 1, 0, 1, 2, 1}, /* two jobs before the idle thread woke: it takes one */
        {2, 0, 1, 1, 2, 1}, /* one thread still starting: it takes one */
        {1, 0, 1, 1, 2, 0}, /* the starting thread takes it */
        {3, 1, 0, 2, 2, 0}, /* at the cap: the job waits */
        {5, 0, 0, 4, 4, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ms_thread_pool_t p = {.queued = cases[i].queued,
                              .idle = cases[i].idle,
                              .starting = cases[i].starting,
                              .nthreads = cases[i].nthreads,
                              .max_threads = cases[i].max_threads};
        if (needs_thread(&p) != cases[i].want)
            TEST_FAIL("case %zu: want %d", i, cases[i].want);
    }
}

/* Jobs that come together while a thread is idle: the idle one takes one, and a new thread
 * (under the cap) the other, rather than one waiting for the other to end. Whether the idle
 * thread wakes between the two submits is up to the scheduler, so the case runs 20 times. */
TEST(thread_pool_starts_a_thread_when_more_jobs_come_than_idle_threads)
{
    setup();
    int both_ran = 0, threads = 0;
    for (int round = 0; round < 20; round++) {
        ms_thread_pool_t *p = pool_new(2, 16);
        int err = 0;
        gates_reset();
        nwoken = 0;
        ms_thread_job_t *first = submit(p, 1, "echo:warm", &err);
        pump_until(1);
        ms_ffi_thread_free(first);
        for (int i = 0; i < 1000 && !pool_idle(p); i++) /* back waiting for work */
            usleep(1000);
        ms_thread_job_t *a = submit(p, 2, "gate:2", &err);
        ms_thread_job_t *b = submit(p, 3, "gate:3", &err);
        threads += p->nthreads;
        both_ran += wait_running(2) == 2; /* at once: a thread each */
        gate_let(2);
        gate_let(3);
        pump_until(3);
        ms_ffi_thread_free(a);
        ms_ffi_thread_free(b);
        ms_ffi_thread_pool_stop(p);
        if (both_ran <= round)
            break; /* one round shows it; the rest would wait 5 s each */
    }
    ASSERT(teardown());
    ASSERT_EQ(20, both_ran);
    ASSERT_EQ(40, threads);
}

TEST(thread_job_of_a_caller_gone_is_freed_when_done_and_wakes_no_one)
{
    setup();
    ms_thread_pool_t *p = pool_new(1, 8);
    int err = 0;
    ms_thread_job_t *running = submit(p, 1, "gate:1", &err);
    ms_thread_job_t *queued = submit(p, 2, "echo:queued", &err);
    ms_thread_job_t *kept = submit(p, 3, "echo:kept", &err);
    ASSERT(running != NULL && queued != NULL && kept != NULL);
    ASSERT_EQ(1, wait_running(1));
    ms_ffi_thread_free(running); /* the caller went while its job runs */
    ms_ffi_thread_free(queued);  /* and while it waits for a thread */
    gate_let(1);
    ASSERT_EQ(1, pump_until(1));
    pump_for(20);
    ASSERT_EQ(1, nwoken);
    ASSERT_EQ(3, woken[0]); /* only the caller still there; the others freed (ASan: no leak) */
    char buf[32];
    ASSERT_EQ(1, result(kept, buf, sizeof(buf)));
    ASSERT_STR_EQ("kept", buf);
    ms_ffi_thread_free(kept);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

static void let_gate_later(void *arg)
{
    usleep(50000);
    gate_let((int)(intptr_t)arg);
}

TEST(thread_pool_stop_waits_for_running_jobs_and_drops_queued_ones)
{
    setup();
    ms_thread_pool_t *p = pool_new(1, 8);
    int err = 0;
    ms_thread_job_t *running = submit(p, 1, "gate:1", &err);
    ms_thread_job_t *queued = submit(p, 2, "echo:never", &err);
    ms_thread_job_t *gone = submit(p, 3, "echo:gone", &err);
    ASSERT(running != NULL && queued != NULL && gone != NULL);
    ASSERT_EQ(1, wait_running(1));
    ms_ffi_thread_free(gone); /* queued, its caller gone: freed when stopped */
    uv_thread_t t;
    uv_thread_create(&t, let_gate_later, (void *)(intptr_t)1);
    ms_ffi_thread_pool_stop(p); /* returns once the running job has ended */
    uv_thread_join(&t);
    ASSERT_EQ(2, pump_until(2));
    pump_for(10);
    ASSERT_EQ(2, nwoken);
    char buf[64];
    ASSERT_EQ(1, result(running, buf, sizeof(buf)));
    ASSERT_STR_EQ("gate 1", buf); /* it ran to its end */
    ASSERT_EQ(0, result(queued, buf, sizeof(buf)));
    ASSERT_STR_EQ("thread pool stopped", buf);
    ms_ffi_thread_free(running);
    ms_ffi_thread_free(queued);
    ASSERT(teardown());
}

TEST(thread_hub_close_frees_jobs_done_whose_callers_are_gone_and_leaves_the_others)
{
    setup();
    ms_thread_pool_t *p = pool_new(2, 8);
    int err = 0;
    ms_thread_job_t *held = submit(p, 1, "gate:1", &err);
    ms_thread_job_t *gone = submit(p, 2, "gate:2", &err);
    ASSERT(held != NULL && gone != NULL);
    ASSERT_EQ(2, wait_running(2));
    ms_ffi_thread_free(gone); /* abandoned, still running */
    gate_let(1);
    gate_let(2);
    ms_ffi_thread_pool_stop(p); /* both ended in their threads; the loop never ran */
    ASSERT_EQ(0, nwoken);
    ASSERT(hubs != NULL && hubs->done != NULL);
    ASSERT(teardown()); /* the server stops: its hub frees `gone` (ASan: no leak) and goes */
    ASSERT_EQ(0, nwoken);
    ASSERT_EQ(1, ms_ffi_thread_done(held)); /* left to its caller, done, unwoken */
    char buf[16];
    ASSERT_EQ(1, result(held, buf, sizeof(buf)));
    ASSERT_STR_EQ("gate 1", buf);
    ms_ffi_thread_free(held);
}

/* An in-process server (moonserve.test) ends while the pools, the process's, go on: its hub
 * must outlive the jobs still in a thread, and wake no one (the server is gone). */
TEST(thread_hub_closed_while_its_jobs_run_waits_for_them_and_wakes_no_one)
{
    setup();
    ms_thread_pool_t *p = pool_new(2, 8);
    int err = 0;
    ms_thread_job_t *gone = submit(p, 1, "gate:1", &err);
    ms_thread_job_t *held = submit(p, 2, "gate:2", &err);
    ASSERT(gone != NULL && held != NULL);
    ASSERT_EQ(2, wait_running(2));
    ms_ffi_thread_free(gone); /* its caller ended with the server */
    ms_ffi_thread_hub_close(srv);
    ms_server_free(srv); /* the pool goes on; the loop too */
    srv = NULL;
    ASSERT(hubs == NULL); /* a new server gets a hub of its own */
    gate_let(1);
    gate_let(2);
    pump_for(50);
    ASSERT_EQ(0, nwoken);
    ASSERT_EQ(1, ms_ffi_thread_done(held)); /* left to the caller that still holds it */
    ms_ffi_thread_free(held);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_jobs_finishing_together_each_wake_once)
{
    setup();
    ms_thread_pool_t *p = pool_new(4, 256);
    int err = 0;
    ms_thread_job_t *jobs[200];
    for (int i = 0; i < 200; i++) {
        jobs[i] = submit(p, 1000 + i, "echo:x", &err);
        ASSERT(jobs[i] != NULL);
    }
    ASSERT_EQ(200, pump_until(200));
    pump_for(10);
    ASSERT_EQ(200, nwoken);
    for (int i = 0; i < 200; i++) {
        ASSERT_EQ(1, was_woken(1000 + i));
        ASSERT_EQ(1, ms_ffi_thread_done(jobs[i]));
        ms_ffi_thread_free(jobs[i]);
    }
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_without_its_runner_answers_each_job_with_an_error)
{
    setup();
    ms_thread_pool_t *p = ms_ffi_thread_pool_new(1, 8, path, "", "no_such_runner_module");
    int err = 0;
    ms_thread_job_t *j = submit(p, 1, "echo:x", &err);
    ASSERT(j != NULL);
    ASSERT_EQ(1, pump_until(1));
    char buf[128];
    ASSERT_EQ(0, result(j, buf, sizeof(buf)));
    ASSERT_STR_EQ("thread pool: cannot make the thread's Lua state", buf);
    ms_ffi_thread_free(j);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

/* The real runner (lua/moonserve/host/core/thread_runner.lua) in a thread: a call encoded as
 * lua/moonserve/host/core/threads.lua encodes it (thread_job_bytes first), and its results
 * bounded by that limit in the thread. */
TEST(thread_runner_of_the_tree_runs_a_call_and_bounds_its_results)
{
    setup();
    ms_thread_pool_t *p = ms_ffi_thread_pool_new(1, 8, MS_SOURCE_ROOT "/lua/?.lua", "",
                                                 "moonserve.host.core.thread_runner");
    int err = 0;
    /* string.rep("x", 200), with thread_job_bytes 1000, then 100 */
    ms_thread_job_t *fits = submit(p, 1, "5;d1000;s6:strings3:reps1:xd200;", &err);
    ms_thread_job_t *big = submit(p, 2, "5;d100;s6:strings3:reps1:xd200;", &err);
    ms_thread_job_t *none = submit(p, 3, "3;d100;s6:strings4:nope", &err);
    ASSERT(fits != NULL && big != NULL && none != NULL);
    ASSERT_EQ(3, pump_until(3));
    char buf[256];
    ASSERT_EQ(1, result(fits, buf, sizeof(buf)));
    ASSERT_EQ(207, strlen(buf));
    ASSERT(strncmp(buf, "1;s200:xxx", 10) == 0);
    ASSERT_EQ(0, result(big, buf, sizeof(buf)));
    ASSERT_STR_EQ("results too large (207 bytes encoded; thread_job_bytes is 100)", buf);
    ASSERT_EQ(0, result(none, buf, sizeof(buf)));
    ASSERT_STR_EQ("module 'string' has no function 'nope'", buf);
    ms_ffi_thread_free(fits);
    ms_ffi_thread_free(big);
    ms_ffi_thread_free(none);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST(thread_pool_stop_with_no_thread_started_frees_it)
{
    setup();
    ms_thread_pool_t *p = pool_new(4, 8);
    ASSERT_EQ(0, p->nthreads);
    ms_ffi_thread_pool_stop(p);
    ASSERT(teardown());
}

TEST_MAIN()
