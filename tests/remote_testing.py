"""Helpers of the remote tests (tests/runtime/test_remote*.py): a key folder, a live
`vdla.runtime.remote.serve` on 127.0.0.1 over the functional simulator, in a thread,
and clients that speak the protocol by hand (TLS alone, the key's handshake, frames
written byte by byte) to play an attacker or a careless client.

    keys = make_keys(tmp_path)
    server = LiveServer(keys, limits=Limits(handshake_seconds=1))
    sock, channel, info = session(server.address, keys.client)
    assert server.alive() and bit_exact_run(server.address, keys.client)
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
    """`serve` in a daemon thread on 127.0.0.1 (any free port), over a functional device.

    keys : the `Keys` it serves with
    limits : its `Limits` (its defaults if None)
    dram_size : the device's DRAM
    log : its log lines; device : the device it serves; address : ``127.0.0.1:PORT``
    """

    def __init__(self, keys: Keys, *, limits: Limits | None = None,
                 dram_size: int = 256 << 20):
        self.log: list[str] = []
        self.device = None
        ready = threading.Event()

        def open_device():
            self.device = vdla.runtime.open(CFG, "functional", dram_size=dram_size)
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
