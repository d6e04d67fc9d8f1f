"""Simulated int8 MACs per second of the functional simulator on blocked GEMMs and on
ResNet-18's layers.

Blocked GEMMs: times `Device.run` only (the program and operands are in DRAM already),
best of several repeats, and checks each result against numpy. Target: at least 1e9
MAC/s for the 256x256x64 GEMM on a two-core CI machine.

ResNet-18 (the zoo model, compiled for the default config with the functional backend,
as ``vdla run resnet18 --sim functional --jobs 1`` runs it): each accelerator op's wall
time and useful MACs in the model's first run, which is what ``vdla run`` reports (each
op's wall includes writing its program and weights on first use, fetching, validating and
running it), then the best of `--repeat` more runs of the same session (warm: programs in
DRAM, loop-nest plans and decoded instructions cached). Every run is checked bit-exactly
against the quantized reference. Target: at least 2 GMAC/s over the model's
accelerator ops and at most 1 s for all of them, in the first run; the PASS/BELOW line
names the machine, since wall times depend on it (and on its load).

    python bench/functional_sim.py [--repeat N] [--only gemm|resnet18]
"""

import argparse
import os
import time

import numpy as np

import vdla
from vdla._platform import cpu_name
from vdla.runtime.kernels import BlockedGemm, GemmSchedule, blocked_gemm_reference

CASES = [  # (M, N, K, virtual threads, schedule or None for the default)
    (256, 256, 64, 1, None),
    (256, 256, 64, 2, None),
    (256, 256, 64, 2, GemmSchedule(tile_m=32, tile_n=16, virtual_threads=2)),
    (1024, 1024, 256, 2, None),
]
TARGET = 1e9
MODEL_RATE, MODEL_SECONDS = 2e9, 1.0   # ResNet-18: MAC/s and seconds, its accelerator ops


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", choices=("gemm", "resnet18"),
                        help="run one part (default: both)")
    args = parser.parse_args()
    if args.only != "resnet18":
        blocked_gemms(args.repeat)
    if args.only != "gemm":
        if args.only is None:
            print()
        resnet18(args.repeat)


def blocked_gemms(repeat: int):
    """The blocked GEMMs of `CASES`, best of `repeat` runs each."""
    config = vdla.HardwareConfig()
    rng = np.random.default_rng(0)
    print(f"functional simulator, config {config.name}, best of {repeat}")
    print(f"{'GEMM':>16} {'threads':>7} {'tiles':>7} {'insns':>6} {'MACs':>11} "
          f"{'run ms':>8} {'MAC/s':>9}  vs target")
    with vdla.runtime.open(config, dram_size=64 << 20) as dev:
        for m, n, k, threads, schedule in CASES:
            a = rng.integers(-128, 128, (m, k), dtype=np.int8)
            b = rng.integers(-128, 128, (n, k), dtype=np.int8)
            with BlockedGemm(dev, a, b, shift=8, schedule=schedule,
                             virtual_threads=threads) as gemm:
                best = float("inf")
                for _ in range(repeat):
                    start = time.perf_counter()
                    stats = gemm.run()
                    best = min(best, time.perf_counter() - start)
                if not np.array_equal(gemm.result(), blocked_gemm_reference(a, b, 8)):
                    raise SystemExit(f"{m}x{n}x{k}: result differs from numpy")
                s = gemm.schedule
                tiles = -(-gemm.blocks[0] // s.tile_m) * -(-gemm.blocks[2] // s.tile_n)
                rate = stats["gemm_macs"] / best
                print(f"{f'{m}x{n}x{k}':>16} {threads:>7} {tiles:>7} {len(gemm.program):>6} "
                      f"{stats['gemm_macs']:>11} {best * 1e3:>8.2f} {rate:>9.3g}  "
                      f"{rate / TARGET:.2f}x")


def resnet18(repeat: int):
    """ResNet-18's accelerator ops: per-op wall time and GMAC/s of the first run, the
    best of `repeat` warm runs, and the verdict against `MODEL_RATE` and `MODEL_SECONDS`."""
    # The compiler is a heavy import the GEMM part does not need.
    from vdla.compiler.pipeline import check, compile_for, graph_for, load_model
    from vdla.compiler.reference import run_reference
    from vdla.compiler.targets.vdla import VdlaTarget

    config = vdla.HardwareConfig()
    model = load_model("resnet18", note=None)
    target = VdlaTarget(config, backend="functional")
    graph = graph_for(model, target)
    compiled, _ = compile_for(graph, target)
    reference = run_reference(graph, model.feed)
    runs = []
    with compiled.session() as session:
        for _ in range(1 + max(repeat, 0)):
            result = session.run(model.feed)
            exact, why = check(result.outputs, reference, graph)
            if not exact:
                raise SystemExit(f"resnet18: not bit-exact vs the quantized reference: {why}")
            runs.append([s for s in result.ops if s.target == target.name])
    first = runs[0]
    warm = min(runs[1:], key=lambda ops: sum(s.wall_seconds for s in ops), default=None)
    warm_by_name = {s.name: s for s in warm} if warm else {}
    print(f"ResNet-18 on the functional simulator, config {config.name}: each accelerator "
          f"op's wall time in the first run (as vdla run reports it) and, warm, the best of "
          f"{repeat} more")
    print(f"{'op':22} {'kind':18} {'MACs':>13} {'first ms':>9} {'GMAC/s':>7} "
          f"{'warm ms':>8} {'GMAC/s':>7}")
    for s in first:
        w = warm_by_name.get(s.name)
        print(f"{s.name:22} {s.op:18} {s.macs or 0:>13,} {s.wall_seconds * 1e3:>9.2f} "
              f"{_rate(s.macs, s.wall_seconds):>7} "
              f"{'-' if w is None else f'{w.wall_seconds * 1e3:.2f}':>8} "
              f"{'-' if w is None else _rate(w.macs, w.wall_seconds):>7}")
    macs = sum(s.macs or 0 for s in first)
    seconds = sum(s.wall_seconds for s in first)
    warm_seconds = sum(s.wall_seconds for s in warm) if warm else None
    print(f"{'total':22} {f'{len(first)} ops':18} {macs:>13,} {seconds * 1e3:>9.2f} "
          f"{_rate(macs, seconds):>7} "
          f"{'-' if warm is None else f'{warm_seconds * 1e3:.2f}':>8} "
          f"{'-' if warm is None else _rate(macs, warm_seconds):>7}")
    rate = macs / seconds
    verdict = "PASS" if rate >= MODEL_RATE and seconds <= MODEL_SECONDS else "BELOW"
    print(f"{verdict}: {rate / 1e9:.2f} GMAC/s (target >= {MODEL_RATE / 1e9:g}) and "
          f"{seconds:.2f} s (target <= {MODEL_SECONDS:g}) over ResNet-18's accelerator ops, "
          f"first run, on {cpu_name()} ({_cores()} cores, load {os.getloadavg()[0]:.1f})")


def _rate(macs, seconds) -> str:
    """GMAC/s, or '-' for an op without MACs."""
    return f"{macs / seconds / 1e9:.2f}" if macs and seconds else "-"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


if __name__ == "__main__":
    main()
