/* ws.h: WebSocket (RFC 6455): a frame parser fed bytes, the server's frame builder, and a
 * WebSocket on a request's tunnel (HTTP/1.1 after 101, HTTP/2 extended CONNECT). */
#ifndef MS_WS_H
#define MS_WS_H

#include "moonserve.h"

enum {
    MS_WS_CONT = 0x0,
    MS_WS_TEXT = 0x1,
    MS_WS_BINARY = 0x2,
    MS_WS_CLOSE = 0x8,
    MS_WS_PING = 0x9,
    MS_WS_PONG = 0xA
};

/* Close codes the server sends itself (RFC 6455 7.4.1). */
enum {
    MS_WS_NORMAL = 1000,
    MS_WS_GOING_AWAY = 1001,
    MS_WS_PROTOCOL = 1002,
    MS_WS_NO_STATUS = 1005, /* never sent: what a close without a code reports */
    MS_WS_ABNORMAL = 1006,  /* never sent: the connection went without a close */
    MS_WS_BAD_DATA = 1007,
    MS_WS_POLICY = 1008,
    MS_WS_TOO_BIG = 1009,
    MS_WS_INTERNAL = 1011
};

/* The longest frame head: 2 bytes, 8 of length, 4 of mask. */
#define MS_WS_HEAD_MAX 14
/* A control frame's payload (RFC 6455 5.5). */
#define MS_WS_CONTROL_MAX 125

typedef struct ms_ws_parser_s ms_ws_parser_t;
/* The zlib streams of a socket with context takeover, one allocation for both ways. */
typedef struct ms_ws_zctx_s ms_ws_zctx_t;

/* What the parser hands on. `p` is valid only during the call. */
typedef struct ms_ws_parser_ops_s {
    /* A whole message (MS_WS_TEXT, MS_WS_BINARY: reassembled, unmasked, text valid UTF-8)
     * or a control frame (MS_WS_PING, MS_WS_PONG, MS_WS_CLOSE: `code` and the reason). */
    void (*message)(ms_ws_parser_t *p, int op, const char *data, size_t n, int code);
    /* Bytes for the peer that the parser answers itself: a pong, the close that answers a
     * close, the close of a protocol error. Copied by the callee. */
    void (*send)(ms_ws_parser_t *p, const char *data, size_t n);
    /* The owner's clock in milliseconds (wrapping), asked at a control frame only, for the
     * cap on control frames a second. NULL: the clock stands still (one window). */
    uint32_t (*now)(ms_ws_parser_t *p);
} ms_ws_parser_ops_t;

/* UTF-8 checked a byte at a time: how many continuation bytes are owed, and the range the
 * next one must fall in (which rules out overlong forms, surrogates and code points past
 * U+10FFFF). */
typedef struct ms_ws_utf8_s {
    uint8_t need, lo, hi;
} ms_ws_utf8_t;

struct ms_ws_parser_s {
    const ms_ws_parser_ops_t *ops;
    void *data;           /* the owner's */
    uint64_t max_message; /* bytes of one reassembled message: over it is 1009 */
    uint64_t max_frame;   /* bytes of one frame's payload: over it is 1009 */
    /* A compressed message's frames are held to what deflate may make of these two at
     * worst (ms_ws_deflated_cap); the message inflated, to max_message. */
    /* the frame being read */
    uint8_t head[MS_WS_HEAD_MAX];
    /* Frames of one message, and control frames a second: past either is 1008; 0: no cap.
     * (These and the counts below are 16 bits, and sit in what were alignment holes, so that
     * an open socket stays in its allocation size class.) */
    uint16_t max_fragments, max_control;
    uint8_t hlen, hneed; /* head bytes had, and needed */
    uint8_t op, fin;
    uint8_t in_payload;
    uint64_t flen, fgot;
    /* the message being reassembled */
    uint8_t msg_op; /* MS_WS_TEXT or MS_WS_BINARY while one is open, else 0 */
    ms_ws_utf8_t utf8;
    uint16_t frags; /* frames of the message being reassembled */
    uint16_t ctl_n; /* control frames since ctl_since */
    ms_buf_t msg; /* owned while a message is on its way; given back once it is handed on */
    uint8_t *ctl; /* a control frame's payload while it comes in pieces; NULL between them */
    /* permessage-deflate (RFC 7692) */
    uint8_t deflate;        /* agreed: RSV1 marks a compressed message */
    uint8_t msg_compressed; /* the message being reassembled is */
    uint8_t inflate_bits;   /* the peer keeps its context (takeover): our window, 9..15; 0: it
                             * does not, and each message is inflated on its own */
    uint8_t deflate_keep;   /* the socket keeps its own context for what it sends, with this
                             * zlib memLevel (1..9); 0: it does not. (Its owner's, here so
                             * that one pointer holds both ways.) */
    uint32_t ctl_since;     /* the owner's clock (ms) when ctl_n began counting */
    ms_buf_t zout;          /* owned: the message being inflated; given back with it */
    ms_ws_zctx_t *z;        /* owned, with takeover either way: the streams kept, each made at
                             * the first message that needs it, until the socket goes */
    /* the close handshake */
    uint8_t close_sent, close_received;
    uint8_t done;    /* a close came or a protocol error happened: nothing more is read */
    int fail_code;   /* the close code of a protocol error, else 0 */
    const char *why; /* a protocol error: what it was, for the log */
};

