/* timer_test.c: the worker's deadline heap, driven by its one uv_timer on a real loop. */
#include "test.h"

#include "../../../core/base/timer.c"

static uv_loop_t loop;
static ms_timers_t tm;

static void setup(void)
{
    uv_loop_init(&loop);
    ms__timers_init(&tm, &loop);
}

static void teardown(void)
{
    ms__timers_close(&tm);
    uv_run(&loop, UV_RUN_DEFAULT);
    ms__timers_free(&tm);
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
static int heap_ok(const ms_timers_t *s)
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
        ms__timers_start(&tm, &t[i].t, (uint64_t)ms[i], note);
        ASSERT(heap_ok(&tm));
    }
    ASSERT_EQ(6, tm.heap_len);
    uint64_t t0 = uv_now(&loop);
    uv_run(&loop, UV_RUN_DEFAULT); /* ends when the last has fired: nothing else holds it */
    ASSERT_EQ(6, nfired);
    static const int want[] = {0, 5, 15, 25, 30, 40};
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(want[i], fired[i]);
    ASSERT(uv_now(&loop) - t0 >= 40); /* not early: the last was due 40 ms on */
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(0, t[i].t.index); /* fired timers are disarmed */
    ASSERT_EQ(0, tm.heap_len);
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
        ms__timers_start(&tm, &t[i].t, (uint64_t)((i * 17) % 40), note);
    }
    ASSERT(heap_ok(&tm));
    int left = 40;
    for (int i = 0; i < 40; i += 3) {
        ms__timers_stop(&tm, &t[i].t);
        ASSERT_EQ(0, t[i].t.index);
        ASSERT(heap_ok(&tm));
        left--;
    }
    ms__timers_stop(&tm, &t[0].t); /* twice: nothing */
    ASSERT_EQ(left, tm.heap_len);
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
    ms__timers_start(&tm, &a.t, 5, note);
    ms__timers_start(&tm, &b.t, 10, note);
    ms__timers_start(&tm, &a.t, 30, note); /* later than b now */
    ASSERT_EQ(2, tm.heap_len);
    ASSERT(heap_ok(&tm));
    ASSERT(tm.heap[0] == &b.t);
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
        ms__timers_start(&tm, t, 1, again);
}

/* ... or stop another that is due in the same run. */
static ms_timer_t *victim;
static void stop_other(ms_timer_t *t)
{
    note(t);
    ms__timers_stop(&tm, victim);
}

TEST(timer_callbacks_may_start_and_stop_timers)
{
    setup();
    ms_timer_t r = {0};
    repeats = 0;
    ms__timers_start(&tm, &r, 0, again);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(3, repeats);
    ASSERT_EQ(0, r.index);

    tagged_t a = {.id = 1}, b = {.id = 2};
    nfired = 0;
    victim = &b.t;
    ms__timers_start(&tm, &a.t, 0, stop_other);
    ms__timers_start(&tm, &b.t, 0, note);
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
    ms__timers_start(&tm, &a, 1000, note);
    uint64_t armed = tm.armed_due;
    ASSERT_EQ(a.due, armed);
    ms__timers_start(&tm, &b, 5000, note); /* later: the uv_timer is left where it is */
    ASSERT_EQ(armed, tm.armed_due);
    ms__timers_start(&tm, &b, 10, note); /* earlier: moved */
    ASSERT_EQ(b.due, tm.armed_due);
    ASSERT(uv_loop_alive(&loop));
    ms__timers_stop(&tm, &a);
    ms__timers_stop(&tm, &b);
    /* Nothing to wait for: the loop may end (a stopping worker must not hang on it). */
    ASSERT(!uv_loop_alive(&loop));
    ms__timers_start(&tm, &a, 1000, note);
    ASSERT(uv_loop_alive(&loop));
    ms__timers_stop(&tm, &a);
    teardown();
}

TEST_MAIN()
