/* timer.h: a worker's timer heap (base/timer.c); ms_timer_t is in moonserve.h. */
#ifndef MS_BASE_TIMER_H
#define MS_BASE_TIMER_H

#include "moonserve.h"

/* Deadlines in a binary heap, driven by one uv_timer. */
typedef struct ms_timers_s {
    uv_timer_t uv;
    ms_timer_t **heap;
    uint32_t heap_len, heap_cap;
    uint64_t armed_due; /* when the uv_timer fires; 0 when it is not armed */
} ms_timers_t;

void ms__timers_init(ms_timers_t *s, uv_loop_t *loop);
void ms__timers_start(ms_timers_t *s, ms_timer_t *t, uint64_t ms, ms_timer_cb cb);
void ms__timers_stop(ms_timers_t *s, ms_timer_t *t);
/* Closes the uv_timer (the loop finishes that), then frees the heap. */
void ms__timers_close(ms_timers_t *s);
void ms__timers_free(ms_timers_t *s);

#endif
