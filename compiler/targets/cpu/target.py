"""The host CPU as a target: the front half's graph, int8 or float, compiled to C.

    target = CpuTarget(threads=2)                        # or get("cpu", threads=2)
    compiled = compile_model(graph, target)              # one C library for the graph
    with compiled.session() as session:
        result = session.run({"input": x})               # op by op, with per-op stats
        outputs = session.run_graph({"input": x})        # the whole graph in one C call

`compile_nodes` generates one C function per node (convolutions `conv`, dense layers
`dense`, everything else `ops`), with the schedule the caller gives (the tuner's
records) or the default chooser's, builds them into one library with the system C
compiler for the machine's instruction set (`isa`: AVX-512 VNNI, AVX2 or portable C;
gcc ``-O3 -march=native``, OpenMP; cached by content hash) and, when the target runs
every node, a runner for the whole graph (`program`). Nodes it refuses fall back to the
host target. int8 graphs are bit-exact against the integer reference; float graphs
differ from the float reference only by float32 rounding.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import INT8_PRODUCTS_MAX
from vdla.compiler.targets.base import (CompiledOp, GraphRun, OpRun, Progress, Support, Target,
                                        TargetSession)
from vdla.compiler.targets.options import TargetOption
from threadpoolctl import threadpool_limits

from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu import layout
from vdla.compiler.targets.cpu import ops as cpu_ops
from vdla._platform import cpu_name
from vdla.compiler.targets.cpu.build import BuildError, machine_features
from vdla.compiler.targets.cpu.fusion import fusions
from vdla.compiler.targets.cpu.kernel import Kernel
from vdla.compiler.targets.cpu.layout_choice import choose_layouts
from vdla.compiler.targets.cpu.library import (aligned_empty, function, load, raise_error,
                                              start_team)
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.machine import (NOMINAL, MachineCosts, MachineModel,
                                              cache_file, machine_model, read_machine)
from vdla.compiler.targets.cpu.program import Program
from vdla.compiler.targets.cpu.tuning import cpu_tasks

__all__ = ["CpuTarget", "default_threads", "claim_cores"]

_GEMM = {"qconv2d": ("int8", "int32"), "qdense": ("int8", "int32"),
         "conv2d": ("float32", "float32"), "dense": ("float32", "float32")}
_PLAIN = {"qconv2d": ("NCHW", "OIHW", "NCHW"), "conv2d": ("NCHW", "OIHW", "NCHW"),
          "qdense": ("NC", "OI", "NC"), "dense": ("NC", "OI", "NC")}


def claim_cores() -> None:
    """Put numpy's BLAS (OpenBLAS) on one thread, for this process (once).

    Its worker threads spin for a while after every BLAS call, and two spinning pools
    on the same cores slow each other down: on this project's 2-core machines ResNet-18
    ran in 7 ms after an idle second, 14-330 ms right after the numpy reference. With one
    BLAS thread there is no second pool, and the reference itself ran 2.4x faster.
    (The target's own team is set up by `library.start_team`.)
    """
    global _BLAS_LIMIT
    if _BLAS_LIMIT is None:
        _BLAS_LIMIT = threadpool_limits(limits=1, user_api="blas")


_BLAS_LIMIT = None


def default_threads() -> int:
    """OpenMP's default team: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True, eq=False)
class CpuOp:
    """A compiled node: its kernel in the `program` (which holds the library)."""

    program: Program
    node: str

    @property
    def kernel(self) -> Kernel:
        return self.program.kernels[self.node]


class CpuTarget(Target):
    """The host CPU, through generated C.

    threads : OpenMP threads a session uses (None: the cores this process may use)
    isa : the instruction set to generate for: a name of `vdla.compiler.targets.cpu.isa.ISAS`
        (``amx``, ``avx512vnni``, ``avx2``, ``portable``) or None for the best this
        machine runs (``amx`` only where the OS grants the tile state); or an `Isa`,
        taken as it is (``amx.modelled``: the tile kernels on the software model of
        the tiles, which runs anywhere)
    log : receives build progress (default: nothing)
    fuse : whether the whole-graph runner runs fusable pairs (a depthwise and a pointwise
        convolution, a convolution and its max pool) as one kernel (`fusion`); False
        runs every node's own (per-layer figures)
    cpu : the name of the CPU a training set's platform was measured on (its manifest
        names it: `from_platform`): `isa` is then taken as named, not probed (this
        machine may lack it), and the target's tasks read that CPU's records and measure
        only on a machine of that name. None (the default): this machine
    machine : that CPU's machine model (a `MachineModel` or its `to_dict`), what the
        default schedules and the cost models' features read of it (`costs`); only with
        `cpu`. None: this machine's, measured (`machine.machine_model`); for another
        CPU's platform, `machine.NOMINAL`'s costs
    bf16 : run the float graph's convolutions of one group, dense layers and batched
        products in bfloat16 on AMX tiles (``--precision bf16``: `precisions` is then
        int8 and bf16, the rest of the float graph float32); needs the ``amx``
        instruction set and AMX-BF16
    """

    name = "cpu"
    description = ("the host CPU: generated C (AMX tiles, AVX-512 VNNI, AVX2 or portable), "
                   "built with the system C compiler (OpenMP)")
    measure_backends = ("wall",)
    cli_options = (
        TargetOption("--threads", "OpenMP threads of the generated code (default: the cores "
                                  "this process may use); tuning records are kept per count",
                     type=int, metavar="N", commands=("run", "compare", "tune", "compile")),
        TargetOption("--isa", f"instruction set of the generated code: "
                              f"{', '.join(cpu_isa.ISAS)} (default: the best this machine's "
                              "compiler offers)", metavar="NAME"),
    )

    @classmethod
    def from_cli(cls, options, *, precision: str = "int8", log=None) -> "CpuTarget":
        """``--threads`` and ``--isa``; an ISA this machine lacks is an error now, before
        any model is loaded."""
        threads, isa = options.get("threads"), options.get("isa")
        if threads is not None and threads < 1:
            raise ValueError(f"--threads must be a positive integer, not {threads}")
        target = cls(threads=threads, isa=isa, bf16=precision == "bf16")
        if isa is not None or target.bf16:
            target.isa          # probes the compiler: ValueError for an ISA it lacks
        return target

    def __init__(self, *, threads: int | None = None, isa: str | None = None, log=None,
                 fuse: bool = True, cpu: str | None = None,
                 machine: MachineModel | Mapping | None = None, bf16: bool = False):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"CpuTarget: threads must be a positive integer, not {threads!r}")
        if isa is not None and not isinstance(isa, (str, cpu_isa.Isa)):
            raise ValueError(f"CpuTarget: isa must be one of {', '.join(cpu_isa.ISAS)} or "
                             f"None, not {isa!r}")
        if not isinstance(fuse, bool):
            raise ValueError(f"CpuTarget: fuse must be True or False, not {fuse!r}")
        if not isinstance(bf16, bool):
            raise ValueError(f"CpuTarget: bf16 must be True or False, not {bf16!r}")
        if cpu is not None and (not isinstance(cpu, str) or not cpu or isa is None):
            raise ValueError(f"CpuTarget: a platform of another CPU needs the CPU's name and "
                             f"its isa, not cpu={cpu!r}, isa={isa!r}")
        if machine is not None and cpu is None:
            raise ValueError("CpuTarget: a machine model is another CPU's platform's: give "
                             "its cpu too")
        if isinstance(machine, Mapping):
            machine = MachineModel.from_dict(machine)
        given = isa if isinstance(isa, cpu_isa.Isa) else None
        self.threads, self._log = threads, log
        self._isa_name = given.name if given is not None else isa
        self.fuse, self.cpu, self._machine, self.bf16 = fuse, cpu, machine, bf16
        self._isa, self._given = given, given
        self._costs: MachineCosts | None = None
        if given is not None and bf16:
            self._check_bf16()
        claim_cores()

    @property
    def isa(self) -> cpu_isa.Isa:
        """The instruction set the code is generated for (probed once; another CPU's
        platform's as named: this machine may lack it)."""
        if self._isa is None:
            if self._isa_name is None:
                self._isa = cpu_isa.detect()
            else:
                chosen = cpu_isa.get(self._isa_name)
                why = None if self.cpu is not None else chosen.refusal(machine_features())
                if why is not None:
                    raise ValueError(f"CpuTarget: {chosen.name} does not run here: {why}")
                self._isa = chosen
            if self.bf16:
                self._check_bf16()
        return self._isa

    def _check_bf16(self) -> None:
        """ValueError unless bfloat16 runs on this target's tiles here."""
        why = None
        if not self._isa.tiles:
            amx = cpu_isa.get("amx").refusal(machine_features())
            why = (f"its instruction set is {self._isa.name}"
                   + (f" (amx: {amx})" if amx else ""))
        elif self.cpu is None and self._given is None and not machine_features().amx_bf16:
            why = "this machine's AMX has no bfloat16 (its compiler lists no __AMX_BF16__)"
        if why is not None:
            self._isa = self._given
            raise ValueError(f"CpuTarget: precision bf16 runs the float graph's "
                             f"convolutions, dense layers and batched products on AMX tiles "
                             f"(tdpbf16ps), and this target cannot: {why}")

    @property
    def precisions(self) -> tuple[str, ...]:
        """int8, and the float graph in float32, or with `bf16` in bfloat16."""
        return ("int8", "bf16" if self.bf16 else "float32")

    @property
    def costs(self) -> MachineCosts:
        """What the default schedules read of the machine (`MachineModel.costs`): this
        machine's measured model (read, unmeasured, without a C compiler), or the model
        another CPU's platform came with (`machine.NOMINAL` without one)."""
        if self._costs is None:
            known = self._machine is not None or self.cpu is None
            self._costs = self._machine_model().costs() if known else NOMINAL
        return self._costs

    def _machine_model(self) -> MachineModel:
        """The machine the code is for: another CPU's platform's model, or this machine's
        (measured once, then cached; read only when it cannot be measured)."""
        if self._machine is not None:
            return self._machine
        try:
            return machine_model()
        except (BuildError, OSError):
            return read_machine()

    @property
    def team(self) -> int:
        """Threads a session runs on."""
        return self.threads or default_threads()

    def options(self) -> dict:
        """threads (None: the cores) and the instruction set the code is generated for
        (the requested one when this machine's cannot be probed)."""
        try:
            isa = self.isa.name
        except (OSError, ValueError, RuntimeError):   # no compiler: `repr` still works
            isa = self._isa_name
        return {"threads": self.threads, "isa": isa}

    def machine(self, *, use_cache: bool = True, log=None) -> dict | None:
        """This machine's model (`machine.machine_model`: read, probed and measured once,
        then cached) as {"model", "cache_file", "error"}; without a C compiler, what can
        be read, unmeasured, and why. None for another CPU's platform (`cpu`).

        use_cache : False measures again, even when a cached model exists
        log : receives a line when it measures
        """
        if self.cpu is not None:
            return None
        try:
            model = machine_model(use_cache=use_cache, log=log)
        except (BuildError, OSError) as exc:
            return {"model": read_machine().to_dict(), "cache_file": None, "error": str(exc)}
        return {"model": model.to_dict(), "cache_file": str(cache_file(model)), "error": None}

    def machine_lines(self, machine) -> list[str]:
        """The model's lines (`MachineModel.lines`) and where it is cached, or why it
        was not measured.

        machine : what `machine` returned
        """
        lines = MachineModel.from_dict(machine["model"]).lines()
        if machine["error"] is not None:
            return lines + [f"not measured: {machine['error']}"]
        # The cache under the home folder as ~/...: the line reads the same for everyone.
        path, home = machine["cache_file"], os.path.expanduser("~")
        if path.startswith(home + os.sep):
            path = "~" + path[len(home):]
        return lines + [f"measured once, cached in {path}"]

    def platforms(self, count: int, *, seed: int = 0) -> list["CpuTarget"]:
        """Targets for the first `count` instruction sets this machine runs, widest first,
        from this target's own down (`--isa avx2` starts at avx2; each a platform of its
        own; `seed` draws nothing here). ValueError when there are fewer."""
        features = machine_features()
        runs = [name for name, isa in cpu_isa.ISAS.items() if isa.runs_on(features)]
        if self.isa.name in runs:
            runs = runs[runs.index(self.isa.name):]
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(runs):
            raise ValueError(f"this machine runs {len(runs)} instruction sets from "
                             f"{self.isa.name} down ({', '.join(runs)}), so 0 to {len(runs)} "
                             f"platforms, not {count!r}")
        return [CpuTarget(threads=self.threads, isa=name, log=self._log)
                for name in runs[:count]]

    def platform_params(self) -> dict:
        """threads, isa, the CPU's name and its machine model (`MachineModel.to_dict`:
        flags, caches, figures), so that a training set's rows carry the machine they
        were measured on (absent for another CPU's platform that came without one)."""
        params = {**self.options(), "cpu": self.cpu if self.cpu is not None else cpu_name()}
        if self._machine is not None or self.cpu is None:
            params["machine"] = self._machine_model().to_dict()
        return params

    @classmethod
    def from_platform(cls, params) -> "CpuTarget":
        """The platform a training set's manifest names, as it was measured: on the CPU
        the manifest names, whichever machine reads the set.

        Why not this machine's: a set is a file that any machine trains from
        (scripts/train_cost_model.py, bench/tuner_transfer.py), and the same set must
        give the same model everywhere. Tasks named after this machine's CPU would find
        none of the records of the machine that measured them, and this machine need
        not offer the set's instruction sets (an AVX2-only one reading a set measured
        with AVX-512) for code that is never built here. A manifest that does not name
        the CPU is taken to be this machine's. Its ``machine`` (the model of the machine
        that measured it) is what the default schedules and the features read."""
        if not isinstance(params, dict) or "isa" not in params:
            raise ValueError(f"a cpu platform needs its isa, not {params!r}")
        return cls(threads=params.get("threads"), isa=params["isa"],
                   cpu=params.get("cpu") or cpu_name(), machine=params.get("machine"))

    def capabilities(self) -> list[tuple[str, str]]:
        return [("conv2d, qconv2d", "float32 or int8: any kernel, stride, padding, dilation "
                                    "and groups (depthwise too); bias, residual, ReLU/clip or "
                                    "requantization and clamp; tuned schedules; on amx, int8 "
                                    "(and bf16) of one group on the tiles"),
                ("dense, qdense", "float32 or int8, with bias, residual, activation or "
                                  "requantization; tuned schedules; on amx, int8 (and bf16) "
                                  "on the tiles"),
                *cpu_ops.CAPABILITIES]

    # --- which nodes ----------------------------------------------------------------------

    def supports(self, node: Node, graph: Graph) -> Support:
        if node.op in _GEMM:
            return self._supports_gemm(node, graph)
        if node.op in cpu_ops.OPS:
            return cpu_ops.supports(node, graph)
        return Support(False, f"the CPU target does not run {node.op!r}")

    def _supports_gemm(self, node: Node, graph: Graph) -> Support:
        a = node.attrs
        for key, want in zip(("data_layout", "kernel_layout", "out_layout"), _PLAIN[node.op]):
            if a[key] != want:
                return Support(False, f"{node.op} with {key} {a[key]!r}: the CPU target takes "
                                      f"plain layouts ({want})")
        data, bias_type = _GEMM[node.op]
        x = graph.tensors[node.inputs[0]]
        if x.dtype != data:
            return Support(False, f"{node.op} on {x.dtype} data: the CPU target runs it on "
                                  f"{data}")
        if graph.constant(node.inputs[1]) is None:
            return Support(False, f"{node.op} with computed weights: the CPU target needs "
                                  "constant weights")
        if graph.tensors[node.inputs[1]].dtype != data:
            return Support(False, f"{node.op} with {graph.tensors[node.inputs[1]].dtype} "
                                  f"weights: the CPU target needs {data}")
        if node.input(2) and (graph.constant(node.input(2)) is None
                              or graph.tensors[node.input(2)].dtype != bias_type):
            return Support(False, f"{node.op} with a computed or non-{bias_type} bias: the "
                                  f"CPU target needs a constant {bias_type} bias")
        if node.input(3) and (graph.tensors[node.input(3)].is_constant
                              or graph.tensors[node.input(3)].dtype != data):
            return Support(False, f"{node.op} with a constant or non-{data} residual: the "
                                  "CPU target adds a computed one")
        if data == "int8":
            terms = int(np.prod(graph.tensors[node.inputs[1]].shape[1:]))
            if terms > INT8_PRODUCTS_MAX:
                return Support(False, f"{node.op} sums {terms} products per output, more "
                                      "than an int32 accumulator holds exactly "
                                      f"({INT8_PRODUCTS_MAX})")
        return Support(True, "generated C on the host CPU")

    # --- compiling --------------------------------------------------------------------------

    def kernel(self, node: Node, graph: Graph, schedule: Any = None, *,
               nonnegative: bool | None = None, in_block: int = 0) -> tuple[Kernel, Any]:
        """`node`'s kernel for this target's ISA and threads (`lower.node_kernel`)."""
        return node_kernel(node, graph, self.isa, schedule=schedule, threads=self.team,
                           nonnegative=nonnegative, in_block=in_block, costs=self.costs,
                           bf16=self.bf16)

    def kernels(self, graph: Graph, nodes: Sequence[Node], *, schedules: Mapping[str, Any],
                progress: Progress | None = None, start: int = 0, total: int | None = None,
                memo: dict | None = None) -> tuple[dict[str, Kernel], dict[str, Any]]:
        """Each of `nodes`' kernel (C text, not compiled) and the schedule it used, by
        node name; each reads its input in the layout its producer writes. `memo`, a
        dict kept between calls, holds the kernels made, by node, schedule and input
        layout (`choose_schedules` tries many schedules of a few nodes)."""
        kernels, used = {}, {}
        blocks: dict[str, int] = {}        # tensor -> the layout its producer writes
        for i, node in enumerate(nodes):
            if progress is not None:
                progress(start + i, len(nodes) if total is None else total, node.name)
            first = node.inputs[0] if node.inputs else ""
            schedule, in_block = schedules.get(node.name), blocks.get(first, 0)
            key = (node.name, schedule, in_block)
            made = None if memo is None else memo.get(key)
            if made is None:
                made = self.kernel(node, graph, schedule, in_block=in_block)
                if memo is not None:
                    memo[key] = made
            kernels[node.name], used[node.name] = made
            blocks[node.outputs[0]] = kernels[node.name].out_block
        return kernels, used

    def choose_schedules(self, graph: Graph, options: Mapping[str, Sequence[tuple[Any, Any]]]
                         ) -> dict[str, tuple[Any, Any]]:
        """Each tuned node's recorded schedule, its layout chosen with its neighbours'
        (`layout_choice.choose_layouts`: a node whose fastest schedule writes another
        layout than its neighbours read pays for the conversions)."""
        nodes = [n for n in graph.nodes() if self.supports(n, graph).ok]
        return choose_layouts(graph, nodes, options, self.kernels)

    def compile_nodes(self, graph: Graph, nodes: Sequence[Node], *,
                      schedules: Mapping[str, Any], progress: Progress | None = None,
                      start: int = 0, total: int | None = None) -> list[CompiledOp]:
        total = len(nodes) if total is None else total
        t0 = time.perf_counter()
        kernels, used = self.kernels(graph, nodes, schedules=schedules, progress=progress,
                                     start=start, total=total)
        fused = (fusions(graph, nodes, used, self.isa, self.team, self.costs)
                 if self.fuse else {})
        program = Program.create(graph, nodes, kernels, self.isa, fused).compile(log=self._log)
        seconds = (time.perf_counter() - t0) / max(1, len(nodes))
        return [CompiledOp(node.name, node.op, self.name, "",
                           None if used[node.name] is None else used[node.name].to_dict(),
                           CpuOp(program, node.name), compile_seconds=seconds)
                for node in nodes]

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        return self.compile_nodes(graph, [node], schedules={node.name: schedule})[0]

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> "CpuSession":
        if device is not None:
            raise ValueError("the CPU target runs on the host; it takes no device")
        return CpuSession(self, graph, ops)

    def export(self, compiled, out_dir, *, example=None, exact: bool = True) -> "os.PathLike":
        """Write `compiled` as a stand-alone C project (`Program.write_project`): the
        library and an example program build with ``make``, no Python; `example` (inputs
        and the outputs expected) becomes its ``in.bin`` and ``out.bin``. Every node must
        run on this target (ValueError naming the others)."""
        host = [op for op in compiled.ops if op.target != self.name]
        if host:
            listed = "; ".join(f"{op.name} ({op.op}): {op.reason}" for op in host[:5])
            raise ValueError(f"{len(host)} op(s) of {compiled.graph.name!r} do not run on the "
                             f"CPU target, so it has no stand-alone form: {listed}")
        return compiled.ops[0].kernel.program.write_project(out_dir, example=example,
                                                            exact=exact)

    def tasks(self, graph: Graph) -> list:
        return cpu_tasks(graph, self)


