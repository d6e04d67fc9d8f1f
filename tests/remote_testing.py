"""Helpers of the remote tests (tests/runtime/test_remote*.py): a key folder, a live
`vdla.runtime.remote.serve` on 127.0.0.1 over the functional simulator (or Verilator),
in a thread, clients that speak the protocol by hand (TLS alone, the key's handshake,
frames written byte by byte) to play an attacker or a careless client, and two
sessions that ask whether the second reads what the first left in the on-chip SRAMs.

    keys = make_keys(tmp_path)
    server = LiveServer(keys, limits=Limits(handshake_seconds=1))
    sock, channel, info = session(server.address, keys.client)
    assert server.alive() and bit_exact_run(server.address, keys.client)
    assert leftover_sram(server.address, keys.client) == {"out": 0, "gemm": 0}
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

import vdla
from vdla.isa import Finish, Gemm, Load, MemoryType, Program, Store, Uop, encode_uops
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference
from vdla.runtime.remote import (Limits, RemoteDevice, RemoteKey, ServerKey, new_key,
                                 read_key, read_server_key, serve)
from vdla.runtime.remote_keys import client_context, pin
from vdla.runtime.remote_wire import (MAGIC, NONCE, Channel, Deadline, handshake_client,
                                      receive_exactly)

CFG = vdla.HardwareConfig()


@dataclasses.dataclass(frozen=True)
class Keys:
    """A key folder's two halves, and where it lies."""

    server: ServerKey
    client: RemoteKey
    folder: Path


def make_keys(folder: Path) -> Keys:
    """A new key folder (`new_key`) at `folder`."""
    new_key(folder)
    return Keys(read_server_key(folder), read_key(folder / "client.key"), folder)


class LiveServer:
    """`serve` in a daemon thread on 127.0.0.1 (any free port), over a simulator's device.

    keys : the `Keys` it serves with
    limits : its `Limits` (its defaults if None)
    dram_size : the device's DRAM
    backend : the device's backend ("functional" or "verilator", of `CFG`)
    log : its log lines; device : the device it serves; address : ``127.0.0.1:PORT``
    """

    def __init__(self, keys: Keys, *, limits: Limits | None = None,
                 dram_size: int = 256 << 20, backend: str = "functional"):
        self.log: list[str] = []
        self.device = None
        ready = threading.Event()

        def open_device():
            options = {"log": lambda line: None} if backend == "verilator" else {}
            self.device = vdla.runtime.open(CFG, backend, dram_size=dram_size, **options)
            return self.device

        def on_ready(port):
            self.port = port
            ready.set()

        self.thread = threading.Thread(target=serve, args=(open_device,), kwargs=dict(
            key=keys.server, host="127.0.0.1", port=0, log=self.log.append, ready=on_ready,
            limits=limits), daemon=True)
        self.thread.start()
        assert ready.wait(30)
        self.address = f"127.0.0.1:{self.port}"

    def settled(self, seconds: float = 10.0) -> bool:
        """Whether every session opened has closed (its blocks and the device's SRAMs
        cleared), waiting up to `seconds`: a client's close does not wait for that."""
        return settled(self.log, seconds)

    def alive(self) -> bool:
        """Whether the server's loop still runs."""
        return self.thread.is_alive()

    def said(self, text: str, seconds: float = 5.0) -> bool:
        """Whether a log line contains `text`, waiting up to `seconds` for it."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if any(text in line for line in self.log):
                return True
            time.sleep(0.02)
        return False


def settled(log: list[str], seconds: float = 10.0) -> bool:
    """Whether a server's `log` says every session it opened has closed, waiting up to
    `seconds` for it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lines = list(log)
        if sum("session opened" in line for line in lines) == sum(
                "session closed" in line for line in lines):
            return True
        time.sleep(0.02)
    return False


