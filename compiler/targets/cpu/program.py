"""A graph's CPU kernels as one program: one C library, one constants blob, and (when the
CPU target runs every node) a runner that executes the whole graph in one call.

    program = Program.create(graph, nodes, kernels, isa)
    program.build                      # the cached library (`CBuild`)
    program.blob                       # every kernel's params, `ALIGN`-aligned
    program.complete                   # it holds every node: vdla_model_run exists

The runner (``vdla_model_run``) calls the op functions in order on a static memory plan:
every tensor the graph computes gets an offset in one arena (tensors whose lifetimes do
not overlap share bytes), graph inputs and outputs are the caller's buffers, and all ops
share one workspace. `write_project` writes the same program as a stand-alone C project
(sources, ``vdla_model.h``, a Makefile, the params file and an example program), which
builds with ``make`` and no Python.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from vdla._fileio import atomic_write
from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.build import BASE_FLAGS, CBuild, write_project
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import ALIGN, Kernel, align
from vdla.compiler.targets.cpu.library import HEADER, build_kernels, header_text, kernels_source

__all__ = ["PARAMS_MAGIC", "Program", "plan_memory"]

#: The params file's first 8 bytes; then the blob's size (little-endian uint64), the blob.
PARAMS_MAGIC = b"VDLAPRM1"

_C_TYPES = {"float32": "float", "int8": "int8_t", "int32": "int32_t", "uint8": "uint8_t",
            "float64": "double", "int64": "int64_t"}


def _nbytes(graph: Graph, tensor: str) -> int:
    t = graph.tensors[tensor]
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(DTYPES[t.dtype]).itemsize


def plan_memory(graph: Graph, nodes: Sequence[Node]) -> tuple[dict[str, int], int]:
    """Arena offsets (`ALIGN`-aligned) of the tensors `nodes` compute that are not graph
    outputs, and the arena's size: first fit, in execution order, of each tensor over
    the span from its producer to its last consumer."""
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in node.inputs:
            if t:
                last_use[t] = i
    placed: list[tuple[int, int, int]] = []   # (offset, end, last step alive)
    offsets, size = {}, 0
    for i, node in enumerate(nodes):
        live = [p for p in placed if p[2] >= i]
        for t in node.outputs:
            if t in graph.outputs:
                continue
            need = align(max(_nbytes(graph, t), 1))
            offset = 0
            for start, end, _ in sorted(live):
                if offset + need <= start:
                    break
                offset = max(offset, align(end))
            placed.append((offset, offset + need, last_use.get(t, i)))
            live.append(placed[-1])
            offsets[t] = offset
            size = max(size, offset + need)
    return offsets, size


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """See the module docstring.

    graph : the graph; nodes : the CPU target's nodes, in execution order
    kernels : node name -> `Kernel`
    isa : the `Isa` it was built for
    build : the library (None until `compile`)
    offsets : node name -> byte offset of its params in `blob`
    blob : every kernel's params (uint8, `ALIGN`-aligned parts)
    arena : tensor -> arena offset, and `arena_size` (for the whole-graph runner)
    """

    graph: Graph
    nodes: tuple[Node, ...]
    kernels: Mapping[str, Kernel]
    isa: Isa
    offsets: Mapping[str, int]
    blob: np.ndarray
    arena: Mapping[str, int]
    arena_size: int
    build: CBuild | None = None

    @classmethod
    def create(cls, graph: Graph, nodes: Sequence[Node], kernels: Mapping[str, Kernel],
               isa: Isa) -> "Program":
        offsets, size = {}, 0
        for node in nodes:
            offsets[node.name] = size
            size = align(size + kernels[node.name].params.size)
        blob = np.zeros(max(size, ALIGN), np.uint8)
        for node in nodes:
            p = kernels[node.name].params
            blob[offsets[node.name]:offsets[node.name] + p.size] = p
        arena, arena_size = plan_memory(graph, nodes) if cls._covers(graph, nodes) else ({}, 0)
        return cls(graph, tuple(nodes), dict(kernels), isa, offsets, blob, arena, arena_size)

    @staticmethod
    def _covers(graph: Graph, nodes: Sequence[Node]) -> bool:
        return {n.name for n in nodes} == {n.name for n in graph.nodes()}

    @functools.cached_property
    def complete(self) -> bool:
        """Whether it runs every node of the graph (and so has ``vdla_model_run``).
        Cached: the graph's node order is a topological sort, too slow for every run."""
        return self._covers(self.graph, self.nodes)

    def workspace(self, threads: int) -> int:
        """Scratch bytes the largest op needs on `threads` threads."""
        return max([k.workspace(threads) for k in self.kernels.values()] + [ALIGN])

    # --- C --------------------------------------------------------------------------------

    def source(self) -> str:
        """The library's C text: the kernels, and the runner when `complete`."""
        return kernels_source([self.kernels[n.name] for n in self.nodes]) + (
            self.runner_source() if self.complete else "")

    def runner_source(self) -> str:
        """``vdla_model_run`` and the size queries (see `header`)."""
        g = self.graph
        where = {name: f"(unsigned char *)inputs[{i}]" for i, name in enumerate(g.inputs)}
        where.update({name: f"(unsigned char *)outputs[{i}]"
                      for i, name in enumerate(g.outputs)})
        where.update({t: f"arena + {off}" for t, off in self.arena.items()})
        calls = []
        for node in self.nodes:
            kernel = self.kernels[node.name]
            ins = ", ".join(f"(const void *){where[t]}" for t in kernel.inputs) or "NULL"
            k = len(calls)
            calls.append(f"    {{   /* {node.name} ({node.op}) */\n"
                         f"        const void *in[] = {{{ins}}};\n"
                         f"        if (seconds) vdla_tick(&t0);\n"
                         f"        {kernel.name}(in, {where[node.outputs[0]]}, params + "
                         f"{self.offsets[node.name]}, ws);\n"
                         f"        if (seconds) seconds[{k}] = vdla_tock(&t0);\n    }}")
        ws_terms = sorted({(align(k.shared_bytes), align(k.thread_bytes))
                           for k in self.kernels.values()})
        ws_lines = "\n".join(f"    m = vdla_max_size(m, (size_t){s} + (size_t)threads * {t});"
                             for s, t in ws_terms)
        return f"""
/* ---- the whole graph {g.name!r}: {len(self.nodes)} ops ---- */
static size_t vdla_max_size(size_t a, size_t b) {{ return a > b ? a : b; }}

size_t vdla_model_params_size(void) {{ return {self.blob.size}; }}
size_t vdla_model_arena_size(void) {{ return {max(self.arena_size, ALIGN)}; }}
size_t vdla_model_workspace_size(int threads) {{
    size_t m = {ALIGN};
    if (threads < 1) threads = 1;
{ws_lines}
    return m;
}}

static void vdla_tick(struct timespec *t) {{ clock_gettime(CLOCK_MONOTONIC, t); }}
static double vdla_tock(const struct timespec *t0) {{
    struct timespec t1; clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}}

/* vdla_model_run, and with `seconds` (one double per op, in order) each op's wall time */
int vdla_model_run_timed(const unsigned char *restrict params, unsigned char *restrict arena,
                         unsigned char *restrict ws, const void *const *inputs,
                         void *const *outputs, double *seconds) {{
    if (!params || !arena || !ws || !inputs || !outputs) return 1;
    struct timespec t0; (void)t0;
    vdla_holding held; vdla_hold(&held);
{chr(10).join(calls)}
    vdla_release(&held);
    return 0;
}}

int vdla_model_run(const unsigned char *restrict params, unsigned char *restrict arena,
                   unsigned char *restrict ws, const void *const *inputs,
                   void *const *outputs) {{
    return vdla_model_run_timed(params, arena, ws, inputs, outputs, NULL);
}}
"""

    def compile(self, *, log: Callable[[str], None] | None = None) -> "Program":
        """This program with its library built (or found in the cache)."""
        build = build_kernels([self.kernels[n.name] for n in self.nodes], self.isa,
                              extra=self.runner_source() if self.complete else "",
                              log=log)
        return dataclasses.replace(self, build=build)

    # --- the stand-alone project -----------------------------------------------------------

    def header(self, name: str) -> str:
        """``vdla_model.h``: the runner's API and the graph's inputs and outputs."""
        g = self.graph

        def describe(kind: str, names) -> str:
            lines = []
            for i, t in enumerate(names):
                tensor = g.tensors[t]
                shape = " x ".join(str(d) for d in tensor.shape)
                lines.append(f" *   {kind} {i}: {t!r}, {tensor.dtype} [{shape}] "
                             f"({_nbytes(g, t)} bytes)")
            return "\n".join(lines)

        guard = re.sub(r"\W", "_", name.removesuffix(".h")).upper() + "_H"
        return f"""/* {name}: the graph {g.name!r} compiled by vdla's CPU target ({self.isa.name}).
 *
{describe("input", g.inputs)}
{describe("output", g.outputs)}
 *
 * All tensors are plain C arrays in row-major order (NCHW for images).
 *
 *     vdla_model *m = vdla_model_load("model.params", 0);   // 0: OpenMP's threads
 *     vdla_model_infer(m, inputs, outputs);                 // arrays of pointers
 *     vdla_model_free(m);
 *
 * or, with buffers of your own (no allocation, no file):
 *
 *     vdla_model_run(params, arena, ws, inputs, outputs);
 *
 * where params holds vdla_model_params_size() bytes (the params file after its 16-byte
 * header), arena vdla_model_arena_size() and ws vdla_model_workspace_size(threads)
 * bytes, each 64-byte aligned. Functions return 0 on success.
 */
#ifndef {guard}
#define {guard}

#include <stddef.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define VDLA_MODEL_INPUTS {len(g.inputs)}
#define VDLA_MODEL_OUTPUTS {len(g.outputs)}
{self._size_macros()}
size_t vdla_model_params_size(void);
size_t vdla_model_arena_size(void);
size_t vdla_model_workspace_size(int threads);
int vdla_model_run(const unsigned char *params, unsigned char *arena, unsigned char *ws,
                   const void *const *inputs, void *const *outputs);
/* the same, each op's wall time in seconds[] (one per op, in the graph's order) */
int vdla_model_run_timed(const unsigned char *params, unsigned char *arena,
                         unsigned char *ws, const void *const *inputs,
                         void *const *outputs, double *seconds);
void vdla_set_threads(int threads);
/* OpenMP's worker threads pinned one per core but `caller` (-1: the calling thread's
   current one), which it returns (vdla_model_load does this); while a run lasts the
   calling thread is held on that core, and let go after. */
int vdla_pin_workers(int caller);

typedef struct vdla_model vdla_model;
/* Reads the params file; NULL (and a message on stderr) if it is missing or not this
   model's. threads: OpenMP threads (0: OpenMP's default). */
vdla_model *vdla_model_load(const char *params_path, int threads);
int vdla_model_infer(vdla_model *model, const void *const *inputs, void *const *outputs);
void vdla_model_free(vdla_model *model);

#ifdef __cplusplus
}}
#endif
#endif
"""

    def _size_macros(self) -> str:
        g = self.graph
        lines = [f"#define VDLA_MODEL_INPUT{i}_BYTES {_nbytes(g, t)}"
                 for i, t in enumerate(g.inputs)]
        lines += [f"#define VDLA_MODEL_OUTPUT{i}_BYTES {_nbytes(g, t)}"
                  for i, t in enumerate(g.outputs)]
        return "\n".join(lines) + "\n"

    def params_file(self) -> bytes:
        return PARAMS_MAGIC + int(self.blob.size).to_bytes(8, "little") + self.blob.tobytes()

    def write_project(self, out_dir: str | os.PathLike, *, name: str = "vdla_model") -> Path:
        """Write the stand-alone project into `out_dir` (see the module docstring).

        Files: ``model.c`` (kernels and runner), ``vdla_cpu.h``, ``vdla_model.h`` (the
        API), ``loader.c`` (`vdla_model_load` & co.), ``run_model.c`` (an example that
        reads raw inputs from files and writes raw outputs), ``model.params``, a
        Makefile (``lib<name>.so``, ``lib<name>.a``, ``run_model``) and a README.
        """
        if not self.complete:
            raise ValueError("write_project: the CPU target does not run every node of "
                             f"graph {self.graph.name!r}, so there is no whole program")
        sources = {HEADER: header_text(), "model.c": self.source(),
                   "vdla_model.h": self.header("vdla_model.h"), "loader.c": _LOADER}
        out = write_project(sources, out_dir, name=name, flags=self.isa.flags)
        atomic_write(out / "run_model.c", _example(self.graph).encode())
        atomic_write(out / "model.params", self.params_file())
        makefile = (out / "Makefile").read_text().replace(
            "all: ", "all: run_model ", 1).replace(
            "clean:\n\trm -f ", "clean:\n\trm -f run_model ", 1)
        makefile += (f"\nrun_model: run_model.c lib{name}.a vdla_model.h\n"
                     f"\t$(CC) $(CFLAGS) $(OPENMP) -o $@ run_model.c lib{name}.a $(LDLIBS)\n")
        atomic_write(out / "Makefile", makefile.encode())
        atomic_write(out / "README.md", _readme(self, name).encode())
        return out


