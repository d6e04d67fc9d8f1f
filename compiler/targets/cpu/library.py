"""Kernels into one shared library, and calling a kernel from Python.

    build = build_kernels([kernel, ...], isa)         # a cached `CBuild`
    lib = load(build)
    y = call(lib, kernel, [x], out, threads=2)        # runs kernel's function

The library's C file includes ``vdla_cpu.h`` (shipped with this package) and defines
every distinct kernel's function once (`Kernel.name` is a hash of its text), plus
``vdla_set_threads``; it is built with the ISA's flags (`vdla.compiler.targets.cpu.isa`).
"""

from __future__ import annotations

import ctypes
from importlib.resources import files
from typing import Callable, Sequence

import numpy as np

from vdla.compiler.targets.cpu.build import CBuild, build_library
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import ALIGN, Kernel

__all__ = ["HEADER", "aligned_empty", "build_kernels", "call", "kernels_source", "load",
           "start_team", "time_runs"]

#: The header every generated file includes.
HEADER = "vdla_cpu.h"

_RUNTIME = r"""
#include <time.h>
#if defined(__linux__)
#include <sched.h>
#include <pthread.h>
#endif

void vdla_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

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
"""


def header_text() -> str:
    return (files("vdla.compiler.targets.cpu") / HEADER).read_text()


def kernels_source(kernels: Sequence[Kernel]) -> str:
    """One C file defining each distinct kernel's function once."""
    # _GNU_SOURCE before any system header: vdla_pin_workers' affinity calls need it.
    seen, parts = set(), ["#define _GNU_SOURCE\n", f'#include "{HEADER}"\n', _RUNTIME]
    for kernel in kernels:
        if kernel.name not in seen:
            seen.add(kernel.name)
            parts.append(kernel.text)
    return "".join(parts)


def build_kernels(kernels: Sequence[Kernel], isa: Isa, *, extra: str = "", name: str = "vdla_cpu",
                  log: Callable[[str], None] | None = None) -> CBuild:
    """The library of `kernels` (and `extra` C text after them), built for `isa`."""
    source = kernels_source(kernels) + extra
    return build_library({HEADER: header_text(), "model.c": source}, name=name,
                         flags=isa.flags, log=log)


def load(build: CBuild) -> ctypes.CDLL:
    lib = build.load()
    lib.vdla_set_threads.argtypes = [ctypes.c_int]
    lib.vdla_set_threads.restype = None
    lib.vdla_max_threads.restype = ctypes.c_int
    lib.vdla_pin_workers.argtypes = [ctypes.c_int]
    lib.vdla_pin_workers.restype = ctypes.c_int
    lib.vdla_call.argtypes = [ctypes.c_void_p] * 5
    lib.vdla_call.restype = None
    return lib


#: The CPU the first `start_team` of this process left to the calling thread (None: none
#: yet); every later library leaves the same one, since the workers are shared.
_CALLER_CPU: int | None = None


def start_team(lib: ctypes.CDLL, threads: int) -> None:
    """Set OpenMP's team size to `threads` and pin its worker threads one per core
    (`vdla_pin_workers`); calls through `vdla_call`, `vdla_time_runs` and the graph
    runner hold the calling thread on the remaining core while they run and let it go
    after (so a thread pool it starts later inherits no pinning: onnxruntime's ran 3x
    slower when the calling thread stayed bound). Measured on 2 cores: unpinned, the
    scheduler sometimes left both threads of the team on one core, where every barrier
    waits a time slice (a 90 us layer took 16 ms, in about a third of the processes).
    One CPU is left to the caller for the whole process (`_CALLER_CPU`): each library
    deciding afresh could hold a caller on the CPU another had pinned the workers to."""
    global _CALLER_CPU
    lib.vdla_set_threads(threads)
    cpu = lib.vdla_pin_workers(-1 if _CALLER_CPU is None else _CALLER_CPU)
    if cpu >= 0:
        _CALLER_CPU = cpu


def function(lib: ctypes.CDLL, kernel: Kernel):
    fn = getattr(lib, kernel.name)
    fn.argtypes = [ctypes.c_void_p] * 4
    fn.restype = None
    return fn


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer of `nbytes` whose start is `ALIGN`-aligned."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def time_runs(lib: ctypes.CDLL, kernel: Kernel, inputs: Sequence[np.ndarray],
              out: np.ndarray, workspace: np.ndarray, runs: int) -> np.ndarray:
    """Wall times (seconds) of `runs` back-to-back runs of `kernel`, timed in C, its
    params (the weights) evicted from the caches before each run: inside a model the
    layers before it have evicted them, and a schedule that reads them several times
    must pay for that in the tuner too (MobileNet-v1's 7x7 1024->1024 float layer ran
    1.7x slower in the model than alone with cached weights)."""
    arrays = [np.ascontiguousarray(a) for a in inputs]
    pointers = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    seconds = np.zeros(runs, np.float64)
    fn = function(lib, kernel)
    lib.vdla_time_runs.argtypes = ([ctypes.c_void_p] * 5
                                   + [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t])
    lib.vdla_time_runs.restype = None
    lib.vdla_time_runs(ctypes.cast(fn, ctypes.c_void_p), pointers, out.ctypes.data,
                       kernel.params.ctypes.data, workspace.ctypes.data, runs,
                       seconds.ctypes.data, kernel.params.size)
    return seconds


def call(lib: ctypes.CDLL, kernel: Kernel, inputs: Sequence[np.ndarray], out: np.ndarray, *,
         workspace: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """Run `kernel` on `inputs` (C-contiguous arrays of its computed inputs, in order)
    into `out`; returns `out`. `workspace` must hold ``kernel.workspace(threads)`` bytes
    (allocated here when None)."""
    if workspace is None:
        workspace = aligned_empty(max(kernel.workspace(threads), 1))
    arrays = [np.ascontiguousarray(a) for a in inputs]
    pointers = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    params = kernel.params if kernel.params.size else np.zeros(1, np.uint8)
    lib.vdla_call(ctypes.cast(function(lib, kernel), ctypes.c_void_p), pointers,
                  out.ctypes.data, params.ctypes.data, workspace.ctypes.data)
    return out
