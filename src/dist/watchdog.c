/* watchdog.c — collectives that cannot hang (comm.h: lk_comm_watchdog_arm). A rank
 * stopped by SIGSTOP, a debugger or a wedged device leaves the others blocked in their
 * next collective for ever, with no message (a killed rank is different: mpirun sees it
 * exit and ends the job). Once armed, every blocking wrapper of comm.c (each collective,
 * lk_comm_wait, lk_comm_split) marks itself in flight here; one thread wakes a few times
 * per timeout and, when the same call has been in flight longer than the timeout, writes
 *   llmkern: rank 0: all_reduce (step 7) did not complete within 3 s (train.comm_timeout_s) ...
 * to stderr, runs the abort hooks (NCCL: ncclCommAbort, so its kernels stop too), and
 * ends the process with status 3: mpirun then ends the job and the stopped rank with it.
 * The cost on the hot path is one uncontended mutex per collective. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dist/watchdog.h"

enum { MAX_HOOKS = 8 };

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running;              /* the thread exists */
    double timeout_s;         /* 0: disarmed */
    double grace_s;           /* > timeout_s: the longer limit of a phase (lk_comm_watchdog_grace) */
    int rank;                 /* the world rank, for the message */
    int64_t step;             /* the caller's step (-1: none) */
    int depth;                /* calls in flight (nested wrappers count once each) */
    uint64_t seq;             /* bumped by every outermost call */
    const char *what;         /* the outermost call in flight */
    int comm_rank, comm_size;
    double since;
    struct { void (*fn)(void *); void *arg; } hooks[MAX_HOOKS];
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .step = -1};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double limit_s(void) { return wd.grace_s > wd.timeout_s ? wd.grace_s : wd.timeout_s; }

static void fire(void) {   /* wd.mu held; never returns */
    char msg[512];
    char step[48] = "";
    if (wd.step >= 0) snprintf(step, sizeof step, " (step %lld)", (long long)wd.step);
    int n = snprintf(msg, sizeof msg, "llmkern: rank %d: %s%s did not complete within %g s (train.comm_timeout_s%s) "
                     "on a communicator of %d ranks (its rank %d): another rank stopped or is stuck; ending the job\n",
                     wd.rank, wd.what ? wd.what : "a collective", step, limit_s(), wd.grace_s > wd.timeout_s ?
                     ", the longer limit of a checkpoint or the start" : "", wd.comm_size, wd.comm_rank);
    if (write(STDERR_FILENO, msg, n > 0 && n < (int)sizeof msg ? (size_t)n : strlen(msg)) < 0) {}
    for (int i = 0; i < MAX_HOOKS; i++)
        if (wd.hooks[i].fn) wd.hooks[i].fn(wd.hooks[i].arg);
    _exit(3);
}

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&wd.mu);
    while (wd.timeout_s > 0) {
        double tick = wd.timeout_s / 4 < 0.5 ? wd.timeout_s / 4 : 0.5;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + tick;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&wd.cv, &wd.mu, &ts);
        if (wd.timeout_s > 0 && wd.depth > 0 && now_s() - wd.since > limit_s()) fire();
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

lk_status lk_comm_watchdog_arm(double timeout_s, int rank) {
    if (!(timeout_s >= 0) || timeout_s > 1e9)
        return lk_error(LK_EINVAL, "comm: watchdog: timeout_s: expected 0 (off) .. 1e9 seconds, got %g", timeout_s);
    pthread_mutex_lock(&wd.mu);
    int was = wd.running;
    wd.timeout_s = timeout_s;
    wd.rank = rank;
    if (timeout_s > 0 && !was) {
        if (pthread_create(&wd.thread, NULL, watch, NULL) != 0) {
            wd.timeout_s = 0;
            pthread_mutex_unlock(&wd.mu);
            return lk_error(LK_EINTERNAL, "comm: watchdog: cannot start its thread");
        }
        wd.running = 1;
    }
    int join = timeout_s == 0 && was;
    if (join) wd.running = 0;
    pthread_cond_signal(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
    if (join) pthread_join(wd.thread, NULL);
    return LK_OK;
}

void lk_comm_watchdog_grace(double seconds) {
    pthread_mutex_lock(&wd.mu);
    wd.grace_s = seconds > 0 ? seconds : 0;
    pthread_mutex_unlock(&wd.mu);
}

void lk_comm_watchdog_step(int64_t step) {
    pthread_mutex_lock(&wd.mu);
    wd.step = step;
    pthread_mutex_unlock(&wd.mu);
}

lk_status lk_comm_watchdog_on_fire(void (*fn)(void *), void *arg, int add) {
    pthread_mutex_lock(&wd.mu);
    lk_status s = LK_OK;
    int i = 0;
    if (add) {
        while (i < MAX_HOOKS && wd.hooks[i].fn) i++;
        if (i == MAX_HOOKS) s = lk_error(LK_ENOMEM, "comm: watchdog: more than %d abort hooks", MAX_HOOKS);
        else wd.hooks[i].fn = fn, wd.hooks[i].arg = arg;
    } else {
        for (; i < MAX_HOOKS; i++)
            if (wd.hooks[i].fn == fn && wd.hooks[i].arg == arg) wd.hooks[i].fn = NULL, wd.hooks[i].arg = NULL;
    }
    pthread_mutex_unlock(&wd.mu);
    return s;
}

int lk_watch_begin(const lk_comm *c, const char *what) {
    if (c->size < 2) return 0;   /* nothing to wait for */
    pthread_mutex_lock(&wd.mu);
    int on = wd.timeout_s > 0;
    if (on && wd.depth++ == 0) {
        wd.what = what, wd.comm_rank = c->rank, wd.comm_size = c->size;
        wd.since = now_s();
        wd.seq++;
    }
    pthread_mutex_unlock(&wd.mu);
    return on;
}

void lk_watch_end(int token) {
    if (!token) return;
    pthread_mutex_lock(&wd.mu);
    if (wd.depth > 0) wd.depth--;
    pthread_mutex_unlock(&wd.mu);
}
