/* mime.h: the content-type table that static files are served with. */
#ifndef MS_MIME_H
#define MS_MIME_H

#include "moonserve.h"

/* An extension -> Content-Type table. Built once at setup, then only read, so workers may
 * share one. */
typedef struct ms_mime_s ms_mime_t;

/* Files larger than this are not read as a mime.types file (a real one is tens of KiB). */
#define MS_MIME_FILE_MAX (4 * 1024 * 1024)
/* Extensions longer than this are never in the table, so lookups compare fixed-size keys. */
#define MS_MIME_EXT_MAX 15

/**
 * Reads a mime.types file ("type/subtype ext1 ext2" per line, '#' starts a comment, as in
 * /etc/mime.types) into a new table. An extension keeps the first type that names it, in file
 * order. Built-in types for the common web formats then fill in the extensions the file lacks;
 * the file wins for those it has. With `path` NULL, or a file that is missing, unreadable, not
 * a regular file or larger than MS_MIME_FILE_MAX, the table holds the built-in types alone.
 * Lines whose type is not a token "/" token are skipped, and so are extensions longer than
 * MS_MIME_EXT_MAX or holding a '.' or '/'. Never returns NULL; free with ms_mime_free().
 */
ms_mime_t *ms_mime_load(const char *path);
void ms_mime_free(ms_mime_t *m);

/**
 * The Content-Type value for the file name that ends `path` (`len` bytes, no query string):
 * the type of the extension after the name's last '.', matched ignoring case, with
 * "; charset=utf-8" after text types and after application/javascript, application/json,
 * application/xml and image/svg+xml. A name without an extension, a dotfile (".bashrc") or an
 * unknown extension gives "application/octet-stream". Only the last segment counts: "/a.b/c"
 * has no extension, "archive.tar.gz" has "gz". The result is NUL-terminated, lives as long as
 * `m`, and its length goes to *out_len unless that is NULL. Allocates nothing; O(1).
 */
const char *ms_mime_type(const ms_mime_t *m, const char *path, size_t len, size_t *out_len);

/**
 * Whether a reply of this Content-Type is worth compressing: text types, JSON, JavaScript, XML
 * (any +json or +xml type, so SVG too), WebAssembly and the uncompressed font formats (ttf,
 * otf). Images, audio, video, archives and anything unknown are not. Parameters after ';' are
 * ignored, and so is case.
 */
int ms_mime_compressible(const char *type, size_t len);

#endif
