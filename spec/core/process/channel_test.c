/* channel_test.c: the master-to-worker channel: messages, descriptors beside them, what is
 * refused, and a worker's ask answered, refused and unanswered. */
#include "test.h"

#include "../../../core/process/channel.c"

#include <fcntl.h>
#include <sys/wait.h>

/* Puts one end of a fresh pair at the worker's descriptor, as the master does, and returns
 * the other end. */
static int as_worker(void)
{
    int p[2];
    /* (fd 3 taken first, so that neither end of the pair is made there) */
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || (null != MS_CHAN_WORKER_FD && dup2(null, MS_CHAN_WORKER_FD) < 0))
        return -1;
    if (null != MS_CHAN_WORKER_FD)
        close(null);
    if (ms_chan_pair(p) < 0 || dup2(p[1], MS_CHAN_WORKER_FD) < 0)
        return -1;
    close(p[1]);
    return p[0];
}

TEST(message_and_descriptor_cross_whole)
{
    int p[2];
    ASSERT_EQ(0, ms_chan_pair(p));
    int file = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT(file >= 0);
    ASSERT_EQ(0, ms_chan_send(p[0], MS_CHAN_OK, "abc", 3, file));
    ASSERT_EQ(0, ms_chan_send(p[0], MS_CHAN_READY, NULL, 0, -1));
    ms_chan_msg_t m;
    int fd;
    ASSERT_EQ(3, ms_chan_recv(p[1], &m, &fd));
    ASSERT_EQ(MS_CHAN_OK, m.type);
    ASSERT(memcmp(m.body, "abc", 3) == 0);
    ASSERT(fd >= 0 && fd != file);
    ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC); /* nothing leaks into what a worker spawns */
    close(fd);
    /* The second message is its own packet, never merged into the first. */
    ASSERT_EQ(0, ms_chan_recv(p[1], &m, &fd));
    ASSERT_EQ(MS_CHAN_READY, m.type);
    ASSERT_EQ(-1, fd);
    /* The peer's end closed: 0 and type 0. */
    close(p[0]);
    ASSERT_EQ(0, ms_chan_recv(p[1], &m, &fd));
    ASSERT_EQ(0, m.type);
    close(p[1]);
    close(file);
}

TEST(too_long_and_malformed_are_refused)
{
    int p[2];
    ASSERT_EQ(0, ms_chan_pair(p));
    static char big[MS_CHAN_MAX + 1];
    ASSERT_EQ(-EMSGSIZE, ms_chan_send(p[0], MS_CHAN_OPEN, big, sizeof(big), -1));
    /* A packet whose length field lies, and one shorter than a header. */
    uint32_t lie[3] = {MS_CHAN_OPEN, 100, 0};
    ASSERT_EQ((ssize_t)sizeof(lie), send(p[0], lie, sizeof(lie), 0));
    ASSERT_EQ(2, send(p[0], "xy", 2, 0));
    ms_chan_msg_t m;
    int fd;
    ASSERT_EQ(-EPROTO, ms_chan_recv(p[1], &m, &fd));
    ASSERT_EQ(-EPROTO, ms_chan_recv(p[1], &m, &fd));
    ASSERT_EQ(-1, fd);
    close(p[0]);
    close(p[1]);
}

/* A master in a child process that answers one ask as told. */
static pid_t master_answers(int chan, uint32_t type, const char *body)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    ms_chan_msg_t m;
    int fd;
    if (ms_chan_recv(chan, &m, &fd) < 0 || m.type != MS_CHAN_ZONE)
        _exit(1);
    int file = type == MS_CHAN_OK ? open("/dev/null", O_RDONLY) : -1;
    _exit(ms_chan_send(chan, type, body, body ? strlen(body) : 0, file) < 0 ? 2 : 0);
}

static int child_ok(pid_t pid)
{
    int status;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(ask_gets_the_answer_refusal_or_times_out)
{
    int master = as_worker();
    ASSERT(master >= 0);
    char why[256];
    int fd;
    pid_t pid = master_answers(master, MS_CHAN_OK, NULL);
    ASSERT_EQ(0, ms_chan_ask(MS_CHAN_ZONE, "z", 1, 5000, &fd, why, sizeof(why)));
    ASSERT(fd >= 0);
    close(fd);
    ASSERT(child_ok(pid));

    pid = master_answers(master, MS_CHAN_ERROR, "it has another size");
    ASSERT_EQ(-EINVAL, ms_chan_ask(MS_CHAN_ZONE, "z", 1, 5000, &fd, why, sizeof(why)));
    ASSERT_STR_EQ("it has another size", why);
    ASSERT_EQ(-1, fd);
    ASSERT(child_ok(pid));

    /* Nobody answers: the ask ends at its deadline, with a sentence. */
    ASSERT_EQ(-ETIMEDOUT, ms_chan_ask(MS_CHAN_ZONE, "z", 1, 50, &fd, why, sizeof(why)));
    ASSERT_STR_EQ("the master did not answer in 50 ms", why);
    /* The master's end gone: the ask fails at once. */
    ms_chan_msg_t m;
    ASSERT(ms_chan_recv(master, &m, &fd) > 0); /* (the unanswered ask) */
    close(master);
    ASSERT(ms_chan_ask(MS_CHAN_ZONE, "z", 1, 5000, &fd, why, sizeof(why)) < 0);
    close(MS_CHAN_WORKER_FD);
}

TEST_MAIN()
