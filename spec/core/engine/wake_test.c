/* wake_test.c: waits that are no request's: woken now, after the call under way, by a slot's
 * timer, in batches. */
#include "test.h"

#include "../../../core/engine/wake.c"

static uv_loop_t loop;
static ms_server_t *srv;

/* What the event callback saw, in order: slot and status. */
static struct {
    int32_t slot;
    int status;
    int depth; /* the server's depth during the call (1: it is the outermost) */
} seen[1024];
static int nseen;
static int32_t chain_from = -100, chain_to; /* the callback for `chain_from` wakes `chain_to` */

static void on_event(int32_t slot, int status, void *data)
{
    (void)data;
    if (nseen < 1024) {
        seen[nseen].slot = slot;
        seen[nseen].status = status;
        seen[nseen].depth = srv->depth;
    }
    nseen++;
    if (slot == chain_from)
        ms_wake(srv, chain_to, 99); /* not delivered inside this call */
}

static void setup(void)
{
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, NULL, NULL, NULL, NULL);
    ms_server_on_event(srv, on_event);
    nseen = 0;
    chain_from = -100;
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
}

TEST(wake_outside_any_call_is_delivered_at_once)
{
    setup();
    ms_wake(srv, 3, 42);
    ASSERT_EQ(1, nseen);
    ASSERT_EQ(3, seen[0].slot);
    ASSERT_EQ(42, seen[0].status);
    ASSERT_EQ(1, seen[0].depth); /* inside a call of its own, so its wakes wait too */
    ms_wake(srv, MS_WAKE_STOP, 0);
    ASSERT_EQ(2, nseen);
    ASSERT_EQ(MS_WAKE_STOP, seen[1].slot);
    /* out of range: ignored */
    ms_wake(srv, -2, 0);
    ms_wake(srv, MS_WAKE_SLOT_MAX + 1, 0);
    ASSERT_EQ(2, nseen);
    /* no callback: nothing to deliver to */
    ms_server_on_event(srv, NULL);
    ms_wake(srv, 1, 0);
    ASSERT_EQ(2, nseen);
    teardown();
}

TEST(wake_made_inside_a_call_is_delivered_after_it_in_order)
{
    setup();
    chain_from = 1;
    chain_to = 2;
    ms_wake(srv, 1, 0);
    ASSERT_EQ(2, nseen);
    ASSERT_EQ(1, seen[0].slot);
    ASSERT_EQ(2, seen[1].slot); /* after slot 1's call returned, not inside it */
    ASSERT_EQ(99, seen[1].status);
    ASSERT_EQ(1, seen[1].depth);

    /* The engine at work (enter/leave): wakes queue in order and go at the leave. */
    nseen = 0;
    ms__server_enter(srv);
    ms_wake(srv, 5, 1);
    ms_wake(srv, 7, 2);
    ms_wake(srv, MS_WAKE_STOP, 3);
    ASSERT_EQ(0, nseen);
    ms__server_leave(srv);
    ASSERT_EQ(3, nseen);
    ASSERT_EQ(5, seen[0].slot);
    ASSERT_EQ(7, seen[1].slot);
    ASSERT_EQ(MS_WAKE_STOP, seen[2].slot);
    ASSERT_EQ(3, seen[2].status);
    ASSERT(srv->woken == NULL);
    teardown();
}

TEST(wake_past_the_batch_waits_for_the_next_turn)
{
    setup();
    int n = MS_WAKE_BATCH + 44;
    ms__server_enter(srv);
    for (int i = 0; i < n; i++)
        ms_wake(srv, i, i);
    ms__server_leave(srv);
    ASSERT_EQ(MS_WAKE_BATCH, nseen); /* the rest wait: the loop has other work */
    ASSERT(uv_is_active((uv_handle_t *)&srv->wake_idle));
    uv_run(&loop, UV_RUN_NOWAIT);
    ASSERT_EQ(n, nseen);
    for (int i = 0; i < n; i++)
        if (seen[i].slot != i || seen[i].status != i)
            TEST_FAIL("wake %d came as slot %d", i, seen[i].slot);
    ASSERT(!uv_is_active((uv_handle_t *)&srv->wake_idle));
    teardown();
}

TEST(wake_after_fires_on_its_timer_and_a_wake_voids_it)
{
    setup();
    ASSERT_EQ(UV_EINVAL, ms_wake_after(srv, -1, 1, 0));
    ASSERT_EQ(UV_EINVAL, ms_wake_after(srv, MS_WAKE_SLOT_MAX + 1, 1, 0));
    ASSERT_EQ(0, ms_wake_after(srv, 4, 10, 7));
    ASSERT_EQ(0, ms_wake_after(srv, 200, 5, 8)); /* a slot past the first table: it grows */
    ASSERT_EQ(0, nseen);
    uint64_t t0 = uv_now(&loop);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(2, nseen);
    ASSERT_EQ(200, seen[0].slot);
    ASSERT_EQ(8, seen[0].status);
    ASSERT_EQ(4, seen[1].slot);
    ASSERT_EQ(7, seen[1].status);
    ASSERT(uv_now(&loop) - t0 >= 10);

    /* Woken before its time: the timer is void (woken once). */
    nseen = 0;
    ms_wake_after(srv, 4, 5, 7);
    ms_wake(srv, 4, 1);
    ASSERT_EQ(1, nseen);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(1, nseen);
    ASSERT_EQ(1, seen[0].status);

    /* Cancelled: nothing comes. Re-armed: the new time and status replace the old. */
    nseen = 0;
    ms_wake_after(srv, 4, 1, 7);
    ms_wake_cancel(srv, 4);
    ms_wake_cancel(srv, 300); /* a slot never used: nothing */
    ms_wake_after(srv, 5, 1, 1);
    ms_wake_after(srv, 5, 3, 2);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(1, nseen);
    ASSERT_EQ(5, seen[0].slot);
    ASSERT_EQ(2, seen[0].status);
    teardown();
}

TEST(wake_queued_then_rearmed_or_cancelled_is_not_delivered_twice)
{
    setup();
    ms__server_enter(srv);
    ms_wake(srv, 1, 1);
    ms_wake(srv, 2, 2);
    ms_wake(srv, 3, 3);
    ms_wake_after(srv, 2, 1, 20); /* replaced: leaves the queue for its timer */
    ms_wake_cancel(srv, 3);       /* disarmed: leaves the queue */
    ms__server_leave(srv);
    ASSERT_EQ(1, nseen);
    ASSERT_EQ(1, seen[0].slot);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(2, nseen);
    ASSERT_EQ(2, seen[1].slot);
    ASSERT_EQ(20, seen[1].status);
    /* A wake queued twice is delivered once, with the last status. */
    nseen = 0;
    ms__server_enter(srv);
    ms_wake(srv, 9, 1);
    ms_wake(srv, 8, 0);
    ms_wake(srv, 9, 2);
    ms__server_leave(srv);
    ASSERT_EQ(2, nseen);
    ASSERT_EQ(8, seen[0].slot);
    ASSERT_EQ(9, seen[1].slot);
    ASSERT_EQ(2, seen[1].status);
    teardown();
}

TEST_MAIN()
