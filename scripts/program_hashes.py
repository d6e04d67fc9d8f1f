"""A SHA-256 per model of the programs the vdla target emits: the check that a refactor of
the back half (compiler/targets/vdla) leaves every program byte for byte as it was.

    python scripts/program_hashes.py --out before.json      # on the old code
    python scripts/program_hashes.py --out after.json       # on the new code
    python scripts/program_hashes.py --compare before.json  # or: compare with a file

Compile only (no device, no Verilator). For each model and each config (the default
`HardwareConfig()`; ``block_out=32``, where activations stay in DRAM in 32-channel
blocks (two inp elements a pixel) and the pools, the elementwise ops and the residuals
widen two input blocks per output block;
and the default with the ALU's MUL, so requantizations multiply),
the hash covers every op of the compiled model in graph order: its name, op, target and
schedule, and for an accelerator op the program's encoded instructions, the encoded
micro-ops, the arena's regions and size, every static array it writes (dtype, shape,
bytes), and where its LOADs and STOREs go once relocated: into the buffer plan's
placements (buffers at fixed addresses) where activations stay in DRAM, the plan itself
hashed too, else into an arena at a fixed address.

Models: every zoo model (ResNet-18/34/50, MobileNet-v1 with its depthwise layers, the
small and the digits CNN), quantized as ``vdla run`` quantizes them; the torch-exported
ONNX blocks of tests/onnx_blocks.py (Inception: concats and ceil-mode pools; DenseNet:
concat views and a depthwise BN; a grouped AlexNet), when torch is installed; the
one-layer convolution and dense graphs of tests/gemm_graphs.py (grouped, depthwise,
strided, residual, per-tensor and per-channel, multiplier or shift); and every case of
tests/op_cases.py (pools, global pools, qadd, relu, concat, flatten; the float ones run
on the host and hash to their host ops).

Options: ``--out PATH`` writes the hashes as JSON; ``--compare PATH`` compares with a
file written before and exits 1 naming every model whose hash changed; ``--only
SUBSTRING`` hashes the models whose name contains it; ``--skip-slow`` leaves out
ResNet-50; ``--jobs N`` runs N processes (default 2). The "mul" config hashes the models
that are not zoo models and the zoo models of `MUL_ZOO` (the deeper ResNets repeat
ResNet-18's layers and take the longest).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))   # the test helpers: gemm_graphs, op_cases, onnx_blocks

from vdla.compiler.frontend import zoo  # noqa: E402
from vdla.compiler.pipeline import graph_for, load_model  # noqa: E402
from vdla.compiler.targets import get  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402
from vdla.config import REQUIRED_ALU_OPS, AluOp, HardwareConfig  # noqa: E402

#: The configs every model is compiled for: name -> config. "mul" adds the ALU's MUL to
#: the default (models quantize with multipliers; the MUL epilogue steps are emitted).
CONFIGS = {"default": HardwareConfig(), "block_out32": HardwareConfig(block_out=32),
           "mul": HardwareConfig(alu_ops=REQUIRED_ALU_OPS | {AluOp.MUL})}

#: A DRAM byte address aligned for every element type, where the arenas are relocated to.
ARENA_BASE = 1 << 24


def _gemm_graphs():
    """(name, graph builder) of the one-layer GEMM graphs."""
    from gemm_graphs import conv_graph, dense_graph

    def conv(seed, **kw):
        return lambda: conv_graph(np.random.default_rng(seed), **kw)[0]

    return {
        "conv_plain": conv(0),
        "conv_multiply_per_tensor": conv(1, multiply=True, per_channel=False),
        "conv_residual": conv(2, residual=True),
        "conv_residual_multiply": conv(3, residual=True, multiply=True),
        "conv_stride2_nobias": conv(4, stride=2, bias=False, k=3, h=15, w=13),
        "conv_1x1_batch2": conv(5, n=2, k=1, pad=0, c=40, o=70),
        "conv_grouped_straddle": conv(6, c=24, o=36, groups=3),
        "conv_grouped_blocks": conv(7, c=64, o=64, groups=2, residual=True),
        "conv_depthwise": conv(8, c=48, o=48, groups=48, h=14, w=14),
        "conv_depthwise_stride2": conv(9, c=32, o=32, groups=32, stride=2, h=15, w=15),
        "conv_relu_input": conv(10, nonnegative=True),
        "conv_big_tiles": conv(11, c=64, o=128, h=28, w=28),
        "dense": lambda: dense_graph(np.random.default_rng(12))[0],
        "dense_residual": lambda: dense_graph(np.random.default_rng(13), residual=True)[0],
        "dense_wide": lambda: dense_graph(np.random.default_rng(14), n=1, c=512, o=1000)[0],
    }


def _op_cases():
    from op_cases import CASES
    return {f"op_{name}": (lambda build=build: build()[0]) for name, build in CASES.items()}


def _array_digest(h, name: str, array) -> None:
    a = np.ascontiguousarray(np.asarray(array))
    h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
    h.update(a.tobytes())


def _plan_relocated(lowered, node, plan, config):
    """The program relocated into the plan's placements, buffers at fixed addresses (in
    the plan's order, each rounded up to 4 KiB) and the arena at `ARENA_BASE`."""
    from vdla.compiler.targets.vdla.placement import relocate_to
    from vdla.compiler.targets.vdla.target import activation_regions
    addresses, next_free = {}, 1 << 30
    for name, buf in plan.buffers.items():
        addresses[name] = next_free
        next_free += -(-buf.nbytes // 4096) * 4096 + 4096
    moved = {}
    for region, tensor in activation_regions(lowered, node).items():
        p = plan.placements[tensor]
        moved[region] = (addresses[p.buffer], p, plan.buffers[p.buffer])
    return relocate_to(lowered.program, config, lowered.regions, ARENA_BASE, moved)


def model_hash(graph, compiled, config) -> tuple[str, dict]:
    """(SHA-256 hex, counts) of compiled model `compiled` of `graph`."""
    h = hashlib.sha256()
    counts = {"ops": 0, "vdla_ops": 0, "insns": 0, "uops": 0}
    plans = set()
    for op in compiled.ops:
        counts["ops"] += 1
        h.update(f"op:{op.name}:{op.op}:{op.target}:"
                 f"{json.dumps(op.schedule, sort_keys=True)}".encode())
        if op.target != "vdla":
            continue
        counts["vdla_ops"] += 1
        kernel = op.kernel
        lowered = kernel.lowered
        if kernel.plan is not None and id(kernel.plan) not in plans:
            plans.add(id(kernel.plan))
            h.update(repr(sorted((n, dataclasses.astuple(b)) for n, b in
                                 kernel.plan.buffers.items())).encode())
            h.update(repr(sorted((n, dataclasses.astuple(p)) for n, p in
                                 kernel.plan.placements.items())).encode())
        if lowered is None:   # a view
            h.update(b"view")
            continue
        h.update(type(lowered).__name__.encode())
        h.update(lowered.program.to_bytes())
        h.update(lowered.uop_bytes)
        h.update(repr(sorted((n, r.offset, r.nbytes) for n, r in
                             lowered.regions.items())).encode())
        h.update(str(lowered.arena_bytes).encode())
        for name in sorted(kernel.static):
            _array_digest(h, name, kernel.static[name])
        # Where every LOAD/STORE goes once relocated (the rest of each instruction is the
        # program's, hashed above): into the plan's placements, or into an arena.
        relocated = (lowered.relocate(ARENA_BASE) if kernel.plan is None else
                     _plan_relocated(lowered, graph.node(op.name), kernel.plan, config))
        h.update(repr([getattr(insn, "dram_base", None) for insn in relocated]).encode())
        counts["insns"] += len(lowered.program.insns)
        counts["uops"] += len(lowered.uop_bytes) // config.uop_bytes
    return h.hexdigest(), counts


#: The zoo models hashed on the "mul" config too (the others' layers are theirs again).
MUL_ZOO = ("resnet18", "mobilenet_v1", "small_cnn", "digits_cnn")


#: The models that take longest (started first).
_SLOWEST = ("resnet50", "resnet18", "mobilenet_v1", "resnet34")


def _onnx_block(name: str) -> str:
    """The path of ONNX block `name`, exported into a fresh folder."""
    import onnx_blocks
    return str(onnx_blocks.BLOCKS[name](Path(tempfile.mkdtemp(prefix="vdla-blocks-"))))


def _sources(skip_slow: bool = False) -> dict:
    """model name -> (kind, source): kind "zoo" (a zoo name) or "onnx" (a callable giving
    an .onnx path) are quantized as ``vdla run`` does; kind "graph" (a callable giving an
    int8 graph) is compiled as it is."""
    out = {name: ("zoo", name) for name in zoo.names()
           if not (skip_slow and name == "resnet50")}
    try:
        import onnx_blocks
        import torch  # noqa: F401 - only to know whether the blocks can be exported
    except ImportError:
        print("program_hashes: torch is missing: the ONNX blocks are skipped", file=sys.stderr)
    else:
        for name in onnx_blocks.BLOCKS:
            out[f"onnx_{name}"] = ("onnx", lambda name=name: _onnx_block(name))
    out.update((name, ("graph", build)) for name, build in _gemm_graphs().items())
    out.update((name, ("graph", build)) for name, build in _op_cases().items())
    return out


def hash_model(name: str) -> tuple[str, dict, float]:
    """(name, {config name: {"sha256": ..., counts}}, seconds) of one model."""
    t0 = time.perf_counter()
    kind, source = _sources()[name]
    if kind == "graph":
        graph, model = source(), None
    else:
        graph = None
        model = load_model(source() if kind == "onnx" else source, seed=0, calibration=4,
                           note=None)
    quantized = {}   # one quantization per requantization mode
    result = {}
    for cname, config in CONFIGS.items():
        if cname == "mul" and kind == "zoo" and name not in MUL_ZOO:
            continue
        target = get("vdla", config=config, backend="functional")
        g = graph
        if g is None:
            mode = target.requant_modes[0]
            if mode not in quantized:
                quantized[mode] = graph_for(model, target)
            g = quantized[mode]
        digest, counts = model_hash(g, compile_model(g, target), config)
        result[cname] = {"sha256": digest, **counts}
    return name, result, time.perf_counter() - t0


def compute(skip_slow: bool = False, only: str | None = None, jobs: int = 1,
            log=print) -> dict:
    """{config name: {model name: {"sha256": ..., counts}}}, over `jobs` processes (the
    slowest models first)."""
    names = [n for n in _sources(skip_slow) if not only or only in n]
    names.sort(key=lambda n: n not in _SLOWEST)   # the longest first: less waiting at the end
    result = {name: {} for name in CONFIGS}

    def record(done):
        name, hashes, seconds = done
        for cname, entry in hashes.items():
            result[cname][name] = entry
        log(f"{name}: {seconds:.1f} s  " + "  ".join(
            f"{c} {e['sha256'][:12]} ({e['vdla_ops']} vdla ops)" for c, e in hashes.items()))

    if jobs <= 1:
        for name in names:
            record(hash_model(name))
    else:
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for done in pool.imap_unordered(hash_model, names):
                record(done)
    return {c: dict(sorted(m.items())) for c, m in result.items()}


def compare(before: dict, after: dict) -> list[str]:
    """The differences between two results: a line per changed, missing or new model."""
    lines = []
    for cname in sorted(set(before) | set(after)):
        b, a = before.get(cname, {}), after.get(cname, {})
        for name in sorted(set(b) | set(a)):
            if name not in a:
                lines.append(f"{cname} {name}: missing now")
            elif name not in b:
                lines.append(f"{cname} {name}: new")
            elif a[name]["sha256"] != b[name]["sha256"]:
                lines.append(f"{cname} {name}: {b[name]['sha256'][:12]} -> "
                             f"{a[name]['sha256'][:12]}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the hashes as JSON to this file")
    parser.add_argument("--compare", help="compare with hashes written before (JSON)")
    parser.add_argument("--only", help="only the models whose name contains this")
    parser.add_argument("--skip-slow", action="store_true", help="leave out ResNet-50")
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = compute(args.skip_slow, args.only, args.jobs)
    models = len(result["default"])
    hashes = sum(len(m) for m in result.values())
    print(f"{models} models, {hashes} hashes ({', '.join(CONFIGS)}) in "
          f"{time.perf_counter() - start:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        if args.only:
            before = {c: {n: v for n, v in m.items() if args.only in n}
                      for c, m in before.items()}
        diff = compare(before, result)
        if diff:
            print("programs changed:\n" + "\n".join(diff))
            return 1
        print(f"identical: {models} models, {hashes} hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
