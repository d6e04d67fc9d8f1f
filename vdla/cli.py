"""The ``vdla`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.config import HardwareConfig

__all__ = ["main"]


class CliError(Exception):
    """A user-facing failure: printed as ``vdla: error: ...`` with exit status 1."""


def _load_config(path: str | None) -> HardwareConfig:
    if path is None:
        return HardwareConfig()
    return HardwareConfig.from_json(Path(path))


def _read_file(path: str, *, binary: bool):
    try:
        return Path(path).read_bytes() if binary else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror}") from None


# --- config ---------------------------------------------------------------------------------

def _cmd_config_show(args) -> int:
    from vdla.isa import layouts_for

    config = _load_config(args.config)
    derived = config.derived()
    layouts = {kind: layout.bit_ranges() for kind, layout in layouts_for(config).items()}
    if args.json:
        print(json.dumps({"parameters": config.to_dict(), "derived": derived,
                          "insn_layouts": layouts}, indent=2))
        return 0
    print(f"config {config.name}")
    print("parameters:")
    for key, value in config.to_dict().items():
        print(f"  {key:<18} {', '.join(value) if isinstance(value, list) else value}")
    print("derived:")
    for key, value in derived.items():
        if key != "name":
            print(f"  {key:<18} {value}")
    print("instruction layouts (field: bits):")
    for kind, fields in layouts.items():
        print(f"  {kind:<7}" + ", ".join(f"{name} {bits}" for name, bits in fields.items()))
    return 0


# --- asm / disasm ---------------------------------------------------------------------------

def _cmd_asm(args) -> int:
    from vdla.isa import Program

    config = _load_config(args.config)
    program = Program.from_asm(_read_file(args.file, binary=False), config, source=args.file)
    out = Path(args.output)
    atomic_write(out, program.to_bytes())
    print(f"{args.file}: {len(program)} instructions, {program.nbytes} bytes -> {out} "
          f"(config {config.name})", file=sys.stderr)
    return 0


def _cmd_disasm(args) -> int:
    from vdla.isa import Program

    config = _load_config(args.config)
    program = Program.from_bytes(_read_file(args.file, binary=True), config)
    text = program.to_asm()
    if args.output:
        atomic_write(Path(args.output), text.encode())
    else:
        sys.stdout.write(text)
    return 0


# --- demo -----------------------------------------------------------------------------------

def _cmd_demo(args) -> int:
    import numpy as np

    import vdla.runtime
    from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference

    config = _load_config(args.config)
    for name in ("m", "n", "k"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be a positive integer, not {getattr(args, name)}")
    rng = np.random.default_rng(args.seed)
    a = rng.integers(-128, 128, size=(args.m, args.k), dtype=np.int8)
    b = rng.integers(-128, 128, size=(args.n, args.k), dtype=np.int8)
    shift = args.shift
    print(f"blocked GEMM {args.m}x{args.n}x{args.k} (int8, >>{shift}, clip to int8) on the "
          f"functional simulator, config {config.name}, {args.threads} virtual thread(s)")
    with vdla.runtime.open(config, backend="functional") as dev:
        start = time.perf_counter()
        out, stats, program = blocked_gemm(dev, a, b, shift=shift, virtual_threads=args.threads)
        seconds = time.perf_counter() - start
    expected = blocked_gemm_reference(a, b, shift)
    mismatches = int(np.count_nonzero(out != expected))
    print(f"  instructions       {len(program)}")
    for key in ("gemm_uops", "gemm_macs", "alu_uops", "dram_bytes_read", "dram_bytes_written"):
        print(f"  {key:<18} {stats.get(key, 0)}")
    print(f"  wall time          {seconds * 1e3:.1f} ms ({stats['gemm_macs'] / seconds / 1e9:.2f} "
          "G simulated MAC/s, including set-up)")
    if mismatches:
        print(f"FAIL: {mismatches} of {out.size} outputs differ from numpy", file=sys.stderr)
        return 1
    print(f"OK: all {out.size} outputs match numpy bit-exactly")
    return 0


# --- entry point ----------------------------------------------------------------------------

# --- verilog --------------------------------------------------------------------------------

def _cmd_verilog(args) -> int:
    from vdla.hw.verilog import generate

    config = _load_config(args.config)
    print(f"vdla: generating Verilog for {config.name} ...", file=sys.stderr)
    start = time.perf_counter()
    paths = generate(config, args.output)
    info = json.loads(paths["manifest"].read_text())
    print(f"{paths['verilog']}  (top {info['top']}, {len(info['ports'])} ports, "
          f"{paths['verilog'].stat().st_size // 1024} KiB)")
    print(f"{paths['manifest']}  (config, register map, ports)")
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vdla", description=__import__("vdla").__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_help = "hardware config JSON (vdla's keys or VTA's vta_config.json); default: VTA's default"

    config = sub.add_parser("config", help="hardware configurations")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_sub.add_parser("show", help="print the parameters and derived values")
    show.add_argument("--config", metavar="FILE", help=config_help)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_cmd_config_show)

    asm = sub.add_parser("asm", help="assemble a text program into an instruction stream")
    asm.add_argument("file", metavar="FILE", help="assembly text")
    asm.add_argument("-o", "--output", required=True, metavar="OUT", help="binary output")
    asm.add_argument("--config", metavar="FILE", help=config_help)
    asm.set_defaults(func=_cmd_asm)

    disasm = sub.add_parser("disasm", help="disassemble an instruction stream")
    disasm.add_argument("file", metavar="FILE", help="binary instruction stream")
    disasm.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    disasm.add_argument("--config", metavar="FILE", help=config_help)
    disasm.set_defaults(func=_cmd_disasm)

    verilog = sub.add_parser("verilog", help="write the accelerator's Verilog and a manifest "
                                             "(config, register map, ports)")
    verilog.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    verilog.add_argument("--config", metavar="FILE", help=config_help)
    verilog.set_defaults(func=_cmd_verilog)

    demo = sub.add_parser("demo", help="run a blocked GEMM on the functional simulator "
                                       "and check it against numpy")
    demo.add_argument("--m", type=int, default=256, help="rows of A and C (default 256)")
    demo.add_argument("--n", type=int, default=256, help="rows of B, columns of C (default 256)")
    demo.add_argument("--k", type=int, default=64, help="reduction length (default 64)")
    demo.add_argument("--shift", type=int, default=8, choices=range(32), metavar="S",
                      help="requantization shift 0..31 (default 8)")
    demo.add_argument("--threads", type=int, default=2, choices=(1, 2),
                      help="virtual threads (default 2)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--config", metavar="FILE", help=config_help)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from vdla.sim.errors import SimError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except (CliError, ValueError, SimError, OSError) as exc:
        print(f"vdla: error: {exc}", file=sys.stderr)
        return 1
