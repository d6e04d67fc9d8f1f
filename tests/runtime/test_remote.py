"""Remote runs (`vdla.runtime.remote`, ``vdla serve``, ``vdla run --remote``) end to end
on localhost, the board runtime over the Verilator shim as the "board". (The server
against hostile and careless clients: test_remote_faults.py, test_remote_isolation.py
and the fuzzer, test_remote_fuzz.py, on the functional simulator.)"""

import json
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import vdla
from board_shim import VerilatorMemory, VerilatorMmio
from remote_testing import (call, heavy_gemm, leftover_sram, make_keys, raw_frame, session,
                            settled, store_at, uop_block, write_program)
from vdla.cli import main
from vdla.compiler import pipeline
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.export import run_exported
from vdla.deploy.board_device import BoardDevice
from vdla.isa import Program, Uop, encode_uops
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference
from vdla.runtime.remote import RemoteDevice, RemoteError, serve
from vdla.runtime.remote_wire import Deadline
from vdla.sim.verilator import VerilatorSimulator

CFG = vdla.HardwareConfig()
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys") / "vdla-key")


class Server:
    """`serve` in a thread over the board runtime on the shim; `log` its lines."""

    def __init__(self, sim, keys, connections=None, timeout=10.0):
        self.log, self.device = [], None
        ready = threading.Event()

        def open_device():
            self.device = BoardDevice(CFG, mmio=VerilatorMmio(sim.model),
                                      memory=VerilatorMemory(sim.model, base=1 << 20),
                                      timeout=timeout)
            return self.device

        def on_ready(port):
            self.port = port
            ready.set()

        self.thread = threading.Thread(target=serve, args=(open_device,), kwargs=dict(
            host="127.0.0.1", port=0, key=keys.server, log=self.log.append, ready=on_ready,
            connections=connections), daemon=True)
        self.thread.start()
        assert ready.wait(60)
        self.address = f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def sim():
    simulator = VerilatorSimulator(CFG, 64 << 20, log=lambda message: None)
    yield simulator
    simulator.close()


@pytest.fixture(scope="module")
def server(sim, keys):
    server = Server(sim, keys)
    yield server
    # A session zeroes its blocks as it closes: let the last one finish before the
    # simulator under it is closed.
    end = time.monotonic() + 10
    while time.monotonic() < end and sum("session opened" in line for line in server.log) \
            > sum("session closed" in line for line in server.log):
        time.sleep(0.05)


def test_a_model_runs_remotely_as_it_runs_here(server, keys):
    target = VdlaTarget(CFG, backend="verilator")
    with RemoteDevice(server.address, key=keys.client, wait=10) as dev:
        assert dev.config == CFG and dev.backend == "remote board"
        remote = pipeline.run_model("small_cnn", target, device=dev)
    assert remote.bit_exact
    assert remote.result.cycles == pipeline.run_model("small_cnn", target).result.cycles
    # The client's blocks were freed when it left.
    assert settled(server.log)
    assert server.device.allocator.bytes_in_use == 0


def test_an_exported_model_plays_remotely(server, keys, tmp_path):
    """A device script (`VdlaTarget.export`, what ``vdla deploy`` bundles) played over
    the connection: the client reports the server's DMA region as its base, so the
    script's blocks land where it recorded them and its programs move by that base."""
    target = VdlaTarget(CFG, backend="verilator")
    loaded = pipeline.load_model("small_cnn")
    graph = pipeline.graph_for(loaded, target)
    compiled, _ = pipeline.compile_for(graph, target)
    folder = target.export(compiled, tmp_path / "small_cnn")
    with RemoteDevice(server.address, key=keys.client, wait=10) as dev:
        assert dev.base == server.device.base == 1 << 20
        outputs, runs = run_exported(folder, dev, loaded.feed)
    reference = pipeline.reference_of(graph, loaded.feed)
    assert all(np.array_equal(outputs[name], reference[name]) for name in graph.outputs)
    assert sum(r["cycles"] for r in runs) == pipeline.run_model(loaded, target).result.cycles


