"""Remote runs (`vdla.runtime.remote`, ``vdla serve``, ``vdla run --remote``) end to end
on localhost, the board runtime over the Verilator shim as the "board"."""

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
from vdla.cli import main
from vdla.compiler import pipeline
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.export import run_exported
from vdla.deploy.board_device import BoardDevice
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference
from vdla.runtime.remote import (MAGIC, NONCE, RemoteDevice, RemoteError, _Channel, _mac,
                                 serve)
from vdla.sim.verilator import VerilatorSimulator

CFG = vdla.HardwareConfig()
KEY = b"0123456789abcdef0123456789abcdef"
TESTS = Path(__file__).resolve().parents[1]


class Server:
    """`serve` in a thread over the board runtime on the shim; `log` its lines."""

    def __init__(self, sim, connections=None):
        self.log, self.device = [], None
        ready = threading.Event()

        def open_device():
            self.device = BoardDevice(CFG, mmio=VerilatorMmio(sim.model),
                                      memory=VerilatorMemory(sim.model, base=1 << 20))
            return self.device

        def on_ready(port):
            self.port = port
            ready.set()

        self.thread = threading.Thread(target=serve, args=(open_device,), kwargs=dict(
            host="127.0.0.1", port=0, key=KEY, log=self.log.append, ready=on_ready,
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
def server(sim):
    return Server(sim)


def test_a_model_runs_remotely_as_it_runs_here(server):
    target = VdlaTarget(CFG, backend="verilator")
    with RemoteDevice(server.address, key=KEY) as dev:
        assert dev.config == CFG and dev.backend == "remote board"
        remote = pipeline.run_model("small_cnn", target, device=dev)
    assert remote.bit_exact
    assert remote.result.cycles == pipeline.run_model("small_cnn", target).result.cycles
    # The client's blocks were freed when it left.
    time.sleep(0.2)
    assert server.device.allocator.bytes_in_use == 0
    assert any("disconnected" in line for line in server.log)


def test_an_exported_model_plays_remotely(server, tmp_path):
    """A device script (`VdlaTarget.export`, what ``vdla deploy`` bundles) played over
    the connection: the client reports the server's DMA region as its base, so the
    script's blocks land where it recorded them and its programs move by that base."""
    target = VdlaTarget(CFG, backend="verilator")
    loaded = pipeline.load_model("small_cnn")
    graph = pipeline.graph_for(loaded, target)
    compiled, _ = pipeline.compile_for(graph, target)
    folder = target.export(compiled, tmp_path / "small_cnn")
    with RemoteDevice(server.address, key=KEY) as dev:
        assert dev.base == server.device.base == 1 << 20
        outputs, runs = run_exported(folder, dev, loaded.feed)
    reference = pipeline.reference_of(graph, loaded.feed)
    assert all(np.array_equal(outputs[name], reference[name]) for name in graph.outputs)
    assert sum(r["cycles"] for r in runs) == pipeline.run_model(loaded, target).result.cycles


def test_a_wrong_key_is_refused_and_can_run_nothing(server):
    with pytest.raises(RemoteError, match="the server refused the key"):
        RemoteDevice(server.address, key=b"not the key, not at all")
    time.sleep(0.1)
    assert "does not hold the key: refused" in server.log[-1]
    assert server.device.allocator.bytes_in_use == 0


def raw_client(address):
    """A client that authenticates, then writes frames by hand."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    hello = sock.recv(len(MAGIC) + NONCE, socket.MSG_WAITALL)
    mine = b"m" * NONCE
    sock.sendall(_mac(KEY, b"client", hello[len(MAGIC):]) + mine)
    assert sock.recv(1 + 32, socket.MSG_WAITALL)[:1] == b"\x01"
    session = _mac(KEY, b"session", hello[len(MAGIC):], mine)
    return sock, _Channel(sock, session, sent=b"c", received=b"s")


def test_an_oversized_or_truncated_upload_is_refused_with_nothing_allocated(server):
    sock, channel = raw_client(server.address)
    with sock:
        channel.send({"call": "alloc", "nbytes": 64})
        reply, _ = channel.receive()
        addr = reply["addr"]
        used = server.device.allocator.bytes_in_use
        # 1 MiB declared for a 64-byte block: refused before the payload is read.
        header = json.dumps({"call": "write", "addr": addr, "nbytes": 1 << 20}).encode()
        sock.sendall(len(header).to_bytes(4, "big") + (1 << 20).to_bytes(8, "big") + header)
        reply, _ = channel.receive()
        assert not reply["ok"] and "not inside one allocated block" in reply["message"]
        # Nothing allocated for it (the server then drops the client and frees its block).
        assert server.device.allocator.bytes_in_use <= used
    sock, channel = raw_client(server.address)
    with sock:
        channel.send({"call": "alloc", "nbytes": 64})
        addr = channel.receive()[0]["addr"]
        header = json.dumps({"call": "write", "addr": addr, "nbytes": 64}).encode()
        sock.sendall(len(header).to_bytes(4, "big") + (64).to_bytes(8, "big") + header
                     + b"x" * 10)
        sock.shutdown(socket.SHUT_WR)          # the upload ends 54 bytes short
        reply, _ = channel.receive()
        assert not reply["ok"] and "cut short (10 of 64 bytes)" in reply["message"]
    time.sleep(0.2)
    assert server.device.allocator.bytes_in_use == 0     # both clients' blocks freed
    # A payload past the frame limit is refused from its length alone.
    sock, channel = raw_client(server.address)
    with sock:
        header = b'{"call":"write","addr":0,"nbytes":1}'
        sock.sendall(len(header).to_bytes(4, "big") + (1 << 40).to_bytes(8, "big") + header)
        reply, _ = channel.receive()
        assert "at most" in reply["message"]


SERVE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import vdla
    from board_shim import VerilatorMemory, VerilatorMmio
    from vdla.deploy.board_device import BoardDevice
    from vdla.runtime.remote import serve
    from vdla.sim.verilator import VerilatorSimulator
    sim = VerilatorSimulator(vdla.HardwareConfig(), 64 << 20, log=lambda m: None)
    serve(lambda: BoardDevice(sim.config, mmio=VerilatorMmio(sim.model, cycles={cycles}),
                              memory=VerilatorMemory(sim.model, base=1 << 20)),
          host="127.0.0.1", port=0, key={key!r}, ready=lambda p: print(p, flush=True),
          log=lambda line: None)
""")


def start_server_process(cycles=4096):
    """A server in its own process (so that a test can kill it): the shim's model runs
    `cycles` cycles between two reads of CTRL (few: runs take long)."""
    script = SERVE.format(tests=str(TESTS), key=KEY, cycles=cycles)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"127.0.0.1:{port}"


def test_a_server_killed_mid_run_is_a_clear_error_in_time():
    proc, address = start_server_process(cycles=64)
    try:
        dev = RemoteDevice(address, key=KEY, timeout=30)
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


def test_vdla_run_remote_gives_the_usual_report(capsys, monkeypatch):
    """``vdla run resnet18 --remote HOST:PORT`` against a server of the shim: the report
    ``vdla run resnet18 --sim verilator`` gives, cycles included."""
    proc, address = start_server_process()
    monkeypatch.setenv("VDLA_REMOTE_KEY", KEY.decode())
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
def functional_server(monkeypatch):
    """A real ``vdla serve --sim functional`` on 127.0.0.1 (any free port), its address;
    the key is in ``$VDLA_REMOTE_KEY`` for the server and the client alike."""
    monkeypatch.setenv("VDLA_REMOTE_KEY", KEY.decode())
    proc = subprocess.Popen([sys.executable, "-m", "vdla", "serve", "--sim", "functional",
                             "--host", "127.0.0.1", "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()   # "vdla: vdla serve: functional device, ... on H:P"
        found = re.search(r" on (127\.0\.0\.1:\d+)$", line.strip())
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


def test_remote_errors_on_the_command_line(capsys, monkeypatch):
    monkeypatch.delenv("VDLA_REMOTE_KEY", raising=False)
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1"]) == 1
    assert "a shared key of at least 16 bytes is needed" in capsys.readouterr().err
    monkeypatch.setenv("VDLA_REMOTE_KEY", KEY.decode())
    assert main(["run", "small_cnn", "--remote", "127.0.0.1:1"]) == 1
    assert "cannot connect to 127.0.0.1:1" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--remote", "nohostport"]) == 1
    assert "give HOST:PORT" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--key-file", "k"]) == 1
    assert "--key-file goes with --remote" in capsys.readouterr().err
    assert main(["run", "small_cnn", "--target", "cpu", "--remote", "127.0.0.1:1"]) == 1
    assert "cannot connect" in capsys.readouterr().err     # the server first, then the target
