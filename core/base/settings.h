/* settings.h: the table of a worker's limits, and the other defaults the core and Lua share. */
#ifndef MS_SETTINGS_H
#define MS_SETTINGS_H

/* Every limit is one line of MS_LIMITS. Made from it: ms_limits_t (moonserve.h) and
 * ms_limits_default() (server.c); the keys the Lua module reads and reports
 * (modules/ms_core.c: core.server{ limits = ... }, core.default_limits(), core.limits());
 * the --limit lines of `moonserve --help` (lua/moonserve/host/core/cli.lua formats
 * core.limits()).
 * spec/lua/limits_spec.lua checks docs/guide/limits.md's table of limits against it.
 *
 * To add a limit: add its line here (at the end, so that ms_limits_t's layout stays), enforce
 * it where it applies (read s->limits.FIELD in h1.c, h2.c, conn.c, ...), add its row to the
 * README's table, and a test that exceeds it. Nothing else names the keys.
 *
 * X(key, field, type, default, unit, max, doc):
 *   key      the name in app:run{ limits = { ... } } and in --limit KEY=VALUE
 *   field    the member of ms_limits_t
 *   type     uint32_t or uint64_t
 *   default  in the unit a user writes: seconds for SECONDS (the README shows this; 0.5 is
 *            500 ms)
 *   unit     COUNT, BYTES, BITS, RATE (bytes a second) or SECONDS (given in seconds, stored
 *            in milliseconds: the field's name ends in _ms)
 *   max      the largest value a user may give, in the field's unit (0: what the field holds)
 *   doc      one line, for --help and core.limits()
 */
