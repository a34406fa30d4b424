/* ms_core.c: the moonserve.core module: setting up servers through the Lua C API, and the
 * one crossing per request from the core into the Lua dispatcher. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <lauxlib.h>
#include <lua.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/ssl.h>

#include "http/accesslog.h"
#include "process/agent.h"
#include "process/channel.h"
#include "process/master.h"
#include "process/proctitle.h"
#include "http/static/static.h"
#include "transport/memio.h"
#include "process/metrics.h"
#include "moonserve.h"
#include "ms_guard.h"
#include "ms_profile.h"

#define SERVER_MT  "moonserve.server"
#define MEMCONN_MT "moonserve.memconn"

/* The request a call into Lua is about: Lua reads it through the FFI, which the JIT
 * compiles, where converting a light userdata argument would stop the trace. */
MS_EXPORT ms_req_t *ms_ffi_current;
/* The server of the call into Lua under way: a wait that is no request's is armed on it. */
MS_EXPORT ms_server_t *ms_ffi_server;

typedef struct binding_s {
    ms_server_t *server;
    uv_loop_t *loop;
    lua_State *L;       /* the state that runs the loop; handlers run in its coroutines */
    int on_request_ref; /* the Lua dispatcher: function(), the request in ms_ffi_current */
    int on_resume_ref;  /* function(), likewise */
    int on_event_ref;   /* function(slot, status): a wake that is no request's (wake.c) */
    uv_signal_t sigint, sigterm, sigquit, sigusr1, sigusr2;
    int signals; /* the signal handles are initialised */
    int stopped;
    uint32_t drain_ms; /* TERM and QUIT drain for this long first (server:drain_delay) */
    ms_agent_t *agent; /* single-process mode's agent-check responder (server:agent_check) */
    ms_tls_t *tls[64]; /* server:tls() settings by id - 1; the server's, freed with it */
    int ntls;
} binding_t;

