/* parts.c: the one list that names a worker's parts and the protocols the accept stage
 * chooses from. The engine goes through these tables and names none of them; a new part or
 * protocol is a file of its own plus a line here (ARCHITECTURE.md, "The core's folders"). */
#include "engine/engine.h"

extern const ms_part_t ms__tcp_part, ms__tls_part, ms__alog_part, ms__sockets_part,
    ms__static_part, ms__ws_part, ms__refusal_part;
extern const ms_proto_t ms__h1_proto, ms__h2_proto;

/* In the order they start, stop and are freed: listeners close at the stop before WebSockets
 * say goodbye; the access logs go before the timer heap they use. */
const ms_part_t *const ms__parts[] = {
    &ms__tcp_part, &ms__tls_part, &ms__alog_part, &ms__sockets_part, &ms__static_part,
    &ms__ws_part, &ms__refusal_part, NULL,
};

const ms_proto_t *const ms__protos[] = {&ms__h1_proto, &ms__h2_proto, NULL};
