/* path.h: request paths under a static mount, cleaned once and opened beneath its directory. */
#ifndef MS_PATH_H
#define MS_PATH_H

#include <stddef.h>
#include <sys/stat.h>

#include "moonserve.h"

/* The longest cleaned path, and the longest segment (NAME_MAX on Linux), in bytes. */
#define MS_PATH_MAX         4096
#define MS_PATH_SEGMENT_MAX 255

/**
 * Turns the URL path below a mount prefix (`len` raw bytes, percent-encoded, no query; with or
 * without a leading '/') into the relative file path it names: percent-decoded once, without a
 * leading or trailing '/', with empty and "." segments dropped. Writes it NUL-terminated into
 * `out` and returns its length (0 for the mount root itself), or a negative code with `why`
 * pointing at a static reason (unless `why` is NULL):
 *  - MS_EBADREQ "NUL byte": %00 or a raw NUL;
 *  - MS_EBADREQ "encoded slash": %2F, which would change where segments split;
 *  - MS_EBADREQ "backslash": '\' raw or as %5C;
 *  - MS_EBADREQ "control byte": a decoded byte below 0x20, or 0x7F;
 *  - MS_EBADREQ "bad percent escape": '%' not followed by two hex digits;
 *  - MS_EBADREQ "dot-dot segment": ".." (raw or encoded) anywhere, even where it would stay
 *    inside the mount;
 *  - MS_EBADREQ "hidden file": a segment starting with '.' (".env", ".git"), unless
 *    `allow_dotfiles`; callers answer 404 for it, so a dotfile's existence does not show;
 *  - MS_ETOOBIG "segment too long": a decoded segment over MS_PATH_SEGMENT_MAX bytes;
 *  - MS_ETOOBIG "path too long": a result over `cap` - 1 or MS_PATH_MAX bytes.
 * The first problem from the left is the one reported. Bytes from 0x80 up pass as they are:
 * file names are bytes, and no UTF-8 form of '.' or '/' is special to Linux. Touches no file
 * system and allocates nothing; on an error, `out` holds nothing useful.
 */
int ms_path_clean(const char *in, size_t len, char *out, size_t cap, int allow_dotfiles,
                  const char **why);

/**
 * Opens `rel` (as made by ms_path_clean(); "" is the directory itself) beneath the directory
 * `root_fd`, read-only, with O_CLOEXEC | O_NOCTTY | O_NONBLOCK, and fstat()s it into `st`
 * (which may be NULL). Symlinks are followed only while they stay beneath `root_fd`; magic
 * links (/proc/self/fd/N and kin) never are. On success returns 0 with the new descriptor in
 * *out_fd, a regular file or a directory (the caller decides about directories, e.g. an
 * index.html). Otherwise returns a negative code with *out_fd = -1: UV_ENOENT, UV_ENOTDIR,
 * UV_EACCES (also for a fifo, socket or device: only regular files and directories are
 * served), UV_EXDEV or UV_ELOOP for a way out of the root (an absolute or ".." symlink that
 * escapes, an absolute `rel`), or whatever else the kernel said, as -errno.
 *
 * It uses openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS. On kernels without it
 * (before 5.6, or a sandbox that hides it: ENOSYS) it walks `rel` one component at a time
 * instead, and that walk is stricter: no symlink is followed at all (UV_ELOOP), and no ".."
 * is taken (UV_EXDEV). It is a blocking system call: a worker that must not wait on a slow
 * disk calls it from the thread pool.
 */
int ms_path_open(int root_fd, const char *rel, int *out_fd, struct stat *st);

/* Set once openat2(2) answered ENOSYS, so later opens go straight to the walk. Tests set it
 * to force the walk. */
extern int ms__path_no_openat2;

#endif
