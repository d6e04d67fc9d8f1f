"""C builds with the system compiler (real gcc, no mocks): results against numpy, the
content-hashed cache (hits, new keys, two processes at once, a corrupt entry rebuilt),
failures that leave the cache clean, the machine's features, and the stand-alone
project built with make."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from vdla.compiler.targets.cpu.build import (BuildError, CompilerNotFound, build_library,
                                             find_c_compiler, machine_features,
                                             write_project)

DOT_H = """\
#include <stdint.h>
int32_t dot_s8(const int8_t *a, const int8_t *b, int n);
void gemv_s8(const int8_t *w, const int8_t *x, int32_t *y, int rows, int cols);
int openmp_on(void);
"""

DOT_C = """\
#include "dot.h"
/* int8 dot product, int32 accumulation */
int32_t dot_s8(const int8_t *a, const int8_t *b, int n) {
    int32_t acc = 0;
    for (int i = 0; i < n; i++)
        acc += (int32_t)a[i] * (int32_t)b[i];
    return acc;
}
"""

GEMV_C = """\
#include "dot.h"
#ifdef _OPENMP
#include <omp.h>
#endif
/* y = w x, one row per OpenMP iteration */
void gemv_s8(const int8_t *w, const int8_t *x, int32_t *y, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        y[r] = dot_s8(w + (long)r * cols, x, cols);
}
int openmp_on(void) {
#ifdef _OPENMP
    return omp_get_max_threads() >= 1;
#else
    return 0;
#endif
}
"""

SOURCES = {"dot.h": DOT_H, "dot.c": DOT_C, "gemv.c": GEMV_C}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p = ctypes.c_void_p
    lib.dot_s8.argtypes, lib.dot_s8.restype = [p, p, ctypes.c_int], ctypes.c_int32
    lib.gemv_s8.argtypes, lib.gemv_s8.restype = [p, p, p, ctypes.c_int, ctypes.c_int], None
    lib.openmp_on.argtypes, lib.openmp_on.restype = [], ctypes.c_int
    return lib


def check_numbers(lib: ctypes.CDLL) -> None:
    """dot_s8 and gemv_s8 against numpy, on the extremes of int8 and odd sizes."""
    rng = np.random.default_rng(21)
    a = rng.integers(-128, 128, 1031).astype(np.int8)
    b = rng.integers(-128, 128, 1031).astype(np.int8)
    a[:4], b[:4] = -128, [-128, 127, -128, 127]
    assert lib.dot_s8(a.ctypes.data, b.ctypes.data, a.size) == \
        int(a.astype(np.int32) @ b.astype(np.int32))
    w = rng.integers(-128, 128, (37, 300)).astype(np.int8)
    y = np.zeros(37, np.int32)
    lib.gemv_s8(w.ctypes.data, a.ctypes.data, y.ctypes.data, 37, 300)
    np.testing.assert_array_equal(y, w.astype(np.int32) @ a[:300].astype(np.int32))


def leftovers(cache) -> list[str]:
    return [p.name for p in (cache / "cpu").glob(".tmp-*")]


class TestBuild:
    def test_builds_loads_and_computes(self, tmp_path):
        build = build_library(SOURCES, name="dot", cache=tmp_path)
        assert not build.cached
        assert build.path == tmp_path / "cpu" / build.key / "libdot.so"
        assert build.folder == build.path.parent
        entry = json.loads((build.folder / "entry.json").read_text())
        assert entry["library"] == "libdot.so" and "-fopenmp" in entry["flags"]
        lib = bind(build.load())
        check_numbers(lib)
        assert lib.openmp_on() == 1

    def test_without_openmp(self, tmp_path):
        lib = bind(build_library(SOURCES, name="dot", openmp=False, cache=tmp_path).load())
        check_numbers(lib)
        assert lib.openmp_on() == 0

    def test_log_receives_progress(self, tmp_path):
        messages = []
        build_library(SOURCES, name="dot", cache=tmp_path, log=messages.append)
        assert any("building libdot.so" in m for m in messages)

    def test_cache_env(self, tmp_path, monkeypatch):
        monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
        build = build_library(SOURCES, name="dot")
        assert build.path.is_relative_to(tmp_path / "cpu")


class TestCache:
    def test_second_build_is_cached(self, tmp_path):
        first = build_library(SOURCES, name="dot", cache=tmp_path)
        second = build_library(SOURCES, name="dot", cache=tmp_path)
        assert second.cached and second.key == first.key and second.path == first.path
        assert second.seconds < 0.2

    @pytest.mark.parametrize("change", [
        dict(flags=["-DVARIANT=1"]), dict(openmp=False), dict(name="dot2"),
        dict(sources={**SOURCES, "dot.c": DOT_C + "/* changed */\n"}),
        dict(sources={**SOURCES, "extra.h": "#define EXTRA 1\n"})])
    def test_a_change_gives_a_new_key(self, tmp_path, change):
        base = dict(sources=SOURCES, name="dot")
        first = build_library(**base, cache=tmp_path)
        changed = build_library(**{**base, **change}, cache=tmp_path)
        assert changed.key != first.key and not changed.cached

    def test_two_processes_share_one_entry(self, tmp_path):
        (tmp_path / "sources.json").write_text(json.dumps(SOURCES))
        cache = tmp_path / "cache"
        script = (
            "import json, sys, time\n"
            "from vdla.compiler.targets.cpu.build import build_library\n"
            "sources = json.loads(open(sys.argv[1]).read())\n"
            "time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # start together\n"
            "b = build_library(sources, name='dot', cache=sys.argv[2],\n"
            "                  log=lambda m: print(m, file=sys.stderr))\n"
            "print(json.dumps({'path': str(b.path), 'cached': b.cached}))\n")
        start = time.time() + 2.0
        procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "sources.json"),
                                   str(cache), str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [proc.communicate(timeout=60) for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outs
        results = [json.loads(out) for out, _ in outs]
        assert results[0]["path"] == results[1]["path"]
        assert sorted(r["cached"] for r in results) == [False, True]   # built once
        assert len([p for p in (cache / "cpu").iterdir() if not p.name.startswith(".")]) == 1
        assert leftovers(cache) == []
        again = build_library(SOURCES, name="dot", cache=cache)
        assert again.cached and str(again.path) == results[0]["path"]
        check_numbers(bind(again.load()))

    def test_corrupt_library_is_rebuilt(self, tmp_path):
        # Not loaded before the truncation: truncating a mapped library crashes the process.
        sources = {**SOURCES, "dot.c": DOT_C + "/* corrupt test */\n"}
        first = build_library(sources, name="dot", cache=tmp_path)
        size = first.path.stat().st_size
        with open(first.path, "r+b") as f:
            f.truncate(size // 2)
        again = build_library(sources, name="dot", cache=tmp_path)
        assert not again.cached and again.path == first.path
        assert again.path.stat().st_size == size
        check_numbers(bind(again.load()))

    def test_missing_entry_record_is_rebuilt(self, tmp_path):
        first = build_library(SOURCES, name="dot", cache=tmp_path)
        (first.folder / "entry.json").unlink()
        assert not build_library(SOURCES, name="dot", cache=tmp_path).cached


class TestErrors:
    def test_compile_error_names_the_log_and_leaves_no_entry(self, tmp_path):
        broken = {**SOURCES, "dot.c": DOT_C.replace("acc = 0;", "acc = 0")}
        with pytest.raises(BuildError) as info:
            build_library(broken, name="dot", cache=tmp_path)
        error = info.value
        assert error.log is not None and str(error.log) in str(error)
        assert error.log.parent == tmp_path / "cpu" / "failed" / error.log.parent.name
        text = error.log.read_text()
        assert "error" in text and "dot.c" in text
        assert "error" in str(error)               # the log's end is in the message
        key = error.log.parent.name
        assert not (tmp_path / "cpu" / key).exists()
        assert leftovers(tmp_path) == []
        # The failure is kept for reading; building again fails the same way.
        with pytest.raises(BuildError):
            build_library(broken, name="dot", cache=tmp_path)
        assert not (tmp_path / "cpu" / key).exists() and error.log.is_file()

    def test_link_error_is_a_build_error(self, tmp_path):
        # Compiles, but -Wl,--no-undefined refuses the missing symbol at link time.
        sources = {"a.c": "int missing(void);\nint f(void) { return missing(); }\n"}
        with pytest.raises(BuildError, match="build.log"):
            build_library(sources, name="a", flags=["-Wl,--no-undefined"], cache=tmp_path)

    def test_no_compiler_says_how_to_install_one(self, tmp_path, monkeypatch):
        monkeypatch.setenv("CC", "/nonexistent")
        with pytest.raises(CompilerNotFound, match="install a C compiler") as info:
            build_library(SOURCES, name="dot", cache=tmp_path)
        assert "/nonexistent" in str(info.value)
        assert isinstance(info.value, BuildError) and isinstance(info.value, OSError)
        assert not (tmp_path / "cpu").exists() or not any((tmp_path / "cpu").iterdir())

    def test_cc_by_name(self, monkeypatch):
        monkeypatch.setenv("CC", "gcc")
        assert find_c_compiler() == shutil.which("gcc")

    @pytest.mark.parametrize("sources, message", [
        ({}, "non-empty"), ({"dot.h": DOT_H}, "at least one .c"),
        ({"../evil.c": DOT_C}, "plain file name"), ({"dot.cpp": DOT_C}, "plain file name"),
        ({"Makefile": DOT_C}, "plain file name")])
    def test_bad_sources(self, tmp_path, sources, message):
        with pytest.raises(ValueError, match=message):
            build_library(sources, name="dot", cache=tmp_path)

    def test_source_text_must_be_str(self, tmp_path):
        with pytest.raises(TypeError, match="'dot.c' must be str"):
            build_library({"dot.c": DOT_C.encode()}, name="dot", cache=tmp_path)

    @pytest.mark.parametrize("name", ["", "lib-dot", "a/b", "dot.so", 3])
    def test_bad_name(self, tmp_path, name):
        with pytest.raises(ValueError, match="library name"):
            build_library(SOURCES, name=name, cache=tmp_path)

    @pytest.mark.parametrize("flags", ["-O2", ["-O2", ""], [None]])
    def test_bad_flags(self, tmp_path, flags):
        with pytest.raises(TypeError, match="flags must be"):
            build_library(SOURCES, name="dot", flags=flags, cache=tmp_path)

    def test_build_error_pickles(self, tmp_path):
        import pickle
        error = BuildError("failed", tmp_path / "build.log")
        again = pickle.loads(pickle.dumps(error))
        assert str(again) == "failed" and again.log == error.log


#: `MachineFeatures` fields and the flags ``/proc/cpuinfo`` names them by, on x86.
CPUINFO_FLAGS = {"sse4_1": "sse4_1", "avx2": "avx2", "fma": "fma", "avx512f": "avx512f",
                 "avx512vnni": "avx512_vnni"}


def cpuinfo_flags() -> set[str] | None:
    """The first processor's flags in ``/proc/cpuinfo``; None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