def test_a_wrong_key_is_refused_and_can_run_nothing(server, keys):
    wrong = type(keys.client)(b"not the key, not at all, no....", keys.client.fingerprint)
    with pytest.raises(RemoteError, match="the server refused the key"):
        RemoteDevice(server.address, key=wrong)
    time.sleep(0.1)
    assert any("does not hold the key: refused" in line for line in server.log)
    assert server.device.allocator.bytes_in_use == 0


def test_an_oversized_or_truncated_upload_is_refused_with_nothing_allocated(server, keys):
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        channel.send({"call": "alloc", "nbytes": 64}, deadline=Deadline(10))
        reply, _ = channel.receive(Deadline(10))
        addr = reply["addr"]
        used = server.device.allocator.bytes_in_use
        # 1 MiB declared for a 64-byte block: refused before the payload is read.
        data = json.dumps({"call": "write", "addr": addr, "nbytes": 1 << 20}).encode()
        head, _, _ = channel.pack(data, bytes(1 << 20))
        sock.sendall(head)
        reply, _ = channel.receive(Deadline(10))
        assert not reply["ok"] and "not inside one block this session" in reply["message"]
        # Nothing allocated for it (the server then drops the client and frees its block).
        assert server.device.allocator.bytes_in_use <= used
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        channel.send({"call": "alloc", "nbytes": 64}, deadline=Deadline(10))
        addr = channel.receive(Deadline(10))[0]["addr"]
        data = json.dumps({"call": "write", "addr": addr, "nbytes": 64}).encode()
        sock.sendall(raw_frame(channel, data, bytes(64))[:len(data) + 44 + 10])
        # The upload ends 54 bytes short: the TCP stream's sending half closed under the
        # TLS (no close_notify), as a client that dies leaves it (TLS ends the connection
        # there: the reason goes to the log).
        socket.socket.shutdown(sock, socket.SHUT_WR)
        with pytest.raises(RemoteError):
            channel.receive(Deadline(10))
    assert settled(server.log)
    assert "with a payload cut short (10 of 64 bytes)" in " ".join(server.log)
    assert server.device.allocator.bytes_in_use == 0     # both clients' blocks freed
    # A payload past the frame limit is refused from its length alone.
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        sock.sendall((40).to_bytes(4, "big") + (1 << 40).to_bytes(8, "big") + b"x" * 72)
        reply, _ = channel.receive(Deadline(10))
        assert "at most" in reply["message"]


def test_the_board_server_checks_dma_and_budget_before_a_run(server, keys):
    """On the board runtime (the Verilator shim) as on the functional simulator: a
    program storing outside the session's blocks, and one of 1.9 billion GEMM micro-ops
    (past the default budget of 500 million), are refused before the board starts."""
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        addr, count = write_program(channel, store_at(server.device.base + (32 << 20)))
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert reply["error"] == "DmaOutsideBlocks", reply
        uops = uop_block(channel, 7)
        addr, count = write_program(channel, heavy_gemm(uops, 7, 16383, 16383))
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert reply["error"] == "BudgetExceeded"
        assert "of its budget of 500,000,000" in reply["message"]


def test_the_board_server_clears_the_srams_between_sessions(server, keys):
    """On the board runtime (the Verilator shim) as on the simulators: what session A
    left in the SRAMs, session B (loading nothing) reads as zeros. The scrub is a
    program the board runs, as many cycles as on Verilator."""
    assert settled(server.log)
    assert leftover_sram(server.address, keys.client) == {"out": 0, "gemm": 0}
    assert settled(server.log)
    assert re.search(r"on-chip buffers cleared \([\d,]+ cycles", server.log[-1])