/* true for rc 0, or nil and rc's text for a negative errno. */
static int push_done(lua_State *L, int rc)
{
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushstring(L, strerror(-rc));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int ms_lua_fail(lua_State *L, int rc)
{
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", ms_err_name(rc), ms_strerror(rc));
    lua_pushstring(L, ms_err_name(rc));
    return 3;
}

/* -- Dispatch ------------------------------------------------------------------------------ */

/* When the dispatcher itself fails (never a handler: those are caught in Lua), the request
 * still gets an answer, so that no client hangs. */
static void dispatch_failed(ms_req_t *r, lua_State *L)
{
    ms_log(MS_LOG_ERR, "dispatcher failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
    if ((r->v.flags & MS_REQ_IN_HANDLER) && r->v.handler < 0) {
        r->v.status = 500;
        ms_reply_send(r, "500 Internal Server Error\n", 26, MS_VEC_STATIC, -1);
        ms_req_finish(r);
    }
}

static void call_lua(binding_t *b, int ref, ms_req_t *r)
{
    lua_State *L = b->L;
    ms_req_t *prev = ms_ffi_current;
    ms_server_t *prev_server = ms_ffi_server;
    ms_ffi_current = r;
    ms_ffi_server = b->server;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    if (lua_pcall(L, 0, 0, 0) != 0)
        dispatch_failed(r, L);
    ms_ffi_current = prev;
    ms_ffi_server = prev_server;
}

/* A wake that is no request's: the dispatcher resumes what it parked on `slot`. Its errors
 * are its own (a timer's are caught in Lua); one that gets here is logged. */
static void on_event(int32_t slot, int status, void *data)
{
    binding_t *b = data;
    lua_State *L = b->L;
    ms_req_t *prev = ms_ffi_current;
    ms_server_t *prev_server = ms_ffi_server;
    ms_ffi_current = NULL;
    ms_ffi_server = b->server;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->on_event_ref);
    lua_pushinteger(L, slot);
    lua_pushinteger(L, status);
    if (lua_pcall(L, 2, 0, 0) != 0) {
        ms_log(MS_LOG_ERR, "dispatcher failed on a wake: %s", lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    ms_ffi_current = prev;
    ms_ffi_server = prev_server;
}

static void on_request(ms_req_t *r, void *data)
{
    binding_t *b = data;
    call_lua(b, b->on_request_ref, r);
}

static void on_resume(ms_req_t *r, void *data)
{
    binding_t *b = data;
    call_lua(b, b->on_resume_ref, r);
}

/* -- Server ------------------------------------------------------------------------------- */

/* The limits Lua may set, made from MS_LIMITS (core/base/settings.h): add a limit there, not here. */
#define UNIT_NAME_COUNT   "count"
#define UNIT_NAME_BYTES   "bytes"
#define UNIT_NAME_BITS    "bits"
#define UNIT_NAME_RATE    "bytes/s"
#define UNIT_NAME_SECONDS "s"
static const struct {
    const char *name;
    size_t offset;
    int wide;         /* uint64_t rather than uint32_t */
    int scale;        /* 1000 for times: given in seconds, kept in milliseconds */
    double max;       /* the largest value, in the field's unit */
    const char *unit; /* UNIT_NAME_* */
    const char *doc;
} limit_keys[] = {
#define LIMIT(key, field, type, dflt, unit, max, doc)                                              \
    {#key,                                                                                         \
     offsetof(ms_limits_t, field),                                                                 \
     sizeof(type) == 8,                                                                            \
     MS_UNIT_SCALE(unit),                                                                          \
     (max) > 0           ? (double)(max)                                                           \
     : sizeof(type) == 8 ? 1.8e19                                                                  \
                         : 4294967295.0,                                                           \
     UNIT_NAME_##unit,                                                                             \
     doc},
    MS_LIMITS(LIMIT)
#undef LIMIT
};

/* read_limits() and core.default_limits() store and load each field as one of these. */
#define LIMIT_TYPE(key, field, type, dflt, unit, max, doc)                                         \
    _Static_assert(sizeof(((ms_limits_t *)0)->field) == sizeof(type) &&                            \
                       (sizeof(type) == 4 || sizeof(type) == 8) && (type)-1 > 0,                   \
                   #key ": uint32_t or uint64_t");
MS_LIMITS(LIMIT_TYPE)
#undef LIMIT_TYPE

/* Reads the table at `t` into `lim`; misuse (an unknown key, a bad value) raises. */
static void read_limits(lua_State *L, int t, ms_limits_t *lim)
{
    lua_pushnil(L);
    while (lua_next(L, t) != 0) {
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        size_t i = 0, n = sizeof(limit_keys) / sizeof(limit_keys[0]);
        while (i < n && strcmp(limit_keys[i].name, key) != 0)
            i++;
        /* (The messages carry no position: they are about the configuration, not the code.) */
        if (i == n) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            lua_pushfstring(L, "unknown limit %s (the limits: ", key);
            luaL_addvalue(&b);
            for (size_t k = 0; k < n; k++) {
                luaL_addstring(&b, limit_keys[k].name);
                luaL_addstring(&b, k + 1 < n ? ", " : ")");
            }
            luaL_pushresult(&b);
            lua_error(L);
        }
        if (!lua_isnumber(L, -1)) {
            lua_pushfstring(L, "bad limit %s (a number expected)", key);
            lua_error(L);
        }
        double d = lua_tonumber(L, -1) * limit_keys[i].scale;
        double max = limit_keys[i].max;
        if (d < 0 || d > max) {
            lua_pushfstring(L, "bad limit %s (out of range: 0 to %f)", key,
                            max / limit_keys[i].scale);
            lua_error(L);
        }
        char *field = (char *)lim + limit_keys[i].offset;
        if (limit_keys[i].wide)
            *(uint64_t *)field = (uint64_t)d;
        else
            *(uint32_t *)field = (uint32_t)d;
        lua_pop(L, 1);
    }
}

/* core.server{ on_request = f, on_resume = g[, on_event = h], limits = { ... } }; times in
 * seconds. */
static int server_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    ms_limits_t lim;
    ms_limits_default(&lim);
    lua_getfield(L, 1, "limits");
    if (lua_istable(L, -1))
        read_limits(L, lua_gettop(L), &lim);
    lua_pop(L, 1);
    binding_t *b = lua_newuserdata(L, sizeof(*b));
    memset(b, 0, sizeof(*b));
    b->on_request_ref = b->on_resume_ref = b->on_event_ref = LUA_NOREF;
    luaL_getmetatable(L, SERVER_MT);
    lua_setmetatable(L, -2);
    lua_getfield(L, 1, "on_request");
    luaL_checktype(L, -1, LUA_TFUNCTION);
    b->on_request_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, 1, "on_resume");
    luaL_checktype(L, -1, LUA_TFUNCTION);
    b->on_resume_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    b->loop = uv_default_loop();
    b->L = L;
    b->server = ms_server_new(b->loop, &lim, on_request, on_resume, b);
    lua_getfield(L, 1, "on_event");
    if (!lua_isnil(L, -1)) {
        luaL_checktype(L, -1, LUA_TFUNCTION);
        b->on_event_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        ms_server_on_event(b->server, on_event);
    } else {
        lua_pop(L, 1);
    }
    return 1;
}

static binding_t *check_server(lua_State *L)
{
    binding_t *b = luaL_checkudata(L, 1, SERVER_MT);
    if (b->server == NULL)
        luaL_error(L, "server is closed");
    return b;
}

/* The TLS settings of id at `idx` (nil or absent: none); misuse raises. */
static ms_tls_t *opt_tls(lua_State *L, binding_t *b, int idx)
{
    if (lua_isnoneornil(L, idx))
        return NULL;
    lua_Integer id = luaL_checkinteger(L, idx);
    if (id < 1 || id > b->ntls)
        luaL_argerror(L, idx, "no such TLS settings");
    return b->tls[id - 1];
}

/* Makes the listener just added a TLS one, if asked. */
static int listen_tls(lua_State *L, binding_t *b, ms_tls_t *tls)
{
    if (tls == NULL)
        return 0;
    int rc = ms_server_listen_tls(b->server, tls);
    if (rc < 0)
        return luaL_error(L, "TLS listener without a default certificate");
    return 0;
}

/* The listener flags from proxy_protocol at `idx`, an https port to redirect to at
 * `idx + 2` (nil: none) and metrics (the scrape's listener) at `idx + 3`. */
static int listen_flags(lua_State *L, binding_t *b, int idx)
{
    int flags = lua_toboolean(L, idx) ? MS_LISTEN_PROXY : 0;
    if (lua_toboolean(L, idx + 3))
        flags |= MS_LISTEN_METRICS;
    if (!lua_isnoneornil(L, idx + 2)) {
        lua_Integer port = luaL_checkinteger(L, idx + 2);
        luaL_argcheck(L, port > 0 && port < 65536, idx + 2, "a port expected");
        ms_server_https_port(b->server, (int)port);
        flags |= MS_LISTEN_REDIRECT_HTTPS;
    }
    return flags;
}

/* server:listen("127.0.0.1:8080"[, backlog[, proxy_protocol[, tls[, redirect_port]]]]) ->
 * port; `tls` is an id from server:tls(); `redirect_port`: every request is answered 308 to
 * https on that port. */
static int server_listen(lua_State *L)
{
    binding_t *b = check_server(L);
    const char *addr = luaL_checkstring(L, 2);
    int flags = listen_flags(L, b, 4);
    ms_tls_t *tls = opt_tls(L, b, 5);
    int rc =
        ms_server_listen(b->server, addr, (int)luaL_optinteger(L, 3, MS_LISTEN_BACKLOG), flags);
    if (rc < 0)
        return ms_lua_fail(L, rc);
    listen_tls(L, b, tls);
    lua_pushinteger(L, ms_server_port(b->server));
    return 1;
}

static const char *opt_field(lua_State *L, int t, const char *k)
{
    lua_getfield(L, t, k);
    const char *v = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
    lua_pop(L, 1); /* (the string stays in the options table) */
    return v;
}

/* server:tls{ ciphers =, ciphersuites =, groups =, refuse_unknown = bool, no_ktls = bool }
 * -> id, or nil and why. */
static int server_tls(lua_State *L)
{
    binding_t *b = check_server(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    if (b->ntls == (int)(sizeof(b->tls) / sizeof(b->tls[0])))
        return luaL_error(L, "too many TLS settings");
    ms_tls_opts_t o = {.ciphers = opt_field(L, 2, "ciphers"),
                       .ciphersuites = opt_field(L, 2, "ciphersuites"),
                       .groups = opt_field(L, 2, "groups")};
    lua_getfield(L, 2, "refuse_unknown");
    o.refuse_unknown = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 2, "no_ktls");
    o.no_ktls = lua_toboolean(L, -1);
    lua_pop(L, 1);
    char err[256];
    ms_tls_t *t = ms_tls_new(b->server, &o, err, sizeof(err));
    if (t == NULL) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    b->tls[b->ntls++] = t;
    lua_pushinteger(L, b->ntls);
    return 1;
}

/* The TLS settings `id` at `idx`: raises for none, or one this server has not made. */
static ms_tls_t *check_tls(lua_State *L, binding_t *b, int idx)
{
    luaL_checkinteger(L, idx);
    return opt_tls(L, b, idx);
}

/* true, or nil and why. */
static int tls_result(lua_State *L, int rc, const char *err)
{
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* server:tls_cert(id, name or nil, cert_pem, key_pem) -> true, or nil and why: a certificate
 * chain and its key for a server name (nil: the default one). */
static int server_tls_cert(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_tls_t *t = check_tls(L, b, 2);
    const char *name = luaL_optstring(L, 3, NULL);
    size_t clen, klen;
    const char *cert = luaL_checklstring(L, 4, &clen);
    const char *key = luaL_checklstring(L, 5, &klen);
    char err[256];
    return tls_result(L, ms_tls_cert(t, name, cert, clen, key, klen, err, sizeof(err)), err);
}

/* server:tls_hook(id, slot): every full handshake on the TLS settings `id` wakes `slot`, and
 * waits for its certificate hook (ms_tls_cert_hook). */
static int server_tls_hook(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_tls_t *t = check_tls(L, b, 2);
    lua_Integer slot = luaL_checkinteger(L, 3);
    luaL_argcheck(L, slot >= 0 && slot <= MS_WAKE_SLOT_MAX, 3, "bad slot");
    ms_tls_cert_hook(t, (int32_t)slot);
    return 0;
}

/* server:tls_staple(id, cert_pem, ocsp_der) -> true, or nil and why: an OCSP response
 * stapled to the handshakes that send that certificate. */
static int server_tls_staple(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_tls_t *t = check_tls(L, b, 2);
    size_t clen, dlen;
    const char *cert = luaL_checklstring(L, 3, &clen);
    const char *der = luaL_checklstring(L, 4, &dlen);
    char err[256];
    return tls_result(L, ms_tls_staple(t, cert, clen, der, dlen, err, sizeof(err)), err);
}

static void worker_signals(int how);

/* The binding whose server:run() took the signals (they are the process's). */
static binding_t *signalled;

static void close_signals(binding_t *b)
{
    if (!b->signals)
        return;
    if (signalled == b)
        signalled = NULL;
    uv_close((uv_handle_t *)&b->sigint, NULL);
    uv_close((uv_handle_t *)&b->sigterm, NULL);
    uv_close((uv_handle_t *)&b->sigquit, NULL);
    uv_close((uv_handle_t *)&b->sigusr1, NULL);
    uv_close((uv_handle_t *)&b->sigusr2, NULL);
    b->signals = 0;
}

static void on_usr1(uv_signal_t *sig, int signum)
{
    binding_t *b = sig->data;
    (void)signum;
    ms_log_reopen();
    if (b->server != NULL)
        ms_server_access_reopen(b->server);
}

static void stopped(ms_server_t *s)
{
    /* The loop ends by itself once nothing is left on it; the signals' handles go now (not
     * at the stop: a second TERM during the drain must not kill the worker). Only the
     * server that took them: another one of the process (app:test's) that stops leaves
     * them to the one serving. */
    if (signalled != NULL && signalled->server == s) {
        ms_agent_close(signalled->agent);
        signalled->agent = NULL;
        close_signals(signalled);
    }
}

/* The listeners have closed: the Lua side hears of the stop (pending timers run with
 * premature = true, the on_worker_stop hooks run). */
static void accept_closed(ms_server_t *s)
{
    ms_wake(s, MS_WAKE_STOP, 0);
}

/* Drains for `delay_ms` (ms_server_drain), then stops accepting and tells the Lua side; the
 * loop ends once the hooks and the requests are done. */
static void stop(binding_t *b, uint32_t delay_ms)
{
    if (b->stopped)
        return;
    b->stopped = 1;
    ms_agent_drain(b->agent);
    ms_server_drain(b->server, delay_ms, accept_closed, stopped);
}

/* TERM and QUIT drain (the drain delay, then the stop); INT, a developer's ^C, stops now,
 * and during a drain's delay cuts it short. */
static void on_signal(uv_signal_t *sig, int signum)
{
    binding_t *b = sig->data;
    if (b->stopped) {
        /* (a second TERM or QUIT: the stop under way goes on) */
        if (signum == SIGINT && ms_server_drain_now(b->server))
            ms_log(MS_LOG_INFO, "signal %d: the drain's delay is cut short: stopping", signum);
        return;
    }
    uint32_t delay = signum == SIGINT ? 0 : b->drain_ms;
    if (delay == 0) /* (else the drain's own line says it: one line for the event) */
        ms_log(MS_LOG_INFO, "signal %d: stopping", signum);
    stop(b, delay);
}

/* USR2: the master's word that a new worker has taken over this one's sockets (a reload):
 * it stops as on TERM, but the service is still up (readyz stays 200). */
static void on_handover(uv_signal_t *sig, int signum)
{
    binding_t *b = sig->data;
    if (b->stopped)
        return; /* (a stop is under way: nothing changes, and no line says otherwise) */
    ms_log(MS_LOG_INFO, "signal %d: a new worker serves in its place: stopping", signum);
    ms_server_handing_over(b->server);
    stop(b, 0);
}

/* server:run(): serves until stopped (server:stop(), SIGINT or SIGTERM). */
static int server_run(lua_State *L)
{
    binding_t *b = check_server(L);
    b->L = L;
    if (!b->signals) {
        uv_signal_init(b->loop, &b->sigint);
        uv_signal_init(b->loop, &b->sigterm);
        uv_signal_init(b->loop, &b->sigquit);
        b->sigint.data = b->sigterm.data = b->sigquit.data = b;
        b->sigusr1.data = b->sigusr2.data = b;
        uv_signal_init(b->loop, &b->sigusr1);
        uv_signal_init(b->loop, &b->sigusr2);
        uv_signal_start(&b->sigusr2, on_handover, SIGUSR2);
        uv_unref((uv_handle_t *)&b->sigusr2);
        uv_signal_start(&b->sigint, on_signal, SIGINT);
        uv_signal_start(&b->sigterm, on_signal, SIGTERM);
        uv_signal_start(&b->sigquit, on_signal, SIGQUIT);
        uv_signal_start(&b->sigusr1, on_usr1, SIGUSR1);
        /* Signals alone do not keep the loop running once the server has stopped. */
        uv_unref((uv_handle_t *)&b->sigint);
        uv_unref((uv_handle_t *)&b->sigterm);
        uv_unref((uv_handle_t *)&b->sigquit);
        uv_unref((uv_handle_t *)&b->sigusr1);
        b->signals = 1;
        signalled = b;
        signal(SIGPIPE, SIG_IGN);
        signal(SIGHUP, SIG_IGN); /* reloading is the master's; a worker keeps serving */
        worker_signals(SIG_UNBLOCK); /* (those that came while it started are handled now) */
    }
    uv_run(b->loop, UV_RUN_DEFAULT);
    return 0;
}

/* server:stop([delay_s]): stops accepting (after draining for delay_s, default none); the
 * loop ends when in-flight requests are done. */
static int server_stop(lua_State *L)
{
    binding_t *b = check_server(L);
    double delay = luaL_optnumber(L, 2, 0);
    luaL_argcheck(L, delay >= 0 && delay <= 86400, 2, "seconds, 0 to 86400");
    b->L = L;
    stop(b, (uint32_t)(delay * 1000));
    return 0;
}

/* server:agent_check(addr[, maint_file]) -> true | nil, err: answers HAProxy's agent-check
 * on `addr` (single-process mode; under a master, the master answers). */
static int server_agent_check(lua_State *L)
{
    binding_t *b = check_server(L);
    const char *addr = luaL_checkstring(L, 2);
    const char *maint = luaL_optstring(L, 3, NULL);
    if (b->agent != NULL)
        return luaL_error(L, "the agent-check answers already");
    int rc = ms_agent_start(b->loop, addr, maint, &b->agent);
    if (rc < 0)
        return ms_lua_fail(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* server:drain_delay(s): how long TERM and QUIT keep accepting, ready no more, before the
 * listeners close (ms_server_drain). */
static int server_drain_delay(lua_State *L)
{
    binding_t *b = check_server(L);
    double delay = luaL_checknumber(L, 2);
    luaL_argcheck(L, delay >= 0 && delay <= 86400, 2, "seconds, 0 to 86400");
    b->drain_ms = (uint32_t)(delay * 1000);
    return 0;
}

/* server:cpu_budget() -> true | nil, err: starts the CPU budget's clock (ms_guard.c) for the
 * state that runs this server's dispatcher; the dispatcher gives each resume its budget. */
static int server_cpu_budget(lua_State *L)
{
    binding_t *b = check_server(L);
    return push_done(L, ms_guard_cpu(b->L));
}

/* server:profile(true) -> true | nil, err: starts sampling this server's process (ms_profile.c).
 * server:profile(false) -> {[folded stack] = samples}, samples in all: stops it. */
static int server_profile(lua_State *L)
{
    binding_t *b = check_server(L);
    int on = lua_toboolean(L, 2);
    int rc = ms_guard_profile(b->L, on);
    if (rc < 0)
        return ms_lua_fail(L, rc);
    if (on) {
        lua_pushboolean(L, 1);
        return 1;
    }
    return ms_profile_push(L);
}

/* server:memory_cap(bytes) -> true | nil, err: caps the Lua heap of the state that runs this
 * server's dispatcher (ms_guard.c); past it, the resumed code gets a memory error. */
static int server_memory_cap(lua_State *L)
{
    binding_t *b = check_server(L);
    lua_Number bytes = luaL_checknumber(L, 2);
    luaL_argcheck(L, bytes >= 1 && bytes <= 0x1p52, 2, "bytes expected");
    return push_done(L, ms_guard_memory(b->L, (size_t)bytes));
}

/* server:metrics(fd, slot) -> true: counts into slot `slot` of the metrics zone of `fd`
 * (core.metrics_create, core.master_metrics), mapped for as long as the process runs. */
static int server_metrics(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_metrics_zone_t *z = ms_metrics_map((int)luaL_checkinteger(L, 2));
    if (z == NULL) {
        lua_pushnil(L);
        lua_pushstring(L, "not a metrics zone");
        return 2;
    }
    int rc = ms_server_metrics(b->server, z, (int)luaL_checkinteger(L, 3));
    if (rc < 0)
        return ms_lua_fail(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* server:pointer() -> the ms_server_t * as a light userdata, for the FFI side's waits. */
static int server_pointer(lua_State *L)
{
    lua_pushlightuserdata(L, check_server(L)->server);
    return 1;
}

/* server:listen_fd(fd[, proxy_protocol[, tls[, redirect_port]]]) -> port: serves on an
 * inherited listening socket. */
static int server_listen_fd(lua_State *L)
{
    binding_t *b = check_server(L);
    int flags = listen_flags(L, b, 3);
    ms_tls_t *tls = opt_tls(L, b, 4);
    int rc = ms_server_listen_fd(b->server, (int)luaL_checkinteger(L, 2), flags);
    if (rc < 0)
        return ms_lua_fail(L, rc);
    listen_tls(L, b, tls);
    lua_pushinteger(L, ms_server_port(b->server));
    return 1;
}

/* server:trust("10.0.0.0/8"): believe X-Forwarded-For from that range. */
static int server_trust(lua_State *L)
{
    binding_t *b = check_server(L);
    int rc = ms_server_trust(b->server, luaL_checkstring(L, 2));
    if (rc < 0)
        return ms_lua_fail(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* server:access_log(path, format) -> id: an access log ("-": stdout; format "combined",
 * "json" or a template of $fields). Nothing goes to it until server:access_default(id) or a
 * handler names it. */
static int server_access_log(lua_State *L)
{
    binding_t *b = check_server(L);
    const char *why;
    int id = ms_server_access_log(b->server, luaL_checkstring(L, 2), luaL_optstring(L, 3, NULL),
                                  &why);
    if (id < 0 && why != NULL) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    if (id < 0)
        return ms_lua_fail(L, id);
    lua_pushinteger(L, id);
    return 1;
}

/* server:access_default(id | -1): the log of every request a handler does not send to
 * another one (static files included). */
static int server_access_default(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_server_access_default(b->server, (int)luaL_checkinteger(L, 2));
    return 0;
}

/* server:access_dropped(id) -> lines of that log dropped so far. */
static int server_access_dropped(lua_State *L)
{
    binding_t *b = check_server(L);
    lua_pushnumber(L, (lua_Number)ms_server_access_dropped(b->server, (int)luaL_checkinteger(L, 2)));
    return 1;
}

/* server:health(livez, readyz): the health paths (nil: off). */
static int server_health(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_server_health(b->server, luaL_optstring(L, 2, NULL), luaL_optstring(L, 3, NULL));
    return 0;
}

/* server:refusal_body(status, kind, body) -> true | nil, err: the app's body for one of the
 * core's refusals; kind "text", "json" or "html" (ms_server_refusal_body). */
static int server_refusal_body(lua_State *L)
{
    binding_t *b = check_server(L);
    static const char *const kinds[] = {"text", "json", "html", NULL};
    int status = (int)luaL_checkinteger(L, 2);
    int kind = luaL_checkoption(L, 3, NULL, kinds);
    size_t len;
    const char *body = luaL_checklstring(L, 4, &len);
    int rc = ms_server_refusal_body(b->server, status, kind, body, len);
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushstring(L, uv_err_name(rc));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* server:request_id_header(on): replies carry x-request-id. */
static int server_request_id_header(lua_State *L)
{
    binding_t *b = check_server(L);
    ms_server_request_id_header(b->server, lua_toboolean(L, 2));
    return 0;
}

/* Reads opts[key] as a string, NULL when absent; raises for another type. */
static const char *opt_string(lua_State *L, int t, const char *key)
{
    lua_getfield(L, t, key);
    const char *v = NULL;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "bad static option %s (a string expected)", key);
        v = lua_tostring(L, -1);
    }
    lua_pop(L, 1); /* the string stays alive in the options table */
    return v;
}

static void opt_flag(lua_State *L, int t, const char *key, uint8_t *v)
{
    lua_getfield(L, t, key);
    if (!lua_isnil(L, -1))
        *v = (uint8_t)lua_toboolean(L, -1);
    lua_pop(L, 1);
}

static void opt_size(lua_State *L, int t, const char *key, uint64_t *v)
{
    lua_getfield(L, t, key);
    if (!lua_isnil(L, -1)) {
        lua_Number n = lua_tonumber(L, -1);
        if (!lua_isnumber(L, -1) || n < 0 || n != (lua_Number)(uint64_t)n)
            luaL_error(L, "bad static option %s (a size in bytes expected)", key);
        *v = (uint64_t)n;
    }
    lua_pop(L, 1);
}

/* server:static(prefix, dir[, opts]) -> mount number: serves the files of `dir` under
 * `prefix` from the core. opts: index (false for none), cache_control, fields, host,
 * memory_max, compress_min, compress_max, listing, spa, dotfiles, immutable, precompressed,
 * compress, live_reload, hooked. */
static int server_static(lua_State *L)
{
    binding_t *b = check_server(L);
    const char *prefix = luaL_checkstring(L, 2), *dir = luaL_checkstring(L, 3);
    ms_static_opts_t o;
    ms_static_opts_default(&o);
    if (lua_istable(L, 4)) {
        lua_getfield(L, 4, "index");
        int no_index = lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (no_index)
            o.index = NULL;
        else if (opt_string(L, 4, "index") != NULL)
            o.index = opt_string(L, 4, "index");
        o.cache_control = opt_string(L, 4, "cache_control");
        o.fields = opt_string(L, 4, "fields");
        o.host = opt_string(L, 4, "host");
        opt_size(L, 4, "memory_max", &o.memory_max);
        opt_size(L, 4, "compress_min", &o.compress_min);
        opt_size(L, 4, "compress_max", &o.compress_max);
        opt_flag(L, 4, "listing", &o.listing);
        opt_flag(L, 4, "spa", &o.spa);
        opt_flag(L, 4, "dotfiles", &o.dotfiles);
        opt_flag(L, 4, "immutable", &o.immutable);
        opt_flag(L, 4, "precompressed", &o.precompressed);
        opt_flag(L, 4, "compress", &o.compress);
        opt_flag(L, 4, "live_reload", &o.live_reload);
        opt_flag(L, 4, "hooked", &o.hooked);
    }
    int id = ms_static_mount(b->server, prefix, dir, &o);
    if (id < 0)
        return ms_lua_fail(L, id);
    lua_pushinteger(L, id);
    return 1;
}

/* server:static_cache([files[, bytes]]): caps the static file cache (nil: the default). */
static int server_static_cache(lua_State *L)
{
    binding_t *b = check_server(L);
    lua_Integer files = luaL_optinteger(L, 2, MS_STATIC_CACHE_FILES);
    lua_Number bytes = luaL_optnumber(L, 3, (lua_Number)MS_STATIC_CACHE_BYTES);
    luaL_argcheck(L, files > 0 && files < (1 << 24), 2, "a count of files expected");
    luaL_argcheck(L, bytes >= 0, 3, "a size in bytes expected");
    ms_static_cache_limits(b->server, (uint32_t)files, (uint64_t)bytes);
    return 0;
}

static int server_stats(lua_State *L)
{
    const ms_server_stats_t *st = ms_server_stats(check_server(L)->server);
    const struct {
        const char *name;
        uint64_t value;
    } fields[] = {
        {"accepted", st->accepted},
        {"closed", st->closed},
        {"requests", st->requests},
        {"bad_requests", st->bad_requests},
        {"connections", st->conns},
        {"in_flight", st->in_flight},
        {"refused_connections", st->refused_conns},
        {"refused_busy", st->refused_busy},
        {"timeouts", st->timeouts},
    };
    int n = (int)(sizeof(fields) / sizeof(fields[0]));
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        lua_pushnumber(L, (lua_Number)fields[i].value);
        lua_setfield(L, -2, fields[i].name);
    }
    return 1;
}

/* server:close(): frees the server once its loop has ended. */
static int server_gc(lua_State *L)
{
    binding_t *b = luaL_checkudata(L, 1, SERVER_MT);
    if (b->server == NULL)
        return 0;
    if (ms_server_stats(b->server)->conns > 0) {
        /* Still serving: the loop is running or will be; leave it be. */
        return 0;
    }
    close_signals(b); /* (their handles are in `b`: closed by the free's last run) */
    ms_agent_close(b->agent);
    b->agent = NULL;
    ms_server_free(b->server);
    b->server = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, b->on_request_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, b->on_resume_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, b->on_event_ref);
    return 0;
}

/* -- In-process connections ---------------------------------------------------------------
 * server:memconn([tag[, slot]]) -> conn; conn:feed(bytes) -> what the server wrote since the
 * last call. Requests go through the same engine and dispatch as over a socket, without one;
 * they report `tag` (ms_ffi_req_memtag), and `slot` is woken when the engine ends the
 * connection. */

typedef struct memconn_s {
    ms_memio_t io;
    int open;
} memconn_t;

static int memconn_new(lua_State *L)
{
    binding_t *b = check_server(L);
    lua_Integer tag = luaL_optinteger(L, 2, 0), slot = luaL_optinteger(L, 3, -1);
    luaL_argcheck(L, tag >= 0 && tag <= UINT32_MAX, 2, "tag out of range");
    luaL_argcheck(L, slot >= -1 && slot < MS_WAKE_SLOT_MAX, 3, "slot out of range");
    memconn_t *m = lua_newuserdata(L, sizeof(*m));
    luaL_getmetatable(L, MEMCONN_MT);
    lua_setmetatable(L, -2);
    ms_memio_open(b->server, &m->io);
    m->io.tag = (uint32_t)tag;
    m->io.wake = (int32_t)(slot + 1);
    m->open = 1;
    b->L = L;
    return 1;
}

/* conn:feed(bytes[, length_only]) -> what the server wrote (or its length), closed */
static int memconn_feed(lua_State *L)
{
    memconn_t *m = luaL_checkudata(L, 1, MEMCONN_MT);
    size_t n;
    const char *p = luaL_optlstring(L, 2, "", &n);
    m->io.out.len = 0;
    if (n > 0)
        ms_memio_feed(&m->io, p, n);
    if (lua_toboolean(L, 3)) /* benchmarks: the length only, so Lua allocates nothing */
        lua_pushinteger(L, (lua_Integer)m->io.out.len);
    else
        lua_pushlstring(L, m->io.out.base ? m->io.out.base : "", m->io.out.len);
    m->io.out.len = 0; /* handed over: a take() after it returns only what comes later */
    lua_pushboolean(L, m->io.conn == NULL);
    return 2;
}

/* conn:take(): what was written since the last feed or take (after timers or resumes). */
static int memconn_take(lua_State *L)
{
    memconn_t *m = luaL_checkudata(L, 1, MEMCONN_MT);
    lua_pushlstring(L, m->io.out.base ? m->io.out.base : "", m->io.out.len);
    m->io.out.len = 0;
    lua_pushboolean(L, m->io.conn == NULL);
    return 2;
}

static int memconn_close(lua_State *L)
{
    memconn_t *m = luaL_checkudata(L, 1, MEMCONN_MT);
    if (m->open) {
        m->open = 0;
        m->io.wake = 0; /* the opener closes it: no news for it */
        ms_memio_peer_close(&m->io, UV_EOF);
        /* A connection a handler still holds would write into what is freed below (and the
         * userdata goes with the collector): the peer is gone for good. */
        if (m->io.conn != NULL)
            ms_memio_peer_close(&m->io, UV_ECONNRESET);
        ms_memio_free(&m->io);
    }
    return 0;
}

/* -- Module -------------------------------------------------------------------------------- */

/* A log level argument: 0 (error), 1 (warn), 2 (info) or 3 (debug); anything else raises. */
static int check_level(lua_State *L, int arg)
{
    lua_Number v = luaL_checknumber(L, arg);
    if (!(v >= MS_LOG_ERR && v <= MS_LOG_DEBUG) || v != (lua_Number)(int)v)
        return luaL_argerror(
            L, arg, lua_pushfstring(L, "log level 0 (error) to 3 (debug) expected, got %f", v));
    return (int)v;
}

static int core_log(lua_State *L)
{
    int level = check_level(L, 1);
    size_t n;
    const char *msg = luaL_checklstring(L, 2, &n);
    ms_log_msg(level, msg, n);
    return 0;
}

/* core.log_level(level) sets the level; core.log_level() returns it. */
static int core_log_level(lua_State *L)
{
    if (lua_isnoneornil(L, 1)) {
        lua_pushinteger(L, ms_log_level());
        return 1;
    }
    ms_log_set(NULL, check_level(L, 1));
    return 0;
}

/* core.log_format("text" | "json") */
static int core_log_format(lua_State *L)
{
    static const char *const names[] = {"text", "json", NULL};
    ms_log_format(luaL_checkoption(L, 1, NULL, names));
    return 0;
}

/* -- Master and workers -------------------------------------------------------------------- */

/* Which of the master's listeners serve TLS (core.master's `https`), for its log lines. */
static uint8_t master_https[16];
/* Which is the metrics listener (core.master's `metrics`, from 1; 0: none). */
static int master_metrics_at;

static void master_listening(const ms_master_opts_t *o)
{
    for (int i = 0; i < o->nlisten; i++) {
        const char *colon = strrchr(o->listen[i], ':');
        int hl = (int)(colon - o->listen[i]);
        ms_log(MS_LOG_INFO, "%s on %s://%.*s:%d/ (%d workers)",
               i + 1 == master_metrics_at ? "metrics listening" : "listening",
               master_https[i] ? "https" : "http", hl ? hl : 7, hl ? o->listen[i] : "0.0.0.0",
               o->ports[i], o->workers);
    }
}

/* The master's Lua state and the function a reload calls (core.master's on_reload), which
 * returns the configuration's new bytes or nil and why. The master runs in one thread,
 * inside core.master's call, so calling back into its state from the loop is safe. */
static lua_State *master_L;
static int master_reload_ref = LUA_NOREF;

static int master_reload(const ms_master_opts_t *o, char *why, size_t why_len)
{
    lua_State *L = master_L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, master_reload_ref);
    if (lua_pcall(L, 0, 2, 0) != 0) {
        snprintf(why, why_len, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "an error");
        lua_pop(L, 1);
        return -1;
    }
    size_t len;
    const char *bytes = lua_tolstring(L, -2, &len);
    if (bytes == NULL) {
        snprintf(why, why_len, "%s",
                 lua_isstring(L, -1) ? lua_tostring(L, -1) : "no configuration");
        lua_pop(L, 2);
        return -1;
    }
    int rc = ms_master_config(bytes, len);
    lua_pop(L, 2);
    if (rc < 0) {
        snprintf(why, why_len, "cannot hand the configuration over: %s", uv_strerror(rc));
        return -1;
    }
    return 0;
}

/* The strings of the list at t[key] (none when it is nil), in an array that lives on the
 * stack as a userdata until the caller returns; the table keeps the strings alive. */
static const char **string_list(lua_State *L, int t, const char *key, int *n)
{
    lua_getfield(L, t, key);
    *n = lua_istable(L, -1) ? (int)lua_objlen(L, -1) : 0;
    const char **list = lua_newuserdata(L, sizeof(char *) * ((size_t)*n + 1));
    for (int i = 0; i < *n; i++) {
        lua_rawgeti(L, -2, i + 1);
        list[i] = luaL_checkstring(L, -1);
        lua_pop(L, 1);
    }
    return list;
}

/* core.master{ argv = {...}, listen = {...}, https = { bool, ... }, workers = n,
 * stop_timeout = s, start_timeout = s, ticket_rotate = s, backlog = n, metrics = i,
 * uid = n, gid = n, files = { path, ... }, logs = { path, ... }, zones = { name = bytes,
 * ... }, pid_file = path }: runs the master until it is stopped; nil, why, true when a log could not be opened
 * or a worker could not start (the sentence is whole). (`https`: which listeners the workers
 * serve TLS on; `metrics`: which one, from 1, is the metrics listener, for the log; uid and
 * gid: who the workers run as; files, logs and zones: ms_master_opts_t's.) */
static int core_master(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    ms_master_opts_t o;
    memset(&o, 0, sizeof(o));
    lua_getfield(L, 1, "argv");
    luaL_checktype(L, -1, LUA_TTABLE);
    int argc = (int)lua_objlen(L, -1);
    char **argv = lua_newuserdata(L, sizeof(char *) * ((size_t)argc + 1));
    for (int i = 0; i < argc; i++) {
        lua_rawgeti(L, -2, i + 1);
        argv[i] = (char *)luaL_checkstring(L, -1);
        lua_pop(L, 1); /* the argv table keeps the strings alive */
    }
    argv[argc] = NULL;
    o.argv = argv;
    lua_getfield(L, 1, "listen");
    luaL_checktype(L, -1, LUA_TTABLE);
    o.nlisten = (int)lua_objlen(L, -1);
    if (o.nlisten < 1 || o.nlisten > 16)
        return luaL_error(L, "listen: 1 to 16 addresses");
    const char *addrs[16];
    int ports[16];
    for (int i = 0; i < o.nlisten; i++) {
        lua_rawgeti(L, -1, i + 1);
        addrs[i] = luaL_checkstring(L, -1);
        lua_pop(L, 1);
    }
    o.listen = addrs;
    o.ports = ports;
    lua_getfield(L, 1, "https");
    for (int i = 0; i < o.nlisten; i++) {
        master_https[i] = 0;
        if (lua_istable(L, -1)) {
            lua_rawgeti(L, -1, i + 1);
            master_https[i] = (uint8_t)lua_toboolean(L, -1);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "workers");
    o.workers = (int)luaL_checkinteger(L, -1);
    lua_getfield(L, 1, "stop_timeout");
    o.stop_timeout = luaL_optnumber(L, -1, MS_STOP_TIMEOUT);
    lua_getfield(L, 1, "start_timeout");
    o.start_timeout = luaL_optnumber(L, -1, MS_START_TIMEOUT);
    lua_getfield(L, 1, "drain_delay");
    o.drain_delay = luaL_optnumber(L, -1, 0);
    lua_getfield(L, 1, "agent_check");
    o.agent_check = luaL_optstring(L, -1, NULL);
    lua_getfield(L, 1, "agent_maint");
    o.agent_maint = luaL_optstring(L, -1, NULL);
    lua_getfield(L, 1, "ticket_rotate");
    o.ticket_rotate = luaL_optnumber(L, -1, MS_TLS_TICKET_ROTATE);
    lua_getfield(L, 1, "backlog");
    o.backlog = (int)luaL_optinteger(L, -1, MS_LISTEN_BACKLOG);
    lua_getfield(L, 1, "metrics");
    master_metrics_at = (int)luaL_optinteger(L, -1, 0);
    lua_getfield(L, 1, "uid");
    o.uid = (int)luaL_optinteger(L, -1, -1);
    lua_getfield(L, 1, "gid");
    o.gid = (int)luaL_optinteger(L, -1, -1);
    if ((o.uid < 0) != (o.gid < 0))
        return luaL_error(L, "uid and gid go together");
    o.files = string_list(L, 1, "files", &o.nfiles);
    o.logs = string_list(L, 1, "logs", &o.nlogs);
    lua_getfield(L, 1, "zones");
    int zt = lua_gettop(L);
    if (lua_istable(L, zt)) {
        for (lua_pushnil(L); lua_next(L, zt) != 0; lua_pop(L, 1))
            o.nzones++;
    }
    o.zone_names = lua_newuserdata(L, sizeof(char *) * ((size_t)o.nzones + 1));
    uint64_t *sizes = lua_newuserdata(L, sizeof(uint64_t) * ((size_t)o.nzones + 1));
    o.zone_sizes = sizes;
    int nz = 0;
    if (lua_istable(L, zt)) {
        for (lua_pushnil(L); lua_next(L, zt) != 0; lua_pop(L, 1)) {
            o.zone_names[nz] = luaL_checkstring(L, -2); /* (the table keeps it alive) */
            sizes[nz++] = (uint64_t)luaL_checknumber(L, -1);
        }
    }
    lua_getfield(L, 1, "config");
    if (!lua_isnil(L, -1))
        o.config = luaL_checklstring(L, -1, &o.config_len); /* (the opts table keeps it) */
    lua_getfield(L, 1, "pid_file");
    o.pid_file = luaL_optstring(L, -1, NULL); /* (the opts table keeps it) */
    lua_getfield(L, 1, "on_reload");
    if (lua_isfunction(L, -1)) {
        master_L = L;
        master_reload_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        o.on_reload = master_reload;
    }
    char why[1200] = "";
    o.why = why;
    o.why_len = sizeof(why);
    o.on_listen = master_listening;
    int rc = ms_master_run(&o);
    if (master_reload_ref != LUA_NOREF) {
        luaL_unref(L, LUA_REGISTRYINDEX, master_reload_ref);
        master_reload_ref = LUA_NOREF;
    }
    if (rc < 0 && why[0] != '\0') {
        lua_pushnil(L);
        lua_pushstring(L, why);
        lua_pushboolean(L, 1);
        return 3;
    }
    if (rc < 0)
        return ms_lua_fail(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.worker_init(): keeps the worker's channel to its master from whatever the worker
 * runs (the master handed it on at fd 3 without close-on-exec, as inheriting needs). */
/* core.proctitle(title): what `ps` shows for this process. true, or nil and an error. */
static int core_proctitle(lua_State *L)
{
    return push_done(L, ms_proctitle_set(luaL_checkstring(L, 1)));
}

/* The signals the master sends a worker (TERM, QUIT, INT to stop, USR1 to reopen the logs,
 * USR2 to hand over). A worker handles them once server_run starts, after the master's OK;
 * until then they wait, blocked, rather than take their default action on a worker still
 * starting (a core dump for QUIT, a death for the others, which the master would take for a
 * failed reload). server_run unblocks them. */
static void worker_signals(int how)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(how, &set, NULL);
}

static int core_worker_init(lua_State *L)
{
    int flags = fcntl(MS_CHAN_WORKER_FD, F_GETFD);
    if (flags < 0 || fcntl(MS_CHAN_WORKER_FD, F_SETFD, flags | FD_CLOEXEC) < 0)
        return ms_lua_fail(L, uv_translate_sys_error(errno));
    ms_chan_worker();
    lua_pushboolean(L, 1);
    return 1;
}

/* core.worker_ready(timeout_s) -> true | nil, err: tells the master this worker listens (on
 * its channel), asks the kernel to stop this worker if the master dies, and waits for the
 * master's word to serve, at most `timeout_s`: in a reload, it comes once every new worker is
 * ready, and a reload that fails kills this one before its loop has accepted anything. */
static int core_worker_ready(lua_State *L)
{
    double timeout = luaL_optnumber(L, 1, 60);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd;
    char why[256];
    int rc = ms_chan_ask(MS_CHAN_READY, NULL, 0, (int)(timeout * 1000), &fd, why, sizeof(why));
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* Sends the master `type` with the sentence at argument 1, which it does not answer. */
static int tell_master(lua_State *L, uint32_t type)
{
    size_t len;
    const char *why = luaL_checklstring(L, 1, &len);
    int rc = ms_chan_send(MS_CHAN_WORKER_FD, type, why, len < 1000 ? len : 1000, -1);
    if (rc < 0)
        return ms_lua_fail(L, uv_translate_sys_error(-rc));
    lua_pushboolean(L, 1);
    return 1;
}

/* core.worker_failed(why) -> true | nil, err: tells the master this worker cannot start, and
 * why (it then exits): the master stops a start, or fails a reload, with that sentence. */
static int core_worker_failed(lua_State *L)
{
    return tell_master(L, MS_CHAN_FAILED);
}

/* core.worker_replace(why) -> true | nil, err: asks the master to replace this worker, and
 * why: it starts another in its slot and, once that one is ready, drains this one. */
static int core_worker_replace(lua_State *L)
{
    return tell_master(L, MS_CHAN_REPLACE);
}

/* How long a worker waits for its master's answer: the master answers from its loop at once,
 * so this bounds only a master that cannot. */
#define MASTER_ASK_MS 10000

/* core.master_zone(name, bytes) -> fd | nil, why: the zone of a shared dictionary, from the
 * master (which makes it the first time it is asked). */
static int core_master_zone(lua_State *L)
{
    size_t nlen;
    const char *name = luaL_checklstring(L, 1, &nlen);
    uint64_t size = (uint64_t)luaL_checknumber(L, 2);
    char body[sizeof(size) + 64], why[512] = "";
    if (nlen > 63)
        return luaL_argerror(L, 1, "name too long");
    memcpy(body, &size, sizeof(size));
    memcpy(body + sizeof(size), name, nlen);
    int fd;
    if (ms_chan_ask(MS_CHAN_ZONE, body, sizeof(size) + nlen, MASTER_ASK_MS, &fd, why,
                    sizeof(why)) < 0 || fd < 0) {
        lua_pushnil(L);
        lua_pushstring(L, fd < 0 && why[0] == '\0' ? "no zone in the master's answer" : why);
        return 2;
    }
    lua_pushinteger(L, fd);
    return 1;
}

/* core.master_tickets() -> true | nil, why: the TLS session ticket keys become the master's,
 * which every worker shares (ms_tls_tickets). */
static int core_master_tickets(lua_State *L)
{
    char why[512] = "";
    int fd;
    if (ms_chan_ask(MS_CHAN_TICKETS, NULL, 0, MASTER_ASK_MS, &fd, why, sizeof(why)) < 0 ||
        fd < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why[0] != '\0' ? why : "no zone in the master's answer");
        return 2;
    }
    int rc = ms_tls_tickets(fd);
    close(fd);
    if (rc < 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot map the TLS ticket keys: %s", uv_strerror(rc));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* core.tls_kernel() -> true | false, why: whether the kernel and OpenSSL offer kernel TLS. */
static int core_tls_kernel(lua_State *L)
{
    const char *why;
    int on = ms_tls_kernel(&why);
    lua_pushboolean(L, on);
    if (on)
        return 1;
    lua_pushstring(L, why);
    return 2;
}

/* core.tls_ticket_rotate(seconds): how often a process without a master makes a new TLS
 * ticket key. */
static int core_tls_ticket_rotate(lua_State *L)
{
    ms_tls_ticket_rotate(luaL_checknumber(L, 1));
    return 0;
}

/* core.metrics_create(workers, routes) -> fd | nil, err: a metrics zone, in this process
 * (a server with no master; the master makes its own). */
static int core_metrics_create(lua_State *L)
{
    int fd = ms_metrics_create((int)luaL_checkinteger(L, 1), (int)luaL_checkinteger(L, 2));
    if (fd < 0)
        return ms_lua_fail(L, fd);
    lua_pushinteger(L, fd);
    return 1;
}

/* core.master_metrics(routes) -> fd, slot | nil, why: the metrics zone from the master, and
 * the slot this worker writes (the master picks one no other live worker writes). */
static int core_master_metrics(lua_State *L)
{
    uint32_t routes = (uint32_t)luaL_checkinteger(L, 1);
    char why[512] = "";
    int fd;
    if (ms_chan_ask(MS_CHAN_METRICS, &routes, sizeof(routes), MASTER_ASK_MS, &fd, why,
                    sizeof(why)) < 0 ||
        fd < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why[0] != '\0' ? why : "no zone in the master's answer");
        return 2;
    }
    lua_pushinteger(L, fd);
    lua_pushinteger(L, atoi(why)); /* (an OK's body: the slot) */
    return 2;
}

/* The largest configuration a worker takes from its master. */
#define MASTER_CONFIG_MAX (16 * 1024 * 1024)

/* core.master_config() -> bytes | nil, why: the configuration the master read (settings and
 * secrets), the same bytes for every worker it starts until its next reload. Read with pread:
 * the memfd's offset is shared by every worker that holds it. */
static int core_master_config(lua_State *L)
{
    char why[512] = "";
    int fd;
    if (ms_chan_ask(MS_CHAN_CONFIG, NULL, 0, MASTER_ASK_MS, &fd, why, sizeof(why)) < 0 ||
        fd < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why[0] != '\0' ? why : "no configuration in the master's answer");
        return 2;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size > MASTER_CONFIG_MAX) {
        close(fd);
        lua_pushnil(L);
        lua_pushstring(L, "the master's configuration cannot be read");
        return 2;
    }
    size_t len = (size_t)st.st_size, off = 0;
    char *p = malloc(len ? len : 1);
    if (p == NULL)
        abort();
    while (off < len) {
        ssize_t n = pread(fd, p + off, len - off, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(fd);
    if (off < len) {
        free(p);
        lua_pushnil(L);
        lua_pushstring(L, "the master's configuration was cut short");
        return 2;
    }
    lua_pushlstring(L, p, len);
    free(p);
    return 1;
}

/* The largest file a worker reads through its master: certificates and keys are a few KB. */
#define MASTER_FILE_MAX (1024 * 1024)

/* core.master_file(path) -> contents | nil, why: a file read by this worker, or, when its
 * user may not (a private key readable by the master's user alone), opened by the master
 * with its rights and read here. */
static int core_master_file(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    char why[512] = "";
    int fd = ms_chan_open(path, 0, why, sizeof(why));
    if (fd < 0) {
        lua_pushnil(L);
        if (why[0] != '\0')
            lua_pushstring(L, why);
        else
            lua_pushfstring(L, "cannot open %s: %s", path, strerror(-fd));
        return 2;
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    size_t total = 0;
    for (;;) {
        char *p = luaL_prepbuffer(&b);
        ssize_t n = read(fd, p, LUAL_BUFFERSIZE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || (total += (size_t)n) > MASTER_FILE_MAX) {
            int err = n < 0 ? errno : EFBIG;
            close(fd);
            if (n == 0)
                break;
            lua_pushnil(L);
            lua_pushfstring(L, "cannot read %s: %s", path, strerror(err));
            return 2;
        }
        luaL_addsize(&b, (size_t)n);
    }
    luaL_pushresult(&b);
    return 1;
}

/* core.user_ids(user, group) -> uid, gid | nil, why: from the system's databases; group nil:
 * the user's own. */
static int core_user_ids(lua_State *L)
{
    int uid, gid;
    char why[512];
    if (ms_user_ids(luaL_checkstring(L, 1), luaL_optstring(L, 2, NULL), &uid, &gid, why,
                    sizeof(why)) < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushinteger(L, uid);
    lua_pushinteger(L, gid);
    return 2;
}

/* core.user_check(uid, gid) -> true | nil, why: whether this process runs as them alone
 * (ms_user_check). core.uid() -> the real user id. */
static int core_user_check(lua_State *L)
{
    char why[512];
    if (ms_user_check((int)luaL_checkinteger(L, 1), (int)luaL_checkinteger(L, 2), why,
                      sizeof(why)) < 0) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int core_uid(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)getuid());
    return 1;
}

/* core.fd_close(fd): closes a descriptor the core handed to Lua (a zone, once mapped). */
static int core_fd_close(lua_State *L)
{
    close((int)luaL_checkinteger(L, 1));
    return 0;
}

static int core_log_open(lua_State *L)
{
    int rc = ms_log_open(luaL_optstring(L, 1, NULL));
    if (rc < 0)
        return ms_lua_fail(L, rc);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.default_limits() -> { key = value }: the core's defaults, times in seconds. */
static int core_default_limits(lua_State *L)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    size_t n = sizeof(limit_keys) / sizeof(limit_keys[0]);
    lua_createtable(L, 0, (int)n);
    for (size_t i = 0; i < n; i++) {
        const char *field = (const char *)&lim + limit_keys[i].offset;
        double v = limit_keys[i].wide ? (double)*(const uint64_t *)field
                                      : (double)*(const uint32_t *)field;
        lua_pushnumber(L, v / limit_keys[i].scale);
        lua_setfield(L, -2, limit_keys[i].name);
    }
    return 1;
}

/* core.limits() -> { { key =, default =, unit =, doc = }, ... }: every limit in the order of
 * MS_LIMITS, defaults as core.default_limits() gives them (times in seconds). The CLI's help
 * and the README's check are made from it. */
static int core_limits(lua_State *L)
{
    core_default_limits(L);
    int defaults = lua_gettop(L);
    size_t n = sizeof(limit_keys) / sizeof(limit_keys[0]);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_createtable(L, 0, 4);
        lua_pushstring(L, limit_keys[i].name);
        lua_setfield(L, -2, "key");
        lua_getfield(L, defaults, limit_keys[i].name);
        lua_setfield(L, -2, "default");
        lua_pushstring(L, limit_keys[i].unit);
        lua_setfield(L, -2, "unit");
        lua_pushstring(L, limit_keys[i].doc);
        lua_setfield(L, -2, "doc");
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

/* core.defaults() -> { backlog =, static_cache_files =, static_cache_bytes =, stop_timeout =,
 * start_timeout = }:
 * the other defaults the core applies when Lua gives none (core/base/settings.h). */
static int core_defaults(lua_State *L)
{
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, MS_START_TIMEOUT);
    lua_setfield(L, -2, "start_timeout");
    lua_pushinteger(L, MS_LISTEN_BACKLOG);
    lua_setfield(L, -2, "backlog");
    lua_pushinteger(L, MS_STATIC_CACHE_FILES);
    lua_setfield(L, -2, "static_cache_files");
    lua_pushnumber(L, (lua_Number)MS_STATIC_CACHE_BYTES);
    lua_setfield(L, -2, "static_cache_bytes");
    lua_pushnumber(L, MS_STOP_TIMEOUT);
    lua_setfield(L, -2, "stop_timeout");
    return 1;
}

static int core_cpus(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)ms_cpus());
    return 1;
}

static uv_timer_t run_bound; /* core.run_once(seconds)'s deadline */
static int run_bound_made;

static void run_bound_cb(uv_timer_t *t)
{
    /* Ends the loop's wait: fired among the timers an iteration runs before it polls, the
     * stop makes that poll not wait (else it would sleep until the next timer after it). */
    uv_stop(t->loop);
}

/* core.run_once([seconds]) -> whether anything is left to run. Runs due timers and events:
 * without waiting, or waiting up to `seconds` for the next one (in-process tests drive the
 * loop while a reply is under way, as a worker's loop would run). */
static int core_run_once(lua_State *L)
{
    lua_Number wait = luaL_optnumber(L, 1, 0);
    uv_loop_t *loop = uv_default_loop();
    if (!(wait > 0)) {
        lua_pushboolean(L, uv_run(loop, UV_RUN_NOWAIT));
        return 1;
    }
    if (!run_bound_made) {
        uv_timer_init(loop, &run_bound);
        run_bound_made = 1;
    }
    /* The timer bounds the poll; stopped after, it keeps nothing alive. */
    uv_update_time(loop);
    uv_timer_start(&run_bound, run_bound_cb, wait > 3600 ? 3600000 : (uint64_t)(wait * 1000) + 1,
                   0);
    int more = uv_run(loop, UV_RUN_ONCE);
    uv_timer_stop(&run_bound);
    lua_pushboolean(L, more);
    return 1;
}

/* -- The log's lines for Lua (core.log_tap) ------------------------------------------------ */

/* Records of [level byte][length, 4 bytes][message], up to TAP_MAX bytes; what comes past it
 * is counted, not kept. */
#define TAP_MAX (256 * 1024)
static char *tap_buf;
static size_t tap_len;
static unsigned long tap_dropped;

static void tap_line(int level, const char *msg, size_t len)
{
    if (tap_len + 5 + len > TAP_MAX) {
        tap_dropped++;
        return;
    }
    if (tap_buf == NULL)
        tap_buf = malloc(TAP_MAX); /* once, for the process's life */
    if (tap_buf == NULL)
        return;
    uint32_t n = (uint32_t)len;
    tap_buf[tap_len] = (char)level;
    memcpy(tap_buf + tap_len + 1, &n, 4);
    memcpy(tap_buf + tap_len + 5, msg, len);
    tap_len += 5 + len;
}

/* core.log_tap(on): from now on, every line the log keeps is also kept for core.log_taken
 * (on), or no more (off: what was kept is dropped). */
static int core_log_tap(lua_State *L)
{
    int on = lua_toboolean(L, 1);
    ms_log_tap(on ? tap_line : NULL);
    if (!on)
        tap_len = 0;
    return 0;
}

static void log_nowhere(int level, const char *msg, size_t len)
{
    (void)level, (void)msg, (void)len; /* core.log_quiet: only the tap sees the line */
}

/* core.log_quiet(on): lines go nowhere but to the tap (on), or to the log again (off). */
static int core_log_quiet(lua_State *L)
{
    ms_log_set(lua_toboolean(L, 1) ? log_nowhere : NULL, ms_log_level());
    return 0;
}

/* core.log_taken() -> { "error: message", ... } the lines kept since the last call, and how
 * many did not fit. */
static int core_log_taken(lua_State *L)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    lua_newtable(L);
    int i = 0;
    for (size_t o = 0; o + 5 <= tap_len;) {
        uint32_t n;
        int level = tap_buf[o];
        memcpy(&n, tap_buf + o + 1, 4);
        lua_pushstring(L, names[level < 0 || level > 3 ? 0 : level]);
        lua_pushliteral(L, ": ");
        lua_pushlstring(L, tap_buf + o + 5, n);
        lua_concat(L, 3);
        lua_rawseti(L, -2, ++i);
        o += 5 + n;
    }
    lua_pushinteger(L, (lua_Integer)tap_dropped);
    tap_len = 0;
    tap_dropped = 0;
    return 2;
}

static int core_now(lua_State *L)
{
    uv_update_time(uv_default_loop());
    lua_pushnumber(L, (lua_Number)uv_now(uv_default_loop()) / 1000.0);
    return 1;
}

/* A userdata type: its metatable with methods and a finalizer. */
static void register_type(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc)
{
    luaL_newmetatable(L, name);
    lua_newtable(L);
    luaL_register(L, NULL, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
}

/* Makes the shared object holding `sym` global: its symbols resolve through dlsym(RTLD_DEFAULT),
 * which is what LuaJIT's ffi.C looks in. RTLD_NOLOAD: the very file already mapped, never a
 * second copy. The handle is kept for the life of the process. */
static void make_global(const void *sym)
{
    Dl_info info;
    if (dladdr(sym, &info) == 0 || info.dli_fname == NULL)
        return;
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

MS_EXPORT int luaopen_moonserve_core(lua_State *L)
{
    /* A worker's signals wait from here (before its app loads) until server_run. */
    if (getenv("MOONSERVE_WORKER") != NULL)
        worker_signals(SIG_BLOCK);
    static const luaL_Reg server_methods[] = {{"listen", server_listen},
                                              {"listen_fd", server_listen_fd},
                                              {"tls", server_tls},
                                              {"tls_cert", server_tls_cert},
                                              {"tls_staple", server_tls_staple},
                                              {"tls_hook", server_tls_hook},
                                              {"run", server_run},
                                              {"stop", server_stop},
                                              {"pointer", server_pointer},
                                              {"metrics", server_metrics},
                                              {"trust", server_trust},
                                              {"access_log", server_access_log},
                                              {"access_default", server_access_default},
                                              {"access_dropped", server_access_dropped},
                                              {"request_id_header", server_request_id_header},
                                              {"health", server_health},
                                              {"drain_delay", server_drain_delay},
                                              {"cpu_budget", server_cpu_budget},
                                              {"memory_cap", server_memory_cap},
                                              {"profile", server_profile},
                                              {"agent_check", server_agent_check},
                                              {"refusal_body", server_refusal_body},
                                              {"stats", server_stats},
                                              {"static", server_static},
                                              {"static_cache", server_static_cache},
                                              {"memconn", memconn_new},
                                              {"close", server_gc},
                                              {NULL, NULL}};
    static const luaL_Reg memconn_methods[] = {
        {"feed", memconn_feed}, {"take", memconn_take}, {"close", memconn_close}, {NULL, NULL}};
    static const luaL_Reg funcs[] = {{"server", server_new},
                                     {"log", core_log},
                                     {"log_level", core_log_level},
                                     {"log_format", core_log_format},
                                     {"log_open", core_log_open},
                                     {"master", core_master},
                                     {"proctitle", core_proctitle},
                                     {"worker_init", core_worker_init},
                                     {"worker_ready", core_worker_ready},
                                     {"worker_failed", core_worker_failed},
                                     {"worker_replace", core_worker_replace},
                                     {"master_zone", core_master_zone},
                                     {"master_tickets", core_master_tickets},
                                     {"tls_ticket_rotate", core_tls_ticket_rotate},
                                     {"tls_kernel", core_tls_kernel},
                                     {"master_file", core_master_file},
                                     {"master_config", core_master_config},
                                     {"user_ids", core_user_ids},
                                     {"user_check", core_user_check},
                                     {"uid", core_uid},
                                     {"master_metrics", core_master_metrics},
                                     {"metrics_create", core_metrics_create},
                                     {"fd_close", core_fd_close},
                                     {"cpus", core_cpus},
                                     {"default_limits", core_default_limits},
                                     {"limits", core_limits},
                                     {"defaults", core_defaults},
                                     {"run_once", core_run_once},
                                     {"log_tap", core_log_tap},
                                     {"log_taken", core_log_taken},
                                     {"log_quiet", core_log_quiet},
                                     {"now", core_now},
                                     {NULL, NULL}};

    /* Inside nginx, libcrypto's and libssl's functions are the process's global symbols, and
     * OpenResty libraries call them through ffi.C (RAND_bytes, EVP_*, HMAC_*), as they call
     * nginx's own (ngx_hex_dump, ms_ngx_ffi.c). `require` loads this module RTLD_LOCAL, and
     * the libraries it links with it, so ffi.C sees none of them: promote all three, in every
     * process that loads the core, before any handler runs. */
    make_global((const void *)OpenSSL_version);
    make_global((const void *)SSL_CTX_new);
    make_global((const void *)luaopen_moonserve_core);

    register_type(L, SERVER_MT, server_methods, server_gc);
    register_type(L, MEMCONN_MT, memconn_methods, memconn_close);

    lua_newtable(L);
    luaL_register(L, NULL, funcs);
    /* Where this file is, so the FFI side can load the very same one. */
    Dl_info info;
    if (dladdr((void *)luaopen_moonserve_core, &info) != 0 && info.dli_fname != NULL) {
        lua_pushstring(L, info.dli_fname);
        lua_setfield(L, -2, "path");
    }
    return 1;
}
