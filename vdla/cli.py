"""The ``vdla`` command line."""

from __future__ import annotations

import argparse
import dataclasses
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
    backend = args.backend
    where = {"functional": "the functional simulator",
             "verilator": "the cycle-accurate Verilator model"}[backend]
    print(f"blocked GEMM {args.m}x{args.n}x{args.k} (int8, >>{shift}, clip to int8) on "
          f"{where}, config {config.name}, {args.threads} virtual thread(s)")
    with vdla.runtime.open(config, backend=backend) as dev:
        start = time.perf_counter()
        out, stats, program = blocked_gemm(dev, a, b, shift=shift, virtual_threads=args.threads)
        seconds = time.perf_counter() - start
    expected = blocked_gemm_reference(a, b, shift)
    mismatches = int(np.count_nonzero(out != expected))
    print(f"  instructions       {len(program)}")
    if backend == "verilator":
        cycles = stats["cycles"]
        macs = args.m * args.n * args.k
        print(f"  cycles             {cycles}  ({cycles / config.clock_mhz:.1f} us at "
              f"{config.clock_mhz:g} MHz)")
        print(f"  GEMM utilization   {macs / (cycles * config.macs_per_cycle):.1%}  (useful MACs "
              "over cycles x MACs per cycle)")
        for key in ("load_busy", "compute_busy", "store_busy", "stall_load_compute",
                    "dram_bytes_read", "dram_bytes_written"):
            print(f"  {key:<18} {stats[key]}")
        print(f"  wall time          {seconds * 1e3:.1f} ms ({cycles / stats['wall_seconds']:,.0f} "
              "simulated cycles/s)")
    else:
        for key in ("gemm_uops", "gemm_macs", "alu_uops", "dram_bytes_read",
                    "dram_bytes_written"):
            print(f"  {key:<18} {stats.get(key, 0)}")
        print(f"  wall time          {seconds * 1e3:.1f} ms ({stats['gemm_macs'] / seconds / 1e9:.2f} "
              "G simulated MAC/s, including set-up)")
    if mismatches:
        print(f"FAIL: {mismatches} of {out.size} outputs differ from numpy", file=sys.stderr)
        return 1
    print(f"OK: all {out.size} outputs match numpy bit-exactly")
    return 0


# --- sim ------------------------------------------------------------------------------------

#: Backends `vdla sim` can run on, and the one it uses without --backend.
SIM_BACKENDS = ("functional", "verilator")
DEFAULT_SIM_BACKEND = "verilator"
#: Options only a cycle-accurate backend understands: (attribute, flag).
_CYCLE_OPTIONS = (("trace", "--trace"), ("wave", "--wave"), ("max_cycles", "--max-cycles"))


def _int_arg(text: str) -> int:
    """An integer option in decimal or 0x hex (argparse turns ValueError into a usage error)."""
    return int(text, 0)


def _read_program(path: str, config: HardwareConfig):
    """The program in `path`: assembly text for ``.asm``/``.s``, else a binary stream."""
    from vdla.isa import DecodeError, Finish, Program, format_insn

    if Path(path).suffix.lower() in (".asm", ".s"):
        program = Program.from_asm(_read_file(path, binary=False), config, source=path)
    else:
        try:
            program = Program.from_bytes(_read_file(path, binary=True), config)
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
    from vdla.runtime import DramAllocator, OutOfMemory

    if dev.allocator.bytes_in_use:
        raise CliError(f"the {backend} device allocated DRAM when it opened; the image cannot "
                       "be placed at address 0")
    dev.allocator = DramAllocator(dev.dram_size, alignment=dev.allocator.alignment, base=0)
    try:
        dev.alloc(nbytes)
    except OutOfMemory:
        raise CliError(f"the image and the program need {nbytes} bytes of DRAM; the device has "
                       f"{dev.dram_size} (pass a larger --dram-size)") from None


