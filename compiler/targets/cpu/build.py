"""Builds C sources into a shared library with the system C compiler, cached on disk.

    build = build_library({"kernels.c": source}, name="kernels")
    lib = build.load()                       # a ctypes.CDLL

A build runs ``cc -O3 -march=native -fPIC -std=c11 -Wall [-fopenmp] FLAGS -shared -o
lib<name>.so *.c -lm`` once (`BASE_FLAGS`); the compiler is `find_c_compiler`'s.
Builds are cached like the Verilator builds (`vdla.sim.verilator.build`), under
`cache_root()` (``$VDLA_CACHE``, default ``~/.cache/vdla``):

- ``cpu/<key>/``: one finished build: the sources, ``lib<name>.so``, the compiler's
  ``build.log`` (its warnings) and ``entry.json``, which records the library's SHA-256;
  an entry whose library does not match (truncated, corrupt) is rebuilt, never loaded.
  The key hashes everything that affects the library: the sources and their names, the
  flags, the compiler (path and ``--version``), what ``-march=native`` means on this
  machine (its predefined macros: a cache shared with another CPU never hands it code
  for instructions it lacks), and `RECIPE_VERSION`.
- ``cpu/failed/<key>/``: the last failed build of a key: its sources and ``build.log``,
  whose path the `BuildError` names. A failure leaves no entry; a later success of the
  key removes its failure.

Builds are safe across processes: a build holds an exclusive lock on
``cpu/.locks/<key>.lock`` (released by the kernel when its process dies), compiles in a
private temporary folder and renames the finished folder into place (atomic). A build
killed half-way leaves only a temporary folder, which the next build of the key removes.

`write_project` writes the same sources with a Makefile instead, for building the
library with ``make`` and no Python.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping, Sequence

from vdla._buildcache import build_entry, cache_root, write_entry
from vdla._fileio import atomic_write
from vdla._tools import tool_folders
from vdla.compiler.targets.cpu.cfiles import render, static_text

__all__ = ["BASE_FLAGS", "OPENMP_FLAG", "RECIPE_VERSION", "BuildError", "CBuild",
           "CompilerNotFound", "MachineFeatures", "build_library", "find_c_compiler",
           "machine_features", "write_project"]

#: Compiler flags of every build, cached or from `write_project`'s Makefile.
BASE_FLAGS = ("-O3", "-march=native", "-fPIC", "-std=c11", "-Wall")
OPENMP_FLAG = "-fopenmp"
#: Bump when the build recipe changes in a way the hashed inputs do not show.
RECIPE_VERSION = 1
#: Compilers looked for when ``$CC`` is not set, in order.
_COMPILERS = ("gcc", "cc")
_LOG_TAIL_LINES = 25
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.[ch]")
_LIBRARY_NAME = re.compile(r"[A-Za-z0-9_]+")


class BuildError(RuntimeError):
    """A C build failed or cannot start. `log` is the compiler's log file when there is
    one (the message names it and quotes its end)."""

    def __init__(self, message: str, log: str | os.PathLike | None = None):
        super().__init__(message)
        self.log = None if log is None else Path(log)

    def __reduce__(self):
        # Picklable across processes (tuner workers) with its log path.
        return type(self), (str(self), self.log)


class CompilerNotFound(BuildError, FileNotFoundError):
    """No C compiler: the message says how to install one. A `FileNotFoundError` too, so
    callers that report `OSError` (the CLI) show it as it is, as for `ToolNotFound`."""


@dataclasses.dataclass(frozen=True)
class MachineFeatures:
    """What the C compiler targets with ``-march=native`` on this machine (its predefined
    macros), and whether it builds OpenMP programs. The CPU target picks its kernels'
    instructions (AVX2 intrinsics or portable C) from these."""

    compiler: str
    sse4_1: bool        # __SSE4_1__
    avx2: bool          # __AVX2__
    fma: bool           # __FMA__
    avx512f: bool       # __AVX512F__
    avx512vnni: bool    # __AVX512VNNI__
    avxvnni: bool       # __AVXVNNI__
    neon: bool          # __ARM_NEON
    openmp: bool        # -fopenmp compiles and links a program
    amx_tile: bool      # __AMX_TILE__ (the CPU has AMX tiles; the OS may still refuse them)
    amx_int8: bool      # __AMX_INT8__
    amx_bf16: bool = False      # __AMX_BF16__ (the bf16 precision's tdpbf16ps)


_FEATURE_MACROS = {"sse4_1": "__SSE4_1__", "avx2": "__AVX2__", "fma": "__FMA__",
                   "avx512f": "__AVX512F__", "avx512vnni": "__AVX512VNNI__",
                   "avxvnni": "__AVXVNNI__", "neon": "__ARM_NEON",
                   "amx_tile": "__AMX_TILE__", "amx_int8": "__AMX_INT8__",
                   "amx_bf16": "__AMX_BF16__"}


@dataclasses.dataclass(frozen=True)
class CBuild:
    """A finished build: the library `path` (``lib<name>.so`` in the cache entry
    `folder`), its cache `key`, whether it came from the cache (`cached`) and how long
    this call took (`seconds`)."""

    path: Path
    key: str
    cached: bool
    seconds: float

    @property
    def folder(self) -> Path:
        return self.path.parent

    def load(self) -> ctypes.CDLL:
        """The library, loaded (the caller declares its functions' argtypes/restype)."""
        return ctypes.CDLL(str(self.path))


# --- the compiler and the machine ---------------------------------------------------------

def _install_hint() -> str:
    if sys.platform == "darwin":
        how = "`xcode-select --install` (or `brew install gcc`)"
    elif sys.platform.startswith("linux"):
        how = "`apt install gcc` (Debian, Ubuntu) or `dnf install gcc` (Fedora)"
    else:
        how = "gcc or clang"
    return f"install a C compiler: {how}; or set $CC to one"


def find_c_compiler() -> str:
    """The path of the C compiler builds use: ``$CC`` when set (a path, or a name looked
    up as below), else the first of gcc and cc in `vdla._tools.tool_folders()` (next to
    the Python interpreter, then PATH). Raises `CompilerNotFound` (a `BuildError`) saying
    how to install one."""
    folders = tool_folders()

    def lookup(name: str) -> str | None:
        if os.sep in name or (os.altsep and os.altsep in name):
            path = Path(name).expanduser()
            return str(path) if path.is_file() and os.access(path, os.X_OK) else None
        for folder in folders:
            path = shutil.which(name, path=folder)
            if path is not None:
                return path
        return None

    requested = os.environ.get("CC", "").strip()
    if requested:
        found = lookup(requested)
        if found is None:
            raise CompilerNotFound(f"$CC is {requested!r}, which is not an executable C "
                                   f"compiler; {_install_hint()}")
        return found
    for name in _COMPILERS:
        found = lookup(name)
        if found is not None:
            return found
    raise CompilerNotFound(f"no C compiler found ({' or '.join(_COMPILERS)}, looked in "
                           f"{', '.join(folders)}); {_install_hint()}")


def _run_probe(command: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, **kwargs)
    except OSError as exc:
        raise CompilerNotFound(f"the C compiler {command[0]!r} does not run ({what}): "
                               f"{exc.strerror}; {_install_hint()}") from None


@lru_cache(maxsize=None)
def _compiler_identity(cc: str) -> str:
    proc = _run_probe([cc, "--version"], "--version")
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines:
        raise BuildError(f"the C compiler {cc!r} fails `--version` (exit status "
                         f"{proc.returncode}): {proc.stderr.strip()}")
    return f"{cc}: {lines[0]}"


@lru_cache(maxsize=None)
def _native_macros(cc: str) -> str:
    """The macros `cc` predefines with ``-march=native`` (``-dM -E`` of an empty file),
    sorted: what the machine's instruction set means to this compiler."""
    proc = _run_probe([cc, "-march=native", "-dM", "-E", "-x", "c", "-"], "-march=native",
                      stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise BuildError(f"the C compiler {cc!r} does not support -march=native (exit "
                         f"status {proc.returncode}): {proc.stderr.strip()}")
    return "\n".join(sorted(proc.stdout.splitlines()))


@lru_cache(maxsize=None)
def _openmp_works(cc: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="vdla-openmp-") as folder:
        (Path(folder) / "probe.c").write_text(static_text("openmp_probe.c"))
        proc = _run_probe([cc, OPENMP_FLAG, "probe.c", "-o", "probe"], OPENMP_FLAG,
                          cwd=folder)
        return proc.returncode == 0 and (Path(folder) / "probe").is_file()


def machine_features(cc: str | None = None) -> MachineFeatures:
    """What `cc` (default `find_c_compiler()`) reports for ``-march=native`` here, and
    whether it builds OpenMP programs. Probed once per compiler and process."""
    cc = find_c_compiler() if cc is None else cc
    defined = {line.split()[1] for line in _native_macros(cc).splitlines()
               if line.startswith("#define ") and len(line.split()) >= 2}
    return MachineFeatures(compiler=cc, openmp=_openmp_works(cc),
                           **{field: macro in defined
                              for field, macro in _FEATURE_MACROS.items()})


# --- checking the arguments ---------------------------------------------------------------

def _check_sources(sources: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(sources, Mapping) or not sources:
        raise ValueError(f"sources must be a non-empty dict of file name -> C text, not "
                         f"{sources!r}")
    for file, text in sources.items():
        if not isinstance(file, str) or not _SOURCE_NAME.fullmatch(file):
            raise ValueError(f"source file name {file!r} must be a plain file name ending "
                             "in .c or .h (letters, digits, _ . -)")
        if not isinstance(text, str):
            raise TypeError(f"source {file!r} must be str, not {type(text).__name__}")
    if not any(file.endswith(".c") for file in sources):
        raise ValueError(f"sources need at least one .c file, not only {sorted(sources)}")
    return dict(sorted(sources.items()))


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _LIBRARY_NAME.fullmatch(name):
        raise ValueError(f"library name must be letters, digits and _ (it becomes "
                         f"lib<name>.so), not {name!r}")
    return name


def _check_flags(flags: Sequence[str]) -> tuple[str, ...]:
    if isinstance(flags, str) or not all(isinstance(f, str) and f for f in flags):
        raise TypeError(f"flags must be a sequence of non-empty strings (one per argument), "
                        f"not {flags!r}")
    return tuple(flags)


def _check_programs(programs: Mapping[str, Sequence[str]],
                    sources: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    checked = {}
    for program, headers in programs.items():
        if not isinstance(program, str) or not _LIBRARY_NAME.fullmatch(program):
            raise ValueError(f"program name must be letters, digits and _ (it becomes a "
                             f"make target), not {program!r}")
        headers = (headers,) if isinstance(headers, str) else tuple(headers)
        strays = [h for h in headers if not (h in sources and h.endswith(".h"))]
        if strays:
            raise ValueError(f"program {program!r} includes {strays}, which are not "
                             f"headers among the sources {sorted(sources)}")
        checked[program] = headers
    return checked


def _compile_flags(flags: tuple[str, ...], openmp: bool) -> list[str]:
    # The caller's flags come last, so they can override the defaults (-O2, -march=...).
    return [*BASE_FLAGS, *([OPENMP_FLAG] if openmp else []), *flags]


# --- the cache ------------------------------------------------------------------------------

def _build_key(sources: dict[str, str], name: str, command_flags: list[str], cc: str) -> str:
    digest = hashlib.sha256()
    for part in (f"recipe {RECIPE_VERSION}", name, json.dumps(command_flags),
                 _compiler_identity(cc), _native_macros(cc)):
        digest.update(part.encode() + b"\0")
    for file, text in sources.items():
        digest.update(file.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:32]


def build_library(sources: Mapping[str, str], *, name: str, flags: Sequence[str] = (),
                  openmp: bool = True, cache: str | os.PathLike | None = None,
                  log: Callable[[str], None] | None = None) -> CBuild:
    """``lib<name>.so`` built from `sources`, or from the cache.

    Parameters
    ----------
    sources : dict of file name -> text
        The ``.c`` files (all compiled and linked into the library) and ``.h`` files.
    name : str
        The library is ``lib<name>.so``.
    flags : sequence of str
        Compiler arguments after `BASE_FLAGS` (so they can override them).
    openmp : bool
        Build with ``-fopenmp``; `BuildError` when the compiler cannot
        (`machine_features(cc).openmp` says beforehand; without it the pragmas are ignored
        and ``_OPENMP`` is not defined).
    cache : folder, optional
        Overrides ``$VDLA_CACHE``.
    log : callable, optional
        Called with one-line progress messages.

    Raises `BuildError` when the compiler fails; its message names the log file (kept in
    ``cpu/failed/<key>/``) and quotes its end. `CompilerNotFound` when there is none.
    """
    sources, name, flags = _check_sources(sources), _check_name(name), _check_flags(flags)
    log = log or (lambda message: None)
    started = time.perf_counter()
    cc = find_c_compiler()
    command_flags = _compile_flags(flags, bool(openmp))
    key = _build_key(sources, name, command_flags, cc)
    builds = (cache_root() if cache is None else Path(cache).expanduser()) / "cpu"
    entry = builds / key
    library_name = f"lib{name}.so"

    def result(cached: bool) -> CBuild:
        return CBuild(entry / library_name, key, cached, time.perf_counter() - started)

    with build_entry(builds, key, log=log, waiting=f"{library_name} ({key})") as tmp:
        if tmp is None:
            return result(True)
        if openmp and not _openmp_works(cc):
            raise BuildError(f"the C compiler {cc} cannot build OpenMP programs "
                             f"({OPENMP_FLAG}); install its OpenMP runtime (gcc: libgomp, "
                             "clang: libomp) or build with openmp=False")
        log(f"building {library_name} with {cc} (cached in {builds}) ...")
        _compile(tmp, sources, library_name, command_flags, cc, builds / "failed" / key)
        write_entry(tmp, library_name, {
            "key": key, "name": name, "compiler": _compiler_identity(cc),
            "flags": command_flags, "seconds": round(time.perf_counter() - started, 3)})
    shutil.rmtree(builds / "failed" / key, ignore_errors=True)
    log(f"built {library_name} in {time.perf_counter() - started:.1f} s")
    return result(False)


def _compile(folder: Path, sources: dict[str, str], library_name: str,
             command_flags: list[str], cc: str, failed: Path) -> None:
    """Compile `sources` in `folder` into `library_name`; on failure move `folder` to
    `failed` (replacing an older failure) and raise `BuildError` naming its log."""
    for file, text in sources.items():
        (folder / file).write_text(text)
    command = [cc, *command_flags, "-shared", "-o", library_name,
               *(file for file in sources if file.endswith(".c")), "-lm"]
    log_path = folder / "build.log"
    with open(log_path, "w") as out:
        out.write(f"$ {shlex.join(command)}\n")   # run in the folder of this log
        out.flush()
        proc = subprocess.run(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    if proc.returncode == 0 and (folder / library_name).is_file():
        return
    shutil.rmtree(failed, ignore_errors=True)
    failed.parent.mkdir(parents=True, exist_ok=True)
    os.rename(folder, failed)
    log_path = failed / "build.log"
    tail = log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    raise BuildError(f"the C build of {library_name} failed (exit status {proc.returncode}); "
                     f"the compiler's log is {log_path}; its end:\n" + "\n".join(tail),
                     log_path)


# --- a project that builds without Python ------------------------------------------------

def write_project(sources: Mapping[str, str], out_dir: str | os.PathLike, *, name: str,
                  flags: Sequence[str] = (), openmp: bool = True,
                  programs: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Write `sources` and a Makefile into `out_dir` (created if needed) and return it.

    ``make`` there builds ``lib<name>.so`` and the static ``lib<name>.a`` with the flags
    `build_library` uses (``make CC=clang``, ``make OPENMP=`` to change the compiler or
    build without OpenMP); no Python needed. Programs linking ``lib<name>.a`` add
    ``-fopenmp -lm``. Each file is written atomically.

    programs : program name -> the headers it includes; ``make`` also builds each program
        from ``<program>.c`` (which the caller writes: it is not part of the library)
        linked with ``lib<name>.a``
    """
    sources, name, flags = _check_sources(sources), _check_name(name), _check_flags(flags)
    programs = _check_programs(programs or {}, sources)
    out = Path(out_dir)
    objects = [file[:-2] + ".o" for file in sources if file.endswith(".c")]
    shared, static = f"lib{name}.so", f"lib{name}.a"
    makefile = render(
        "Makefile", SHARED=shared, STATIC=static, CFLAGS=" ".join(BASE_FLAGS + flags),
        OPENMP=OPENMP_FLAG if openmp else "", OBJS=" ".join(objects),
        HDRS=" ".join(file for file in sources if file.endswith(".h")),
        ALL=" ".join([*programs, shared, static]),
        CLEAN=" ".join([*programs, "$(OBJS)", shared, static]))
    makefile += "".join(render("program.mk", PROGRAM=program, STATIC=static,
                               PREREQUISITES=" ".join([static, *headers]))
                        for program, headers in programs.items())
    for file, text in sources.items():
        atomic_write(out / file, text.encode())
    atomic_write(out / "Makefile", makefile.encode())
    return out
