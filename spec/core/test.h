/* test.h: a small unit-test harness: TEST() registers, ASSERT_*() reports and returns. */
#ifndef MS_TEST_H
#define MS_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct test_case_s {
    const char *name;
    void (*fn)(void);
    struct test_case_s *next;
} test_case_t;

static test_case_t *test_list, **test_tail = &test_list;
static int test_failed_now;

#define TEST(name)                                                                             \
    static void test_##name(void);                                                             \
    static test_case_t test_case_##name = {#name, test_##name, NULL};                          \
    __attribute__((constructor)) static void test_register_##name(void)                        \
    {                                                                                          \
        *test_tail = &test_case_##name;                                                        \
        test_tail = &test_case_##name.next;                                                    \
    }                                                                                          \
    static void test_##name(void)

#define TEST_FAIL(...)                                                                         \
    do {                                                                                       \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, "\n");                                                                 \
        test_failed_now = 1;                                                                   \
        return;                                                                                \
    } while (0)

#define ASSERT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond))                                                                           \
            TEST_FAIL("assertion failed: %s", #cond);                                          \
    } while (0)

#define ASSERT_EQ(want, got)                                                                   \
    do {                                                                                       \
        long long w_ = (long long)(want), g_ = (long long)(got);                               \
        if (w_ != g_)                                                                          \
            TEST_FAIL("%s == %s: want %lld, got %lld", #want, #got, w_, g_);                   \
    } while (0)

#define ASSERT_STR_EQ(want, got)                                                               \
    do {                                                                                       \
        const char *w_ = (want), *g_ = (got);                                                  \
        if (w_ == NULL || g_ == NULL || strcmp(w_, g_) != 0)                                   \
            TEST_FAIL("%s: want \"%s\", got \"%s\"", #got, w_ ? w_ : "(null)",                 \
                      g_ ? g_ : "(null)");                                                     \
    } while (0)

/* Asserts that `hay` holds `needle`. */
#define ASSERT_HAS(hay, needle)                                                                \
    do {                                                                                       \
        const char *h_ = (hay), *n_ = (needle);                                                \
        if (h_ == NULL || strstr(h_, n_) == NULL)                                              \
            TEST_FAIL("%s does not hold \"%s\"; it is:\n%s", #hay, n_, h_ ? h_ : "(null)");   \
    } while (0)

#define ASSERT_LACKS(hay, needle)                                                              \
    do {                                                                                       \
        const char *h_ = (hay), *n_ = (needle);                                                \
        if (h_ != NULL && strstr(h_, n_) != NULL)                                              \
            TEST_FAIL("%s holds \"%s\"; it is:\n%s", #hay, n_, h_);                            \
    } while (0)

static int test_main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    for (test_case_t *t = test_list; t != NULL; t = t->next) {
        if (argc > 1 && strstr(t->name, argv[1]) == NULL)
            continue;
        test_failed_now = 0;
        t->fn();
        if (test_failed_now) {
            failed++;
            printf("not ok - %s\n", t->name);
        } else {
            passed++;
            printf("ok - %s\n", t->name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define TEST_MAIN()                                                                            \
    int main(int argc, char **argv)                                                            \
    {                                                                                          \
        return test_main(argc, argv);                                                          \
    }

#endif