def tcp(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def reset(sock: socket.socket) -> None:
    """Close `sock` with a TCP reset (SO_LINGER 0), as a killed peer's kernel may."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def tls(address: str, *, raw: socket.socket | None = None) -> socket.socket:
    """A TLS connection to the server, its certificate not checked (an attacker's)."""
    return client_context().wrap_socket(raw or tcp(address))


def greeting(sock: socket.socket) -> bytes:
    """The server's greeting (`MAGIC` and its challenge), read off `sock`."""
    return bytes(receive_exactly(sock, len(MAGIC) + NONCE, "the greeting", Deadline(10)))


def session(address: str, key: RemoteKey, *, wait: float = 10.0, open_call: bool = True
            ) -> tuple[socket.socket, Channel, dict]:
    """A client by hand: TLS (pinned), the key's handshake, and (with `open_call`) the
    ``open`` call, waiting up to `wait` seconds for the device (the last test's session
    may still be closing); (socket, channel, the reply to open)."""
    sock = tls(address)
    pin(sock, key.fingerprint, address)
    channel = handshake_client(sock, key.key, Deadline(10))
    info = {}
    if open_call:
        channel.send({"call": "open", "wait": wait}, deadline=Deadline(10))
        info, _ = channel.receive(Deadline(10 + wait))
        assert info["ok"], info
    return sock, channel, info


def call(channel: Channel, header: dict, payload=b"") -> tuple[dict, bytes]:
    channel.send(header, payload, deadline=Deadline(10))
    return channel.receive(Deadline(30))


def raw_frame(channel: Channel, data: bytes, payload=b"", *, good_mac: bool = True) -> bytes:
    """The bytes of a frame of header bytes `data` (any bytes: a test's malformed JSON)
    and `payload`, with the right MACs or (not `good_mac`) a header MAC flipped."""
    head, body, tail = channel.pack(data, payload)
    if not good_mac:
        head = head[:-1] + bytes([head[-1] ^ 1])
    return head + bytes(body) + tail


def bit_exact_run(address: str, key: RemoteKey, *, seed: int = 0, timeout: float = 30) -> bool:
    """A real client's blocked GEMM on the server, bit-exact against numpy."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (32, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (48, 64), dtype=np.int8)
    with RemoteDevice(address, key=key, timeout=timeout, wait=10) as dev:
        out = blocked_gemm(dev, a, b, shift=6)[0]
    return np.array_equal(out, blocked_gemm_reference(a, b, 6))


def write_program(channel: Channel, insns: list) -> tuple[int, int]:
    """`insns` written into a block of the session of `channel`; (address of the
    instructions, their count)."""
    program = Program(tuple(insns), CFG).to_bytes()
    reply, _ = call(channel, {"call": "alloc", "nbytes": len(program)})
    addr = reply["addr"]
    assert call(channel, {"call": "write", "addr": addr, "nbytes": len(program)},
                program)[0]["ok"]
    return addr, len(insns)


def uop_block(channel: Channel, count: int) -> int:
    """A block of `count` zero micro-ops in the session of `channel`; its address."""
    table = encode_uops([Uop(0, 0, 0)] * count, CFG)
    addr = call(channel, {"call": "alloc", "nbytes": len(table)})[0]["addr"]
    assert call(channel, {"call": "write", "addr": addr, "nbytes": len(table)},
                table)[0]["ok"]
    return addr


def heavy_gemm(uop_addr: int, uops: int, iter_out: int, iter_in: int) -> list:
    """A program of iter_out x iter_in x `uops` GEMM micro-ops over the micro-ops at
    `uop_addr` (tokens left out: the budget refuses it before anything checks them)."""
    return [Load(memory_type=MemoryType.UOP, dram_base=uop_addr // CFG.uop_bytes,
                 y_size=1, x_size=uops, x_stride=uops),
            Gemm(uop_bgn=0, uop_end=uops, iter_out=iter_out, iter_in=iter_in),
            Finish()]


def store_at(addr: int) -> list:
    """A valid program whose one STORE writes one OUT element at byte `addr` (an empty
    GEMM hands it the compute token; FINISH waits for it)."""
    return [Gemm(push_next=True),
            Store(dram_base=addr // CFG.out_elem_bytes, y_size=1, x_size=1, x_stride=1,
                  pop_prev=True, push_prev=True),
            Finish(pop_next=True)]


def header(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


#: Rows of inp, wgt, acc and out the SRAM probes below fill and read.
PROBE_ROWS = 16


def _probe_tail(b: ProgramBuilder, out_addr: int, first: int) -> None:
    """Append a STORE of out rows 0..PROBE_ROWS-1 to out element `first` onward of
    `out_addr`, waiting for compute before and handing compute the token back after."""
    b.dep_push(COMPUTE, STORE)
    b.dep_pop(COMPUTE, STORE)
    b.store(dram_base=out_addr // CFG.out_elem_bytes + first, y_size=1, x_size=PROBE_ROWS,
            x_stride=PROBE_ROWS)
    b.dep_push(STORE, COMPUTE)
    b.dep_pop(STORE, COMPUTE)


def _probe_gemm() -> Gemm:
    """acc[o] += inp[o] . wgt[o]^T for o < PROBE_ROWS, over micro-op 0 as the uop SRAM
    holds it (a zero micro-op: dst, src and wgt 0, stepped by the factors)."""
    return Gemm(uop_bgn=0, uop_end=1, iter_out=PROBE_ROWS, iter_in=1, dst_factor_out=1,
                src_factor_out=1, wgt_factor_out=1)


def sram_filler(ones_addr: int, uop_addr: int, out_addr: int) -> Program:
    """A client's program that leaves PROBE_ROWS rows of inp and wgt of ones (from
    `ones_addr`), acc of block_in (16) and out of its low byte (16) in the SRAMs, and
    stores out to `out_addr`: what a session that ran a layer leaves behind."""
    b = ProgramBuilder(CFG)
    b.load(MemoryType.INP, dram_base=ones_addr // CFG.inp_elem_bytes, y_size=1,
           x_size=PROBE_ROWS, x_stride=PROBE_ROWS)
    b.load(MemoryType.WGT, dram_base=ones_addr // CFG.wgt_elem_bytes, y_size=1,
           x_size=PROBE_ROWS, x_stride=PROBE_ROWS)
    b.dep_push(LOAD, COMPUTE)
    b.dep_pop(LOAD, COMPUTE)
    b.load(MemoryType.UOP, dram_base=uop_addr // CFG.uop_bytes, y_size=1, x_size=1,
           x_stride=1)
    b.append(dataclasses.replace(_probe_gemm(), reset_reg=True))
    b.append(_probe_gemm())
    _probe_tail(b, out_addr, 0)
    return b.finish()


def sram_probe(out_addr: int) -> Program:
    """A program that loads nothing: it stores out rows 0..PROBE_ROWS-1 as it finds them
    (to out elements 0.. of `out_addr`), then runs `_probe_gemm` over the inp, wgt, acc
    and uop SRAMs as it finds them and stores out again (elements PROBE_ROWS.. onward).
    On cleared SRAMs both are zeros; after `sram_filler`, 16 and 32."""
    b = ProgramBuilder(CFG)
    b.store(dram_base=out_addr // CFG.out_elem_bytes, y_size=1, x_size=PROBE_ROWS,
            x_stride=PROBE_ROWS)
    b.dep_push(STORE, COMPUTE)
    b.dep_pop(STORE, COMPUTE)
    b.append(_probe_gemm())
    _probe_tail(b, out_addr, PROBE_ROWS)
    return b.finish()


def leftover_sram(address: str, key: RemoteKey, then=None) -> dict[str, int]:
    """Session A (`sram_filler`) then session B (`sram_probe`), each a connection of its
    own: how many nonzero bytes B read of the out buffer as A left it ("out") and of
    its GEMM over A's inp, wgt and acc rows ("gemm"). A's own output is checked too.

    address, key : the server's, and the client's key
    then : called with A's `RemoteDevice` after its program ran (more of A's work)
    """
    out_bytes = PROBE_ROWS * CFG.out_elem_bytes
    with RemoteDevice(address, key=key, wait=10) as first:
        ones = first.alloc(PROBE_ROWS * CFG.wgt_elem_bytes)
        first.write(ones, np.ones(PROBE_ROWS * CFG.wgt_elem_bytes, np.int8))
        uop = first.alloc(CFG.uop_bytes)
        first.write(uop, encode_uops([Uop(0, 0, 0)], CFG))
        out = first.alloc(out_bytes)
        first.run(*first.load_program(sram_filler(ones, uop, out)))
        assert (first.read(out, out_bytes) == CFG.block_in).all()    # A's own result
        if then is not None:
            then(first)
    with RemoteDevice(address, key=key, wait=10) as second:
        out = second.alloc(2 * out_bytes)
        second.run(*second.load_program(sram_probe(out)))
        seen = second.read(out, 2 * out_bytes)
    return {"out": int(np.count_nonzero(seen[:out_bytes])),
            "gemm": int(np.count_nonzero(seen[out_bytes:]))}
