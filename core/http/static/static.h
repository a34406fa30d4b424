/* static.h: static files served from the core: mounts, the file cache, and the reply rules
 * (conditional requests, ranges, encodings, index, listing, fallback, caching). */
#ifndef MS_STATIC_H
#define MS_STATIC_H

#include "moonserve.h"

/* What a mount does besides serving files. Fill with ms_static_opts_default() first. */
typedef struct ms_static_opts_s {
    const char *index;         /* a directory's page ("index.html": a name, no '/', at most
                                * 60 bytes); NULL: none */
    const char *cache_control; /* for names without a fingerprint (at most 256 bytes, no
                                * control bytes); NULL: no such field */
    const char *fields;        /* more field lines for every reply ("name: value\r\n"...) */
    const char *host;          /* serve only this Host (lowercase, no port); NULL: any */
    uint64_t memory_max;       /* files up to this size are kept in memory (64 KiB) */
    uint64_t compress_min;     /* compress on the fly from this size (1 KiB) ... */
    uint64_t compress_max;     /* ... up to this one (1 MiB); larger files go as they are */
    uint8_t listing;           /* list a directory without an index page (escaped HTML) */
    uint8_t spa;               /* an unknown path with no extension in its last segment gets the
                                * root's index page: for single-page applications */
    uint8_t dotfiles;          /* serve names that start with '.' */
    uint8_t immutable;         /* fingerprinted names ("app.3f9a1c.js") are cached for a year */
    uint8_t precompressed;     /* serve file.br and file.gz when the client takes them */
    uint8_t compress;          /* compress with brotli or gzip on the fly, caching the result */
    uint8_t live_reload;       /* add a script to HTML pages that reloads them on a change */
    uint8_t hooked;            /* the app runs a hook first: a request this mount wins (by
                                * the longest prefix) goes to Lua, never served before it */
} ms_static_opts_t;

void ms_static_opts_default(ms_static_opts_t *o);

/* Answers of ms_static_serve() besides 0. */
enum { MS_STATIC_MISS = 1 /* no file there: the caller answers (404, or its own route) */ };

/**
 * Serves the files of the directory `dir` under the path `prefix` ("/assets", or "/" for all)
 * of server `s`; `o` is copied. The directory is opened now, once: a new one behind the same
 * name is seen after a reload. Returns the mount's number (>= 0) or a negative code
 * (UV_EINVAL for a bad prefix or option, or what opening the directory said).
 */
int ms_static_mount(ms_server_t *s, const char *prefix, const char *dir, const ms_static_opts_t *o);

/* Caps the file cache: open files kept, and bytes of file contents held in memory. */
void ms_static_cache_limits(ms_server_t *s, uint32_t files, uint64_t bytes);

/**
 * Answers `r` from mount `id` with the file its path names below the prefix: 0 when it
 * answered (the reply is complete; the caller finishes the request), MS_STATIC_MISS when
 * there is no file to serve, or for a method other than GET and HEAD (nothing is sent).
 */
int ms_static_serve(ms_req_t *r, int id);

/**
 * Answers `r` with the file at `path` (`len` bytes; named by a handler, so trusted and not
 * confined to a mount) under the rules of a mount with the default options. With `typed`
 * the handler has set Content-Type itself. 0, or a negative code (UV_ENOENT, UV_EISDIR...)
 * with nothing sent.
 */
int ms_static_file(ms_req_t *r, const char *path, size_t len, int typed);

/* Counts changes seen under live_reload mounts (for the page reload event stream). */
uint64_t ms_static_generation(ms_server_t *s);

/* For the request path: serves `r` in the core if the mount with the longest prefix it is
 * under has no hook. Returns 0 when it answered, else MS_STATIC_MISS (also when a hooked
 * mount wins: Lua runs the hook, then ms_static_serve()). */
int ms__static_dispatch(ms_req_t *r);
void ms__static_free(ms_server_t *s);

#endif