def _cmd_sim(args) -> int:
    import numpy as np

    import vdla.runtime
    from vdla.isa import INSN_BYTES

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
    config = _load_config(args.config)
    program = _read_program(args.program, config)
    image = _read_file(args.dram, binary=True) if args.dram is not None else b""
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
    rows = sorted(stats.items(), key=lambda item: (item[0] != "cycles", item[0]))  # cycles first
    key_width = max([len(key) for key in stats] + [len("wall time")])
    value_width = max([len(str(value)) for value in stats.values()] + [1])
    for key, value in rows:
        print(f"  {key:<{key_width}}  {value:>{value_width}}")
    speed = f" ({stats['cycles'] / seconds:,.0f} cycles/s)" if stats.get("cycles") else ""
    print(f"  {'wall time':<{key_width}}  {seconds * 1e3:.1f} ms{speed}")
    return 0


# --- run ------------------------------------------------------------------------------------

#: Backends `vdla run` can use, and the one it uses without --sim.
RUN_BACKENDS = ("functional", "verilator")
DEFAULT_RUN_BACKEND = "verilator"


def _progress(verb: str):
    """A progress callback for `compile_model`/`Session.run`: one updating line on a
    terminal's stderr, nothing when stderr is not a terminal (logs and tests stay clean).
    Returns (callback or None, function that ends the line)."""
    if not sys.stderr.isatty():
        return None, lambda: None

    def show(done: int, total: int, name: str):
        print(f"\r\x1b[K{verb} [{done + 1}/{total}] {name}", end="", file=sys.stderr,
              flush=True)

    return show, lambda: print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def _load_model(model: str, seed: int, calibration: int):
    """(float graph, calibration samples, the run's feed, a note on the input) for MODEL:
    a zoo name or an .onnx path. digits_cnn calibrates on training images and runs on
    test image `seed`; other models use seeded standard-normal inputs."""
    import numpy as np

    from vdla.compiler import from_onnx, zoo

    if model.lower().endswith(".onnx"):
        if not Path(model).is_file():
            raise CliError(f"ONNX file {model!r} does not exist (MODEL is a zoo name: "
                           f"{', '.join(zoo.names())}, or a path to an .onnx file)")
        graph = from_onnx(model)
    elif model in zoo.names():
        graph = zoo.get(model)
    else:
        raise CliError(f"unknown model {model!r}; MODEL is a zoo name ({', '.join(zoo.names())}) "
                       "or a path to an .onnx file")
    if len(graph.inputs) != 1:
        raise CliError(f"{model}: vdla run feeds models with one input; this one has "
                       f"{len(graph.inputs)} ({', '.join(graph.inputs)})")
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    if model == "digits_cnn":
        from vdla.compiler.datasets import digits_split
        x_train, _, x_test, y_test = digits_split()
        index = seed % len(x_test)
        samples = x_train[:calibration, None]      # one (1, 1, 8, 8) sample each
        return (graph, {name: samples}, {name: x_test[index][None]},
                f"test image {index} of the digits split (label {y_test[index]})")
    rng = np.random.default_rng(seed)
    samples = rng.standard_normal((calibration,) + shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    return graph, {name: samples}, {name: x}, f"standard-normal input, seed {seed}"


def _format_schedule(schedule: dict | None) -> str:
    """A schedule compactly, e.g. ``h14 w56 ci4 co4 oc2`` (threads only when 2), or a
    pool's ``h8 w56 c4``."""
    if schedule is None:
        return "-"
    text = f"h{schedule['tile_h']} w{schedule['tile_w']}"
    if "tile_c" in schedule:  # a pool
        return text + f" c{schedule['tile_c']}"
    text += f" ci{schedule['tile_ci']} co{schedule['tile_co']}"
    if schedule["oc_nthread"] > 1:
        text += f" oc{schedule['oc_nthread']}"
    if schedule["h_nthread"] > 1:
        text += f" ht{schedule['h_nthread']}"
    return text


def _op_table(ops) -> list[str]:
    """The per-op table: name, op, where it ran, schedule, cycles, GEMM util, DRAM bytes."""
    header = ("op", "kind", "on", "schedule", "cycles", "GEMM util", "DRAM bytes")
    rows = [(s.name, s.op, s.target, _format_schedule(s.schedule),
             "-" if s.cycles is None else f"{s.cycles:,}",
             "-" if s.gemm_utilization is None else f"{s.gemm_utilization:.1%}",
             "-" if s.dram_bytes is None else f"{s.dram_bytes:,}") for s in ops]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]

    def line(row):
        left = [f"{v:<{w}}" for v, w in zip(row[:4], widths[:4])]
        right = [f"{v:>{w}}" for v, w in zip(row[4:], widths[4:])]
        return "  ".join(left + right).rstrip()

    return [line(header)] + [line(r) for r in rows]


