/* Preloaded before libfaketime on the skewed worker hosts.
 *
 * libfaketime 0.9.10 (Debian 12) with FAKETIME_DONT_FAKE_MONOTONIC mishandles
 * clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which Python 3.11's time.sleep uses: it
 * passes a negative time to the kernel and the sleep fails with EINVAL (libfaketime issue 426).
 * The monotonic clock is not faked there, so the call goes to the kernel unchanged. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *req,
                    struct timespec *rem) {
    long result = syscall(SYS_clock_nanosleep, clock_id, flags, req, rem);
    return result == 0 ? 0 : errno;
}
