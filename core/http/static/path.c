/* path.c: request paths under a static mount: decoded and checked once, then opened beneath the
 * mount's directory without ever leaving it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_PATH */
#endif
#include "http/static/path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#define MS_HAVE_OPENAT2_H 1
#endif
#endif

#ifndef MS_HAVE_OPENAT2_H
/* The kernel's ABI (linux/openat2.h, Linux 5.6), for headers older than it. */
struct open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_BENEATH       0x08
#endif

#ifndef SYS_openat2
/* One number on every architecture since the tables were unified, except alpha. */
#if defined(__alpha__)
#define SYS_openat2 547
#else
#define SYS_openat2 437
#endif
#endif

/* How a file is opened for serving: O_NONBLOCK so that a fifo that slipped in cannot hang the
 * worker in open(), O_NOCTTY so that a terminal never becomes ours. */
#define MS_PATH_OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)

/* openat2 answers EAGAIN when a rename or mount racing the lookup keeps it from proving that a
 * ".." stayed beneath the root. Retrying is what the kernel asks for, a few times at most, so
 * that someone renaming in a loop cannot keep a worker here. */
#define MS_PATH_OPEN_RETRIES 4

int ms__path_no_openat2;

/* -- Cleaning ---------------------------------------------------------------------------- */

static int hex_value(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch |= 0x20;
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

#define REFUSE(code, reason)                                                                       \
    do {                                                                                           \
        if (why != NULL)                                                                           \
            *why = (reason);                                                                       \
        return (code);                                                                             \
    } while (0)

int ms_path_clean(const char *in, size_t len, char *out, size_t cap, int allow_dotfiles,
                  const char **why)
{
    if (why != NULL)
        *why = NULL;
    if (cap == 0)
        REFUSE(MS_ETOOBIG, "path too long");
    size_t limit = cap - 1 < MS_PATH_MAX ? cap - 1 : MS_PATH_MAX;
    size_t o = 0, i = 0;
    while (i < len) {
        /* Each segment is decoded aside first: whether it is kept ("." and "" are not) is
         * known only at its end, and a dropped one must not count against the room in `out`. */
        char seg[MS_PATH_SEGMENT_MAX];
        size_t n = 0;
        for (; i < len && in[i] != '/'; i++) {
            unsigned char ch = (unsigned char)in[i];
            if (ch == '%') {
                int hi = len - i > 2 ? hex_value((unsigned char)in[i + 1]) : -1;
                int lo = hi >= 0 ? hex_value((unsigned char)in[i + 2]) : -1;
                if (lo < 0)
                    REFUSE(MS_EBADREQ, "bad percent escape");
                ch = (unsigned char)(hi << 4 | lo);
                i += 2;
                /* Decoded once, a slash would split segments where no check has looked, and
                 * "..%2F" would become a way up. */
                if (ch == '/')
                    REFUSE(MS_EBADREQ, "encoded slash");
            }
            if (ch == 0)
                REFUSE(MS_EBADREQ, "NUL byte");
            /* A separator on other systems, so "..\" is a way up wherever the tree is copied. */
            if (ch == '\\')
                REFUSE(MS_EBADREQ, "backslash");
            if (ch < 0x20 || ch == 0x7f)
                REFUSE(MS_EBADREQ, "control byte");
            if (n == sizeof(seg))
                REFUSE(MS_ETOOBIG, "segment too long");
            seg[n++] = (char)ch;
        }
        i++; /* the '/' */
        if (n == 0 || (n == 1 && seg[0] == '.'))
            continue;
        /* Refused even where it would stay inside: a path that needs ".." has no business
         * here, and refusing it leaves nothing to get right about where the root is. */
        if (n == 2 && seg[0] == '.' && seg[1] == '.')
            REFUSE(MS_EBADREQ, "dot-dot segment");
        if (seg[0] == '.' && !allow_dotfiles)
            REFUSE(MS_EBADREQ, "hidden file");
        if (n + (o > 0) > limit - o)
            REFUSE(MS_ETOOBIG, "path too long");
        if (o > 0)
            out[o++] = '/';
        memcpy(out + o, seg, n);
        o += n;
    }
    out[o] = 0;
    return (int)o;
}

#undef REFUSE

/* -- Opening ----------------------------------------------------------------------------- */

/* Returns a descriptor or -errno; UV_ENOSYS when the kernel has no openat2. */
static int open_beneath(int root_fd, const char *rel)
{
    struct open_how how;
    memset(&how, 0, sizeof(how));
    how.flags = MS_PATH_OPEN_FLAGS;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    for (int tries = 0;; tries++) {
        long fd = syscall(SYS_openat2, root_fd, rel, &how, sizeof(how));
        if (fd >= 0)
            return (int)fd;
        if ((errno != EAGAIN && errno != EINTR) || tries == MS_PATH_OPEN_RETRIES)
            return -errno;
    }
}

/* Without openat2, the path is walked one component at a time, each opened with O_NOFOLLOW
 * relative to the directory before it, so no component can be swapped for a symlink between a
 * check and its use. That cannot tell a symlink that stays inside from one that leaves, so it
 * follows none; nor does it take "..". Returns a descriptor or -errno. */
static int open_walk(int root_fd, const char *rel)
{
    if (rel[0] == '/')
        return UV_EXDEV;
    int dir = root_fd, rc;
    const char *p = rel;
    for (;;) {
        const char *end = strchrnul(p, '/'), *next = end;
        while (*next == '/')
            next++;
        size_t n = (size_t)(end - p);
        char name[NAME_MAX + 1];
        if (n > NAME_MAX) {
            rc = UV_ENAMETOOLONG;
            break;
        }
        memcpy(name, p, n);
        name[n] = 0;
        if (n == 0) /* "" is the root itself */
            strcpy(name, ".");
        if (n == 2 && name[0] == '.' && name[1] == '.') {
            rc = UV_EXDEV;
            break;
        }
        if (*next == 0) {
            rc = openat(dir, name, MS_PATH_OPEN_FLAGS | O_NOFOLLOW);
            if (rc < 0)
                rc = -errno;
            break;
        }
        int fd = openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            rc = -errno;
            /* O_PATH | O_NOFOLLOW takes the symlink itself, which is then "not a directory";
             * say what the kernel's own walk would: a symlink that may not be followed. */
            struct stat lst;
            if (rc == UV_ENOTDIR && fstatat(dir, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISLNK(lst.st_mode))
                rc = UV_ELOOP;
            break;
        }
        if (dir != root_fd)
            close(dir);
        dir = fd;
        p = next;
    }
    if (dir != root_fd)
        close(dir);
    return rc;
}

int ms_path_open(int root_fd, const char *rel, int *out_fd, struct stat *st)
{
    struct stat local;
    if (st == NULL)
        st = &local;
    *out_fd = -1;
    int fd = UV_ENOSYS;
    /* Relaxed is enough: the flag only ever goes from 0 to 1, and a worker that has not seen
     * it yet merely asks the kernel once more. */
    if (!__atomic_load_n(&ms__path_no_openat2, __ATOMIC_RELAXED)) {
        fd = open_beneath(root_fd, rel[0] ? rel : ".");
        if (fd == UV_ENOSYS)
            __atomic_store_n(&ms__path_no_openat2, 1, __ATOMIC_RELAXED);
    }
    if (fd == UV_ENOSYS)
        fd = open_walk(root_fd, rel);
    /* A socket, or a device without a driver, cannot be opened at all (ENXIO); like a fifo or
     * a device that can, it is not something we serve. */
    if (fd == UV_ENXIO)
        return UV_EACCES;
    if (fd < 0)
        return fd;
    /* FIXME: a device node beneath the root is opened before it is refused, and opening some
     * devices does something. Checking first would cost an O_PATH open and a second open. */
    if (fstat(fd, st) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    if (!S_ISREG(st->st_mode) && !S_ISDIR(st->st_mode)) {
        close(fd);
        return UV_EACCES;
    }
    *out_fd = fd;
    return 0;
}
