"""What the remote server keeps from whom, on 127.0.0.1 over the functional simulator:
the wire is encrypted (a session captured by a proxy holds none of the model's weight
bytes), a session reads nothing another left, a program's DMA stays inside its own
session's blocks, no session reads the on-chip SRAMs another left (on the functional
simulator and on Verilator; the board's test is in test_remote.py), a session's budgets
of micro-ops and wall time hold, and keys are the tool's own, kept private, on a server
that listens on 127.0.0.1 unless told."""

import inspect
import os
import socket
import threading
import time

import numpy as np
import pytest

from remote_testing import (CFG, LiveServer, bit_exact_run, call, heavy_gemm, leftover_sram,
                            make_keys, session, store_at, uop_block, write_program)
import vdla
from vdla.config import AluOp
from vdla.isa import MemoryType, Uop, encode_uops
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.cli import build_parser
from vdla.compiler import pipeline
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.runtime.kernels import blocked_gemm
from vdla.runtime.remote import (BudgetExceeded, Limits, NotCleared, RemoteDevice,
                                 RemoteError, new_key, read_key, read_server_key, serve)
from vdla.runtime.remote_scrub import scrub, scrub_program, zero_block_bytes


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys") / "vdla-key")


@pytest.fixture(scope="module")
def server(keys):
    return LiveServer(keys, limits=Limits(max_uops=2_000_000))


class Proxy:
    """A TCP proxy on 127.0.0.1 to `target`, recording every byte both ways."""

    def __init__(self, target: str):
        host, port = target.split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.captured = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink):
        try:
            while data := source.recv(1 << 16):
                with self.lock:
                    self.captured += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def windows(blob: bytes, width: int = 16) -> set[bytes]:
    return {blob[i:i + width] for i in range(len(blob) - width + 1)}


def test_a_captured_session_holds_none_of_the_models_weights(server, keys, capsys):
    """small_cnn run through a recording proxy: not one 16-byte window of its weight
    arrays, or of anything the client wrote (packed weights, programs, the input), is
    in the capture; the same search over the bytes written finds them all (the
    control). The old protocol sent every weight array verbatim."""
    proxy = Proxy(server.address)
    target = VdlaTarget(CFG, backend="functional")
    written = []
    with RemoteDevice(proxy.address, key=keys.client, wait=10) as dev:
        send = dev._write
        dev._write = lambda addr, raw: (written.append(bytes(raw)), send(addr, raw))[1]
        result = pipeline.run_model("small_cnn", target, device=dev)
    assert result.bit_exact
    graph = pipeline.graph_for(pipeline.load_model("small_cnn"), target)
    weights = [graph.constant(name).tobytes() for name in graph.tensors
               if graph.constant(name) is not None and graph.constant(name).nbytes >= 16]
    time.sleep(0.2)
    seen = windows(bytes(proxy.captured))
    wanted = set().union(*(windows(w) for w in weights)) | set().union(
        *(windows(w) for w in written if len(set(w)) > 4))     # not runs of zeros
    found = wanted & seen
    control = wanted & set().union(*(windows(w) for w in written + weights))
    with capsys.disabled():
        print(f"\ncapture: {len(proxy.captured):,} bytes of a small_cnn session; "
              f"{len(weights)} weight arrays and {len(written)} writes "
              f"({sum(map(len, written)):,} bytes): {len(wanted):,} distinct 16-byte "
              f"windows, {len(found)} in the capture (control: {len(control):,} found in "
              "the plaintext)")
    assert len(weights) == 8 and len(control) == len(wanted) > 10_000
    assert not found


def test_a_session_reads_nothing_the_last_one_left(server, keys):
    secret = np.arange(4096, dtype=np.uint8) | 1
    with RemoteDevice(server.address, key=keys.client, wait=10) as first:
        addr = first.alloc(len(secret))
        first.write(addr, secret)
        assert np.array_equal(first.read(addr, len(secret)), secret)
    with RemoteDevice(server.address, key=keys.client, wait=10) as second:
        again = second.alloc(len(secret))
        assert again == addr                            # the same memory, handed out again
        assert not second.read(again, len(secret)).any()
    time.sleep(0.1)
    assert not server.device.dram[addr:addr + len(secret)].any()   # zeroed when it closed


