"""What a CPU-target op compiles to: one C function, its constant data, its scratch.

Every generated function has one signature, so the session and the model runner call
them alike:

    void NAME(const void *const *in,        /* the node's computed inputs, in order */
              void *out,                    /* its output (`Kernel.out_block`'s layout) */
              const unsigned char *params,  /* its constants: packed weights, tables */
              unsigned char *ws);           /* scratch: `Kernel.workspace(threads)` */

The C text never holds the model's numbers: weights, biases and requantization tables
travel in ``params`` (a `Params` blob), so one source (and one cached build) serves
every model of the same shapes and schedules, and the tuner's builds are shared across
weights. Two nodes whose C text is identical share one function (`Kernel.text` names it
by its hash).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

__all__ = ["ALIGN", "Kernel", "Params", "SIGNATURE", "align", "param_pointers"]

#: Alignment of every array in a params blob and of every buffer the runner hands out.
ALIGN = 64

#: The parameter list of every generated function.
SIGNATURE = ("(const void *const *restrict in, void *restrict out_, "
             "const unsigned char *restrict params, unsigned char *restrict ws)")


def param_pointers(*pointers: tuple[str, str, int]) -> str:
    """C declarations, one a line, of read-only pointers into a kernel's ``params``: each
    (C element type, name, byte offset)."""
    return "\n".join(f"    const {c_type} *restrict {name} = (const {c_type} *)(params + {at});"
                     for c_type, name, at in pointers)


def align(n: int, to: int = ALIGN) -> int:
    return -(-int(n) // to) * to


class Params:
    """A params blob under construction: `add` an array, get its byte offset."""

    def __init__(self):
        self._parts: list[np.ndarray] = []
        self.size = 0

    def add(self, array: np.ndarray) -> int:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        offset = self.size
        self._parts.append(data)
        self.size = align(offset + data.size)
        return offset

    def blob(self) -> np.ndarray:
        out = np.zeros(self.size, np.uint8)
        offset = 0
        for part in self._parts:
            out[offset:offset + part.size] = part
            offset = align(offset + part.size)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One op compiled to C.

    body : the C definition of the function with ``NAME`` where its name goes (and
        ``NAME_`` as the prefix of its helpers)
    params : its constants (uint8 array, `ALIGN`-aligned parts)
    inputs : the node's computed inputs the function reads (``in[0]``, ``in[1]``, ...)
    shared_bytes : scratch every thread shares
    thread_bytes : scratch each thread owns (after the shared part)
    macs : useful multiply-accumulates of one run (None: not a GEMM op)
    in_blocks : the layout each of `inputs` must be in (`vdla.compiler.targets.cpu.layout`:
        0 plain, ``c`` blocked NCHW{c}c); empty: all plain
    out_block : the layout of its output (0: plain)
    items : the work items OpenMP shares among the threads per image, with a static
        schedule (1: the kernel runs on one thread; None: not counted). What a thread
        count can get out of the kernel: ``bench/cpu_scaling.py`` projects from it.
    checks : whether it checks its input and may report an error (``vdla_fail`` in
        ``c/runtime.c``: a gather's index outside its table); the runner stops there
    """

    body: str
    params: np.ndarray
    inputs: tuple[str, ...]
    shared_bytes: int = 0
    thread_bytes: int = 0
    macs: int | None = None
    in_blocks: tuple[int, ...] = ()
    out_block: int = 0
    items: int | None = None
    checks: bool = False

    def in_block(self, k: int) -> int:
        """The layout input `k` must be in."""
        return self.in_blocks[k] if self.in_blocks else 0

    @property
    def name(self) -> str:
        """The function's name: a hash of its text, so equal text is one function."""
        return "vdla_k" + hashlib.sha256(self.body.encode()).hexdigest()[:16]

    @property
    def text(self) -> str:
        return self.body.replace("NAME", self.name)

    def workspace(self, threads: int) -> int:
        """Scratch bytes for a run on `threads` threads."""
        return align(self.shared_bytes) + threads * align(self.thread_bytes)