_LOADER = r"""/* vdla_model_load & co.: the params file, an arena and a workspace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "vdla_model.h"

struct vdla_model {
    unsigned char *params, *arena, *ws;
};

static void *vdla_alloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}

vdla_model *vdla_model_load(const char *path, int threads) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "vdla_model_load: cannot open %s\n", path); return NULL; }
    char magic[8]; uint64_t size = 0;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "VDLAPRM1", 8) != 0
            || fread(&size, 8, 1, f) != 1 || size != vdla_model_params_size()) {
        fprintf(stderr, "vdla_model_load: %s is not this model's params file (expected %zu "
                        "bytes of params)\n", path, vdla_model_params_size());
        fclose(f); return NULL;
    }
    vdla_model *m = calloc(1, sizeof *m);
    if (threads > 0) vdla_set_threads(threads);
    vdla_pin_workers(-1);   /* OpenMP's workers one per core; see model.c */
    int workers = threads > 0 ? threads : 1;
#ifdef _OPENMP
    if (threads <= 0) { extern int omp_get_max_threads(void); workers = omp_get_max_threads(); }
#endif
    m->params = vdla_alloc(size);
    m->arena = vdla_alloc(vdla_model_arena_size());
    m->ws = vdla_alloc(vdla_model_workspace_size(workers));
    if (!m->params || !m->arena || !m->ws || fread(m->params, 1, size, f) != size) {
        fprintf(stderr, "vdla_model_load: cannot read %s\n", path);
        fclose(f); vdla_model_free(m); return NULL;
    }
    fclose(f);
    return m;
}

int vdla_model_infer(vdla_model *m, const void *const *inputs, void *const *outputs) {
    return m ? vdla_model_run(m->params, m->arena, m->ws, inputs, outputs) : 1;
}

void vdla_model_free(vdla_model *m) {
    if (!m) return;
    free(m->params); free(m->arena); free(m->ws); free(m);
}
"""


