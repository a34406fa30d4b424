/* master_test.c: the master's own walk of the files the operator named: links followed only
 * where the workers' user could not have made them, no hard link or FIFO in their place. */
#define _GNU_SOURCE
#include "test.h"

#include "../../../core/process/master.c"

#include <arpa/inet.h>
#include <ftw.h>
#include <netinet/in.h>

/* A user that is not the one running the tests (root in CI, someone else elsewhere): the
 * workers', so that "may the workers' user write here" is asked of directories the tests
 * make with their own owner and mode bits. */
#define OTHER_UID 65534

static ms_master_opts_t opts;
static char root[64];

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(p);
}

/* A fresh temporary tree: `root`/open (0777: the workers' user may write),
 * `root`/closed (0755, ours: it may not), each with a file "log" holding "x". */
static int setup(int workers_uid)
{
    if (root[0] != '\0')
        nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    snprintf(root, sizeof(root), "/tmp/ms-master-test-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    chmod(root, 0755);
    char p[256];
    const char *dirs[] = {"open", "closed"};
    mode_t modes[] = {0777, 0755};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof(p), "%s/%s", root, dirs[i]);
        if (mkdir(p, 0700) < 0 || chmod(p, modes[i]) < 0)
            return -1;
        snprintf(p, sizeof(p), "%s/%s/log", root, dirs[i]);
        FILE *f = fopen(p, "w");
        if (f == NULL)
            return -1;
        fputs("x", f);
        fclose(f);
    }
    memset(&opts, 0, sizeof(opts));
    opts.uid = workers_uid;
    opts.gid = workers_uid;
    M.o = &opts;
    return 0;
}

/* walk() of `root`/`rel` with `flags`: the descriptor or -errno; `*why` the refusal. */
static int walk_rel(const char *rel, int flags, const char **why)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    int links = 0;
    *why = NULL;
    return walk(AT_FDCWD, p, flags, &links, why);
}

#define LOG_APPEND (O_WRONLY | O_APPEND | O_CREAT)

TEST(link_in_a_directory_the_workers_may_write_is_refused)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    char target[256], link[256];
    snprintf(target, sizeof(target), "%s/closed/log", root);
    snprintf(link, sizeof(link), "%s/open/evil", root);
    ASSERT_EQ(0, symlink(target, link));
    const char *why;
    int fd = walk_rel("open/evil", LOG_APPEND, &why);
    ASSERT_EQ(-ELOOP, fd);
    ASSERT_HAS(why, "a symbolic link in a directory the workers' user may write");
    fd = walk_rel("open/evil", O_RDONLY, &why);
    ASSERT_EQ(-ELOOP, fd);
    /* A directory link there too: the walk refuses it on the way. */
    snprintf(target, sizeof(target), "%s/closed", root);
    snprintf(link, sizeof(link), "%s/open/dir", root);
    ASSERT_EQ(0, symlink(target, link));
    fd = walk_rel("open/dir/log", O_RDONLY, &why);
    ASSERT_EQ(-ELOOP, fd);
}

/* The workers' user owns a directory it cannot write (0555): it may chmod it, so a link
 * there is refused as well. */
TEST(link_in_a_directory_the_workers_own_is_refused)
{
    ASSERT_EQ(0, setup((int)getuid()));
    char p[256], target[256];
    snprintf(p, sizeof(p), "%s/mine", root);
    ASSERT_EQ(0, mkdir(p, 0755));
    snprintf(target, sizeof(target), "%s/closed/log", root);
    snprintf(p, sizeof(p), "%s/mine/evil", root);
    ASSERT_EQ(0, symlink(target, p));
    snprintf(p, sizeof(p), "%s/mine", root);
    ASSERT_EQ(0, chmod(p, 0555));
    const char *why;
    int fd = walk_rel("mine/evil", O_RDONLY, &why);
    ASSERT_EQ(-ELOOP, fd);
    ASSERT_HAS(why, "may write");
}