def _compare(compiled_values: dict, reference_values: dict, graph) -> tuple[bool, str]:
    """Whether every graph output matches the reference bit-exactly; if not, which
    outputs differ and the first op whose output differs."""
    import numpy as np

    bad = [name for name in graph.outputs
           if not np.array_equal(compiled_values[name], reference_values[name])
           or compiled_values[name].dtype != reference_values[name].dtype]
    if not bad:
        return True, ""
    details = []
    for name in bad:
        a, b = compiled_values[name], reference_values[name]
        count = int(np.count_nonzero(a != b)) if a.shape == b.shape else a.size
        details.append(f"output {name!r}: {count} of {b.size} values differ")
    for node in graph.nodes():
        out = node.outputs[0]
        if not np.array_equal(compiled_values[out], reference_values[out]):
            details.append(f"first differing op: {node.name!r} ({node.op})")
            break
    return False, "; ".join(details)


def _cmd_run(args) -> int:
    import vdla.runtime
    from vdla.compiler import passes, quantize, run_reference
    from vdla.compiler.backend import compile_model

    if args.calibration < 1:
        raise CliError(f"--calibration must be a positive integer, not {args.calibration}")
    if args.seed < 0:
        raise CliError(f"--seed must be a non-negative integer, not {args.seed}")
    board, dram = None, None
    if args.board:
        from vdla.cli_boards import board_config
        board, config = board_config(args.board, args.config)
        dram = board.dram_timing()
    else:
        config = _load_config(args.config)
    graph, calibration, feed, input_note = _load_model(args.model, args.seed, args.calibration)
    start = time.perf_counter()
    quantized = quantize(passes.prepare(graph), calibration, config)
    quantize_seconds = time.perf_counter() - start

    schedules = {}
    if args.records:
        from vdla.cli_tune import best_schedules_for_run
        schedules = best_schedules_for_run(args.records, quantized, config)
    show, done = _progress("compiling")
    try:
        compiled = compile_model(quantized, config, schedules=schedules, progress=show)
    finally:
        done()
    backend = args.sim
    show, done = _progress(f"running on {backend}")
    try:
        # verilator logs a build; a board's device has its DRAM model
        with (board.open_device(config, backend) if board is not None
              else vdla.runtime.open(config, backend=backend)) as dev:
            with compiled.session(dev) as session:
                result = session.run(feed, progress=show, keep=True)
    finally:
        done()
    reference = run_reference(quantized, feed, keep=True)
    bit_exact, mismatch = _compare(result.values, reference, quantized)

    on_vdla = len(compiled.vdla_ops)
    print(f"{args.model}: {len(compiled.ops)} ops ({on_vdla} on vdla, "
          f"{len(compiled.ops) - on_vdla} on the host), config {config.name}, {backend} "
          f"backend, {input_note}")
    if board is not None:
        print(f"board: {board.name} ({board.part.name}) at {board.clock_mhz:g} MHz, DRAM "
              f"{dram.bytes_per_cycle:g} bytes/cycle, {dram.read_latency}-cycle read latency"
              + ("" if backend == "verilator" else " (the functional backend has no timing)"))
    for row in _op_table(result.ops):
        print(f"  {row}")
    for s in result.ops:
        if s.target == "host" and s.op in ("qconv2d", "qdense"):
            print(f"  note: {s.name} runs on the host: {s.reason}")
    if args.records:
        gemm_ops = [op for op in compiled.vdla_ops if op.op in ("qconv2d", "qdense")]
        print(f"schedules: {len(schedules)} of {len(gemm_ops)} convolution/dense ops from the "
              f"records {args.records}, the others from the default chooser")
    if result.cycles is None:
        print("total cycles: - (the functional backend counts no cycles; use --sim verilator)")
    else:
        print(f"total cycles: {result.cycles:,} = {result.seconds_at_clock * 1e3:.3f} ms at "
              f"{config.clock_mhz:g} MHz")
    print(f"prepare + quantize: {quantize_seconds:.2f} s; compile: "
          f"{compiled.compile_seconds:.2f} s; simulation: {result.wall_seconds:.2f} s wall")
    print(f"bit-exact vs the quantized reference: {'yes' if bit_exact else 'NO'}"
          + ("" if bit_exact else f" ({mismatch})"))

    if args.json:
        report = {"model": args.model, "backend": backend, "config": config.name,
                  "board": args.board,
                  "dram": None if dram is None else dataclasses.asdict(dram),
                  "clock_mhz": config.clock_mhz, "bit_exact": bit_exact,
                  "cycles": result.cycles, "seconds_at_clock": result.seconds_at_clock,
                  "quantize_seconds": quantize_seconds,
                  "compile_seconds": compiled.compile_seconds,
                  "wall_seconds": result.wall_seconds,
                  "records": args.records, "tuned_ops": sorted(schedules),
                  "ops": [s.to_dict() for s in result.ops]}
        atomic_write(Path(args.json), (json.dumps(report, indent=2) + "\n").encode())
    if not bit_exact:
        raise CliError(f"{args.model}: the {backend} outputs differ from the quantized "
                       f"reference ({mismatch})")
    return 0


