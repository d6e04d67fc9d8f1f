"""The Verilator build cache across processes: reuse, concurrent builds, a build killed
half-way, a corrupt entry. Real builds of a small config in a private cache folder."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import vdla
from vdla.sim.verilator import VerilatorSimulator, build_model
from vdla.sim.verilator.build import LIBRARY_NAME, build_note

SMALL = vdla.HardwareConfig(block_in=8, block_out=8, uop_buff_size=4096, inp_buff_size=4096,
                            wgt_buff_size=16384, acc_buff_size=16384)

BUILD_SCRIPT = textwrap.dedent("""
    import json, sys
    import vdla
    from vdla.sim.verilator import build_model
    config = vdla.HardwareConfig.from_json(sys.argv[1])
    build = build_model(config)
    print(json.dumps({"built": build.built, "key": build.key, "library": str(build.library)}))
""")


def start_build(config_path, cache):
    env = dict(os.environ, VDLA_CACHE=str(cache))
    return subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(config_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])


@pytest.fixture
def small_config(tmp_path):
    path = tmp_path / "small.json"
    SMALL.to_json(path)
    return path


def runs_a_program(cache):
    """The cached model loads and runs FINISH."""
    sim = VerilatorSimulator(SMALL, 1 << 16, cache=cache)
    program = vdla.isa.Program([vdla.isa.Finish()], SMALL)
    sim.dram[:16] = np.frombuffer(program.to_bytes(), np.uint8)
    stats = sim.run_from_dram(0, 1)
    sim.close()
    return stats["compute_insns"] == 1


def test_default_model_is_reused_by_a_second_process(tmp_path):
    """The session's default build (whatever built it) is found by a new process, which
    builds nothing."""
    config = tmp_path / "default.json"
    vdla.HardwareConfig().to_json(config)
    first = finish(start_build(config, os.environ.get("VDLA_CACHE") or _default_cache()))
    second = finish(start_build(config, os.environ.get("VDLA_CACHE") or _default_cache()))
    assert not second["built"]
    assert second["key"] == first["key"]


def _default_cache():
    from vdla._buildcache import cache_root
    return cache_root()


def test_concurrent_builds_build_once_and_a_corrupt_entry_is_rebuilt(tmp_path, small_config):
    cache = tmp_path / "cache"
    procs = [start_build(small_config, cache) for _ in range(2)]
    results = [finish(p) for p in procs]
    assert sorted(r["built"] for r in results) == [False, True]   # one built, one waited
    assert results[0]["key"] == results[1]["key"]
    again = finish(start_build(small_config, cache))
    assert not again["built"]
    entry = cache / "verilator" / again["key"]
    names = {p.name for p in entry.iterdir()}
    assert {"entry.json", LIBRARY_NAME, "build.log"} <= names and "obj" not in names
    # Corrupt the library: the next build notices (hash mismatch) and rebuilds it.
    library = entry / LIBRARY_NAME
    library.write_bytes(library.read_bytes()[:1000])
    messages = []
    rebuilt = build_model(SMALL, cache=cache, log=messages.append)
    assert rebuilt.built
    assert any("corrupt" in m for m in messages)
    assert runs_a_program(cache)


def test_a_killed_build_leaves_nothing_that_loads(tmp_path, small_config):
    cache = tmp_path / "cache"
    builds = cache / "verilator"
    proc = start_build(small_config, cache)
    # Wait until the C++ compiler is at work in the build's private folder, then kill the
    # whole process group (Python, make, g++) as a crash or ^C would.
    deadline = time.monotonic() + 300
    while not list(builds.glob(".tmp-*/obj/*.cpp")):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the build never started compiling"
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    leftovers = list(builds.glob(".tmp-*"))
    assert leftovers, "the killed build should have left its temporary folder"
    assert not [p for p in builds.iterdir() if not p.name.startswith(".")]   # no entry
    # The next build (another process) removes the debris and builds afresh.
    result = finish(start_build(small_config, cache))
    assert result["built"]
    assert not list(builds.glob(".tmp-*"))
    assert runs_a_program(cache)


def test_a_traced_build_says_why_before_it_starts(tmp_path):
    traced = build_note(SMALL, "fst", tmp_path)
    assert traced.startswith(f"building the Verilator model of {SMALL.name} with FST tracing: "
                             "a waveform needs a model built with tracing, cached apart from "
                             "the untraced one (about a minute, once;")
    assert "tracing" not in build_note(SMALL, None, tmp_path)


@pytest.mark.slow
def test_a_waveform_build_says_why_and_is_cached(tmp_path, small_config):
    """`vdla sim --wave` builds a model with tracing (a minute) where the plain run took
    seconds: it says why before the build, and a second --wave run finds it cached."""
    program = tmp_path / "finish.asm"
    program.write_text("FINISH\n")
    env = dict(os.environ, VDLA_CACHE=str(tmp_path / "cache"))

    def sim_wave(name: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "vdla", "sim", str(program), "--config",
                               str(small_config), "--wave", str(tmp_path / name)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / name).read_text().startswith("$")    # a VCD file's header
        return proc.stderr

    first = sim_wave("one.vcd")
    assert ("with VCD tracing: a waveform needs a model built with tracing, cached apart "
            "from the untraced one") in first
    assert first.index("needs a model built with tracing") < first.index("built in ")
    second = sim_wave("two.vcd")
    assert "building" not in second and "built in" not in second
