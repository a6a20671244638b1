/*
 * ptydrive: runs a command on a pseudo-terminal and drives it from a script,
 * so that specs can test an interactive program (readline, Ctrl-C, Tab) the
 * way a person at a terminal would use it.
 *
 *   ptydrive [-t SECONDS] [-w COLUMNS] -- COMMAND [ARGS...] < steps
 *
 * Steps, one per line (blank lines and lines starting with '#' are skipped):
 *   send TEXT     type TEXT; escapes \n \r \t \e \\ \xHH (\x03 is Ctrl-C)
 *   expect TEXT   wait until TEXT shows up in the output after the previous
 *                 match (same escapes)
 *   sleep MS      wait, still collecting output
 * After the last step, waits for the command to exit.
 *
 * Everything the command writes goes to stdout as it arrives. The exit status
 * is the command's own (128 + signal if a signal killed it), or 124 when a
 * step or the final wait took longer than SECONDS (default 10): the command
 * is then killed, so a hung program never hangs the test run.
 */
#define _DEFAULT_SOURCE /* forkpty */

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int master = -1;
static bool output_closed;
static char *output; /* everything read so far */
static size_t output_len, output_cap;
static size_t matched; /* expect searches from here */
static char *line;     /* the current step (global: no leak report on early exits) */

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Waits up to timeout_ms for output, appends it to `output` and stdout. */
static void pump(long long timeout_ms) {
    if (output_closed) {
        if (timeout_ms > 0) usleep((useconds_t)(timeout_ms * 1000));
        return;
    }
    struct pollfd pfd = {.fd = master, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms < 0 ? 0 : (int)timeout_ms);
    if (r < 0 && errno == EINTR) return;
    if (r <= 0) return;
    char buf[4096];
    ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) { /* EIO: the command closed its terminal */
        output_closed = true;
        return;
    }
    if (output_len + (size_t)n + 1 > output_cap) {
        output_cap = (output_len + (size_t)n + 1) * 2;
        output = realloc(output, output_cap);
        if (!output) {
            perror("ptydrive");
            exit(2);
        }
    }
    memcpy(output + output_len, buf, (size_t)n);
    output_len += (size_t)n;
    fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
}

/* Decodes the escapes of TEXT in place; returns the decoded length. */
static size_t unescape(char *s) {
    char *out = s;
    for (char *p = s; *p; p++) {
        if (*p != '\\' || !p[1]) {
            *out++ = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'e': *out++ = '\033'; break;
        case 'x': {
            char hex[3] = {0};
            for (int k = 0; k < 2 && isxdigit((unsigned char)p[1]); k++) hex[k] = *++p;
            *out++ = (char)strtol(hex, NULL, 16);
            break;
        }
        default: *out++ = *p; break;
        }
    }
    return (size_t)(out - s);
}

static bool expect(const char *text, size_t len, long long timeout_ms) {
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        for (size_t i = matched; i + len <= output_len; i++)
            if (memcmp(output + i, text, len) == 0) {
                matched = i + len;
                return true;
            }
        long long left = deadline - now_ms();
        if (left <= 0 || output_closed) return false;
        pump(left);
    }
}

static void send_text(const char *text, size_t len) {
    while (len > 0) {
        ssize_t n = write(master, text, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return; /* the command is gone; a later expect will say so */
        }
        text += n;
        len -= (size_t)n;
    }
}

static int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    long long timeout_ms = 10000;
    unsigned short cols = 200;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            timeout_ms = (long long)(atof(argv[++i]) * 1000);
        else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc)
            cols = (unsigned short)atoi(argv[++i]);
        else
            break;
    }
    if (i + 1 >= argc || strcmp(argv[i], "--") != 0) {
        fprintf(stderr, "usage: ptydrive [-t SECONDS] [-w COLUMNS] -- COMMAND [ARGS...] < steps\n");
        return 2;
    }
    char **command = argv + i + 1;

    struct winsize ws = {.ws_row = 24, .ws_col = cols};
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    if (pid < 0) {
        perror("ptydrive: forkpty");
        return 2;
    }
    if (pid == 0) {
        execvp(command[0], command);
        fprintf(stderr, "ptydrive: cannot run %s: %s\n", command[0], strerror(errno));
        _exit(127);
    }

    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        if (n == 0 || line[0] == '#') continue;
        char *arg = strchr(line, ' ');
        arg = arg ? arg + 1 : line + n;
        if (strncmp(line, "send ", 5) == 0) {
            send_text(arg, unescape(arg));
        } else if (strncmp(line, "expect ", 7) == 0) {
            size_t len = unescape(arg);
            if (!expect(arg, len, timeout_ms)) {
                fprintf(stderr, "\nptydrive: %s waiting for \"%s\"\n",
                        output_closed ? "output ended" : "timed out", line + 7);
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                return 124;
            }
        } else if (strncmp(line, "sleep ", 6) == 0) {
            long long until = now_ms() + atoll(arg);
            for (long long left; (left = until - now_ms()) > 0;) pump(left);
        } else {
            fprintf(stderr, "ptydrive: bad step: %s\n", line);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return 2;
        }
    }
    free(line);
    line = NULL;

    /* Collect the rest of the output and the exit status. */
    long long deadline = now_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (now_ms() >= deadline) {
            fprintf(stderr, "\nptydrive: timed out waiting for the command to exit\n");
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return 124;
        }
        pump(output_closed ? 10 : 50);
    }
    while (!output_closed) { /* drain what the command wrote last */
        struct pollfd pfd = {.fd = master, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) break;
        pump(0);
    }
    return exit_code(status);
}
