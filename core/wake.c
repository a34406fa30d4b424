/* wake.c: waits that belong to no request: a completion in C resumes whatever Lua parked on
 * a slot (a timer's run, a worker hook, a light thread, a socket's connect, read or write). */
#include "moonserve.h"

#include "internal.h"

/* One per slot the binding has used: allocated the first time, kept with the server, so a
 * wait costs no allocation once the worker is warm. */
struct ms_wake_s {
    ms_timer_t timer; /* first: the timer callback finds the wake from it */
    ms_server_t *server;
    int32_t slot;
    int status; /* what the slot is woken with when the timer fires */
};

void ms_server_on_event(ms_server_t *s, ms_event_cb cb)
{
    s->on_event = cb;
}

static ms_wake_t *wake_at(ms_server_t *s, int32_t slot)
{
    if ((uint32_t)slot >= s->wakes_cap) {
        uint32_t cap = s->wakes_cap ? s->wakes_cap : 64;
        while (cap <= (uint32_t)slot)
            cap *= 2;
        s->wakes = ms_mem_realloc(s->wakes, cap * sizeof(*s->wakes));
        memset(s->wakes + s->wakes_cap, 0, (cap - s->wakes_cap) * sizeof(*s->wakes));
        s->wakes_cap = cap;
    }
    ms_wake_t *w = s->wakes[slot];
    if (w == NULL) {
        w = ms_mem_alloc(sizeof(*w));
        memset(w, 0, sizeof(*w));
        w->server = s;
        w->slot = slot;
        s->wakes[slot] = w;
    }
    return w;
}

void ms_wake(ms_server_t *s, int32_t slot, int status)
{
    if (slot >= 0 && (uint32_t)slot < s->wakes_cap && s->wakes[slot] != NULL)
        ms_timer_stop(s, &s->wakes[slot]->timer); /* woken once: a pending timeout is void */
    if (s->on_event != NULL)
        ms__server_event(s, slot, status);
}

static void wake_fired(ms_timer_t *t)
{
    ms_wake_t *w = (ms_wake_t *)t;
    ms_wake(w->server, w->slot, w->status);
}

int ms_wake_after(ms_server_t *s, int32_t slot, uint64_t ms, int status)
{
    if (slot < 0 || slot > MS_WAKE_SLOT_MAX)
        return UV_EINVAL;
    ms_wake_t *w = wake_at(s, slot);
    w->status = status;
    ms_timer_start(s, &w->timer, ms, wake_fired);
    return 0;
}

void ms_wake_cancel(ms_server_t *s, int32_t slot)
{
    if (slot >= 0 && (uint32_t)slot < s->wakes_cap && s->wakes[slot] != NULL)
        ms_timer_stop(s, &s->wakes[slot]->timer);
}

void ms__wakes_free(ms_server_t *s)
{
    for (uint32_t i = 0; i < s->wakes_cap; i++)
        if (s->wakes[i] != NULL) {
            ms_timer_stop(s, &s->wakes[i]->timer);
            ms_mem_free(s->wakes[i]);
        }
    ms_mem_free(s->wakes);
    s->wakes = NULL;
    s->wakes_cap = 0;
}
