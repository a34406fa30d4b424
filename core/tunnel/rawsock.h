/* rawsock.h: a raw socket on a request's tunnel: the connection's bytes as they come, after
 * a 101 on HTTP/1.1, for code that speaks its own protocol over them (OpenResty's
 * ngx.req.socket(true), on which resty.websocket.server runs). */
#ifndef MS_RAWSOCK_H
#define MS_RAWSOCK_H

#include "moonserve.h"

typedef struct ms_raw_s ms_raw_t;

/* Takes `r` over: the 101 goes now with the fields set so far, and the peer's bytes queue
 * for ms_raw_peek. Like a WebSocket, the request stops counting against `in_flight` and
 * counts against `websockets` instead. `send_queue` bounds the bytes queued to the peer.
 * Returns the socket, or NULL with *err: MS_EBUSY over `websockets`, or what ms_req_tunnel
 * returned. The socket is the caller's until ms_raw_free(). */
ms_raw_t *ms_raw_accept(ms_req_t *r, uint64_t send_queue, int *err);
/* Frees the socket, before its request finishes (ms_req_finish, which closes the
 * connection once what was queued has gone). */
void ms_raw_free(ms_raw_t *t);
/* The bytes received and not yet consumed: points *p at them and returns their count; 0 when
 * none has come yet (wait with ms_raw_wait), MS_ECLOSED when none will (the peer ended its
 * side, or the connection went). Valid until the next call on the socket. */
int64_t ms_raw_peek(ms_raw_t *t, const char **p);
/* Drops the first `n` bytes ms_raw_peek showed. */
void ms_raw_consume(ms_raw_t *t, size_t n);
/* Wakes `slot` of the server when bytes come or the peer ends (-1: nobody waits). */
void ms_raw_wait(ms_raw_t *t, int32_t slot);
/* Queues bytes to the peer; `owner` and `anchor` as for ms_tunnel_write. Returns 0,
 * MS_ECLOSED once the connection is gone, or MS_ETOOBIG when bytes are queued already and
 * these would take the queue past its cap (the connection is then cut). A caller that may
 * wait waits for the queue to drain (ms_reply_congested, ms_req_wait_drain) between sends:
 * a handler waiting so is woken when the connection goes. */
int ms_raw_send(ms_raw_t *t, const char *p, size_t len, int owner, int32_t anchor);
/* 1 once nothing more goes to the peer (the connection went, or was cut). */
int ms_raw_closed(ms_raw_t *t);
/* The server's socket_read_timeout (send: socket_send_timeout) in ms: the request sockets'
 * default, as OpenResty's lua_socket_read_timeout is theirs. */
uint32_t ms_raw_timeout_ms(ms_server_t *s, int send);
/* raw_socket_buffer_bytes: the most a line, pattern or "*a" read of the Lua side holds. */
uint32_t ms_raw_buffer_cap(ms_server_t *s);

#endif