def test_a_board_run_past_its_timeout_ends_before_the_next_session(sim, keys):
    """A run stopped by the board's timeout goes on running there (and the board ignores
    a start meanwhile): the server waits for it to end before it zeroes the session's
    memory and clears the SRAMs, so the next session reads zeros, not that run's
    leftovers, and the clearing program is the one that ran."""
    server = Server(sim, keys, connections=2, timeout=0.1)

    def overrun(dev):
        uops = dev.alloc(7 * CFG.uop_bytes)
        dev.write(uops, encode_uops([Uop(0, 0, 0)] * 7, CFG))
        program = Program(tuple(heavy_gemm(uops, 7, 500, 1000)), CFG)
        with pytest.raises(RemoteError, match="did not finish in"):
            dev.run(*dev.load_program(program))

    assert leftover_sram(server.address, keys.client, then=overrun) == {"out": 0, "gemm": 0}
    assert settled(server.log)
    assert all(re.search(r"on-chip buffers cleared \([\d,]+ cycles", line)
               for line in server.log if "session closed" in line)


SERVE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import vdla
    from board_shim import VerilatorMemory, VerilatorMmio
    from vdla.deploy.board_device import BoardDevice
    from vdla.runtime.remote import read_server_key, serve
    from vdla.sim.verilator import VerilatorSimulator
    sim = VerilatorSimulator(vdla.HardwareConfig(), 64 << 20, log=lambda m: None)
    serve(lambda: BoardDevice(sim.config, mmio=VerilatorMmio(sim.model, cycles={cycles}),
                              memory=VerilatorMemory(sim.model, base=1 << 20)),
          host="127.0.0.1", port=0, key=read_server_key({keys!r}),
          ready=lambda p: print(p, flush=True),
          log=lambda line: None)
