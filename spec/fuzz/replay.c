/* replay.c: runs a fuzz target over every file of a corpus directory, without libFuzzer,
 * so the corpus is a regression test in every build. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    int passed = 0;
    for (int i = 1; i < argc; i++) {
        int inputs = 0;
        DIR *d = opendir(argv[i]);
        if (d == NULL) {
            perror(argv[i]);
            printf("0 passed, 1 failed\n");
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            FILE *f = fopen(path, "rb");
            if (f == NULL)
                continue;
            static uint8_t buf[1 << 20];
            size_t n = fread(buf, 1, sizeof(buf), f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, n);
            inputs++;
        }
        closedir(d);
        /* A crash never gets here: the test fails with the signal. */
        printf("ok - every input of %s (%d)\n", argv[i], inputs);
        passed++;
    }
    printf("%d passed, 0 failed\n", passed);
    return 0;
}