def test_a_session_reads_nothing_the_last_one_left_in_the_srams(server, keys):
    """Session A leaves rows of ones in inp and wgt, 16 in acc and out; session B, a new
    connection, runs a program that loads nothing: its STORE of the out buffer and its
    GEMM over A's inp, wgt, acc (and the uop SRAM as found) read zeros. Without the
    scrub B read A's 16s and 32s (256 nonzero bytes each)."""
    assert server.settled()
    assert leftover_sram(server.address, keys.client) == {"out": 0, "gemm": 0}
    assert server.settled() and "on-chip buffers cleared (" in server.log[-1]
    sram = server.device.simulator.sram
    assert not any(buffer.any() for buffer in sram.values())


@pytest.mark.parametrize("config", [
    CFG, vdla.HardwareConfig(dw_taps=3, alu_hold=True),
    vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "TAB", "DIV"}),
    vdla.HardwareConfig(batch=2, block_in=8, block_out=32),
    vdla.HardwareConfig(block_in=4, block_out=4, uop_buff_size=64, inp_buff_size=32,
                        wgt_buff_size=64, acc_buff_size=64)], ids=lambda c: c.name)
def test_the_scrub_zeroes_every_row_of_every_sram(config):
    """Every byte of the uop, inp, wgt, acc and out SRAMs (and the ALU's table) set, then
    `scrub`: all zero (the decoded micro-ops and the table as TAB reads it too), its DRAM
    block freed and zeroed, on configs with the extensions, other element sizes, and
    depths under the 16 rows a padded LOAD fills."""
    device = vdla.runtime.open(config, "functional", dram_size=1 << 20)
    simulator = device.simulator
    for buffer in simulator.sram.values():
        buffer[...] = 0xA5
    simulator.uop_dst[:] = simulator.uop_src[:] = simulator.uop_wgt[:] = 3
    simulator.table[:] = 3
    done = scrub(device)
    assert not any(buffer.any() for buffer in simulator.sram.values()), \
        {m.name: int(np.count_nonzero(b)) for m, b in simulator.sram.items()}
    assert not (simulator.uop_dst.any() or simulator.uop_src.any() or simulator.uop_wgt.any())
    assert not simulator.table.any() or AluOp.TAB not in config.alu_ops
    assert device.allocator.bytes_in_use == 0 and not device.dram.any()
    assert done.stats["gemm_uops"] == config.acc_depth and done.cycles is None
    loads = {insn.memory_type for insn in scrub_program(config, 0).insns
             if insn.opcode == 0}
    assert loads == {MemoryType.UOP, MemoryType.INP, MemoryType.WGT} | (
        {MemoryType.TAB} if AluOp.TAB in config.alu_ops else set())
    assert zero_block_bytes(config) <= max(config.uop_buff_size, config.wgt_buff_size,
                                           1024 * (AluOp.TAB in config.alu_ops))


def test_a_server_whose_scrub_fails_opens_no_more_sessions(keys):
    """A device whose scrub fails (here: its run raises) after a session: the next
    client is refused with the reason, naming the fix; the server stays up."""
    server = LiveServer(keys, dram_size=1 << 20)

    def hung(*args, **kwargs):
        raise RuntimeError("the accelerator hung")

    with RemoteDevice(server.address, key=keys.client, wait=10) as dev:
        dev.alloc(64)
        server.device.run = hung
    assert server.settled() and "NOT CLEARED" in server.log[-1]
    with pytest.raises(NotCleared, match=r"clearing the accelerator's on-chip buffers failed "
                                         r"\(RuntimeError: the accelerator hung\); restart"):
        RemoteDevice(server.address, key=keys.client, wait=10)
    assert server.alive()