class TestMachine:
    def test_features(self):
        features = machine_features()
        assert features.compiler == find_c_compiler()
        assert features.openmp            # gcc with libgomp on this machine
        if platform.machine() in ("x86_64", "AMD64"):
            # What the compiler reports for -march=native is what the CPU has: not a
            # list of one machine's (an x86 CPU may lack AVX2, or have AVX-512).
            flags = cpuinfo_flags()
            if flags is not None:
                for field, flag in CPUINFO_FLAGS.items():
                    assert getattr(features, field) == (flag in flags), field
            assert not features.neon
        elif platform.machine() in ("aarch64", "arm64"):
            assert features.neon and not features.avx2
        assert machine_features(features.compiler) == features   # cached per compiler


MAIN_C = """\
#include <stdio.h>
#include "dot.h"
int main(void) {
    int8_t a[5] = {-128, 127, 3, -4, 5}, b[5] = {-128, -128, 2, 2, 2};
    int8_t w[10] = {1, 1, 1, 1, 1, -1, -1, -1, -1, -1};
    int32_t y[2];
    gemv_s8(w, a, y, 2, 5);
    printf("%d %d %d\\n", dot_s8(a, b, 5), y[0], y[1]);
    return 0;
}
"""


class TestProject:
    def test_make_builds_shared_and_static(self, tmp_path):
        out = write_project(SOURCES, tmp_path / "project", name="dot")
        assert sorted(p.name for p in out.iterdir()) == ["Makefile", "dot.c", "dot.h",
                                                         "gemv.c"]
        env = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "MAKEFLAGS")}
        subprocess.run(["make", "-s"], cwd=out, env=env, check=True, capture_output=True)
        assert (out / "libdot.so").is_file() and (out / "libdot.a").is_file()
        lib = bind(ctypes.CDLL(str(out / "libdot.so")))
        check_numbers(lib)
        assert lib.openmp_on() == 1
        # The static library links into a C program: no Python anywhere.
        (tmp_path / "main.c").write_text(MAIN_C)
        subprocess.run(["gcc", "-fopenmp", f"-I{out}", "main.c", str(out / "libdot.a"),
                        "-lm", "-o", "main"], cwd=tmp_path, check=True, capture_output=True)
        run = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True,
                             check=True)
        expected = (-128 * -128 + 127 * -128 + 6 - 8 + 10, -128 + 127 + 3 - 4 + 5,
                    128 - 127 - 3 + 4 - 5)
        assert run.stdout.split() == [str(v) for v in expected]

    def test_make_builds_a_program_on_the_static_library(self, tmp_path):
        out = write_project(SOURCES, tmp_path, name="dot", programs={"main": ["dot.h"]})
        (out / "main.c").write_text(MAIN_C)
        makefile = (out / "Makefile").read_text()
        assert "all: main libdot.so libdot.a\n" in makefile
        assert "rm -f main $(OBJS) libdot.so libdot.a\n" in makefile
        assert makefile.endswith("\nmain: main.c libdot.a dot.h\n"
                                 "\t$(CC) $(CFLAGS) $(OPENMP) -o $@ main.c libdot.a $(LDLIBS)\n")
        env = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "MAKEFLAGS")}
        subprocess.run(["make", "-s"], cwd=out, env=env, check=True, capture_output=True)
        run = subprocess.run([str(out / "main")], capture_output=True, text=True, check=True)
        assert len(run.stdout.split()) == 3
        assert not (out / "main.o").exists()    # main.c is not part of the library

    @pytest.mark.parametrize("programs, message", [
        ({"my prog": []}, "program name must be letters, digits and _"),
        ({"main": ["nosuch.h"]}, r"program 'main' includes \['nosuch.h'\], which are not"),
        ({"main": ["dot.c"]}, r"includes \['dot.c'\]"),
    ])
    def test_bad_programs(self, tmp_path, programs, message):
        with pytest.raises(ValueError, match=message):
            write_project(SOURCES, tmp_path, name="dot", programs=programs)
        assert not any(tmp_path.iterdir())

    def test_makefile_uses_the_build_flags(self, tmp_path):
        out = write_project(SOURCES, tmp_path, name="dot", flags=["-DX=1"], openmp=False)
        makefile = (out / "Makefile").read_text()
        assert "CFLAGS = -O3 -march=native -fPIC -std=c11 -Wall -DX=1" in makefile
        assert "OPENMP = \n" in makefile