""")


def start_server_process(keys, cycles=4096):
    """A server in its own process (so that a test can kill it), of the key folder of
    `keys`: the shim's model runs `cycles` cycles between two reads of CTRL (few: runs
    take long)."""
    script = SERVE.format(tests=str(TESTS), keys=str(keys.folder), cycles=cycles)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"127.0.0.1:{port}"


def test_a_server_killed_mid_run_is_a_clear_error_in_time(keys):
    proc, address = start_server_process(keys, cycles=64)
    try:
        dev = RemoteDevice(address, key=keys.client, timeout=30)
        a = np.ones((256, 512), dtype=np.int8)
        assert np.array_equal(blocked_gemm(dev, a[:16], a[:16])[0],
                              blocked_gemm_reference(a[:16], a[:16], 0))
        threading.Timer(1.0, proc.kill).start()
        start = time.perf_counter()
        with pytest.raises(RemoteError,
                           match=r"no answer to \w+: (the peer closed|the connection broke)"
                           ) as error:
            for _ in range(100):          # long runs until the server dies under one
                blocked_gemm(dev, a, a)
        assert time.perf_counter() - start < 30
        # The call the server died under is the error; freeing the GEMM's memory on the
        # dead server afterwards fails too, and at most adds a note.
        assert "no answer to free" not in str(error.value)
    finally:
        proc.kill()
        proc.wait()


def test_vdla_run_remote_gives_the_usual_report(keys, capsys, monkeypatch):
    """``vdla run resnet18 --remote HOST:PORT`` against a server of the shim: the report
    ``vdla run resnet18 --sim verilator`` gives, cycles included."""
    proc, address = start_server_process(keys)
    monkeypatch.setenv("VDLA_REMOTE_KEY_FILE", keys.client.path)
    try:
        assert main(["run", "resnet18", "--remote", address]) == 0
        remote = capsys.readouterr().out
        assert main(["run", "resnet18", "--sim", "verilator", "--jobs", "1"]) == 0
        local = capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()

    def cycles(report):
        return [line for line in report.splitlines() if "cycles" in line.lower()][:3]

    assert "bit-exact vs the quantized reference: yes" in remote
    assert cycles(remote) == cycles(local)


@pytest.fixture
def functional_server(keys, monkeypatch):
    """A real ``vdla serve --sim functional --key-dir DIR`` on 127.0.0.1 (any free port),
    its address; the client's key file is in ``$VDLA_REMOTE_KEY_FILE``."""
    monkeypatch.setenv("VDLA_REMOTE_KEY_FILE", keys.client.path)
    proc = subprocess.Popen([sys.executable, "-m", "vdla", "serve", "--sim", "functional",
                             "--port", "0", "--key-dir", str(keys.folder)],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()   # "vdla: vdla serve: functional device, ... on H:P"
        found = re.search(r" on (127\.0\.0\.1:\d+) \(TLS, certificate ", line.strip())
        assert found, f"vdla serve said {line!r}"
        yield found[1]
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_a_remote_run_records_the_servers_backend(functional_server, capsys, tmp_path):
    """``vdla run --remote`` against a server of the functional simulator: the record
    says the run ran on it (``options.backend``: remote functional), not on the Verilator
    model the target would open here by default, and the report says so too."""
    path = tmp_path / "remote.json"
    assert main(["run", "small_cnn", "--remote", functional_server, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    record = json.loads(path.read_text())
    assert record["bit_exact"] is True
    assert record["options"]["backend"] == "remote functional"
    assert record["summary"]["vdla"]["backend"] == "remote functional"
    assert record["options"]["dram"] is None and record["cycles"] is None
    assert f"ran on the accelerator `vdla serve` serves at {functional_server} (remote " \
           "functional backend)" in out
    assert "remote functional backend," in out.splitlines()[0]     # the title line
    assert "verilator" not in out.lower()       # no header or hint of the local model


@pytest.mark.parametrize("sim", ["functional", "verilator"])
def test_a_board_run_records_the_simulator_it_ran_on(sim, capsys, tmp_path):
    """``vdla run --board`` simulates the board here: the record names the board and the
    simulator that ran it (and, on the timed model, the board's memory timing)."""
    path = tmp_path / "board.json"
    assert main(["run", "small_cnn", "--board", "pynq-z1", "--sim", sim, "--jobs", "1",
                 "--json", str(path)]) == 0
    capsys.readouterr()
    record = json.loads(path.read_text())
    assert record["options"]["backend"] == record["summary"]["vdla"]["backend"] == sim
    assert record["board"] == record["options"]["board"] == "pynq-z1"
    assert (record["options"]["dram"] is not None) == (sim == "verilator")


def test_remote_errors_on_the_command_line(keys, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("VDLA_REMOTE_KEY_FILE", raising=False)
    monkeypatch.setenv("VDLA_REMOTE_KEY", "0123456789abcdef0123456789abcdef")
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1"]) == 1
    assert ("a key file is needed: --key-file PATH or $VDLA_REMOTE_KEY_FILE ($VDLA_REMOTE_KEY, "
            "a key in the environment, is no longer read)") in capsys.readouterr().err
    monkeypatch.setenv("VDLA_REMOTE_KEY_FILE", keys.client.path)
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1"]) == 1
    assert "cannot connect to 127.0.0.1:1" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--remote", "nohostport"]) == 1
    assert "give HOST:PORT" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1", "--remote-wait", "-1"]) == 1
    assert "wait must be a number of seconds of at least 0, not -1.0" in \
        capsys.readouterr().err
    assert main(["run", "small_cnn", "--key-file", "k"]) == 1
    assert "--key-file goes with --remote" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--target", "cpu", "--remote", "127.0.0.1:1"]) == 1
    assert "cannot connect" in capsys.readouterr().err     # the server first, then the target
    loose = tmp_path / "client.key"
    loose.write_bytes(open(keys.client.path, "rb").read())
    loose.chmod(0o644)
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1", "--key-file", str(loose)]) == 1
    assert f"{loose} has mode 644" in capsys.readouterr().err


def test_vdla_serve_new_key_writes_a_key_folder_once(tmp_path, capsys):
    folder = tmp_path / "vdla-key"
    assert main(["serve", "--new-key", str(folder)]) == 0
    out = capsys.readouterr().out
    fingerprint = re.search(r"certificate SHA-256 fingerprint: ([0-9a-f]{64})", out)[1]
    assert f"fingerprint {fingerprint}" in (folder / "client.key").read_text()
    assert f"--key-file {folder / 'client.key'}" in out
    assert main(["serve", "--new-key", str(folder)]) == 1
    assert "already holds server.pem and client.key" in capsys.readouterr().err
