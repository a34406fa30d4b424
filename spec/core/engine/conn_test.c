/* conn_test.c: a connection's references, its reply queue (text and pieces in one gathered
 * write), writes the socket takes in part, and its deadline. */
#include "test.h"

#include "../../../core/engine/conn.c"
#include "../../../core/transport/memio.h"
#include "text.h"

static uv_loop_t loop;
static ms_server_t *srv;

static void setup(const ms_limits_t *lim)
{
    ms_log_set(NULL, MS_LOG_ERR);
    uv_loop_init(&loop);
    srv = ms_server_new(&loop, lim, NULL, NULL, NULL);
}

static void teardown(void)
{
    ms_server_free(srv);
    uv_loop_close(&loop);
}

/* -- A transport whose socket takes `room` bytes a call, and keeps the rest of a write as a
 * pending one until the test completes it: what a full kernel buffer does. */
typedef struct {
    ms_buf_t out;      /* what the peer got */
    ms_buf_t pending;  /* handed to write(), not yet done */
    size_t room;       /* bytes try_write takes per call */
    int tries, writes; /* calls */
    unsigned max_iov;  /* the most pieces one try_write was given */
    int closed;
} trickle_t;

static trickle_t *trickle_of(ms_conn_t *c)
{
    return *(trickle_t **)ms_conn_io_data(c);
}

static int tr_try_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    trickle_t *t = trickle_of(c);
    t->tries++;
    if (n > t->max_iov)
        t->max_iov = n;
    size_t room = t->room, done = 0;
    for (unsigned i = 0; i < n && room > 0; i++) {
        size_t k = bufs[i].len < room ? bufs[i].len : room;
        ms__buf_append(&t->out, bufs[i].base, k);
        room -= k;
        done += k;
    }
    return done ? (int)done : UV_EAGAIN;
}

static int tr_write(ms_conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    trickle_t *t = trickle_of(c);
    t->writes++;
    for (unsigned i = 0; i < n; i++)
        ms__buf_append(&t->pending, bufs[i].base, bufs[i].len);
    ms__conn_hold(c);
    return 0;
}

/* The socket took the pending write. */
static void tr_complete(ms_conn_t *c, int status)
{
    trickle_t *t = trickle_of(c);
    if (status == 0)
        ms__buf_append(&t->out, t->pending.base, t->pending.len);
    t->pending.len = 0;
    ms_conn_write_done(c, status);
    ms__conn_release(c);
}

static void tr_read(ms_conn_t *c)
{
    (void)c;
}

static void tr_close(ms_conn_t *c)
{
    trickle_of(c)->closed++;
    ms_conn_closed(c);
}

static const ms_io_t trickle_io = {.try_write = tr_try_write,
                                   .write = tr_write,
                                   .read_stop = tr_read,
                                   .read_start = tr_read,
                                   .close = tr_close};

static ms_conn_t *trickle_open(trickle_t *t, size_t room)
{
    memset(t, 0, sizeof(*t));
    t->room = room;
    ms_conn_t *c = ms_conn_new(srv, &trickle_io, sizeof(t));
    *(trickle_t **)ms_conn_io_data(c) = t;
    return c;
}

static void trickle_free(trickle_t *t)
{
    ms_mem_free(t->out.base);
    ms_mem_free(t->pending.base);
}

TEST(conn_queue_writes_text_and_pieces_in_order_in_one_gather)
{
    setup(NULL);
    trickle_t t;
    ms_conn_t *c = trickle_open(&t, 1 << 20);
    ms_out_t *o = ms__conn_out(c);
    ASSERT(ms__conn_out(c) == o); /* one queue until it is written */
    ms__out_text(srv, o, "HTTP/1.1 200 OK\r\n", 17);
    ms__out_text(srv, o, "\r\n", 2); /* text right after text extends the same piece */
    ASSERT_EQ(1, o->nvecs);
    static const char body[] = "a body that is referenced, not copied";
    ms__out_vec(srv, o, body, sizeof(body) - 1, MS_VEC_STATIC, -1);
    ms__out_text(srv, o, "|tail", 5);
    ASSERT_EQ(3, o->nvecs);
    ASSERT_EQ(17 + 2 + sizeof(body) - 1 + 5, ms__conn_queued(c));
    ms__out_vec(srv, o, "", 0, MS_VEC_STATIC, -1); /* empty: nothing queued */
    ASSERT_EQ(3, o->nvecs);
    ms__conn_flush(c);
    ASSERT_EQ(1, t.tries); /* one gathered write */
    ASSERT_EQ(3, t.max_iov);
    ASSERT_STR_EQ("HTTP/1.1 200 OK\r\n\r\na body that is referenced, not copied|tail",
                  text(&t.out));
    ASSERT_EQ(0, ms__conn_queued(c));
    ASSERT(c->pend == o && o->nvecs == 0); /* kept, with its buffers, for the next reply */
    ASSERT(c->flight == NULL);
    ms__conn_idle(c); /* an idle connection gives it back */
    ASSERT(c->pend == NULL);
    ms__conn_close(c, 0);
    ASSERT_EQ(1, t.closed);
    ASSERT_EQ(0, (int)srv->stats->conns);
    trickle_free(&t);
    teardown();
}

