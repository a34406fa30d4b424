/* wake.c: waits that belong to no request: a completion in C resumes whatever Lua parked on
 * a slot (a timer's run, a worker hook, a light thread, a socket's connect, read or write). */
#include "moonserve.h"

#include "engine/engine.h"

/* At most this many queued wakes are delivered at once; the rest wait for the next turn of
 * the loop (s->wake_idle), so that code that keeps waking itself (two threads passing a
 * pooled connection back and forth) cannot keep the loop from its other work. */
#define MS_WAKE_BATCH 256

/* One per slot the binding has used: allocated the first time, kept with the server, so a
 * wait costs no allocation once the worker is warm. */
struct ms_wake_s {
    ms_timer_t timer; /* first: the timer callback finds the wake from it */
    ms_server_t *server;
    int32_t slot;
    int status;                /* what the slot is woken with (its timer, its turn in the queue) */
    ms_wake_t *next, **pprev;  /* in s->woken while queued (pprev != NULL) */
};

static void wake_fired(ms_timer_t *t)
{
    ms_wake_t *w = (ms_wake_t *)t;
    ms_wake(w->server, w->slot, w->status);
}

void ms_server_on_event(ms_server_t *s, ms_event_cb cb)
{
    s->on_event = cb;
}

static ms_wake_t *wake_new(ms_server_t *s, int32_t slot)
{
    ms_wake_t *w = ms_mem_alloc(sizeof(*w));
    memset(w, 0, sizeof(*w));
    w->server = s;
    w->slot = slot;
    return w;
}

static ms_wake_t *wake_at(ms_server_t *s, int32_t slot)
{
    if (slot == MS_WAKE_STOP) {
        if (s->wake_stop == NULL)
            s->wake_stop = wake_new(s, slot);
        return s->wake_stop;
    }
    if ((uint32_t)slot >= s->wakes_cap) {
        uint32_t cap = s->wakes_cap ? s->wakes_cap : 64;
        while (cap <= (uint32_t)slot)
            cap *= 2;
        s->wakes = ms_mem_realloc(s->wakes, cap * sizeof(*s->wakes));
        memset(s->wakes + s->wakes_cap, 0, (cap - s->wakes_cap) * sizeof(*s->wakes));
        s->wakes_cap = cap;
    }
    ms_wake_t *w = s->wakes[slot];
    if (w == NULL)
        w = s->wakes[slot] = wake_new(s, slot);
    return w;
}

/* The slot's wake if it has one yet, else NULL. */
static ms_wake_t *wake_find(ms_server_t *s, int32_t slot)
{
    if (slot == MS_WAKE_STOP)
        return s->wake_stop;
    return slot >= 0 && (uint32_t)slot < s->wakes_cap ? s->wakes[slot] : NULL;
}

static void unqueue(ms_server_t *s, ms_wake_t *w)
{
    if (w->pprev == NULL)
        return;
    *w->pprev = w->next;
    if (w->next != NULL)
        w->next->pprev = w->pprev;
    else
        s->woken_tail = w->pprev;
    w->next = NULL;
    w->pprev = NULL;
}

/* Voids what the slot was to be woken by: its timer, its place in the queue. */
static void disarm(ms_server_t *s, ms_wake_t *w)
{
    ms_timer_stop(s, &w->timer);
    unqueue(s, w);
}

/* Lua runs only with nothing of C's below it but the loop and the core's calls into it:
 * never inside an FFI call (LuaJIT cannot be entered again from C that JIT-compiled code
 * called: the trace reloads its stack base from state the inner call cleared), nor inside
 * the socket engine's work. So a wake made while depth > 0 (a call into Lua, and hence any
 * call from Lua, or the engine at work) waits in a queue until depth is back to 0
 * (run_deferred): still this turn of the loop, after the code that caused it. */
void ms_wake(ms_server_t *s, int32_t slot, int status)
{
    if (slot < MS_WAKE_STOP || slot > MS_WAKE_SLOT_MAX)
        return;
    ms_wake_t *w = wake_find(s, slot);
    if (w != NULL)
        disarm(s, w); /* woken once: a pending timeout is void */
    if (s->on_event == NULL)
        return;
    if (s->depth == 0) {
        ms__server_event(s, slot, status);
        return;
    }
    if (w == NULL)
        w = wake_at(s, slot);
    w->status = status;
    if (s->woken == NULL)
        s->woken_tail = &s->woken;
    w->pprev = s->woken_tail;
    *s->woken_tail = w;
    s->woken_tail = &w->next;
}

static void wakes_idle(uv_idle_t *h)
{
    ms_server_t *s = container_of(h, ms_server_t, wake_idle);
    uv_idle_stop(h);
    if (s->woken != NULL && !s->woken_running)
        ms__wakes_run(s);
}

void ms__wakes_run(ms_server_t *s)
{
    s->woken_running = 1;
    for (int n = 0; s->woken != NULL; n++) {
        if (n == MS_WAKE_BATCH) { /* the rest, in their order, on the next turn */
            uv_idle_start(&s->wake_idle, wakes_idle);
            break;
        }
        ms_wake_t *w = s->woken;
        unqueue(s, w);
        ms__server_event(s, w->slot, w->status);
    }
    s->woken_running = 0;
}

int ms_wake_after(ms_server_t *s, int32_t slot, uint64_t ms, int status)
{
    if (slot < 0 || slot > MS_WAKE_SLOT_MAX)
        return UV_EINVAL;
    ms_wake_t *w = wake_at(s, slot);
    unqueue(s, w); /* replaced */
    w->status = status;
    ms_timer_start(s, &w->timer, ms, wake_fired);
    return 0;
}

void ms_wake_cancel(ms_server_t *s, int32_t slot)
{
    ms_wake_t *w = wake_find(s, slot);
    if (w != NULL)
        disarm(s, w);
}

void ms__wakes_free(ms_server_t *s)
{
    for (uint32_t i = 0; i < s->wakes_cap; i++)
        if (s->wakes[i] != NULL) {
            ms_timer_stop(s, &s->wakes[i]->timer);
            ms_mem_free(s->wakes[i]);
        }
    if (s->wake_stop != NULL) {
        ms_timer_stop(s, &s->wake_stop->timer);
        ms_mem_free(s->wake_stop);
    }
    ms_mem_free(s->wakes);
    s->wakes = NULL;
    s->wakes_cap = 0;
    s->wake_stop = NULL;
    s->woken = NULL;
    s->woken_tail = NULL;
}
