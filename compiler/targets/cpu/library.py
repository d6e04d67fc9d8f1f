"""Kernels into one shared library, and calling a kernel from Python.

    build = build_kernels([kernel, ...], isa)         # a cached `CBuild`
    lib = load(build)
    y = call(lib, kernel, [x], out, threads=2)        # runs kernel's function

The library's C file starts with ``c/runtime.c`` (``vdla_set_threads``, pinning, calling
and timing a kernel; it includes ``vdla_cpu.h``, both shipped with this package) and
defines every distinct kernel's function once (`Kernel.name` is a hash of its text); it
is built with the ISA's flags (`vdla.compiler.targets.cpu.isa`).
"""

from __future__ import annotations

import ctypes
import mmap
from importlib.resources import files
from typing import Callable, Sequence

import numpy as np

from vdla.compiler.targets.cpu.build import CBuild, build_library
from vdla.compiler.targets.cpu.cfiles import static_text
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import ALIGN, Kernel

__all__ = ["HEADER", "aligned_empty", "build_kernels", "call", "kernels_source", "load",
           "raise_error", "start_team", "time_runs"]

#: The header every generated file includes.
HEADER = "vdla_cpu.h"

def header_text() -> str:
    return (files("vdla.compiler.targets.cpu") / HEADER).read_text()


def kernels_source(kernels: Sequence[Kernel]) -> str:
    """One C file defining each distinct kernel's function once."""
    # c/runtime.c starts the file: it defines _GNU_SOURCE before any system header
    # (vdla_pin_workers' affinity calls need it) and includes HEADER.
    seen, parts = set(), [static_text("runtime.c")]
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
    lib.vdla_error.argtypes = []
    lib.vdla_error.restype = ctypes.c_char_p
    lib.vdla_clear_error.argtypes = []
    lib.vdla_clear_error.restype = None
    return lib


def raise_error(lib: ctypes.CDLL) -> None:
    """Raise the ValueError a kernel reported through ``vdla_fail`` (an index outside its
    table; `Kernel.checks`), if any, and clear it."""
    message = lib.vdla_error()
    if message:
        lib.vdla_clear_error()
        raise ValueError(message.decode(errors="replace"))


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


#: Buffers from this size on sit in transparent huge pages (2 MB).
_HUGE = 2 << 20


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer of `nbytes` whose start is `ALIGN`-aligned. One of `_HUGE` bytes
    or more is an anonymous mapping asked for huge pages (``MADV_HUGEPAGE``: a machine
    whose transparent huge pages are "madvise" gives them only so) and starts on a
    2 MB boundary, so every page of it can be huge. Why: the whole-graph runner's
    workspace and arena are megabytes read with large strides (Winograd's transformed
    input, 3.2 MB on ResNet-50), and with numpy's own allocation whether they got huge
    pages depended on where the allocation fell. (ResNet-18 float32 ran in 12.2 ms in
    some processes and 17.6 ms in others; such slow runs became rarer with this, but
    the host's own slow spells turned out the larger cause: docs/targets/cpu.md.)"""
    if nbytes < _HUGE:
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        return raw[start:start + nbytes]
    region = mmap.mmap(-1, nbytes + _HUGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(region, np.uint8)       # keeps the mapping alive
    start = (-raw.ctypes.data) % _HUGE
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
    if kernel.checks:
        raise_error(lib)
    return out
