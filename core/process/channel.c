/* channel.c: messages between the master and a worker, over a SOCK_SEQPACKET socket pair:
 * one message a packet, a descriptor beside it when the message hands one over. */
#include "process/channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEAD_LEN offsetof(ms_chan_msg_t, body)

int ms_chan_pair(int out[2])
{
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, out) < 0)
        return -errno;
    return 0;
}

int ms_chan_send(int chan, uint32_t type, const void *body, size_t len, int fd)
{
    if (len > MS_CHAN_MAX)
        return -EMSGSIZE;
    struct {
        uint32_t type, len;
    } head = {type, (uint32_t)len};
    struct iovec iov[2] = {{&head, sizeof(head)}, {(void *)body, len}};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len > 0 ? 2 : 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.space;
        mh.msg_controllen = sizeof(ctl.space);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(chan, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : 0;
}

int ms_chan_recv(int chan, ms_chan_msg_t *m, int *fd)
{
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {m, sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space,
                        .msg_controllen = sizeof(ctl.space)};
    *fd = -1;
    ssize_t n;
    do
        n = recvmsg(chan, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len >= CMSG_LEN(sizeof(int)))
            memcpy(fd, CMSG_DATA(c), sizeof(int)); /* we send one at most: more is not ours */
    if (n == 0) {
        m->type = 0;
        return 0;
    }
    /* A packet shorter than its header says, or cut (MSG_TRUNC), is not one of ours. */
    if ((size_t)n < HEAD_LEN || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
        m->len != (size_t)n - HEAD_LEN) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return -EPROTO;
    }
    return (int)m->len;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ms_chan_ask(uint32_t type, const void *body, size_t len, int timeout_ms, int *fd, char *why,
                size_t why_len)
{
    *fd = -1;
    int rc = ms_chan_send(MS_CHAN_WORKER_FD, type, body, len, -1);
    if (rc < 0) {
        snprintf(why, why_len, "cannot ask the master: %s", strerror(-rc));
        return rc;
    }
    /* The master answers at once from its loop; the wait bounds a master that cannot. */
    int64_t deadline = now_ms() + timeout_ms;
    struct pollfd p = {.fd = MS_CHAN_WORKER_FD, .events = POLLIN};
    for (;;) {
        int left = (int)(deadline - now_ms());
        int n = left > 0 ? poll(&p, 1, left) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(why, why_len, "the master did not answer in %d ms", timeout_ms);
            return n < 0 ? -errno : -ETIMEDOUT;
        }
        break;
    }
    static ms_chan_msg_t m; /* a worker asks from its one thread, one ask at a time */
    int got;
    rc = ms_chan_recv(MS_CHAN_WORKER_FD, &m, &got);
    if (rc < 0 || m.type == 0) {
        snprintf(why, why_len, "no answer from the master: %s",
                 rc < 0 ? strerror(-rc) : "its end is closed");
        return rc < 0 ? rc : -EPIPE;
    }
    if (m.type == MS_CHAN_OK) {
        *fd = got;
        snprintf(why, why_len, "%.*s", (int)m.len, m.body);
        return 0;
    }
    if (got >= 0)
        close(got);
    if (m.type != MS_CHAN_ERROR) {
        snprintf(why, why_len, "the master answered with message %u", m.type);
        return -EPROTO;
    }
    snprintf(why, why_len, "%.*s", (int)m.len, m.body);
    return -EINVAL;
}

/* -- Files through the master ----------------------------------------------------------- */

static int is_worker;

void ms_chan_worker(void)
{
    is_worker = 1;
}

int ms_chan_open(const char *path, int append, char *why, size_t why_len)
{
    why[0] = '\0';
    /* (O_NONBLOCK: a FIFO named as a TLS file must not hang the worker; it is refused.) */
    int flags = append ? O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY
                       : O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    int fd = open(path, flags, 0644);
    struct stat st;
    if (fd >= 0 && !append && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        snprintf(why, why_len, "cannot open %.400s: not a regular file", path);
        return -EINVAL;
    }
    if (fd >= 0)
        return fd;
    int err = errno;
    size_t len = strlen(path);
    if (!is_worker || (err != EACCES && err != EPERM) || len > MS_CHAN_MAX)
        return -err;
    /* A worker that runs as another user than its master: the master opens the file, if the
     * operator named it, with its own rights. */
    int rc =
        ms_chan_ask(append ? MS_CHAN_APPEND : MS_CHAN_OPEN, path, len, 10000, &fd, why, why_len);
    if (rc < 0 || fd < 0)
        return rc < 0 ? rc : -EPROTO;
    return fd;
}
