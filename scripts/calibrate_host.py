"""Time vdla's host kernels on this machine and fit the sweep's host time model to them.

Usage: python3 scripts/calibrate_host.py [--out PATH] [--repeats N] [--table]

A sweep prices the ops a config leaves on the host with `vdla.dse.host.HostModel`: per
op kind, a fixed cost per op plus a cost per unit of its work (elements of the tensor its
kernel walks, or a product's MACs). This script measures the kernels a session runs for
those ops (the integer reference kernels of `vdla.compiler.reference`, as the host target
runs them: ``KERNELS[op](node, inputs, graph)``) over a few sizes each, on int8 data
drawn at random, with the attributes (quantization parameters) of the real ops of the
zoo's bert_tiny and gpt_mini quantized for the vta-plus config. Each size is timed after
two warm-up calls, as the median of several runs (at least `--repeats`, more for fast
kernels). Each kind is fitted by non-negative least squares on the relative error, and
the model, its samples and the fit's worst relative error are written atomically to
``dse/calibration/host.json`` (or `--out`) with the provenance: the CPU's model name, the
instruction sets numpy dispatches to on it (detected), the cores, numpy's version, the
date and the command. It prints the fit as a table; ``--table`` prints the table of the
file without measuring.

It takes about a minute. Run it on an idle machine: the times are this CPU's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vdla._fileio import atomic_write  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline, targets  # noqa: E402
from vdla.compiler.ir.tensor import Node  # noqa: E402
from vdla.compiler.reference import KERNELS  # noqa: E402
from vdla.compiler.reference.integer_transformer import layer_norm_params  # noqa: E402
from vdla.dse.host import FORMAT, HOST_CALIBRATION, KINDS, HostModel, kind_of, work_of  # noqa: E402
from vdla.shipped import load_config  # noqa: E402

#: The config whose legalized graphs give the split attention's qsoftmax and qmatmul.
CONFIG = "vta-plus"


# --- the machine ------------------------------------------------------------------------

def numpy_simd() -> list[str]:
    """The CPU features numpy found here and dispatches its loops to (numpy's own
    detection, as ``numpy.show_runtime()`` reports it)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:    # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return [name for name, found in __cpu_features__.items() if found]


