"""Session-wide hooks: the count of fuzzed inputs per target (tests/fuzzing.py) in the
terminal summary, added up over pytest-xdist workers.

These hooks live here, not in tests/fuzz/, because the xdist controller collects no
tests: it loads only the conftest files on the way to the paths it was given, and it
is the one that prints the summary.

Also: Triton runs the GPU target's kernels under its interpreter in every test process.
Triton reads ``TRITON_INTERPRET`` once, when it is first imported, so it is set here,
before any test module can import it (tests/compiler/targets/gpu). And the Verilator
models' build level (below)."""

from __future__ import annotations

import os

import pytest

import fuzzing

os.environ.setdefault("TRITON_INTERPRET", "1")
# The suite builds the Verilator models of many configs: at "lto" each build takes a
# third of a profile-guided one's time, and runs the same programs in the same cycles
# (tests/sim/test_verilator_optimise.py builds a profile-guided model and checks that).
os.environ.setdefault("VDLA_VERILATOR_OPTIMISE", "lto")


@pytest.fixture(scope="session")
def small_cnn_bundle(tmp_path_factory):
    """`vdla deploy small_cnn --board pynq-z1`'s bundle, written once per test process
    (its Verilog alone takes about 20 s; three test modules read it). Not to be changed:
    a module takes its own copy (`bundles.copy_of`)."""
    from vdla.cli import main as vdla_main
    out = tmp_path_factory.mktemp("deploy") / "small_cnn"
    assert vdla_main(["deploy", "small_cnn", "--board", "pynq-z1", "-o", str(out)]) == 0
    return out


def pytest_sessionfinish(session):
    # On an xdist worker: hand the counts to the controller (xdist sends workeroutput
    # after every pytest_sessionfinish hook has run).
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[fuzzing.WORKEROUTPUT_KEY] = fuzzing.counts()


@pytest.hookimpl(optionalhook=True)   # an xdist hook: absent without pytest-xdist
def pytest_testnodedown(node, error):
    # A worker that crashed may have sent nothing.
    fuzzing.merge(getattr(node, "workeroutput", {}).get(fuzzing.WORKEROUTPUT_KEY, {}))


def pytest_terminal_summary(terminalreporter):
    found = fuzzing.counts()
    if found:
        terminalreporter.write_sep("-", "fuzzing")
        terminalreporter.write_line(fuzzing.summary(found))