# --- verilog --------------------------------------------------------------------------------

def _cmd_verilog(args) -> int:
    from vdla.hw.verilog import generate

    if args.board:
        from vdla.cli_boards import write_board_files
        return write_board_files(args)
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


# --- export ---------------------------------------------------------------------------------

def _cmd_export(args) -> int:
    from vdla.compiler import zoo
    from vdla.compiler.onnx_export import MAX_OPSET, MIN_OPSET, save_onnx

    if args.batch < 1:
        raise CliError(f"--batch must be a positive integer, not {args.batch}")
    if args.image_size is not None and args.image_size < 1:
        raise CliError(f"--image-size must be a positive integer, not {args.image_size}")
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        raise CliError(f"--opset {args.opset} is not supported; choose {MIN_OPSET} to {MAX_OPSET}")
    if args.model not in zoo.names():
        print(f"vdla: error: unknown model {args.model!r}; known models: "
              f"{', '.join(zoo.names())}", file=sys.stderr)
        return 2
    graph = zoo.get(args.model, batch=args.batch, image_size=args.image_size)
    path = save_onnx(graph, args.output, opset=args.opset)
    # Parameters as torch counts them: every constant but BN's running statistics.
    stats = {n.inputs[i] for n in graph.nodes() if n.op == "batch_norm" for i in (3, 4)}
    params = sum(t.data.size for name, t in graph.tensors.items()
                 if t.is_constant and name not in stats)
    print(f"{path}: {args.model}, {len(graph.nodes())} ops, {params:,} parameters, "
          f"opset {args.opset}")
    return 0


