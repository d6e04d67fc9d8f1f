"""``vdla sim``: run an assembled program on a simulator and print its statistics."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import vdla.runtime
from vdla._fileio import atomic_write
from vdla.cli.common import CONFIG_HELP, CliError, int_arg, load_config, output_file, read_file
from vdla.config import HardwareConfig
from vdla.isa import INSN_BYTES, DecodeError, Finish, Program, format_insn
from vdla.runtime import DramAllocator, OutOfMemory

__all__ = ["DEFAULT_BACKEND", "add_parser", "run"]

#: Backends `vdla sim` can run on, and the one it uses without --backend.
#: The simulator `vdla sim` runs on without --backend (vdla.runtime.BACKENDS: all).
DEFAULT_BACKEND = "verilator"
#: Options only a cycle-accurate backend understands: (attribute, flag).
_CYCLE_OPTIONS = (("trace", "--trace"), ("wave", "--wave"))


def _read_program(path: str, config: HardwareConfig):
    """The program in `path`: assembly text for ``.asm``/``.s``, else a binary stream."""
    if Path(path).suffix.lower() in (".asm", ".s"):
        program = Program.from_asm(read_file(path, binary=False), config, source=path)
    else:
        try:
            program = Program.from_bytes(read_file(path, binary=True), config)
        except DecodeError as exc:
            raise CliError(f"{path}: {exc}") from None
    if not len(program):
        raise CliError(f"{path}: the program has no instructions")
    if not isinstance(program[-1], Finish):
        raise CliError(f"{path}: the program does not end in FINISH (its last instruction is "
                       f"{format_insn(program[-1])}), so the accelerator would never be done")
    return program


def _claim_dram_from_zero(dev, nbytes: int, backend: str) -> None:
    """Allocate DRAM ``[0, nbytes)`` on a freshly opened device.

    The image must sit at address 0, where its program's absolute dram_base fields expect
    it, but a device's allocator keeps the first block free (so that a forgotten address 0
    is never valid); on a device with nothing allocated yet, one starting at 0 replaces it.
    """
    if dev.allocator.bytes_in_use:
        raise CliError(f"the {backend} device allocated DRAM when it opened; the image cannot "
                       "be placed at address 0")
    dev.allocator = DramAllocator(dev.dram_size, alignment=dev.allocator.alignment, base=0)
    try:
        dev.alloc(nbytes)
    except OutOfMemory:
        raise CliError(f"the image and the program need {nbytes} bytes of DRAM; the device has "
                       f"{dev.dram_size} (pass a larger --dram-size)") from None




def add_parser(sub) -> None:
    sim = sub.add_parser("sim", help="run an assembled program on a simulator and print its "
                                     "statistics")
    sim.add_argument("program", metavar="PROGRAM",
                     help="instruction stream from `vdla asm`, or assembly text (.asm, .s)")
    sim.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    sim.add_argument("--backend", choices=vdla.runtime.BACKENDS, default=DEFAULT_BACKEND,
                     help=f"simulator (default {DEFAULT_BACKEND})")
    sim.add_argument("--dram", metavar="IMAGE",
                     help="raw DRAM image loaded at byte address 0, where the program's "
                          "LOAD/STORE dram_base fields (absolute) expect its data")
    sim.add_argument("--dram-size", type=int_arg, metavar="BYTES",
                     help="DRAM of the simulated device (default: the backend's)")
    sim.add_argument("--insn-addr", type=int_arg, metavar="ADDR",
                     help="DRAM byte address of the instructions (default: the first aligned "
                          "address after the image)")
    sim.add_argument("--dump", type=output_file, metavar="FILE",
                     help="after the run, write DRAM from 0 to the end of the instructions")
    sim.add_argument("--max-cycles", type=int_arg, metavar="N",
                     help="the cycle budget: a program whose work cannot fit is refused "
                          "before it runs (both backends), and a Verilator run that goes "
                          "past it is stopped (default: 4x the program's estimated cycles "
                          "+ 100,000, at most 2e9)")
    sim.add_argument("--trace", type=output_file, metavar="TRACE.json",
                     help="write a per-module busy/wait timeline for ui.perfetto.dev (verilator)")
    sim.add_argument("--wave", type=output_file,
                     metavar="FILE.fst|.vcd", help="write a waveform (verilator)")
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.set_defaults(func=run)


def run(args) -> int:
    backend = args.backend
    if backend != "verilator":
        for attr, flag in _CYCLE_OPTIONS:
            if getattr(args, attr) is not None:
                raise CliError(f"{flag} needs --backend verilator (the {backend} backend does "
                               "not simulate cycles)")
    if args.max_cycles is not None and args.max_cycles < 1:
        raise CliError(f"--max-cycles must be a positive integer, not {args.max_cycles}")
    if args.wave is not None and Path(args.wave).suffix.lower() not in (".fst", ".vcd"):
        raise CliError(f"--wave {args.wave!r}: the file name must end in .fst or .vcd "
                       "(it picks the format)")
    config = load_config(args.config)
    program = _read_program(args.program, config)
    image = read_file(args.dram, binary=True) if args.dram is not None else b""
    if args.dram is not None and not image:
        raise CliError(f"DRAM image {args.dram!r} is empty")

    alignment = vdla.runtime.dram_alignment(config)
    if args.insn_addr is None:
        insn_addr = -(-len(image) // alignment) * alignment
    else:
        insn_addr = args.insn_addr
        if insn_addr < 0 or insn_addr % INSN_BYTES:
            raise CliError(f"--insn-addr {insn_addr:#x} must be a non-negative multiple of "
                           f"{INSN_BYTES} (the size of an instruction)")
        if insn_addr < len(image):
            raise CliError(f"the instructions at {insn_addr:#x}..{insn_addr + program.nbytes:#x} "
                           f"overlap the DRAM image at 0x0..{len(image):#x}; pass an "
                           f"--insn-addr of at least {len(image):#x}, or leave it out")
    end = insn_addr + program.nbytes

    options = {}
    if args.dram_size is not None:
        options["dram_size"] = args.dram_size
    if args.wave is not None:
        options["waveform"] = args.wave
    run_options = {}
    if args.max_cycles is not None:
        run_options["max_cycles"] = args.max_cycles
    if args.trace is not None:
        run_options["timeline"] = True
    with vdla.runtime.open(config, backend=backend, **options) as dev:
        _claim_dram_from_zero(dev, end, backend)
        if image:
            dev.write(0, image)
        dev.write(insn_addr, program.to_bytes())
        start = time.perf_counter()
        stats = dev.run(insn_addr, len(program), **run_options)
        seconds = time.perf_counter() - start
        if args.trace is not None:
            dev.timeline.save(args.trace)
            print(f"vdla: wrote the timeline to {args.trace} (open it in ui.perfetto.dev or "
                  "chrome://tracing)", file=sys.stderr)
        if args.dump is not None:
            atomic_write(Path(args.dump), dev.read(0, end).tobytes())
            print(f"vdla: wrote DRAM 0x0..{end:#x} ({end} bytes) to {args.dump}", file=sys.stderr)
    if args.wave is not None:
        print(f"vdla: waveform in {args.wave}", file=sys.stderr)

    stats = {key: value.item() if isinstance(value, np.generic) else value
             for key, value in stats.items() if key != "wall_seconds"}
    if args.json:
        print(json.dumps({"program": args.program, "backend": backend, "config": config.name,
                          "instructions": len(program), "stats": stats,
                          "wall_seconds": seconds}, indent=2))
        return 0
    print(f"{args.program}: {len(program)} instructions at DRAM {insn_addr:#x}, "
          f"image {len(image)} bytes at 0x0, config {config.name}, {backend} backend")
    # The counters this backend measured (the JSON has every key: None for the others).
    measured = {key: value for key, value in stats.items() if value is not None}
    rows = sorted(measured.items(), key=lambda item: (item[0] != "cycles", item[0]))
    key_width = max([len(key) for key in measured] + [len("wall time")])
    value_width = max([len(str(value)) for value in measured.values()] + [1])
    for key, value in rows:
        print(f"  {key:<{key_width}}  {value:>{value_width}}")
    speed = f" ({stats['cycles'] / seconds:,.0f} cycles/s)" if stats.get("cycles") else ""
    print(f"  {'wall time':<{key_width}}  {seconds * 1e3:.1f} ms{speed}")
    if len(measured) < len(stats):
        print(f"  (no {', '.join(k for k in stats if k not in measured)}: the {backend} "
              "backend has no clock; --backend verilator counts them)")
    return 0

