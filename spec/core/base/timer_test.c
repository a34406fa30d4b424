/* timer_test.c: the worker's deadline heap, driven by its one uv_timer on a real loop. */
#include "test.h"

#include "../../../core/base/timer.c"

static uv_loop_t loop;
static ms_server_t *srv;

static void setup(void)
{
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
}

/* A timer that notes, in order, which fired. */
typedef struct {
    ms_timer_t t;
    int id;
} tagged_t;

static int fired[64], nfired;

static void note(ms_timer_t *t)
{
    fired[nfired++] = ((tagged_t *)t)->id;
}

/* Every parent due no later than its children, and each timer knows its place. */
static int heap_ok(const ms_server_t *s)
{
    for (uint32_t i = 0; i < s->heap_len; i++) {
        if (s->heap[i]->index != i + 1)
            return 0;
        if (i > 0 && s->heap[(i - 1) / 2]->due > s->heap[i]->due)
            return 0;
    }
    return 1;
}

TEST(timer_fires_in_due_order_on_the_loop)
{
    setup();
    static const int ms[] = {40, 5, 25, 15, 0, 30};
    tagged_t t[6];
    nfired = 0;
    for (int i = 0; i < 6; i++) {
        t[i].id = ms[i];
        t[i].t.index = 0;
        ms_timer_start(srv, &t[i].t, (uint64_t)ms[i], note);
        ASSERT(heap_ok(srv));
    }
    ASSERT_EQ(6, srv->heap_len);
    uint64_t t0 = uv_now(&loop);
    uv_run(&loop, UV_RUN_DEFAULT); /* ends when the last has fired: nothing else holds it */
    ASSERT_EQ(6, nfired);
    static const int want[] = {0, 5, 15, 25, 30, 40};
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(want[i], fired[i]);
    ASSERT(uv_now(&loop) - t0 >= 40); /* not early: the last was due 40 ms on */
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(0, t[i].t.index); /* fired timers are disarmed */
    ASSERT_EQ(0, srv->heap_len);
    teardown();
}

TEST(timer_stopped_never_fires_and_the_heap_stays_whole)
{
    setup();
    tagged_t t[40];
    nfired = 0;
    /* due times in a scrambled order, then every third stopped (from the root, the middle
     * and the leaves) */
    for (int i = 0; i < 40; i++) {
        t[i].id = i;
        t[i].t.index = 0;
        ms_timer_start(srv, &t[i].t, (uint64_t)((i * 17) % 40), note);
    }
    ASSERT(heap_ok(srv));
    int left = 40;
    for (int i = 0; i < 40; i += 3) {
        ms_timer_stop(srv, &t[i].t);
        ASSERT_EQ(0, t[i].t.index);
        ASSERT(heap_ok(srv));
        left--;
    }
    ms_timer_stop(srv, &t[0].t); /* twice: nothing */
    ASSERT_EQ(left, srv->heap_len);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(left, nfired);
    for (int k = 0; k < nfired; k++) {
        ASSERT(fired[k] % 3 != 0);
        if (k > 0) /* in order of due time */
            ASSERT((fired[k - 1] * 17) % 40 <= (fired[k] * 17) % 40);
    }
    teardown();
}

TEST(timer_started_again_moves_instead_of_doubling)
{
    setup();
    tagged_t a = {.id = 1}, b = {.id = 2};
    nfired = 0;
    ms_timer_start(srv, &a.t, 5, note);
    ms_timer_start(srv, &b.t, 10, note);
    ms_timer_start(srv, &a.t, 30, note); /* later than b now */
    ASSERT_EQ(2, srv->heap_len);
    ASSERT(heap_ok(srv));
    ASSERT(srv->heap[0] == &b.t);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(2, nfired);
    ASSERT_EQ(2, fired[0]);
    ASSERT_EQ(1, fired[1]);
    teardown();
}

/* A callback may start its own timer again (a repeating deadline). */
static int repeats;
static void again(ms_timer_t *t)
{
    if (++repeats < 3)
        ms_timer_start(srv, t, 1, again);
}

/* ... or stop another that is due in the same run. */
static ms_timer_t *victim;
static void stop_other(ms_timer_t *t)
{
    note(t);
    ms_timer_stop(srv, victim);
}

TEST(timer_callbacks_may_start_and_stop_timers)
{
    setup();
    ms_timer_t r = {0};
    repeats = 0;
    ms_timer_start(srv, &r, 0, again);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(3, repeats);
    ASSERT_EQ(0, r.index);

    tagged_t a = {.id = 1}, b = {.id = 2};
    nfired = 0;
    victim = &b.t;
    ms_timer_start(srv, &a.t, 0, stop_other);
    ms_timer_start(srv, &b.t, 0, note);
    uv_sleep(2); /* both due by the time the loop looks */
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(1, nfired);
    ASSERT_EQ(1, fired[0]);
    teardown();
}

TEST(timer_is_armed_only_earlier_and_holds_the_loop_only_while_armed)
{
    setup();
    ms_timer_t a = {0}, b = {0};
    ms_timer_start(srv, &a, 1000, note);
    uint64_t armed = srv->armed_due;
    ASSERT_EQ(a.due, armed);
    ms_timer_start(srv, &b, 5000, note); /* later: the uv_timer is left where it is */
    ASSERT_EQ(armed, srv->armed_due);
    ms_timer_start(srv, &b, 10, note); /* earlier: moved */
    ASSERT_EQ(b.due, srv->armed_due);
    ASSERT(uv_loop_alive(&loop));
    ms_timer_stop(srv, &a);
    ms_timer_stop(srv, &b);
    /* Nothing to wait for: the loop may end (a stopping worker must not hang on it). */
    ASSERT(!uv_loop_alive(&loop));
    ms_timer_start(srv, &a, 1000, note);
    ASSERT(uv_loop_alive(&loop));
    ms_timer_stop(srv, &a);
    teardown();
}

TEST_MAIN()