def test_the_verilator_server_clears_the_srams_between_sessions(keys):
    """As on the functional simulator, on the cycle-accurate model of the Verilog: what
    session A left in the SRAMs, session B reads as zeros; the scrub costs 12,628 cycles
    of the default config (126 us at 100 MHz), as docs/boards.md says."""
    server = LiveServer(keys, backend="verilator", dram_size=16 << 20)
    assert leftover_sram(server.address, keys.client) == {"out": 0, "gemm": 0}
    assert server.settled()
    assert sum("on-chip buffers cleared (12,628 cycles" in line for line in server.log) == 3


def _fill_every_sram(dev, ones: int, zero_uop: int) -> None:
    """Every row of inp, wgt, uop and acc of `dev` loaded with bytes of 1 (from `ones`;
    micro-op 0 from `zero_uop`, for the GEMM), and out set by a GEMM to acc's low byte."""
    c, b = CFG, ProgramBuilder(CFG)
    for memory, depth, elem in ((MemoryType.INP, c.inp_depth, c.inp_elem_bytes),
                                (MemoryType.WGT, c.wgt_depth, c.wgt_elem_bytes)):
        b.load(memory, dram_base=ones // elem, y_size=1, x_size=depth, x_stride=depth)
    b.dep_push(LOAD, COMPUTE)
    b.load(MemoryType.UOP, dram_base=ones // c.uop_bytes, y_size=1, x_size=c.uop_depth,
           x_stride=c.uop_depth)
    b.load(MemoryType.UOP, dram_base=zero_uop // c.uop_bytes, y_size=1, x_size=1, x_stride=1)
    b.load(MemoryType.ACC, dram_base=ones // c.acc_elem_bytes, y_size=1, x_size=c.acc_depth,
           x_stride=c.acc_depth)
    b.dep_pop(LOAD, COMPUTE)
    b.gemm(uop_end=1, iter_out=c.acc_depth, iter_in=1, dst_factor_out=1)
    dev.run(*dev.load_program(b.finish()))


def _gemm_then_store(b: ProgramBuilder, out: int, rows: int, **factors) -> None:
    """acc[o] += inp[src] . wgt[wgt] for o < `rows` over micro-op 0 as the SRAM holds it
    (`factors` step src and wgt), then out rows 0..rows-1 stored at byte `out`."""
    b.gemm(uop_end=1, iter_out=rows, iter_in=1, dst_factor_out=1, **factors)
    b.dep_push(COMPUTE, STORE)
    b.dep_pop(COMPUTE, STORE)
    b.store(dram_base=out // CFG.out_elem_bytes, y_size=1, x_size=rows, x_stride=rows)
    b.dep_push(STORE, COMPUTE)
    b.dep_pop(STORE, COMPUTE)


def test_on_verilator_the_scrub_zeroes_every_row_of_every_sram_it_can_be_read_from():
    """The cycle-accurate model: every row of every SRAM filled, `scrub`, then read back
    through the ISA, every row: out stored as found; acc by a GEMM adding nothing; wgt's
    rows times a row of ones loaded into inp; in a second round (that load overwrites
    inp row 0) inp's rows times a row of ones loaded into wgt. All zeros. (The uop
    SRAM, indices only, is checked row by row on the functional simulator.)"""
    c = CFG
    dev = vdla.runtime.open(c, "verilator", dram_size=16 << 20, log=lambda line: None)
    try:
        size = max(c.inp_buff_size, c.wgt_buff_size, c.acc_buff_size, c.uop_buff_size)
        ones = dev.alloc(size)
        dev.write(ones, np.ones(size, np.uint8))
        zero_uop = dev.alloc(c.uop_bytes)
        dev.write(zero_uop, encode_uops([Uop(0, 0, 0)], c))
        rows = {"out": c.out_depth, "acc": c.acc_depth, "wgt": c.wgt_depth,
                "inp": c.inp_depth}
        outs = {name: dev.alloc(n * c.out_elem_bytes) for name, n in rows.items()}
        for round_ in ("out acc wgt", "inp"):
            _fill_every_sram(dev, ones, zero_uop)
            assert scrub(dev).cycles > 0
            b = ProgramBuilder(c)
            if round_ == "inp":
                b.load(MemoryType.WGT, dram_base=ones // c.wgt_elem_bytes, y_size=1,
                       x_size=1, x_stride=1)
                b.dep_push(LOAD, COMPUTE)
                b.dep_pop(LOAD, COMPUTE)
                _gemm_then_store(b, outs["inp"], c.inp_depth, src_factor_out=1)
            else:
                b.store(dram_base=outs["out"] // c.out_elem_bytes, y_size=1,
                        x_size=c.out_depth, x_stride=c.out_depth)
                b.dep_push(STORE, COMPUTE)
                b.dep_pop(STORE, COMPUTE)
                _gemm_then_store(b, outs["acc"], c.acc_depth)
                b.dep_push(COMPUTE, LOAD)       # the GEMM read inp row 0 before this LOAD
                b.dep_pop(COMPUTE, LOAD)
                b.load(MemoryType.INP, dram_base=ones // c.inp_elem_bytes, y_size=1,
                       x_size=1, x_stride=1)
                b.dep_push(LOAD, COMPUTE)
                b.dep_pop(LOAD, COMPUTE)
                _gemm_then_store(b, outs["wgt"], c.wgt_depth, wgt_factor_out=1)
            dev.run(*dev.load_program(b.finish()))
        found = {name: int(np.count_nonzero(dev.read(addr, rows[name] * c.out_elem_bytes)))
                 for name, addr in outs.items()}
        assert found == dict.fromkeys(rows, 0)
    finally:
        dev.close()


def test_a_freed_block_is_zeroed_before_anyone_gets_it_again(server, keys):
    with RemoteDevice(server.address, key=keys.client, wait=10) as dev:
        addr = dev.alloc(256)
        dev.write(addr, np.full(256, 7, np.uint8))
        dev.free(addr)
        assert not server.device.dram[addr:addr + 256].any()


def test_a_programs_dma_outside_its_sessions_blocks_is_refused(server, keys):
    """A valid program's STORE 200 MiB into the device (inside its DRAM, in no block of
    the session: it used to run), a LOAD of micro-ops from there, and instructions there
    are refused before they run, naming the instruction; the bytes there are untouched.
    The same program with its STORE inside a block of the session runs."""
    far = 200 << 20
    server.device.dram[far:far + 16] = 0x5A
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        addr, count = write_program(channel, store_at(far))
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert not reply["ok"] and reply["error"] == "DmaOutsideBlocks"
        assert f"instruction 1 writes DRAM bytes {far:#x}" in reply["message"]
        addr, count = write_program(channel, heavy_gemm(far, 1, 1, 1))
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert "instruction 0 reads DRAM bytes" in reply["message"]
        reply, _ = call(channel, {"call": "run", "insn_addr": far, "insn_count": 3})
        assert "not inside memory this session allocated" in reply["message"]
        block = call(channel, {"call": "alloc", "nbytes": 16})[0]["addr"]
        addr, count = write_program(channel, store_at(block))
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert reply["ok"] and reply["stats"]["store_bytes_out"] == 16
    assert (server.device.dram[far:far + 16] == 0x5A).all()
    server.device.dram[far:far + 16] = 0


def test_a_run_past_the_micro_op_budget_is_refused_before_it_starts(server, keys):
    """1.9 billion GEMM micro-ops (ten minutes of the functional simulator) against a
    budget of 2 million: refused at once, naming both; the server stays up."""
    sock, channel, _ = session(server.address, keys.client)
    with sock:
        uops = uop_block(channel, 7)
        addr, count = write_program(channel, heavy_gemm(uops, 7, 16383, 16383))
        start = time.monotonic()
        reply, _ = call(channel, {"call": "run", "insn_addr": addr, "insn_count": count})
        assert time.monotonic() - start < 2
    assert reply["error"] == "BudgetExceeded"
    assert "this run needs 1,878,818,826 micro-ops" in reply["message"]
    assert "of its budget of 2,000,000" in reply["message"]
    assert server.alive() and bit_exact_run(server.address, keys.client)


def test_the_budget_counts_every_run_of_a_session(keys):
    server = LiveServer(keys, limits=Limits(max_uops=5_000))
    with RemoteDevice(server.address, key=keys.client) as dev:
        a = np.ones((32, 64), np.int8)
        with pytest.raises(BudgetExceeded, match=r"the session has run [\d,]+ of its budget "
                                                 r"of 5,000"):
            for _ in range(50):
                blocked_gemm(dev, a, a)
    assert bit_exact_run(server.address, keys.client)     # a new session, a new budget


def test_a_session_past_its_wall_time_is_ended_with_the_reason(keys):
    server = LiveServer(keys, limits=Limits(session_seconds=0.5))
    with RemoteDevice(server.address, key=keys.client) as dev:
        dev.alloc(64)
        time.sleep(0.7)
        with pytest.raises(BudgetExceeded, match=r"the session's wall time of 0.5 s is spent"):
            dev.alloc(64)
    assert server.alive() and bit_exact_run(server.address, keys.client)


def test_a_key_file_others_can_read_is_refused_naming_the_fix(keys, tmp_path):
    folder = tmp_path / "k"
    new_key(folder)
    os.chmod(folder / "client.key", 0o644)
    with pytest.raises(ValueError, match=rf"{folder / 'client.key'} has mode 644: other "
                                         rf"users can read this secret; `chmod 600 "):
        read_key(folder / "client.key")
    with pytest.raises(ValueError, match="has mode 644"):
        read_server_key(folder)
    os.chmod(folder / "client.key", 0o600)
    os.chmod(folder / "server.pem", 0o606)
    with pytest.raises(ValueError, match="server.pem has mode 606"):
        read_server_key(folder)


@pytest.mark.parametrize("key, says", [
    ("correcthorsebattery", "not 19 characters of text"),
    ("00" * 32, "only 1 distinct bytes in 32: not random"),
    ("abcd" * 4, r"at least 16 random bytes in hex \(32 hex digits\), not 16 characters"),
    ("", "not 0 characters"),
])
def test_a_low_entropy_key_is_refused(tmp_path, keys, key, says):
    path = tmp_path / "client.key"
    path.write_text(f"key {key}\nfingerprint {keys.client.fingerprint}\n")
    path.chmod(0o600)
    with pytest.raises(ValueError, match=says):
        read_key(path)


def test_keys_are_new_random_and_private(tmp_path):
    one, two = new_key(tmp_path / "a"), new_key(tmp_path / "b")
    assert len(one.key) == 32 and one.key != two.key and one.fingerprint != two.fingerprint
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    for name in ("client.key", "server.pem"):
        assert (tmp_path / "a" / name).stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="already holds server.pem and client.key"):
        new_key(tmp_path / "a")
    (tmp_path / "b" / "client.key").write_bytes((tmp_path / "a" / "client.key").read_bytes())
    with pytest.raises(ValueError, match="the files are from two `vdla serve --new-key` runs"):
        read_server_key(tmp_path / "b")
    assert one.key.hex() not in repr(one)      # no secret in a log or a traceback


def test_a_client_refuses_a_server_of_another_certificate(server, tmp_path):
    """The key file pins the server's certificate: a server with another (someone in
    the middle) is refused before the key's handshake starts."""
    other = new_key(tmp_path / "other")
    with pytest.raises(RemoteError, match="the server's certificate has SHA-256"):
        RemoteDevice(server.address, key=other)
    assert server.alive()


def test_the_server_listens_on_127_0_0_1_unless_asked():
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    args = build_parser().parse_args(["serve", "--sim", "functional"])
    assert args.host == "127.0.0.1"
