/* channel.h: the channel between the master and each of its workers. ARCHITECTURE.md,
 * "The master and its workers", describes what goes over it. */
#ifndef MS_CHANNEL_H
#define MS_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

/* A worker's end of its channel: the master places it at this descriptor. */
#define MS_CHAN_WORKER_FD 3

/* The longest message body. A file or a zone goes as a descriptor beside the message, so
 * nothing large is ever copied through the channel. */
#define MS_CHAN_MAX 4096

/* What a message is. A worker asks (READY, ZONE, OPEN, TICKETS) and the master answers every
 * ask but FAILED and REPLACE with OK (and a descriptor) or ERROR (and a sentence). */
enum {
    MS_CHAN_READY = 1, /* the worker listens and its start hooks have returned; the OK says
                          serve (in a reload, once every new worker is ready) */
    MS_CHAN_ZONE,      /* a shared dictionary's zone: u64 size, then the name */
    MS_CHAN_OPEN,      /* a file opened by the master (a TLS key): the path */
    MS_CHAN_METRICS,   /* the metrics zone: u32 routes; the OK's body is the slot, in text */
    MS_CHAN_OK,        /* the answer: the descriptor beside it, if the ask wants one */
    MS_CHAN_ERROR,     /* the answer: why not, a sentence for the log */
    MS_CHAN_TICKETS,   /* the zone of the TLS session ticket keys (tickets.h) */
    MS_CHAN_APPEND,    /* a log file the master opened for appending: its path as named */
    MS_CHAN_FAILED,    /* the worker cannot start: why, a sentence; no answer */
    MS_CHAN_CONFIG,    /* the configuration the master read (its bytes in a sealed memfd) */
    MS_CHAN_REPLACE,   /* the worker asks to be replaced (its Lua heap stays past its cap):
                          why, a sentence; no answer */
};

/* One message: a header, then `len` bytes of body. One message is one packet of the
 * channel's SOCK_SEQPACKET socket pair, so it is never split nor merged with another. */
typedef struct ms_chan_msg_s {
    uint32_t type;
    uint32_t len;
    char body[MS_CHAN_MAX];
} ms_chan_msg_t;

/* Makes a channel: out[0] is the master's end, out[1] the worker's. Both are close-on-exec
 * (the master hands the worker's end on at MS_CHAN_WORKER_FD). Returns 0 or -errno. */
int ms_chan_pair(int out[2]);

/* Sends `type` with `len` bytes of `body` and, when `fd` >= 0, that descriptor beside it.
 * Returns 0 or -errno (-EAGAIN on a full non-blocking end). */
int ms_chan_send(int chan, uint32_t type, const void *body, size_t len, int fd);

/* Receives one message into `m` and the descriptor beside it into `*fd` (-1 when none).
 * Returns the body's length, 0 at the peer's end with `m->type` 0, or -errno; a malformed
 * message is -EPROTO. */
int ms_chan_recv(int chan, ms_chan_msg_t *m, int *fd);

/* A worker's ask: sends `type` and `body` on its channel and waits, at most `timeout_ms`,
 * for the master's answer. Returns 0 on an OK, with the descriptor beside it in `*fd` (-1
 * when none) and the OK's body, if any, in `why` as a string, or a negative code with the master's sentence in `why`: -EINVAL when the master
 * refuses, another code when the channel fails. */
int ms_chan_ask(uint32_t type, const void *body, size_t len, int timeout_ms, int *fd, char *why,
                size_t why_len);

/* Marks this process as a worker with a channel at MS_CHAN_WORKER_FD: ms_chan_open may then
 * ask the master. */
void ms_chan_worker(void);

/* Opens `path` for reading (append 0) or for appending, creating it (append 1), close-on-exec.
 * When this process may not (EACCES, EPERM: a worker that runs as another user than its
 * master) and it is a worker, the master opens it, if it is a file the operator named, and
 * hands the descriptor over. Returns the descriptor, or -errno with, when the master
 * refused, its sentence in `why` (otherwise `why` is ""). */
int ms_chan_open(const char *path, int append, char *why, size_t why_len);

#endif
