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
import textwrap
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from vdla._fileio import atomic_write
from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.build import BASE_FLAGS, CBuild, write_project
from vdla.compiler.targets.cpu.cfiles import render, static_text
from vdla.compiler.targets.cpu.fusion import Fusion
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import ALIGN, Kernel, align
from vdla.compiler.targets.cpu.layout import PLAIN, blocked_bytes, convert_kernel, describe
from vdla.compiler.targets.cpu.library import HEADER, build_kernels, header_text, kernels_source

__all__ = ["PARAMS_MAGIC", "Program", "Step", "VIEW_OPS", "plan_memory", "plan_steps",
           "view_roots"]

#: The params file's first 8 bytes; then the blob's size (little-endian uint64), the blob.
PARAMS_MAGIC = b"VDLAPRM1"

_C_TYPES = {"float32": "float", "int8": "int8_t", "int32": "int32_t", "uint8": "uint8_t",
            "float64": "double", "int64": "int64_t"}


def _nbytes(graph: Graph, tensor: str, block: int = PLAIN) -> int:
    t = graph.tensors[tensor]
    itemsize = np.dtype(DTYPES[t.dtype]).itemsize
    return blocked_bytes(t.shape, itemsize, block)


#: A buffer of the program: a tensor in one layout (`vdla.compiler.targets.cpu.layout`).
Buffer = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class Step:
    """One call of the runner: a node's kernel, or a layout conversion (``node`` None).

    name : the node's name, or ``layout:TENSOR:NCHW->NCHW16c`` for a conversion
    kernel : the function it calls
    reads : the buffers of ``kernel.inputs``, in order; writes : its output buffer
    fused : for a fused kernel (`vdla.compiler.targets.cpu.fusion`), the nodes whose work
        it does besides `node`'s (their time is counted in `node`'s)
    view : a node of `VIEW_OPS` whose output is its input's bytes: the runner calls
        nothing and gives the output its input's buffer (`view_roots`)
    """

    name: str
    kernel: Kernel
    reads: tuple[Buffer, ...]
    writes: Buffer
    node: Node | None = None
    fused: tuple[str, ...] = ()
    view: bool = False


#: Ops whose output holds its input's bytes unchanged (only the shape differs): in the
#: whole-graph runner such a node is a view of its input, not a copy. ViT-tiny has 98
#: reshapes, a 151 kB copy each: 1.3 ms of its 22 ms on an AMD EPYC (2 threads).
VIEW_OPS = frozenset({"reshape", "flatten"})


def _is_view(graph: Graph, node: Node, kernel: Kernel) -> bool:
    """Whether `node` runs as a view (`Step.view`): a `VIEW_OPS` node whose one computed
    input and output are plain, and whose output is not a graph output (that one is the
    caller's buffer, so it is written)."""
    return (node.op in VIEW_OPS and len(kernel.inputs) == 1
            and kernel.in_block(0) == PLAIN == kernel.out_block
            and node.outputs[0] not in graph.outputs)


def view_roots(steps: Sequence[Step]) -> dict[Buffer, Buffer]:
    """The buffer each view step's output shares: its input's, or (a view of a view) the
    buffer at the start of the chain."""
    roots: dict[Buffer, Buffer] = {}
    for step in steps:
        if step.view:
            roots[step.writes] = roots.get(step.reads[0], step.reads[0])
    return roots


def plan_steps(graph: Graph, nodes: Sequence[Node], kernels: Mapping[str, Kernel],
               fused: Mapping[str, Fusion] | None = None) -> list[Step]:
    """The nodes' kernels in order, with a conversion before every read of a tensor in
    another layout than its producer wrote (one per tensor and layout, reused by later
    readers), and after a node whose graph output it writes blocked. Graph inputs and
    outputs are plain. `fused`: node name -> the `Fusion` that runs it with the nodes it
    absorbs (whose own steps are left out), writing its `Fusion.output` if it names
    one."""
    fused = fused or {}
    absorbed = {n for f in fused.values() for n in f.absorbed}
    written: dict[str, int] = {t: PLAIN for t in graph.inputs}
    have: set[Buffer] = {(t, PLAIN) for t in graph.inputs}
    steps: list[Step] = []

    def convert(tensor: str, block: int) -> None:
        if (tensor, block) in have:
            return
        src = written[tensor]
        t = graph.tensors[tensor]
        kernel = convert_kernel(t.shape, t.dtype, src, block)
        steps.append(Step(f"layout:{tensor}:{describe(src)}->{describe(block)}", kernel,
                          ((tensor, src),), (tensor, block)))
        have.add((tensor, block))

    for node in nodes:
        if node.name in absorbed:       # runs in the fused kernel of another node
            written.setdefault(node.outputs[0], kernels[node.name].out_block)
            continue
        fusion = fused.get(node.name)
        kernel = kernels[node.name] if fusion is None else fusion.kernel
        reads = []
        for k, tensor in enumerate(kernel.inputs):
            if tensor not in written:        # produced by a node not in this program
                written[tensor] = PLAIN
                have.add((tensor, PLAIN))
            convert(tensor, kernel.in_block(k))
            reads.append((tensor, kernel.in_block(k)))
        out = (fusion.output if fusion else "") or node.outputs[0]
        written[out] = kernel.out_block
        have.add((out, kernel.out_block))
        steps.append(Step(node.name, kernel, tuple(reads), (out, kernel.out_block), node,
                          () if fusion is None else fusion.absorbed,
                          fusion is None and _is_view(graph, node, kernel)))
        if out in graph.outputs and kernel.out_block != PLAIN:
            convert(out, PLAIN)
    return steps


