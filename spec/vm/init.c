/* spec/vm/init.c: the first process of the kernel TLS test machine (spec/vm/ktls): loads the
 * modules the initramfs holds (in the order of /modules/order), mounts the host's root
 * read-only over 9p with fresh /proc, /sys, /dev and a tmpfs on /tmp, brings up lo, runs the
 * guest script ($MS_GUEST, from the kernel's command line) there, and powers off. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void load_modules(void)
{
    FILE *f = fopen("/modules/order", "r");
    char line[256];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = 0;
        int fd = open(line, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || syscall(SYS_finit_module, fd, "", 0) != 0)
            perror(line);
        if (fd >= 0)
            close(fd);
    }
    if (f != NULL)
        fclose(f);
}

static void must_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                       const char *opts)
{
    if (mount(src, dst, type, flags, opts) != 0)
        perror(dst);
}

static void lo_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0)
        perror("lo");
    ifr.ifr_flags |= IFF_UP;
    if (s >= 0 && ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
        perror("lo up");
    if (s >= 0)
        close(s);
}

/* Makes the directories of `path` that do not exist (they may be in the fresh /tmp). */
static void mkdir_p(char *path)
{
    for (char *p = path + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    }
    mkdir(path, 0755);
}

int main(void)
{
    const char *guest = getenv("MS_GUEST");
    int status = -1;
    load_modules();
    must_mount("hostroot", "/root", "9p", MS_RDONLY,
               "trans=virtio,version=9p2000.L,msize=524288,cache=loose");
    must_mount("proc", "/root/proc", "proc", 0, NULL);
    must_mount("sysfs", "/root/sys", "sysfs", 0, NULL);
    must_mount("devtmpfs", "/root/dev", "devtmpfs", 0, NULL);
    must_mount("tmpfs", "/root/tmp", "tmpfs", 0, "size=512m");
    must_mount("tmpfs", "/root/run", "tmpfs", 0, NULL);
    /* The tree is shared on its own too: it may sit under a directory the guest has fresh
     * (a checkout in /tmp). */
    const char *tree = getenv("MS_TREE");
    if (tree != NULL && tree[0] == '/' && strlen(tree) < 4000) {
        char at[4096];
        snprintf(at, sizeof(at), "/root%s", tree);
        mkdir_p(at);
        must_mount("tree", at, "9p", MS_RDONLY,
                   "trans=virtio,version=9p2000.L,msize=524288,cache=loose");
    }
    if (chroot("/root") != 0 || chdir("/") != 0)
        perror("chroot");
    lo_up();
    if (guest == NULL) {
        fprintf(stderr, "init: no MS_GUEST on the kernel's command line\n");
    } else {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/sh", "sh", guest, (char *)NULL);
            perror("exec");
            _exit(127);
        }
        if (pid > 0 && waitpid(pid, &status, 0) == pid)
            status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    }
    printf("ms-vm: exit %d\n", status);
    fflush(stdout);
    sync();
    reboot(RB_POWER_OFF);
    return 0;
}