TEST(link_in_a_read_only_directory_is_followed)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    char p[256], target[256];
    snprintf(target, sizeof(target), "%s/closed/log", root);
    snprintf(p, sizeof(p), "%s/closed/current", root);
    ASSERT_EQ(0, symlink(target, p));
    snprintf(p, sizeof(p), "%s/closed/rel", root);
    ASSERT_EQ(0, symlink("log", p)); /* relative: from the link's own directory */
    snprintf(p, sizeof(p), "%s/closed/here", root);
    ASSERT_EQ(0, symlink(".", p));
    const char *rels[] = {"closed/current", "closed/rel", "closed/here/log"};
    for (int i = 0; i < 3; i++) {
        const char *why;
        int fd = walk_rel(rels[i], O_RDONLY, &why);
        ASSERT(fd >= 0);
        char c = 0;
        ASSERT_EQ(1, read(fd, &c, 1));
        ASSERT_EQ('x', c);
        close(fd);
    }
    const char *why;
    int fd = walk_rel("closed/current", LOG_APPEND, &why);
    ASSERT(fd >= 0);
    close(fd);
}

TEST(hard_link_in_a_directory_the_workers_may_write_is_refused)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    char from[256], to[256];
    snprintf(from, sizeof(from), "%s/closed/log", root);
    snprintf(to, sizeof(to), "%s/open/other", root);
    ASSERT_EQ(0, link(from, to));
    const char *why;
    int fd = walk_rel("open/other", LOG_APPEND, &why);
    ASSERT_EQ(-EPERM, fd);
    ASSERT_HAS(why, "hard links");
    /* Where the workers may not write, a second name is the operator's own doing. */
    fd = walk_rel("closed/log", LOG_APPEND, &why);
    ASSERT(fd >= 0);
    close(fd);
    /* A file with one name in the open directory is the log itself. */
    fd = walk_rel("open/log", LOG_APPEND, &why);
    ASSERT(fd >= 0);
    close(fd);
}

/* A FIFO in a log's place, with a reader that never reads (a worker's): refused, opened
 * without waiting, wherever it is. */
/* A FIFO is a log only where the workers' user cannot have put it (an operator's pipe to a
 * log reader); a TLS file never. */
TEST(fifo_is_a_log_only_where_the_workers_may_not_write)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    const char *where[] = {"open/fifo", "closed/fifo"};
    for (int i = 0; i < 2; i++) {
        char p[256];
        snprintf(p, sizeof(p), "%s/%s", root, where[i]);
        ASSERT_EQ(0, mkfifo(p, 0666));
        int reader = open(p, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ASSERT(reader >= 0);
        const char *why;
        int fd = walk_rel(where[i], LOG_APPEND, &why);
        if (fd >= 0)
            close(fd);
        if (i == 0) {
            ASSERT_EQ(-EINVAL, fd);
            ASSERT_HAS(why, "not a regular file");
        } else {
            ASSERT(fd >= 0);
        }
        fd = walk_rel(where[i], O_RDONLY, &why);
        if (fd >= 0)
            close(fd);
        ASSERT_EQ(-EINVAL, fd);
        close(reader);
    }
}

/* What operators name for a log that is not a file: /dev/null, a terminal. A character
 * device in a directory the workers' user may not write is a log; a TLS file never. */
TEST(character_device_is_a_log_where_the_workers_may_not_write)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    int links = 0;
    const char *why = NULL;
    int fd = walk(AT_FDCWD, "/dev/null", LOG_APPEND, &links, &why);
    ASSERT(fd >= 0);
    ASSERT_EQ(3, write(fd, "abc", 3));
    /* Blocking again: a log write is whole. */
    ASSERT_EQ(0, fcntl(fd, F_GETFL) & O_NONBLOCK);
    close(fd);
    fd = walk(AT_FDCWD, "/dev/null", O_RDONLY, &links, &why);
    if (fd >= 0)
        close(fd);
    ASSERT_EQ(-EINVAL, fd);
    /* The same device where the workers may write (/dev is root's: workers that ran as
     * root could change it): refused. */
    opts.uid = 0;
    fd = walk(AT_FDCWD, "/dev/null", LOG_APPEND, &links, &why);
    if (fd >= 0)
        close(fd);
    ASSERT_EQ(-EINVAL, fd);
}