def fused_key(name: str) -> str:
    """The key of node `name`'s fused kernel in `Program.offsets`."""
    return f"fused:{name}"


def plan_memory(graph: Graph, steps: Sequence[Step]) -> tuple[dict[Buffer, int], int]:
    """Arena offsets (`ALIGN`-aligned) of the buffers `steps` write that are not the
    graph's inputs or plain outputs, and the arena's size: first fit, in execution
    order, of each buffer over the span from its writer to its last reader. A view's
    output (`Step.view`) gets its root's offset (`view_roots`), and keeps the root alive
    until its own last reader."""
    roots = view_roots(steps)
    last_use: dict[Buffer, int] = {}
    for i, step in enumerate(steps):
        for b in step.reads:
            last_use[roots.get(b, b)] = i
    placed: list[tuple[int, int, int]] = []   # (offset, end, last step alive)
    offsets, size = {}, 0
    for i, step in enumerate(steps):
        live = [p for p in placed if p[2] >= i]
        b = step.writes
        if step.view or (b[1] == PLAIN and b[0] in graph.outputs):
            continue
        need = align(max(_nbytes(graph, *b), 1))
        offset = 0
        for start, end, _ in sorted(live):
            if offset + need <= start:
                break
            offset = max(offset, align(end))
        placed.append((offset, offset + need, last_use.get(b, i)))
        offsets[b] = offset
        size = max(size, offset + need)
    offsets.update({b: offsets[root] for b, root in roots.items() if root in offsets})
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
    steps : what the whole-graph runner calls (`plan_steps`: the nodes, and layout
        conversions between them), when the program is `complete`
    arena : buffer -> arena offset, and `arena_size` (for the whole-graph runner)
    """

    graph: Graph
    nodes: tuple[Node, ...]
    kernels: Mapping[str, Kernel]
    isa: Isa
    offsets: Mapping[str, int]
    blob: np.ndarray
    steps: tuple[Step, ...]
    arena: Mapping[Buffer, int]
    arena_size: int
    build: CBuild | None = None

    @classmethod
    def create(cls, graph: Graph, nodes: Sequence[Node], kernels: Mapping[str, Kernel],
               isa: Isa, fused: Mapping[str, Fusion] | None = None) -> "Program":
        """The program of `nodes` with `kernels`; `fused` (node name -> `Fusion`, see
        `plan_steps`) changes what the whole-graph runner calls, not the nodes' own
        kernels (the session's op-by-op calls)."""
        steps, arena, arena_size = (), {}, 0
        if cls._covers(graph, nodes):
            steps = tuple(plan_steps(graph, nodes, kernels, fused))
            arena, arena_size = plan_memory(graph, steps)
        # The nodes' params, then the fused kernels' (`fused_key`).
        parts = [(node.name, kernels[node.name]) for node in nodes]
        parts += [(fused_key(step.name), step.kernel) for step in steps if step.fused]
        offsets, size = {}, 0
        for name, kernel in parts:
            offsets[name] = size
            size = align(size + kernel.params.size)
        blob = np.zeros(max(size, ALIGN), np.uint8)
        for name, kernel in parts:
            blob[offsets[name]:offsets[name] + kernel.params.size] = kernel.params
        return cls(graph, tuple(nodes), dict(kernels), isa, offsets, blob, steps, arena,
                   arena_size)

    @staticmethod
    def _covers(graph: Graph, nodes: Sequence[Node]) -> bool:
        return {n.name for n in nodes} == {n.name for n in graph.nodes()}

    @functools.cached_property
    def complete(self) -> bool:
        """Whether it runs every node of the graph (and so has ``vdla_model_run``).
        Cached: the graph's node order is a topological sort, too slow for every run."""
        return self._covers(self.graph, self.nodes)

    @property
    def conversions(self) -> tuple[Step, ...]:
        """The runner's layout conversions."""
        return tuple(step for step in self.steps if step.node is None)

    def _all_kernels(self) -> list[Kernel]:
        return [self.kernels[n.name] for n in self.nodes] + [
            step.kernel for step in self.steps if step.node is None or step.fused]

    def workspace(self, threads: int) -> int:
        """Scratch bytes the largest op needs on `threads` threads."""
        return max([k.workspace(threads) for k in self._all_kernels()] + [ALIGN])

    # --- C --------------------------------------------------------------------------------

    def source(self) -> str:
        """The library's C text: the kernels, and the runner when `complete`."""
        return kernels_source(self._all_kernels()) + (
            self.runner_source() if self.complete else "")

    def runner_source(self) -> str:
        """``vdla_model_run`` and the size queries (see `header`). ``seconds`` gets one
        figure per step (`steps`: nodes and conversions, in order)."""
        g = self.graph
        where = {(name, PLAIN): f"(unsigned char *)inputs[{i}]"
                 for i, name in enumerate(g.inputs)}
        where.update({(name, PLAIN): f"(unsigned char *)outputs[{i}]"
                      for i, name in enumerate(g.outputs)})
        where.update({b: f"arena + {off}" for b, off in self.arena.items()})
        where.update({b: where[root] for b, root in view_roots(self.steps).items()})
        calls = []
        for k, step in enumerate(self.steps):
            kernel = step.kernel
            if step.view:
                calls.append(f"    /* {step.node.name} ({step.node.op}): a view of "
                             f"{step.reads[0][0]} */")
                continue
            ins = ", ".join(f"(const void *){where[b]}" for b in step.reads) or "NULL"
            params = ("params" if step.node is None else
                      f"params + {self.offsets[fused_key(step.name) if step.fused else step.name]}")
            what = "".join(f"{n} + " for n in step.fused) + (
                f"{step.node.name} ({step.node.op})" if step.node else step.name)
            calls.append(f"    {{   /* {what} */\n"
                         f"        const void *in[] = {{{ins}}};\n"
                         f"        if (seconds) vdla_tick(&t0);\n"
                         f"        {kernel.name}(in, {where[step.writes]}, {params}, ws);\n"
                         f"        if (seconds) seconds[{k}] = vdla_tock(&t0);\n"
                         + (f"        if (vdla_error()) {{ vdla_release(&held); return 2; }}\n"
                            if kernel.checks else "") + "    }")
        ws_terms = sorted({(align(k.shared_bytes), align(k.thread_bytes))
                           for k in self._all_kernels()})
        ws_lines = "\n".join(f"    m = vdla_max_size(m, (size_t){s} + (size_t)threads * {t});"
                             for s, t in ws_terms)
        return render("runner.c", GRAPH=repr(g.name), OPS=len(self.steps),
                      PARAMS_SIZE=self.blob.size, ARENA_SIZE=max(self.arena_size, ALIGN),
                      ALIGN=ALIGN, WORKSPACE_TERMS=ws_lines, CALLS="\n".join(calls))

    def compile(self, *, log: Callable[[str], None] | None = None) -> "Program":
        """This program with its library built (or found in the cache)."""
        build = build_kernels(self._all_kernels(), self.isa,
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
        return render("vdla_model.h", FILE=name, GRAPH=repr(g.name), ISA=self.isa.name,
                      INPUTS=describe("input", g.inputs),
                      OUTPUTS=describe("output", g.outputs), GUARD=guard,
                      N_INPUTS=len(g.inputs), N_OUTPUTS=len(g.outputs),
                      SIZE_MACROS=self._size_macros())

    def _size_macros(self) -> str:
        g = self.graph
        lines = [f"#define VDLA_MODEL_INPUT{i}_BYTES {_nbytes(g, t)}"
                 for i, t in enumerate(g.inputs)]
        lines += [f"#define VDLA_MODEL_OUTPUT{i}_BYTES {_nbytes(g, t)}"
                  for i, t in enumerate(g.outputs)]
        lines.append(f"#define VDLA_MODEL_STEPS {len(self.steps)}")
        return "\n".join(lines) + "\n"

    def params_file(self) -> bytes:
        return PARAMS_MAGIC + int(self.blob.size).to_bytes(8, "little") + self.blob.tobytes()

    def write_project(self, out_dir: str | os.PathLike, *, name: str = "vdla_model",
                      example: Mapping[str, np.ndarray] | None = None,
                      exact: bool = True) -> Path:
        """Write the stand-alone project into `out_dir` (see the module docstring).

        Files: ``model.c`` (kernels and runner), ``vdla_cpu.h``, ``vdla_model.h`` (the
        API), ``loader.c`` (`vdla_model_load` & co.), ``run_model.c`` (an example that
        reads raw inputs from files and writes raw outputs), ``model.params``, a
        Makefile (``lib<name>.so``, ``lib<name>.a``, ``run_model``) and a README that
        gives the byte layout of ``run_model``'s files.

        example : {tensor name: array} of every graph input and output: written as
            ``in.bin`` and ``out.bin`` (``in0.bin``, ``in1.bin``, ... for several) in
            ``run_model``'s layout, so the project can be run and checked at once
        exact : whether ``run_model`` reproduces the example's outputs byte for byte
            (the quantized graph) or only closely (float sums in another order)
        """
        if not self.complete:
            raise ValueError("write_project: the CPU target does not run every node of "
                             f"graph {self.graph.name!r}, so there is no whole program")
        sources = {HEADER: header_text(), "model.c": self.source(),
                   "vdla_model.h": self.header("vdla_model.h"),
                   "loader.c": static_text("loader.c")}
        out = write_project(sources, out_dir, name=name, flags=self.isa.flags,
                            programs={"run_model": ["vdla_model.h"]})
        atomic_write(out / "run_model.c", _example(self.graph).encode())
        atomic_write(out / "model.params", self.params_file())
        if example is not None:
            for names, files in ((self.graph.inputs, io_files(self.graph.inputs, "in")),
                                 (self.graph.outputs, io_files(self.graph.outputs, "out"))):
                for tensor, file in zip(names, files):
                    dtype = np.dtype(DTYPES[self.graph.tensors[tensor].dtype]).newbyteorder("<")
                    atomic_write(out / file, np.ascontiguousarray(example[tensor],
                                                                  dtype).tobytes())
        atomic_write(out / "README.md", _readme(self, name, example is not None,
                                                exact).encode())
        return out


def io_files(tensors: Sequence[str], stem: str) -> list[str]:
    """The example files of `tensors` (a graph's inputs or outputs): ``STEM.bin`` for
    one, ``STEM0.bin``, ``STEM1.bin``, ... for several."""
    if len(tensors) == 1:
        return [f"{stem}.bin"]
    return [f"{stem}{i}.bin" for i in range(len(tensors))]


def _example(graph: Graph) -> str:
    """``run_model.c``: reads each input from a file, runs, writes each output."""
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    return render(
        "run_model.c", N_INPUTS=n_in, N_OUTPUTS=n_out, FILES=n_in + n_out,
        INPUT_BYTES=", ".join(f"VDLA_MODEL_INPUT{i}_BYTES" for i in range(n_in)),
        OUTPUT_BYTES=", ".join(f"VDLA_MODEL_OUTPUT{i}_BYTES" for i in range(n_out)),
        USAGE=" IN" * n_in + " OUT" * n_out,
        # C has no zero-length arrays
        INPUT_SLOTS=max(n_in, 1), OUTPUT_SLOTS=max(n_out, 1))


def _readme(program: Program, name: str, example: bool = False, exact: bool = True) -> str:
    g = program.graph
    ins, outs = io_files(g.inputs, "in"), io_files(g.outputs, "out")

    def line(kind: str, i: int, t: str, file: str) -> str:
        tensor = g.tensors[t]
        return (f"- {kind} {i}: `{t}`, {tensor.dtype} {list(tensor.shape)}, "
                f"{_nbytes(g, t):,} bytes (`{file}`)")

    io = "\n".join([*(line("input", i, t, f) for i, (t, f) in enumerate(zip(g.inputs, ins))),
                    *(line("output", i, t, f) for i, (t, f) in enumerate(zip(g.outputs, outs)))])
    mine = [f"my_{f}" for f in outs]
    if not example:
        text = "Write the input files yourself in that layout."
    else:
        match = ("byte for byte" if exact else
                 "closely, not byte for byte (its float sums run in another order than "
                 "the reference's; `vdla compile --check` checks the tolerance)")
        text = textwrap.fill(
            f"`vdla compile` wrote an example input, {', '.join(f'`{f}`' for f in ins)} "
            "(the model's seeded input: `vdla compile --seed` picks it), and the output "
            f"the reference computes for it, {', '.join(f'`{f}`' for f in outs)}; "
            f"`run_model` gives it {match}:", 88) + (
                f"\n\n    ./run_model model.params {' '.join(ins)} {' '.join(mine)}\n"
                + "".join(f"    cmp {m} {f}\n" for m, f in zip(mine, outs) if exact))
    return render("README.md", GRAPH=g.name, ISA=program.isa.name,
                  FLAGS=" ".join(BASE_FLAGS + program.isa.flags), OPS=len(program.nodes),
                  PARAMS_BYTES=f"{program.blob.size:,}", TENSORS=io,
                  SHARED=f"lib{name}.so", STATIC=f"lib{name}.a", IN_FILES=" ".join(ins),
                  OUT_FILES_RUN=" ".join(mine), EXAMPLE=text.rstrip("\n"))