/* A parser for a server's side: client frames must be masked. */
void ms_ws_parser_init(ms_ws_parser_t *p, const ms_ws_parser_ops_t *ops, uint64_t max_message,
                       uint64_t max_frame);
/* The most bytes a compressed message (or frame) may take on the wire whose inflated form
 * is at most `n` bytes: deflate's worst-case expansion, with room for the empty blocks
 * a sender's flushes leave. */
uint64_t ms_ws_deflated_cap(uint64_t n);
/* Frees what the parser holds. */
void ms_ws_parser_free(ms_ws_parser_t *p);
/* Feeds bytes from the peer. Returns 0, or MS_EBADREQ for a protocol error: the close with
 * p->fail_code went to ops->send, p->why says what it was, and nothing more is read. */
int ms_ws_parse(ms_ws_parser_t *p, const char *in, size_t n);

/* Whether `code` may stand in a close frame from the peer (1000-1003, 1007-1011, 3000-4999). */
int ms_ws_close_code_ok(int code);
/* Whether `p` is whole, valid UTF-8. */
int ms_ws_utf8_ok(const char *p, size_t n);
/* Checks n more bytes of a text that may end inside a code point. Returns 0 or -1. */
int ms_ws_utf8_step(ms_ws_utf8_t *u, const uint8_t *p, size_t n);

/* Compresses `len` bytes as one permessage-deflate message (LZ77 window of 2^bits bytes,
 * 9..15) without its trailing 00 00 ff ff: on its own (no context takeover), or, with
 * `p->deflate_keep`, with the context p keeps from the messages sent before. Returns a
 * pointer to the bytes, valid until the next call, and their count in *out_len; NULL if zlib
 * failed (the message may go uncompressed). */
const char *ms_ws_deflate(ms_ws_parser_t *p, const char *data, size_t len, int bits,
                          size_t *out_len);

/* Writes the head of an unmasked (server) frame of `len` bytes. Returns its length (2..10). */
size_t ms_ws_frame_head(uint8_t *out, int op, int fin, uint64_t len);
/* Writes a close frame with `code` (0: none) and up to 123 bytes of `reason` (cut at a code
 * point). Returns its length. `out` holds 2 + MS_WS_CONTROL_MAX bytes. */
size_t ms_ws_close_frame(uint8_t *out, int code, const char *reason, size_t rlen);

/* Sec-WebSocket-Accept for a Sec-WebSocket-Key: writes 28 characters and a NUL to `out` and
 * returns 28, or MS_EBADREQ for a key that is not 16 bytes in base64. */
int ms_ws_accept_key(const char *key, size_t len, char *out);

/* -- A WebSocket on a request's tunnel -------------------------------------------------- */

typedef struct ms_ws_s ms_ws_t;