/* A link whose directory cannot be checked is refused, not followed. */
TEST(link_with_an_unknown_directory_is_refused)
{
    ASSERT_EQ(0, setup(OTHER_UID));
    char target[256], p[256];
    snprintf(target, sizeof(target), "%s/closed/log", root);
    snprintf(p, sizeof(p), "%s/closed/current", root);
    ASSERT_EQ(0, symlink(target, p));
    int lfd = open(p, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    ASSERT(lfd >= 0);
    int links = 0;
    const char *why = NULL;
    int fd = follow(-1, lfd, O_RDONLY, &links, &why); /* (closes lfd) */
    if (fd >= 0)
        close(fd);
    ASSERT(fd < 0);
    ASSERT(why != NULL);
}

/* The configuration a worker asks for: the bytes given, in a memfd no process may write, the
 * same descriptor for every ask, and a new one once the master replaces it (a reload). */
TEST(config_is_a_sealed_copy_replaced_on_reload)
{
    char why[128] = "";
    M.config_fd = -1;
    ASSERT(ask_config(why, sizeof(why)) < 0);
    ASSERT_STR_EQ("the master has no configuration to hand over", why);
    ASSERT_EQ(0, ms_master_config("first", 5));
    int fd = ask_config(why, sizeof(why));
    ASSERT(fd >= 0);
    ASSERT_EQ(fd, ask_config(why, sizeof(why)));
    char buf[16] = "";
    ASSERT_EQ(5, (int)pread(fd, buf, sizeof(buf), 0));
    ASSERT(memcmp(buf, "first", 5) == 0);
    ASSERT(pwrite(fd, "X", 1, 0) < 0); /* sealed: F_SEAL_WRITE */
    ASSERT(ftruncate(fd, 0) < 0);      /* F_SEAL_SHRINK */
    int seals = fcntl(fd, F_GET_SEALS);
    ASSERT(seals & F_SEAL_SEAL);
    int kept = dup(fd); /* a worker that has it keeps it */
    ASSERT_EQ(0, ms_master_config("second!", 7));
    int fd2 = ask_config(why, sizeof(why));
    ASSERT(fd2 >= 0);
    ASSERT_EQ(7, (int)pread(fd2, buf, sizeof(buf), 0));
    ASSERT(memcmp(buf, "second!", 7) == 0);
    ASSERT_EQ(5, (int)pread(kept, buf, sizeof(buf), 0));
    ASSERT(memcmp(buf, "first", 5) == 0);
    close(kept);
    close(M.config_fd);
    M.config_fd = -1;
}

/* A master that cannot listen for the agent-check fails its start without keeping the
 * sockets it bound for the workers. */
TEST(run_closes_the_bound_sockets_when_the_agent_cannot_listen)
{
    int busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    ASSERT_EQ(0, bind(busy, (struct sockaddr *)&a, sizeof(a)));
    ASSERT_EQ(0, listen(busy, 1));
    ASSERT_EQ(0, getsockname(busy, (struct sockaddr *)&a, &al));
    char agent[64];
    snprintf(agent, sizeof(agent), "127.0.0.1:%d", ntohs(a.sin_port));
    static char *argv[] = {"/bin/false", NULL};
    const char *listen_on[] = {"127.0.0.1:0"};
    int ports[1] = {0};
    ms_master_opts_t o;
    memset(&o, 0, sizeof(o));
    o.argv = argv;
    o.listen = listen_on;
    o.ports = ports;
    o.nlisten = 1;
    o.workers = 2;
    o.backlog = 16;
    o.uid = o.gid = -1;
    o.agent_check = agent;
    ms_log_set(NULL, MS_LOG_ERR); /* (its one line: cannot listen) */
    ASSERT(ms_master_run(&o) < 0);
    ASSERT(ports[0] > 0);
    /* Its port is free again: no socket of the master's listens on it any more. */
    int again = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = htons((uint16_t)ports[0]);
    ASSERT_EQ(0, bind(again, (struct sockaddr *)&a, sizeof(a)));
    close(again);
    close(busy);
}

int main(int argc, char **argv)
{
    int rc = test_main(argc, argv);
    if (root[0] != '\0')
        nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