class CpuSession(TargetSession):
    """The programs' libraries loaded, their params in aligned memory, one workspace."""

    def __init__(self, target: CpuTarget, graph: Graph, ops: Sequence[CompiledOp]):
        self.graph, self.threads = graph, target.team
        self._programs: dict[int, tuple[Program, Any, np.ndarray]] = {}
        self._functions = {}
        need = 64
        for op in ops:
            program = op.kernel.program
            if id(program) not in self._programs:
                lib = load(program.build)
                blob = aligned_empty(program.blob.size)
                blob[:] = program.blob
                self._programs[id(program)] = (program, lib, blob)
                need = max(need, program.workspace(self.threads))
            _, lib, blob = self._programs[id(program)]
            fn = ctypes.cast(function(lib, op.kernel.kernel), ctypes.c_void_p)
            self._functions[op.name] = (lib, fn, op.kernel.kernel,
                                        blob.ctypes.data + program.offsets[op.name])
        self._workspace = aligned_empty(need)
        self._arena = None
        self._start()

    def _set_threads(self):
        for _, lib, _ in self._programs.values():
            lib.vdla_set_threads(self.threads)

    def _start(self):
        """Once per session: the team's size and its workers pinned (`start_team`)."""
        for _, lib, _ in self._programs.values():
            start_team(lib, self.threads)

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        lib, fn, kernel, params = self._functions[op.name]
        by_name = dict(zip(node.inputs, args))
        # The kernel's layouts: inputs blocked and the output unblocked here, in numpy
        # (the whole-graph runner converts in C, only where a layout changes).
        arrays = layout.kernel_inputs(kernel, [by_name[t] for t in kernel.inputs])
        pointers = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        t = self.graph.tensors[node.outputs[0]]
        raw, plain = layout.kernel_output(kernel, t.shape, DTYPES[t.dtype])
        self._set_threads()
        lib.vdla_call(fn, pointers, raw.ctypes.data, params, self._workspace.ctypes.data)
        if kernel.checks:
            raise_error(lib)
        return OpRun([plain(raw)], macs=kernel.macs)

    def run_graph(self, feed: Mapping[str, np.ndarray]) -> GraphRun | None:
        """The whole graph in one call of the compiled runner (``vdla_model_run_timed``:
        each op timed in C), when one program holds every node; None otherwise. `feed`
        is checked by the caller."""
        if len(self._programs) != 1:
            return None
        program, lib, blob = next(iter(self._programs.values()))
        if not program.complete:
            return None
        if self._arena is None:
            self._arena = aligned_empty(max(program.arena_size, 64))
            run = lib.vdla_model_run_timed
            run.argtypes = [ctypes.c_void_p] * 6
            run.restype = ctypes.c_int
        g = self.graph
        inputs = [np.ascontiguousarray(feed[name], DTYPES[g.tensors[name].dtype])
                  for name in g.inputs]
        outputs = [np.empty(g.tensors[name].shape, DTYPES[g.tensors[name].dtype])
                   for name in g.outputs]
        ins = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])
        outs = (ctypes.c_void_p * len(outputs))(*[a.ctypes.data for a in outputs])
        seconds = np.zeros(max(1, len(program.steps)), np.float64)
        self._set_threads()
        status = lib.vdla_model_run_timed(blob.ctypes.data, self._arena.ctypes.data,
                                          self._workspace.ctypes.data, ins, outs,
                                          seconds.ctypes.data)
        if status == 2:
            raise_error(lib)
        if status:
            raise RuntimeError(f"vdla_model_run returned {status}")
        ops = {s.name: float(t) for s, t in zip(program.steps, seconds) if s.node is not None}
        # A fused step's time is its node's; the nodes it absorbed ran inside it.
        ops.update({n: 0.0 for s in program.steps for n in s.fused})
        layouts = {s.name: float(t) for s, t in zip(program.steps, seconds) if s.node is None}
        return GraphRun(dict(zip(g.outputs, outputs)), ops, layouts)

    def close(self) -> None:
        self._functions, self._programs = {}, {}
