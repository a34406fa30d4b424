/* shdict_bench.c: shared dictionary get and incr per second, from one process and from two,
 * each with its own mapping of one zone (as workers have it).
 *   build/bench/shdict_bench [seconds per case, default 2]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "process/shdict.h"

#define NKEYS 1000

enum { OP_GET_ONE, OP_GET_MANY, OP_INCR };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs `op` for `secs` on a fresh mapping of the zone; returns the operations done. */
static unsigned long long run(int fd, int op, double secs)
{
    ms_shdict_t *d;
    if (ms_shdict_attach(fd, NULL, 0, &d) < 0)
        exit(2);
    char buf[64], key[16];
    ms_shdict_val_t v;
    unsigned long long n = 0;
    unsigned seed = (unsigned)getpid();
    double end = now_s() + secs;
    do {
        for (int i = 0; i < 1024; i++) {
            long rc;
            double out;
            switch (op) {
            case OP_GET_ONE: rc = ms_shdict_get(d, "hot", 3, buf, sizeof(buf), 0, &v); break;
            case OP_GET_MANY:
                seed = seed * 1103515245 + 12345;
                rc = ms_shdict_get(d, key,
                                   (size_t)snprintf(key, sizeof(key), "key%u", (seed >> 8) % NKEYS),
                                   buf, sizeof(buf), 0, &v);
                break;
            default: rc = ms_shdict_incr(d, "n", 1, 1, 1, 0, 0, &out, NULL);
            }
            if (rc < 0)
                exit(3);
        }
        n += 1024;
    } while (now_s() < end);
    ms_shdict_detach(d);
    return n;
}

static double measure(int fd, int op, int procs, double secs)
{
    int p[2];
    if (pipe(p) < 0)
        exit(1);
    for (int i = 0; i < procs; i++) {
        if (fork() == 0) {
            unsigned long long n = run(fd, op, secs);
            if (write(p[1], &n, sizeof(n)) != sizeof(n))
                _exit(1);
            _exit(0);
        }
    }
    unsigned long long total = 0;
    for (int i = 0; i < procs; i++) {
        unsigned long long n = 0;
        if (read(p[0], &n, sizeof(n)) != sizeof(n))
            exit(1);
        total += n;
        wait(NULL);
    }
    close(p[0]);
    close(p[1]);
    return (double)total / secs;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2;
    int fd = ms_shdict_create("bench", 16 << 20);
    ms_shdict_t *d;
    if (fd < 0 || ms_shdict_attach(fd, NULL, 0, &d) < 0) {
        fprintf(stderr, "shdict_bench: cannot make a zone\n");
        return 1;
    }
    const char *val = "a value of some thirty-two bytes";
    ms_shdict_store(d, MS_SHDICT_SET, "hot", 3, MS_SHDICT_STRING, val, strlen(val), 0, 0, 0, NULL);
    for (int i = 0; i < NKEYS; i++) {
        char key[16];
        int n = snprintf(key, sizeof(key), "key%d", i);
        ms_shdict_store(d, MS_SHDICT_SET, key, (size_t)n, MS_SHDICT_STRING, val, strlen(val), 0, 0,
                        0, NULL);
    }
    const char *names[] = {"get (one key)", "get (1000 keys)", "incr (one key)"};
    printf("%-18s %16s %16s\n", "operation", "1 process ops/s", "2 processes ops/s");
    for (int op = OP_GET_ONE; op <= OP_INCR; op++) {
        double one = measure(fd, op, 1, secs);
        double two = measure(fd, op, 2, secs);
        printf("%-18s %16.0f %16.0f\n", names[op], one, two);
    }
    ms_shdict_detach(d);
    close(fd);
    return 0;
}