TEST(conn_a_write_taken_in_part_goes_on_from_the_exact_byte)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    setup(&lim);
    /* Every split point across three pieces: the socket takes `room` bytes, then the rest
     * goes as a pending write that starts where the taken part ended. */
    static const char a[] = "0123456789", b[] = "abcdefghij";
    for (size_t room = 1; room < 26; room++) {
        trickle_t t;
        ms_conn_t *c = trickle_open(&t, room);
        ms_out_t *o = ms__conn_out(c);
        ms__out_text(srv, o, "HEAD:", 5);
        ms__out_vec(srv, o, a, 10, MS_VEC_STATIC, -1);
        ms__out_vec(srv, o, b, 10, MS_VEC_STATIC, -1);
        ms__out_text(srv, o, ".", 1);
        ms__conn_flush(c);
        ASSERT_EQ(room, t.out.len);
        ASSERT_EQ(1, t.writes);
        ASSERT(c->flags & MS_CONN_WRITING);
        ASSERT(c->flight == o && c->pend == NULL);
        ASSERT_EQ(MS_PHASE_SEND, c->phase); /* the send deadline runs while it waits */
        ASSERT_EQ(26 - room, ms__conn_queued(c));
        /* A reply made meanwhile waits in a new queue, behind the one under way. */
        ms__out_text(srv, ms__conn_out(c), "NEXT", 4);
        ASSERT(c->pend != o);
        ms__conn_flush(c); /* a write is under way: nothing more now */
        ASSERT_EQ(1, t.writes);
        t.room = 1 << 20;
        tr_complete(c, 0); /* done: the accept stage's write flushes what waited */
        if (strcmp(text(&t.out), "HEAD:0123456789abcdefghij.NEXT") != 0)
            TEST_FAIL("room %zu: the peer got %s", room, t.out.base);
        ASSERT_EQ(0, ms__conn_queued(c));
        ASSERT(c->flight == NULL);
        ASSERT(c->phase != MS_PHASE_SEND);
        ms__conn_close(c, 0);
        trickle_free(&t);
    }
    ASSERT_EQ(0, (int)srv->stats->conns);
    teardown();
}

TEST(conn_a_failed_write_closes_and_drops_the_queue)
{
    setup(NULL);
    trickle_t t;
    ms_conn_t *c = trickle_open(&t, 2);
    ms__out_text(srv, ms__conn_out(c), "abcdef", 6);
    ms__conn_flush(c);
    ASSERT_EQ(1, t.writes);
    tr_complete(c, UV_EPIPE);
    ASSERT_EQ(1, t.closed);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ASSERT_STR_EQ("ab", text(&t.out));
    trickle_free(&t);
    teardown();
}

TEST(conn_lives_until_its_last_reference_is_let_go)
{
    setup(NULL);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    ASSERT_EQ(1, c->refs);
    ms__conn_hold(c); /* a handler holds its request */
    ms__conn_close(c, 0);
    ASSERT_EQ(2, m.closed);
    ASSERT(c->flags & MS_CONN_CLOSED);
    ASSERT_EQ(1, (int)srv->stats->conns); /* still there for the handler */
    ms__conn_close(c, 1);                 /* closed already: nothing */
    ASSERT_EQ(2, m.closed);
    /* Replies to a closed connection are dropped, and their anchors let go. */
    int32_t anchor = ms_anchor_get(srv);
    ms__out_vec(srv, ms__conn_out(c), "lua", 3, MS_VEC_LUA, anchor);
    ms__conn_flush(c);
    ASSERT_EQ(0, m.out.len);
    int32_t slots[4];
    ASSERT_EQ(1, ms_anchor_drain(srv, slots, 4));
    ASSERT_EQ(anchor, slots[0]);
    ms__conn_release(c);
    ASSERT_EQ(0, (int)srv->stats->conns);
    ASSERT_EQ(1, (int)srv->stats->closed);
    ms_memio_free(&m);
    teardown();
}

TEST(conn_anchors_come_back_once_their_strings_are_written)
{
    setup(NULL);
    ms_memio_t m;
    ms_conn_t *c = ms_memio_open(srv, &m);
    int32_t a = ms_anchor_get(srv), b = ms_anchor_get(srv);
    ASSERT(a != b);
    m.congested = 1;
    ms_out_t *o = ms__conn_out(c);
    ms__out_vec(srv, o, "first ", 6, MS_VEC_LUA, a);
    ms__out_hold(srv, o, b); /* held to here, though it adds no bytes */
    ms__out_text(srv, o, "second", 6);
    ASSERT_EQ(12, ms__conn_queued(c));
    ms__conn_flush(c);
    int32_t slots[4];
    ASSERT_EQ(0, ms_anchor_drain(srv, slots, 4)); /* not written yet: still held */
    m.congested = 0;
    ms_memio_drain(&m);
    ASSERT_STR_EQ("first second", text(&m.out));
    ASSERT_EQ(2, ms_anchor_drain(srv, slots, 4));
    ASSERT((slots[0] == a && slots[1] == b) || (slots[0] == b && slots[1] == a));
    /* Drained slots are handed out again before new ones. */
    int32_t again = ms_anchor_get(srv);
    ASSERT(again == a || again == b);
    ms_memio_peer_close(&m, UV_EOF);
    ms_memio_free(&m);
    teardown();
}

TEST(conn_deadlines_close_an_idle_connection_and_time_out_a_head)
{
    ms_limits_t lim;
    ms_limits_default(&lim);
    lim.head_timeout_ms = 10;
    setup(&lim);
    ms_memio_t idle, head;
    ms_conn_t *ci = ms_memio_open(srv, &idle);
    ms_memio_open(srv, &head);
    ASSERT_EQ(MS_PHASE_HEAD, ci->phase);
    ms__conn_arm(ci, MS_PHASE_IDLE, 5);
    ms_memio_feed(&head, "GE", 2); /* a head that never ends */
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(2, idle.closed);
    ASSERT(head.conn == NULL);
    ASSERT_EQ(1, (int)srv->stats->timeouts); /* the head's; idleness is no timeout */
    ASSERT_EQ(0, (int)srv->stats->conns);
    ms_memio_free(&idle);
    ms_memio_free(&head);
    teardown();
}

TEST_MAIN()
