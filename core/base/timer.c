/* timer.c: a binary heap of deadlines driven by one uv_timer per worker. */
#include "base/timer.h"

#include <string.h>

static void heap_swap(ms_timer_t **h, uint32_t a, uint32_t b)
{
    ms_timer_t *t = h[a];
    h[a] = h[b];
    h[b] = t;
    h[a]->index = a + 1;
    h[b]->index = b + 1;
}

static void sift_up(ms_timer_t **h, uint32_t i)
{
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (h[parent]->due <= h[i]->due)
            break;
        heap_swap(h, i, parent);
        i = parent;
    }
}

static void sift_down(ms_timer_t **h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l]->due < h[m]->due)
            m = l;
        if (r < n && h[r]->due < h[m]->due)
            m = r;
        if (m == i)
            break;
        heap_swap(h, i, m);
        i = m;
    }
}

static void timers_run(uv_timer_t *ut);

/* Points the uv_timer at the earliest deadline. It is only moved earlier, never later:
 * firing early is cheap (nothing is due, it re-arms) and saves a libuv call per request,
 * since every request pushes its connection's idle deadline later. */
static void arm(ms_timers_t *s)
{
    if (s->heap_len == 0)
        return;
    uint64_t due = s->heap[0]->due;
    if (s->armed_due != 0 && s->armed_due <= due)
        return;
    uint64_t now = uv_now(s->uv.loop);
    s->armed_due = due;
    uv_timer_start(&s->uv, timers_run, due > now ? due - now : 0, 0);
}

static void heap_remove(ms_timers_t *s, ms_timer_t *t)
{
    uint32_t i = t->index - 1, last = --s->heap_len;
    t->index = 0;
    if (i == last)
        return;
    s->heap[i] = s->heap[last];
    s->heap[i]->index = i + 1;
    sift_up(s->heap, i);
    sift_down(s->heap, s->heap_len, s->heap[i]->index - 1);
}

void ms__timers_stop(ms_timers_t *s, ms_timer_t *t)
{
    if (t->index == 0)
        return;
    heap_remove(s, t);
    if (s->heap_len == 0) /* nothing to wait for: let a stopping loop end; stays armed */
        uv_unref((uv_handle_t *)&s->uv);
}

void ms__timers_start(ms_timers_t *s, ms_timer_t *t, uint64_t ms, ms_timer_cb cb)
{
    if (t->index != 0)
        heap_remove(s, t);
    t->due = uv_now(s->uv.loop) + ms;
    t->cb = cb;
    if (s->heap_len == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 64;
        s->heap = ms_mem_realloc(s->heap, s->heap_cap * sizeof(*s->heap));
    }
    if (s->heap_len == 0)
        uv_ref((uv_handle_t *)&s->uv);
    s->heap[s->heap_len] = t;
    t->index = ++s->heap_len;
    sift_up(s->heap, s->heap_len - 1);
    if (s->heap[0] == t)
        arm(s);
}

/* Fires every timer that is due. A callback may start or stop timers, the one that fired
 * included; the loop takes the heap's head afresh each time. */
static void timers_run(uv_timer_t *ut)
{
    ms_timers_t *s = container_of(ut, ms_timers_t, uv);
    uint64_t now = uv_now(s->uv.loop);
    s->armed_due = 0;
    while (s->heap_len > 0 && s->heap[0]->due <= now) {
        ms_timer_t *t = s->heap[0];
        heap_remove(s, t);
        t->cb(t);
    }
    arm(s);
}

void ms__timers_init(ms_timers_t *s, uv_loop_t *loop)
{
    memset(s, 0, sizeof(*s));
    uv_timer_init(loop, &s->uv); /* armed, it keeps the loop alive: a parked handler is work
                                  * still to do */
}

void ms__timers_close(ms_timers_t *s)
{
    if (!uv_is_closing((uv_handle_t *)&s->uv))
        uv_close((uv_handle_t *)&s->uv, NULL);
}

void ms__timers_free(ms_timers_t *s)
{
    ms_mem_free(s->heap);
    s->heap = NULL;
}