def machine() -> dict:
    """This machine as the calibration file records it (detected, not assumed)."""
    try:
        from vdla.compiler.targets.cpu import isa as cpu_isa
        isa = cpu_isa.detect().name
    except Exception as exc:    # no C compiler to ask: say so rather than guess
        isa = f"unknown ({type(exc).__name__}: {exc})"
    return {"cpu": cpu_name(), "isa": isa, "numpy_simd": numpy_simd(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "load": round(os.getloadavg()[0], 2)}


# --- the kernels' templates -------------------------------------------------------------

def templates() -> dict[str, Node]:
    """A real node per op (its attributes: quantization parameters), from the zoo's
    bert_tiny (masked attention) and gpt_mini (causal) quantized for `CONFIG`, the split
    attention's ops from their legalized graphs."""
    target = targets.get("vdla", config=load_config(CONFIG), backend="functional")
    out: dict[str, Node] = {}
    for name, tag in (("bert_tiny", "bert"), ("gpt_mini", "gpt")):
        model = pipeline.load_model(name, calibration=2, note=None)
        graph = pipeline.quantize_for(model, target)
        for g in (graph, target.legalize(graph)):
            for node in g.nodes():
                out.setdefault(f"{tag}:{node.op}", node)
    return out


# --- the cases --------------------------------------------------------------------------

def cases(t: dict, rng) -> list[dict]:
    """Every timed case: kind, op, a node, its inputs, a label."""
    def i8(*shape):
        return rng.integers(-128, 128, shape, dtype=np.int8)

    def node(op, template=None, n_inputs=1, **attrs):
        base = dict(template.attrs) if template is not None else {}
        base.update(attrs)
        return Node("calibrate", op, [f"in{i}" for i in range(n_inputs)], ["out"], base)

    out = []

    def add(kind, op, n, args, label, graph=None):
        out.append({"kind": kind, "op": op, "node": n, "args": args, "label": label,
                    "graph": graph})

    for r, c in ((16, 16), (64, 64), (128, 128), (256, 256), (128, 512), (512, 512)):
        label = f"{r}x{c}"
        add("qsoftmax", "qsoftmax", node("qsoftmax", t["bert:qsoftmax"], causal=False),
            [i8(r, c)], label)
        mask = np.zeros((1, c), bool)
        mask[:, -max(c // 4, 1):] = True
        add("qsoftmax_masked", "qsoftmax",
            node("qsoftmax", t["bert:qsoftmax"], 2, causal=False), [i8(r, c), mask],
            label + " mask 1x" + str(c))
        add("qsoftmax_causal", "qsoftmax", node("qsoftmax", t["gpt:qsoftmax"], causal=True),
            [i8(r, c)], label + " causal")
    for s, d in ((16, 128), (64, 128), (128, 256), (197, 192), (256, 768), (512, 768)):
        # Its integer parameters depend on the row length: made for it, as the
        # quantizer makes them (BERT's gamma 1 and beta 0, the template's scales).
        a = t["bert:qlayer_norm"].attrs
        gamma, beta, params = layer_norm_params(np.ones(d), np.zeros(d), a["epsilon"],
                                                a["in_scale"], a["out_scale"], d)
        add("qlayer_norm", "qlayer_norm",
            node("qlayer_norm", t["bert:qlayer_norm"], 3, params=params),
            [i8(1, s, d), gamma, beta], f"1x{s}x{d}")
    for s, f in ((16, 512), (64, 1024), (128, 512), (197, 768), (128, 3072)):
        for tag in ("bert", "gpt"):     # the erf form and the tanh form
            add("qgelu", "qgelu", node("qgelu", t[f"{tag}:qgelu"]), [i8(s, f)],
                f"{s}x{f} {t[f'{tag}:qgelu'].attrs['approximate']}")
    for b, h, s, d in ((1, 2, 32, 64), (1, 4, 64, 64), (1, 2, 128, 64), (1, 4, 128, 32),
                       (1, 3, 197, 64), (1, 12, 128, 64)):
        q, k, v = i8(b, h, s, d), i8(b, h, s, d), i8(b, h, s, d)
        label = f"{b}x{h}x{s}x{d}"
        add("qattention", "qattention",
            node("qattention", t["bert:qattention"], 3, causal=False), [q, k, v], label)
        mask = np.zeros((b, 1, 1, s), bool)
        mask[..., -max(s // 4, 1):] = True
        add("qattention", "qattention",
            node("qattention", t["bert:qattention"], 4, causal=False), [q, k, v, mask],
            label + " mask")
        add("qattention", "qattention", node("qattention", t["gpt:qattention"], 3),
            [q, k, v], label + " causal")
    table = i8(8192, 768)
    for s, d in ((16, 128), (128, 128), (64, 256), (128, 768), (512, 768)):
        ids = rng.integers(0, 8192, (1, s)).astype(np.int64)
        add("gather", "gather", node("gather", t["bert:gather"], 2),
            [np.ascontiguousarray(table[:, :d]), ids], f"1x{s}x{d}")
    for shape in ((1, 2), (1, 128), (1, 16, 128), (1, 128, 128), (1, 3, 224, 224),
                  (1, 64, 8192)):
        label = "x".join(map(str, shape))
        add("quantize", "quantize", node("quantize", t["bert:quantize"]),
            [rng.standard_normal(shape).astype(np.float32)], label)
        add("dequantize", "dequantize", node("dequantize", t["bert:dequantize"]),
            [i8(*shape)], label)
    for m, k, n in ((16, 64, 16), (128, 64, 128), (128, 128, 128), (197, 64, 197),
                    (256, 256, 256)):
        add("gemm", "qmatmul", node("qmatmul", t["bert:qmatmul"], 2), [i8(m, k), i8(n, k)],
            f"qmatmul {m}x{k} @ ({n}x{k})T")
    dense = t["bert:qdense"]
    for m, k, n in ((16, 128, 128), (128, 128, 384), (128, 512, 128), (64, 256, 1024)):
        shift = tuple(np.resize(np.asarray(dense.attrs["shift"]), n).tolist())
        bias = rng.integers(-1000, 1000, n).astype(np.int32)
        add("gemm", "qdense", node("qdense", dense, 3, shift=shift),
            [i8(m, k), i8(n, k), bias], f"qdense {m}x{k} -> {n}")
    for s, d in ((16, 128), (128, 128), (197, 192), (512, 768)):
        graph = types.SimpleNamespace(tensors={"out": types.SimpleNamespace(shape=(s, d))})
        add("layout", "reshape", node("reshape", shape=(s, d)), [i8(1, s, d)],
            f"reshape 1x{s}x{d}", graph)
        heads = 4 if d % 4 == 0 else 2
        add("layout", "transpose", node("transpose", perm=(0, 2, 1, 3)),
            [i8(1, s, heads, d // heads)], f"transpose 1x{s}x{heads}x{d // heads}")
        add("layout", "slice", node("slice", starts=(0,), ends=(d // 2,), axes=(1,),
                                    steps=(1,)), [i8(s, d)], f"slice {s}x{d}")
        add("layout", "concat", node("concat", n_inputs=2, axis=1),
            [i8(s, d // 2), i8(s, d // 2)], f"concat 2x {s}x{d // 2}")
    for shape in ((1, 128), (1, 128, 128), (1, 197, 192), (1, 512, 768)):
        label = "x".join(map(str, shape))
        x = rng.standard_normal(shape).astype(np.float32)
        add("elementwise", "add", node("add", n_inputs=2), [x, x.copy()], f"add {label}")
        add("elementwise", "mul", node("mul", n_inputs=2), [x, np.float32(-1e4)],
            f"mul {label}")
        add("elementwise", "tanh", node("tanh"), [x], f"tanh {label}")
        add("elementwise", "cast", node("cast", dtype="float32"),
            [rng.integers(0, 2, shape).astype(np.int64)], f"cast {label}")
        add("elementwise", "less", node("less", n_inputs=2), [x, np.float32(0.5)],
            f"less {label}")
    return out


# --- timing and the fit -------------------------------------------------------------------

def time_case(case: dict, repeats: int) -> tuple[float, tuple]:
    """The median wall time of the case's kernel (after two warm-up calls) and its
    output's shape."""
    fn = KERNELS[case["op"]]
    node, args, graph = case["node"], case["args"], case["graph"]
    result = fn(node, args, graph)
    fn(node, args, graph)
    start = time.perf_counter()
    fn(node, args, graph)
    first = time.perf_counter() - start
    # At least `repeats` runs, more for fast kernels (up to about 0.2 s of them).
    runs = max(repeats, min(200, int(0.2 / max(first, 1e-6))))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(node, args, graph)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tuple(np.asarray(result[0]).shape)


def fit(kind: str, samples: list[dict]) -> dict:
    """per_op and per_unit of `kind` by non-negative least squares on the relative error,
    and the fit's worst relative error over `samples`."""
    work = KINDS[kind]
    a = np.array([[1.0, *(s["work"][w] for w in work)] for s in samples])
    t = np.array([s["seconds"] for s in samples])
    scale = a.max(axis=0)                       # columns of one size, for the solver
    coef, _ = nnls((a / scale) / t[:, None], np.ones(len(t)))
    coef = coef / scale
    predicted = a @ coef
    for s, p in zip(samples, predicted):
        s["predicted"] = float(p)
    return {"per_op": float(coef[0]),
            "per_unit": {w: float(c) for w, c in zip(work, coef[1:])},
            "worst_error": float(np.max(np.abs(predicted - t) / t)),
            "samples": samples}


def table(data: dict) -> str:
    """The fit as a table: kind, per-op cost, per-unit costs, worst relative error."""
    rows = [("kind", "per op (us)", "per unit (ns)", "worst error", "samples")]
    for kind, k in data["kinds"].items():
        units = ", ".join(f"{w} {1e9 * c:.3g}" for w, c in k["per_unit"].items())
        rows.append((kind, f"{1e6 * k['per_op']:.1f}", units,
                     f"{100 * k['worst_error']:.0f}%", str(len(k["samples"]))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i in (0, 2) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    m = data["machine"]
    head = (f"host model: {m['cpu']} ({m['cores']} cores, {m['isa']}), numpy "
            f"{data['numpy']}, {data['date']}")
    return head + "\n" + "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HOST_CALIBRATION, metavar="PATH",
                   help=f"the calibration file to write (default {HOST_CALIBRATION})")
    p.add_argument("--repeats", type=int, default=7,
                   help="timed runs per size at least (default 7; fast kernels get more)")
    p.add_argument("--table", action="store_true",
                   help="print the fit of the file (--out) and measure nothing")
    args = p.parse_args(argv)
    if args.table:
        try:
            HostModel.load(args.out)
        except ValueError as exc:
            p.error(str(exc))
        print(table(json.loads(args.out.read_text())))
        return 0
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, not {args.repeats}")
    start = time.perf_counter()
    here = machine()
    rng = np.random.default_rng(0)
    samples: dict[str, list] = {kind: [] for kind in KINDS}
    for case in cases(templates(), rng):
        seconds, out_shape = time_case(case, args.repeats)
        node = case["node"]
        shapes = [np.shape(a) for a in case["args"]]
        work = work_of(case["op"], shapes, out_shape)
        if case["op"] != "qsoftmax":
            assert kind_of(case["op"]) == case["kind"], case
        samples[case["kind"]].append({"op": node.op, "case": case["label"], "work": work,
                                      "seconds": seconds})
    command = "python3 scripts/calibrate_host.py" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    data = {"format": FORMAT, "machine": here,
            "numpy": np.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "seconds": round(time.perf_counter() - start, 1),
            "kinds": {kind: fit(kind, s) for kind, s in samples.items()}}
    HostModel.from_dict(data, source=str(args.out))   # the file it writes must load
    atomic_write(args.out, (json.dumps(data, indent=1) + "\n").encode())
    print(table(data))
    print(f"wrote {args.out} in {data['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
