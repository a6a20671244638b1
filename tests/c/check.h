/* tests/c/check.h - the check counters and macros the C tests share.
 *
 *   static int checks, failures      every check counts; main() reports both
 *   FAIL(fmt, ...)                   a failure: counted, printed with its place
 *   FAIL_AT(line, fmt, ...)          the same for a line a helper was given
 *   CHECK(cond)                      cond holds (else its text is the message)
 *   CHECKM(cond, fmt, ...)           cond holds, else FAIL(fmt, ...)
 *   OK(expr)                         expr returns ND_OK, else a failure and the
 *                                    calling test function returns
 *   EXPECT_ERR(what, call, want, s1, s2)
 *                                    call returns status want, and
 *                                    nd_last_error() contains s1 and s2 (NULL: any)
 *   S(...), S0, V(...)               shape and value literals as pointer, count
 *
 * A failure's place prints as "file:line: FAIL: ", or as "FAIL line N: "
 * when the test defines CHECK_PLACE_LINE before including this.
 * Header only: CMake builds each tests/c/test_X.c as a test and links the
 * other .c files there as helpers; a header needs nothing. */
#ifndef NEEDLE_TESTS_CHECK_H
#define NEEDLE_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>
#include "needle.h"

static int checks = 0, failures = 0;

static inline void check_place(const char *file, int line) {
#ifdef CHECK_PLACE_LINE
    (void)file;
    printf("FAIL line %d: ", line);
#else
    printf("%s:%d: FAIL: ", file, line);
#endif
}

#define FAIL_AT(line, ...) do { failures++; check_place(__FILE__, (line)); printf(__VA_ARGS__); \
                                printf("\n"); } while (0)
#define FAIL(...) FAIL_AT(__LINE__, __VA_ARGS__)
#define CHECK(cond) do { checks++; if (!(cond)) FAIL("%s", #cond); } while (0)
#define CHECKM(cond, ...) do { checks++; if (!(cond)) FAIL(__VA_ARGS__); } while (0)
/* A call that must succeed; on failure the current test function returns. */
#define OK(expr) do { checks++; nd_status s_ = (expr); if (s_ != ND_OK) { \
        FAIL("%s -> %s: %s", #expr, nd_status_name(s_), nd_last_error()); return; } } while (0)

static inline void expect_err_at(const char *file, int line, const char *what, nd_status got,
                                 nd_status want, const char *s1, const char *s2) {
    checks++;
    const char *msg = nd_last_error();
    if (got != want || (s1 && !strstr(msg, s1)) || (s2 && !strstr(msg, s2))) {
        failures++;
        check_place(file, line);
        printf("%s: got status '%s' message '%s'; expected '%s' mentioning '%s' '%s'\n", what,
               nd_status_name(got), got ? msg : "", nd_status_name(want), s1 ? s1 : "",
               s2 ? s2 : "");
    }
}
#define EXPECT_ERR(what, call, want, s1, s2) \
    expect_err_at(__FILE__, __LINE__, what, call, want, s1, s2)

/* shape literal: S(2,3) -> (const int64_t[]){2,3}, 2 */
#define S(...) (const int64_t[]){__VA_ARGS__}, \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
/* the shape of a 0-dim tensor */
#define S0 (const int64_t *)NULL, 0
/* values literal: V(1, 2.5) -> (const double[]){1, 2.5}, 2 */
#define V(...) (const double[]){__VA_ARGS__}, \
    (int)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double))

#endif
