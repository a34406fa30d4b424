/* agent.h: HAProxy's agent-check responder: one line a connection, the instance's state. */
#ifndef MS_AGENT_H
#define MS_AGENT_H

#include "moonserve.h"

typedef struct ms_agent_s ms_agent_t;

/**
 * Listens on `addr` ("HOST:PORT") on `loop` and answers each connection with one line and a
 * close: "maint" while the file `maint_file` exists (NULL: never), else "drain" once
 * ms_agent_drain was called, else "ready". The listener does not keep the loop running.
 * Returns 0 and sets `*out`, or a negative UV_E* code.
 */
int ms_agent_start(uv_loop_t *loop, const char *addr, const char *maint_file, ms_agent_t **out);
/* From now on the answer is "drain" (unless in maintenance). */
void ms_agent_drain(ms_agent_t *a);
/* The line the next connection gets, without its newline. */
const char *ms_agent_word(ms_agent_t *a);
/* Closes the listener; the loop frees it. NULL does nothing. */
void ms_agent_close(ms_agent_t *a);

#endif