#define MS_LIMITS(X)                                                                               \
    X(connections, connections, uint32_t, 16384, COUNT, 0,                                         \
      "open connections per worker; past it, new ones are closed")                                 \
    X(per_source, per_source, uint32_t, 256, COUNT, 0, "open connections from one source")         \
    X(in_flight, in_flight, uint32_t, 1024, COUNT, 0,                                              \
      "requests in handlers per worker; past it, 503")                                             \
    X(websockets, websockets, uint32_t, 10000, COUNT, 0,                                           \
      "open WebSockets per worker (not in_flight); past it, 503")                                  \
    X(line_bytes, line_bytes, uint32_t, 8192, BYTES, 0, "the request line: 414")                   \
    X(head_bytes, head_bytes, uint32_t, 32768, BYTES, 0, "request line plus fields: 431")          \
    X(header_count, header_count, uint32_t, 100, COUNT, 0, "number of fields: 431")                \
    X(body_bytes, body_bytes, uint64_t, 8388608, BYTES, 0,                                         \
      "a request body, unless its route says otherwise: 413")                                      \
    X(body_bytes_max, body_bytes_max, uint64_t, 0, BYTES, 0,                                       \
      "the largest body any route allows (0: body_bytes)")                                         \
    X(head_timeout, head_timeout_ms, uint32_t, 10, SECONDS, 0,                                     \
      "a whole head, from its first byte: 408")                                                    \
    X(body_timeout, body_timeout_ms, uint32_t, 30, SECONDS, 0,                                     \
      "a whole body, unless it keeps body_min_rate: 408")                                          \
    X(body_min_rate, body_min_rate, uint32_t, 4096, RATE, 0,                                       \
      "bytes a second a body must average past body_timeout")                                      \
    X(idle_timeout, idle_timeout_ms, uint32_t, 15, SECONDS, 0,                                     \
      "keep-alive between requests: close")                                                        \
    X(send_timeout, send_timeout_ms, uint32_t, 30, SECONDS, 0,                                     \
      "a reply that makes no progress: close")                                                     \
    X(requests_per_connection, requests_per_connection, uint32_t, 1000, COUNT, 0,                  \
      "requests on one connection: the last closes it")                                            \
    /* An IPv4 address is one source; IPv6 addresses are one under a prefix of this many bits      \
     * (a host or subscriber may hold a whole /64). */                                             \
    X(source_ipv6_prefix, source_ipv6_prefix, uint32_t, 64, BITS, 128,                             \
      "bits of the IPv6 prefix that is one source for per_source")                                 \
    X(timers_pending, timers_pending, uint32_t, 1024, COUNT, 0,                                    \
      "timers waiting to run per worker; past it, timer.at fails")                                 \
    X(timers_running, timers_running, uint32_t, 256, COUNT, 0,                                     \
      "timer runs under way per worker; past it, a run is skipped")                                \
    X(thread_job_bytes, thread_job_bytes, uint32_t, 16777216, BYTES, 0,                            \
      "a thread job's encoded arguments or results; past it, an error")                            \
    /* Outbound sockets (moonserve.socket): a new socket's timeouts, as OpenResty's                \
     * lua_socket_* directives, and its pools' size when connect and setkeepalive name none. */    \
    X(socket_connect_timeout, socket_connect_timeout_ms, uint32_t, 60, SECONDS, 0,                 \
      "a socket's connect unless settimeout says: \"timeout\"")                                    \
    X(socket_send_timeout, socket_send_timeout_ms, uint32_t, 60, SECONDS, 0,                       \
      "a socket's send with no progress: \"timeout\", closed")                                     \
    X(raw_socket_buffer_bytes, raw_socket_buffer_bytes, uint32_t, 1048576, BYTES, 0,               \
      "a raw request socket's line, pattern or \"*a\" read: closed")                               \
    X(socket_read_timeout, socket_read_timeout_ms, uint32_t, 60, SECONDS, 0,                       \
      "a socket's receive: \"timeout\", still usable")                                             \
    X(socket_keepalive_timeout, socket_keepalive_timeout_ms, uint32_t, 60, SECONDS, 0,             \
      "an idle pooled connection unless setkeepalive says (0: kept)")                              \
    X(socket_pool_size, socket_pool_size, uint32_t, 30, COUNT, 0,                                  \
      "idle connections a pool keeps unless connect says")                                         \
    /* Name resolution: getaddrinfo tells no TTL, so answers are kept for a set time; lookups      \
     * run on libuv's thread pool, shared with file work, so at most its size less one. */         \
    X(resolver_ttl, resolver_ttl_ms, uint32_t, 30, SECONDS, 0,                                     \
      "a name's answer is cached (0: not)")                                                        \
    X(resolver_negative_ttl, resolver_negative_ttl_ms, uint32_t, 1, SECONDS, 0,                    \
      "a name that did not resolve is cached (0: not)")                                            \
    X(resolver_in_flight, resolver_in_flight, uint32_t, 2, COUNT, 0,                               \
      "lookups at once, below libuv's thread pool; the rest queue")                                \
    X(resolver_names, resolver_names, uint32_t, 1024, COUNT, 0,                                    \
      "names in a worker's resolver cache")                                                        \
    X(handshake_timeout, handshake_timeout_ms, uint32_t, 10, SECONDS, 0,                           \
      "a whole TLS handshake, from the accept: close")                                             \
    /* A WebSocket peer's frames that carry little and cost a frame's work each: empty             \
     * continuations, pings (each answered). 0: no cap. */                                         \
    X(websocket_fragments, websocket_fragments, uint32_t, 4096, COUNT, 65535,                      \
      "frames of one WebSocket message: close 1008 (0: no cap)")                                   \
    X(websocket_control_rate, websocket_control_rate, uint32_t, 100, COUNT, 65535,                 \
      "WebSocket pings and pongs a second: close 1008 (0: no cap)")                                \
    /* What a client still sends of a body after its HTTP/2 stream's reply is complete: read       \
     * and dropped (as nginx does) so that the client sees a stream that ends, up to these;        \
     * past either, RST_STREAM(NO_ERROR). */                                                       \
    X(discard_bytes, discard_bytes, uint64_t, 8388608, BYTES, 0,                                   \
      "HTTP/2 body dropped after an early reply; then RST_STREAM")                                 \
    X(discard_timeout, discard_timeout_ms, uint32_t, 10, SECONDS, 0,                               \
      "HTTP/2 body dropped after its handler ends; then RST_STREAM")                               \
    /* Shared dictionaries on Redis (moonserve/redis/dict.lua): checked in Lua before anything     \
     * is sent, so an oversized key or value never reaches the server every instance shares. */    \
    X(redis_key_bytes, redis_key_bytes, uint32_t, 65535, BYTES, 0,                                 \
      "a key of a Redis shared dictionary; past it, an error")                                     \
    X(redis_value_bytes, redis_value_bytes, uint32_t, 1048576, BYTES, 0,                           \
      "a Redis shared dictionary's stored value; past it, an error")                               \
    /* Fan-out across instances (moonserve/fanout.lua). */                                         \
    X(fanout_queue, fanout_queue, uint32_t, 10000, COUNT, 0,                                       \
      "publishes a worker keeps for Redis; past it, the oldest fail")                              \
    /* Runaway Lua (modules/ms_guard.c): milliseconds of CPU, counted by the core's clock. */      \
    X(handler_cpu_ms, handler_cpu_ms, uint32_t, 2000, COUNT, 0,                                    \
      "CPU ms a handler or timer runs without yielding: 503 (0: none)")                            \
    /* The Lua heap of a worker (modules/ms_guard.c): past it, the code that allocates gets a      \
     * memory error; a heap that stays past three quarters of it has its worker replaced. */       \
    X(lua_memory, lua_memory, uint64_t, 1073741824, BYTES, 0,                                      \
      "bytes of a worker's Lua heap: past it, 503 (0: no cap)")

/* The units of MS_LIMITS. A SECONDS limit is stored in milliseconds. */
enum { MS_UNIT_COUNT, MS_UNIT_BYTES, MS_UNIT_BITS, MS_UNIT_RATE, MS_UNIT_SECONDS };
#define MS_UNIT_SCALE(unit) (MS_UNIT_##unit == MS_UNIT_SECONDS ? 1000 : 1)

/* -- Other shared defaults -------------------------------------------------------------- */

/* Descriptors kept free for what connections already open need (an upstream socket, a file):
 * a new connection that would leave fewer is refused, before the process runs out. */
#define MS_FD_RESERVE 32
/* listen(2)'s backlog when a caller gives none (0 or less). */
#define MS_LISTEN_BACKLOG 511
/* The static file cache of a worker: open files, and bytes of contents held in memory
 * (server:static_cache() and app:run{ static_cache = ... } override them). */
#define MS_STATIC_CACHE_FILES 1024
#define MS_STATIC_CACHE_BYTES (64u * 1024 * 1024)
/* Seconds a stopping worker may take to finish before the master kills it. */
#define MS_STOP_TIMEOUT 30
/* Seconds a starting worker may take to be ready (its on_worker_start hooks returned)
 * before the master stops it: the start or reload fails and old workers keep serving. */
#define MS_START_TIMEOUT 10

#endif