# --- entry point ----------------------------------------------------------------------------

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
    verilog.add_argument("--board", metavar="NAME",
                         help="also write the board's wrapper, constraints, vendor project "
                              "script and manifest (see `vdla boards`; default config: the "
                              "board's)")
    verilog.set_defaults(func=_cmd_verilog)

    sim = sub.add_parser("sim", help="run an assembled program on a simulator and print its "
                                     "statistics")
    sim.add_argument("program", metavar="PROGRAM",
                     help="instruction stream from `vdla asm`, or assembly text (.asm, .s)")
    sim.add_argument("--config", metavar="FILE", help=config_help)
    sim.add_argument("--backend", choices=SIM_BACKENDS, default=DEFAULT_SIM_BACKEND,
                     help=f"simulator (default {DEFAULT_SIM_BACKEND})")
    sim.add_argument("--dram", metavar="IMAGE",
                     help="raw DRAM image loaded at byte address 0, where the program's "
                          "LOAD/STORE dram_base fields (absolute) expect its data")
    sim.add_argument("--dram-size", type=_int_arg, metavar="BYTES",
                     help="DRAM of the simulated device (default: the backend's)")
    sim.add_argument("--insn-addr", type=_int_arg, metavar="ADDR",
                     help="DRAM byte address of the instructions (default: the first aligned "
                          "address after the image)")
    sim.add_argument("--dump", metavar="FILE",
                     help="after the run, write DRAM from 0 to the end of the instructions")
    sim.add_argument("--max-cycles", type=_int_arg, metavar="N",
                     help="fail a run that takes more cycles (verilator)")
    sim.add_argument("--trace", metavar="TRACE.json",
                     help="write a per-module busy/wait timeline for ui.perfetto.dev (verilator)")
    sim.add_argument("--wave", metavar="FILE.fst|.vcd", help="write a waveform (verilator)")
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.set_defaults(func=_cmd_sim)

    demo = sub.add_parser("demo", help="run a blocked GEMM on the simulated accelerator and "
                                       "check it against numpy")
    demo.add_argument("--m", type=int, default=256, help="rows of A and C (default 256)")
    demo.add_argument("--n", type=int, default=256, help="rows of B, columns of C (default 256)")
    demo.add_argument("--k", type=int, default=64, help="reduction length (default 64)")
    demo.add_argument("--shift", type=int, default=8, choices=range(32), metavar="S",
                      help="requantization shift 0..31 (default 8)")
    demo.add_argument("--threads", type=int, default=2, choices=(1, 2),
                      help="virtual threads (default 2)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=SIM_BACKENDS, default="verilator",
                      help="simulator (default verilator; the first run builds the model)")
    demo.add_argument("--config", metavar="FILE", help=config_help)
    demo.set_defaults(func=_cmd_demo)

    export = sub.add_parser("export", help="write a built-in model (vdla.compiler.zoo) as ONNX")
    export.add_argument("model", metavar="MODEL",
                        help="zoo model name (resnet18, mobilenet_v1, small_cnn, ...)")
    export.add_argument("-o", "--output", required=True, metavar="FILE.onnx", help="ONNX output")
    export.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    export.add_argument("--image-size", type=int, metavar="S",
                        help="input height and width (default: the model's)")
    export.add_argument("--opset", type=int, default=13, metavar="K",
                        help="ONNX opset to write (default 13)")
    export.set_defaults(func=_cmd_export)

    run = sub.add_parser("run", help="compile a model, run it on the simulated accelerator and "
                                     "check it bit-exactly against the quantized reference")
    run.add_argument("model", metavar="MODEL",
                     help="zoo model name (resnet18, digits_cnn, small_cnn, ...) or an .onnx path")
    run.add_argument("--sim", choices=RUN_BACKENDS, default=DEFAULT_RUN_BACKEND,
                     help=f"simulator (default {DEFAULT_RUN_BACKEND}; the first run builds the "
                          "model)")
    run.add_argument("--config", metavar="FILE", help=config_help)
    run.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    run.add_argument("--seed", type=int, default=0,
                     help="seeds the inputs (digits_cnn: the test image's index) (default 0)")
    run.add_argument("--calibration", type=int, default=4, metavar="N",
                     help="calibration samples for quantization (default 4)")
    run.add_argument("--board", metavar="NAME",
                     help="simulate the board's config, DRAM port and memory timing, and "
                          "report time at its clock (see `vdla boards`; --config then names "
                          "a config for the board)")
    run.add_argument("--records", metavar="DB",
                     help="compile each convolution with its best schedule in this tuning "
                          "records file (vdla tune); the default chooser for the others")
    run.set_defaults(func=_cmd_run)

    from vdla import cli_boards, cli_tune
    cli_tune.add_parser(sub, config_help)
    cli_boards.add_parsers(sub, config_help)
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