typedef struct ms_ws_opts_s {
    uint64_t max_message;     /* bytes of a message from the peer */
    uint64_t max_frame;       /* bytes of a frame's payload from the peer */
    uint64_t send_queue;      /* bytes queued to the peer: past it the socket closes (1008) */
    uint32_t ping_ms;         /* a ping after this long without a frame from the peer; 0 none */
    uint32_t pong_ms;         /* no frame this long after the ping: closed (1011) */
    uint32_t idle_ms;         /* no message this long: closed (1001); 0 none */
    uint32_t close_ms;        /* how long the peer has to answer our close */
    uint8_t deflate_bits;     /* permessage-deflate agreed, with our window bits; 0: not */
    uint8_t deflate_keep;     /* our deflate context is kept across messages (we did not agree
                               * to server_no_context_takeover), with this zlib memLevel
                               * (1..9); 0: each message is deflated on its own */
    uint8_t inflate_bits;     /* the client keeps its context: our inflater's window (9..15),
                               * kept across messages; 0: each message inflated on its own */
    uint8_t deliver_control;  /* pings and pongs go to the receiver too */
} ms_ws_opts_t;

/* What ms_ws_receive returns besides a negative code. */
enum {
    MS_WS_GOT = 1,     /* a message: *op, *data, *len (and *code for a close) */
    MS_WS_PENDING = 0, /* nothing yet: park on ms_ws_wait's slot */
};

/* Takes `r` over as a WebSocket: the 101 (or HTTP/2's 200) goes now with the fields set
 * so far. The request stops counting against `in_flight` and counts against `websockets`
 * instead. Returns the socket, or NULL with *err: MS_EBUSY over `websockets`, or what
 * ms_req_tunnel returned. The socket is the caller's until ms_ws_free(). */
ms_ws_t *ms_ws_accept(ms_req_t *r, const ms_ws_opts_t *o, int *err);
/* 1 when the socket outlives its request (HTTP/1.1): once the request's handler finishes it
 * (ms_req_finish), the socket keeps the connection and the request is gone; 0 (HTTP/2) when
 * the request must stay unfinished until ms_ws_free(). */
int ms_ws_outlives(ms_ws_t *ws);
/* A slot its owner keeps with the socket (a socket with callbacks: where it is woken), so
 * that the owner's object for it needs no field of its own; -1 until set. */
void ms_ws_set_home(ms_ws_t *ws, int32_t slot);
int32_t ms_ws_home(ms_ws_t *ws);
/* The server the socket is on. */
ms_server_t *ms_ws_server(ms_ws_t *ws);
/* Frees the socket (a close 1000 goes first if no close did): for one that does not outlive
 * its request, before the request finishes; for one that does, at any time, and the
 * connection closes once what was queued has gone. */
void ms_ws_free(ms_ws_t *ws);
/* The next message, if one has come: its bytes stay valid until the next call. Returns
 * MS_WS_GOT, MS_WS_PENDING, or MS_ECLOSED when no more will come (the close was handed on
 * already, or the connection went). */
int ms_ws_receive(ms_ws_t *ws, int *op, const char **data, size_t *len, int *code);
/* Wakes `slot` of the server when something can be received (-1: nobody waits). */
void ms_ws_wait(ms_ws_t *ws, int32_t slot);
/* Sends a message (MS_WS_TEXT, MS_WS_BINARY) or a ping or pong; `owner` and `anchor` as for
 * ms_tunnel_write. Returns 0, MS_ECLOSED (closed, or closing), or MS_ETOOBIG when the send
 * queue is over its cap (the socket closes with 1008). */
int ms_ws_send(ms_ws_t *ws, int op, const char *p, size_t len, int owner, int32_t anchor);
/* Sends a whole frame built once for many sockets (a broadcast), referenced. As ms_ws_send. */
int ms_ws_send_frame(ms_ws_t *ws, const char *frame, size_t len, int owner, int32_t anchor);
/* Starts the close handshake with `code` and `reason`. Returns 0 or MS_ECLOSED. */
int ms_ws_close(ms_ws_t *ws, int code, const char *reason, size_t rlen);
/* 1 once a close was sent or received, or the connection went. */
int ms_ws_closed(ms_ws_t *ws);
/* Sends every open WebSocket of the server close 1001 (the server stops). */
void ms__ws_stop_all(ms_server_t *s);

#endif
