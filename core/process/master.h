/* master.h: the master process of the master/worker model. */
#ifndef MS_MASTER_H
#define MS_MASTER_H

#include "moonserve.h"

typedef struct ms_master_opts_s ms_master_opts_t;
struct ms_master_opts_s {
    char **argv;         /* the command that runs a worker: this program again */
    const char **listen; /* "HOST:PORT" addresses */
    int *ports;          /* out: the port bound for each address */
    int nlisten;         /* 1 to 16 */
    int workers;
    int backlog;
    double stop_timeout; /* seconds a stopping worker gets before SIGKILL */
    /* TERM and QUIT: seconds the listening sockets stay open, the workers draining (not
     * ready, still accepting), before the master closes its copies of them. */
    double drain_delay;
    /* HAProxy's agent-check responder (agent.h): "HOST:PORT" or NULL; the file whose
     * presence says "maint", or NULL. */
    const char *agent_check, *agent_maint;
    double start_timeout; /* seconds a starting worker gets to be ready before SIGKILL */
    double ticket_rotate; /* seconds between new TLS ticket keys (0: MS_TLS_TICKET_ROTATE) */
    /* The user and group the workers run as (ms_user_ids), or -1 and -1: the master's. Each
     * worker drops to them before it runs any of its code: no supplementary groups, then
     * setgid, then setuid. */
    int uid, gid;
    /* The files the operator named, by path: the only ones the master opens for a worker
     * that cannot open them itself. `files` are read (TLS certificates, keys and OCSP
     * responses: MS_CHAN_OPEN), `logs` appended to (the log, the access logs:
     * MS_CHAN_APPEND); the master opens each log once before the workers start, so that a
     * bad one stops it there. */
    const char **files, **logs;
    int nfiles, nlogs;
    /* The shared dictionaries the app declared at the start: the only zones the master
     * makes (MS_CHAN_ZONE), each only with its declared size. */
    const char **zone_names;
    const uint64_t *zone_sizes;
    int nzones;
    /* Out: why the start failed when a worker could not start (ms_master_run returns
     * UV_ECANCELED): the worker's own sentence when it sent one (MS_CHAN_FAILED). */
    char *why;
    size_t why_len;
    /* Called once the sockets are bound, before the workers start. */
    void (*on_listen)(const ms_master_opts_t *o);
    /* The configuration the workers run with: bytes the caller made (the environment's
     * settings and secrets), which every worker asks for (MS_CHAN_CONFIG) and gets as the same
     * sealed memfd, so that no worker reads a file that changed since. NULL: none. */
    const char *config;
    size_t config_len;
    /* Called on SIGHUP before the new workers start, as nginx reads its configuration again on
     * a reload: returns 0 having called ms_master_config with the new bytes, or -1 with why in
     * `why`, and the reload does not happen (the old workers serve on). NULL: nothing to do. */
    int (*on_reload)(const ms_master_opts_t *o, char *why, size_t why_len);
    /* A file the master writes its pid to once every worker is ready (FILE.oldbin while an
     * upgrade it started is under way), and removes when it stops. NULL: none. */
    const char *pid_file;
};

/* Replaces the configuration workers started from now on get (MS_CHAN_CONFIG); the workers
 * running keep theirs. Returns 0 or a negative code. Only from the master's own thread. */
int ms_master_config(const char *bytes, size_t len);

/* The CPUs this process may use: what the scheduler allows (its affinity), and no more than
 * its cgroup's CPU quota, rounded up (cgroup v2's cpu.max, v1's cpu.cfs_quota_us and
 * cpu.cfs_period_us): a container limited to 2 CPUs on a 64-core host gets 2 workers. */
int ms_cpus(void);
/* The CPUs a quota of `quota` microseconds per `period` gives, rounded up; 0 for no limit
 * (a negative quota, or a period of 0). */
int ms__cpus_of_quota(long long quota, long long period);

/* Binds the sockets, starts the workers and supervises them until SIGTERM or SIGINT, when
 * it stops them gracefully. SIGHUP starts new workers (running the code as it is now) that
 * take over from the old ones, which drain, all at once when every new one is ready; SIGUSR1
 * reopens log files everywhere. A worker finds its sockets from MOONSERVE_LISTEN_FDS (count, from
 * fd 4 on), its number and the number of workers from MOONSERVE_WORKER and MOONSERVE_WORKER_COUNT
 * (MOONSERVE_WORKERS is the operator's setting, passed on as it is), the user and group ids it was
 * started as from MOONSERVE_WORKER_IDS ("UID:GID", when the master's opts give them), and its
 * channel to the master at fd 3 (channel.h): it asks there for its shared dictionaries' zones, the
 * TLS ticket keys and the files only the master may open, and says there that it is ready, within
 * start_timeout seconds or it is killed (a reload then fails and the old worker keeps serving).
 * A worker that cannot start says why (MS_CHAN_FAILED) and exits: at the start, before every
 * slot has served, that stops the master (UV_ECANCELED, the sentence in o->why); during a
 * reload, the reload fails with one log line and the old workers serve on.
 * SIGUSR2 starts a new master (o->argv again) that takes over these listening sockets
 * (MOONSERVE_UPGRADE_FDS, from fd 4 on, and a pipe at fd 3 on which it says it is ready) and
 * runs beside this one; SIGQUIT, like SIGTERM, then stops this one gracefully. A new master
 * that exits, or is not ready in time, leaves this one serving. Returns 0 or a negative code. */
int ms_master_run(const ms_master_opts_t *o);

/* The ids of `user` and of `group` (NULL: the user's own group) from the system's user and
 * group databases. Returns 0, or -1 with a sentence naming what is wrong in `why`. */
int ms_user_ids(const char *user, const char *group, int *uid, int *gid, char *why, size_t why_len);

/* Whether this process runs as `uid` and `gid`, really and effectively, with no supplementary
 * group but `gid`, and cannot become root again. Returns 0, or -1 with why not in `why`. */
int ms_user_check(int uid, int gid, char *why, size_t why_len);

#endif
