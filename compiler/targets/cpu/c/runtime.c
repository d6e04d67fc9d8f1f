#define _GNU_SOURCE
#include "vdla_cpu.h"

#include <stdio.h>
#include <time.h>
#if defined(__linux__)
#include <sched.h>
#include <pthread.h>
#endif

/* The first error a kernel reported since vdla_clear_error (`vdla_fail`: an index read
   from a tensor outside its table); the kernel reads nothing out of bounds and goes on,
   and the caller (the session, the whole-graph runner) reports the error. */
static char vdla_error_text[512];
static volatile int vdla_error_flag;

void vdla_fail(const char *prefix, long long value, const char *suffix) {
#ifdef _OPENMP
    #pragma omp critical(vdla_error)
#endif
    {
        if (!vdla_error_flag) {
            snprintf(vdla_error_text, sizeof vdla_error_text, "%s%lld%s", prefix, value, suffix);
            vdla_error_flag = 1;
        }
    }
}

const char *vdla_error(void) { return vdla_error_flag ? vdla_error_text : NULL; }

void vdla_clear_error(void) { vdla_error_flag = 0; }

void vdla_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* Linux hands a process the AMX tile data state only when it asks (arch_prctl
   ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18); without it the first tile instruction
   faults. The permission is the process's (every thread's, and those it starts later), so
   it is asked once: the first AMX kernel to run asks, later calls read the answer. A
   refusal is reported (vdla_fail) on every call, so no caller mistakes the kernel's
   untouched output for a result. */
#if defined(VDLA_AMX) && !defined(VDLA_AMX_MODEL)
#if defined(__linux__)
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
#endif

static volatile int vdla_amx_state;   /* 0: not asked yet; 1: granted; < 0: -errno */

int vdla_amx_ready(void) {
    if (vdla_amx_state == 0) {
#if defined(__linux__) && defined(SYS_arch_prctl)
        vdla_amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : (errno ? -errno : -1);
#else
        vdla_amx_state = -1;
#endif
    }
    if (vdla_amx_state != 1)
        vdla_fail("the OS refused this process the AMX tile state (arch_prctl "
                  "ARCH_REQ_XCOMP_PERM: errno ", -vdla_amx_state, "), so its AMX kernels "
                  "cannot run; build for avx512vnni instead");
    return vdla_amx_state == 1;
}
#endif

int vdla_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* OpenMP's worker threads pinned one per CPU of the caller's affinity mask but `caller`
   (-1: the CPU the caller is on now), which is left to the caller: vdla_pin_workers
   returns it (-1 if nothing was pinned). The workers are the process's (OpenMP's pool),
   so every library loaded in a process must leave the same CPU: the first one's choice
   is passed to the others (`start_team`). During a call the caller is held on that CPU
   (vdla_hold ... vdla_release) and let go after, so nothing else it runs, such as
   another library's thread pool, inherits the pinning. */
static int vdla_caller_cpu = -1;

int vdla_pin_workers(int caller) {
#if defined(__linux__) && defined(_OPENMP)
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) return -1;
    if (caller < 0 || !CPU_ISSET(caller, &mask)) caller = sched_getcpu();
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mask) && c != caller) cpus[n++] = c;
    if (n == 0) return -1;
    int pinned = 0;
    #pragma omp parallel reduction(+:pinned)
    {
        int t = omp_get_thread_num();
        if (t > 0) {
            cpu_set_t one; CPU_ZERO(&one); CPU_SET(cpus[(t - 1) % n], &one);
            pinned += pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
        }
    }
    vdla_caller_cpu = pinned ? caller : -1;
    return vdla_caller_cpu;
#else
    (void)caller;
    return -1;
#endif
}

typedef struct {
    int held;
#if defined(__linux__)
    cpu_set_t saved;
#endif
} vdla_holding;

static void vdla_hold(vdla_holding *h) {
    h->held = 0;
#if defined(__linux__)
    if (vdla_caller_cpu < 0 || sched_getaffinity(0, sizeof h->saved, &h->saved) != 0) return;
    cpu_set_t one; CPU_ZERO(&one); CPU_SET(vdla_caller_cpu, &one);
    h->held = sched_setaffinity(0, sizeof one, &one) == 0;
#endif
}

static void vdla_release(vdla_holding *h) {
#if defined(__linux__)
    if (h->held) sched_setaffinity(0, sizeof h->saved, &h->saved);
#endif
    h->held = 0;
}

typedef void (*vdla_fn)(const void *const *, void *, const unsigned char *, unsigned char *);

/* fn(in, out, params, ws) with the caller held on its CPU. */
void vdla_call(vdla_fn fn, const void *const *in, void *out, const unsigned char *params,
               unsigned char *ws) {
    vdla_holding h; vdla_hold(&h);
    fn(in, out, params, ws);
    vdla_release(&h);
}

/* Evict [p, p + n) from every cache level (as a layer's weights are when it runs inside
   a model, after the layers before it). */
static void vdla_evict(const unsigned char *p, size_t n) {
#if defined(VDLA_X86) && defined(__SSE2__)
    for (size_t i = 0; i < n; i += 64) _mm_clflush(p + i);
    _mm_mfence();
#else
    (void)p; (void)n;
#endif
}

/* Run fn `runs` times, each run's wall time in seconds[], its params (`params_bytes`)
   evicted from the caches before each: timing without Python, as in a model. */
void vdla_time_runs(vdla_fn fn, const void *const *in, void *out,
                    const unsigned char *params, unsigned char *ws, int runs,
                    double *seconds, size_t params_bytes) {
    vdla_holding h; vdla_hold(&h);
    for (int r = 0; r < runs; r++) {
        vdla_evict(params, params_bytes);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fn(in, out, params, ws);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        seconds[r] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    vdla_release(&h);
}
