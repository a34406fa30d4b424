/* core/process/proctitle.c: the process title `ps` shows, by rewriting argv's memory in place.
 *
 * LuaJIT's main keeps argv to itself, so the area is found from /proc/self/stat: arg_start,
 * arg_end, env_start and env_end (proc(5), fields 48 to 51) give the command line's and the
 * environment's strings. The title is written over the command line, and, when the
 * environment's strings follow it directly (as the kernel lays them out at exec), over those
 * too, once they have been copied to the heap and `environ` pointed at the copies. Linux shows
 * a command line whose last byte is no longer NUL up to the first NUL, so a title longer than
 * argv still reads whole (fs/proc/base.c, get_mm_cmdline). */
#include "process/proctitle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

extern char **environ;

static char *area; /* the writable area: argv's strings, and environ's once moved */
static size_t area_len;

/* Reads fields 48 to 51 of /proc/self/stat. Returns 0, or a negative errno. */
static int read_areas(unsigned long v[4])
{
    char buf[2048];
    FILE *f = fopen("/proc/self/stat", "re");
    if (f == NULL)
        return -errno;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Field 2, comm, may hold spaces and parentheses: count from the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -EINVAL;
    p++;
    for (int field = 3; field < 48; field++) {
        p = strchr(p + 1, ' ');
        if (p == NULL)
            return -EINVAL;
    }
    for (int i = 0; i < 4; i++) {
        char *end;
        v[i] = strtoul(p + 1, &end, 10);
        if (end == p + 1)
            return -EINVAL;
        p = end;
    }
    return 0;
}

/* Finds the area once: argv's strings, plus environ's when they follow directly. */
static int find_area(void)
{
    unsigned long v[4];
    int rc = read_areas(v);
    if (rc < 0)
        return rc;
    unsigned long arg_start = v[0], arg_end = v[1], env_start = v[2], env_end = v[3];
    if (arg_end <= arg_start)
        return -EINVAL;
    area = (char *)arg_start;
    area_len = arg_end - arg_start;
    if (env_start != arg_end || env_end <= env_start)
        return 0;
    /* Every environ string inside the area moves to the heap first; the area then ends
     * where the last one did. A string outside it (a setenv since) stays where it is. */
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **moved = malloc((n + 1) * sizeof(char *));
    if (moved == NULL)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char *e = environ[i];
        if ((unsigned long)e >= env_start && (unsigned long)e < env_end) {
            moved[i] = strdup(e);
            if (moved[i] == NULL) {
                for (size_t j = 0; j < i; j++)
                    if (moved[j] != environ[j])
                        free(moved[j]);
                free(moved);
                return 0; /* argv's area alone */
            }
        } else {
            moved[i] = e;
        }
    }
    moved[n] = NULL;
    environ = moved; /* (the old array, in the stack's area, is left as it is) */
    area_len = env_end - arg_start;
    return 0;
}

int ms_proctitle_set(const char *title)
{
    if (area == NULL) {
        int rc = find_area();
        if (rc < 0)
            return rc;
    }
    size_t len = strlen(title);
    if (len > area_len - 1)
        len = area_len - 1;
    memcpy(area, title, len);
    memset(area + len, 0, area_len - len);
    /* comm: what `ps -o comm`, `top` and the kernel's messages show (15 bytes and NUL). */
    (void)prctl(PR_SET_NAME, title, 0, 0, 0);
    return 0;
}