def _example(graph: Graph) -> str:
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    return f"""/* run_model: vdla_model.h's API from a program.
 *   ./run_model model.params IN_0 ... OUT_0 ... [REPEATS]
 * reads each input's raw bytes from a file, runs the model REPEATS times (default 1),
 * writes each output's raw bytes, prints the mean time per run (after one untimed run). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "vdla_model.h"

static const size_t in_bytes[] = {{{", ".join(f"VDLA_MODEL_INPUT{i}_BYTES" for i in range(n_in))}}};
static const size_t out_bytes[] = {{{", ".join(f"VDLA_MODEL_OUTPUT{i}_BYTES" for i in range(n_out))}}};

int main(int argc, char **argv) {{
    if (argc < 2 + {n_in + n_out}) {{
        fprintf(stderr, "usage: %s model.params{" IN" * n_in}{" OUT" * n_out} [REPEATS]\\n", argv[0]);
        return 2;
    }}
    vdla_model *m = vdla_model_load(argv[1], 0);
    if (!m) return 1;
    const void *inputs[{max(n_in, 1)}]; void *outputs[{max(n_out, 1)}];
    for (int i = 0; i < {n_in}; i++) {{
        void *buf = malloc(in_bytes[i]);
        FILE *f = fopen(argv[2 + i], "rb");
        if (!f || fread(buf, 1, in_bytes[i], f) != in_bytes[i]) {{
            fprintf(stderr, "cannot read %zu bytes from %s\\n", in_bytes[i], argv[2 + i]);
            return 1;
        }}
        fclose(f);
        inputs[i] = buf;
    }}
    for (int i = 0; i < {n_out}; i++) outputs[i] = malloc(out_bytes[i]);
    int repeats = argc > 2 + {n_in + n_out} ? atoi(argv[2 + {n_in + n_out}]) : 1;
    if (repeats < 1) repeats = 1;
    /* one run first: it starts OpenMP's threads and touches every buffer */
    if (vdla_model_infer(m, inputs, outputs)) {{ fprintf(stderr, "run failed\\n"); return 1; }}
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < repeats; r++)
        if (vdla_model_infer(m, inputs, outputs)) {{ fprintf(stderr, "run failed\\n"); return 1; }}
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < {n_out}; i++) {{
        FILE *f = fopen(argv[2 + {n_in} + i], "wb");
        if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) {{
            fprintf(stderr, "cannot write %s\\n", argv[2 + {n_in} + i]);
            return 1;
        }}
        fclose(f);
    }}
    printf("%.3f ms per run (%d runs)\\n",
           ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / repeats, repeats);
    vdla_model_free(m);
    return 0;
}}
"""


def _readme(program: Program, name: str) -> str:
    g = program.graph
    io = "\n".join(f"- input {i}: `{t}`, {g.tensors[t].dtype} {list(g.tensors[t].shape)}"
                   for i, t in enumerate(g.inputs))
    io += "\n" + "\n".join(f"- output {i}: `{t}`, {g.tensors[t].dtype} "
                           f"{list(g.tensors[t].shape)}" for i, t in enumerate(g.outputs))
    return f"""# {g.name}: C library written by vdla's CPU target

Built for `{program.isa.name}` (compiled with `{" ".join(BASE_FLAGS + program.isa.flags)}`
and OpenMP). {len(program.nodes)} ops; params {program.blob.size:,} bytes in `model.params`.

{io}

    make                      # lib{name}.so, lib{name}.a, run_model
    ./run_model model.params input.bin output.bin 10

`vdla_model.h` documents the API. Link `lib{name}.a` with `-fopenmp -lm`.
"""
