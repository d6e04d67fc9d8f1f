"""The device API over the network: a board's accelerator served by ``vdla serve``, used
from a workstation as any device (`RemoteDevice`), so that ``vdla run MODEL --remote
HOST:PORT`` compiles here and runs there.

    serve(vdla.boards.get("pynq-z1").open_hardware, port=9091, key=b"...")   # the board
    with RemoteDevice("board:9091", key=b"...") as dev: ...                  # anywhere

What crosses the wire is the device API's own calls (``config``, ``alloc``, ``free``,
``write``, ``read``, ``run``) with their numbers and bytes, nothing that runs: no pickle,
no code. The workstation's session drives them as it drives a local device, so a model
runs on the board exactly as in a simulator (its ops' programs and data at the same
offsets).

**Authentication.** Both ends hold one shared key. The server opens with a random
challenge; the client answers with HMAC-SHA256(key, challenge) and its own challenge,
which the server answers likewise, so each side proves the key without sending it. A
client that does not answer right is told so and disconnected before it can send a
call. Every frame after that carries an HMAC under a key derived from both challenges
and a frame counter, so a frame cannot be forged, altered, replayed or reordered on the
way.

**Frames.** ``[4-byte header length][8-byte payload length][JSON header][payload]
[32-byte MAC]``, big-endian. A header over `MAX_HEADER` bytes, a payload over
`MAX_PAYLOAD`, or a ``write`` whose payload is not exactly the bytes its block has
room for, is refused before its payload is read or anything allocated, and the server
closes the connection (a stream cut mid-frame cannot be resynchronised). A frame cut
short (the peer gone) is an error naming how much arrived.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import time
from typing import Callable

import numpy as np

from vdla.config import HardwareConfig
from vdla.runtime.device import Device, in_stat_order

__all__ = ["Closed", "MAX_HEADER", "MAX_PAYLOAD", "RemoteDevice", "RemoteError", "read_key",
           "serve"]

MAGIC = b"VDLA-REMOTE/1\n"
#: Largest JSON header a peer may send.
MAX_HEADER = 64 << 10
#: Largest payload a peer may send (a model's weights go in several writes).
MAX_PAYLOAD = 256 << 20
NONCE = 32
MAC = 32
_LENGTHS = struct.Struct(">IQ")


class RemoteError(RuntimeError):
    """The remote call failed: refused, failed on the server (its error named), or the
    connection broke."""


class Closed(RemoteError):
    """The peer closed the connection between two frames."""


def read_key(path: str | None = None) -> bytes:
    """The shared key: the file at `path`, else ``$VDLA_REMOTE_KEY``; at least 16 bytes.
    ValueError naming where it looked."""
    if path is not None:
        try:
            key = open(path, "rb").read().strip()
        except OSError as exc:
            raise ValueError(f"key file {path!r}: {exc.strerror}") from None
    else:
        key = os.environ.get("VDLA_REMOTE_KEY", "").encode()
    if len(key) < 16:
        raise ValueError("a shared key of at least 16 bytes is needed: --key-file PATH or "
                         "$VDLA_REMOTE_KEY (for example `openssl rand -hex 32`)")
    return key


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


class _Channel:
    """Frames over a connected socket, each with its MAC under `key` and a counter per
    direction."""

    def __init__(self, sock: socket.socket, key: bytes, *, sent: bytes, received: bytes):
        self.sock, self.key = sock, key
        # A call waits for its answer: no Nagle delay on the small frames.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._out, self._in = sent, received       # direction labels in the MAC
        self._sent = self._received = 0

    def _exactly(self, n: int, what: str, *, first: bool = False) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = self.sock.recv(min(n - got, 1 << 20))
            except socket.timeout:
                raise RemoteError(f"no answer within {self.sock.gettimeout():g} s while "
                                  f"receiving {what}") from None
            except OSError as exc:
                raise RemoteError(f"the connection broke while receiving {what}: "
                                  f"{exc.strerror or exc}") from None
            if not chunk:
                if first and not got:
                    raise Closed("the peer closed the connection")
                raise RemoteError(f"the peer closed the connection with {what} cut short "
                                  f"({got} of {n} bytes)")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def send(self, header: dict, payload: bytes | np.ndarray = b"") -> None:
        data = json.dumps(header, separators=(",", ":")).encode()
        body = memoryview(payload).cast("B") if len(payload) else b""
        lengths = _LENGTHS.pack(len(data), len(body))
        counter = struct.pack(">Q", self._sent)
        tag = hmac.new(self.key, self._out + counter + lengths + data, hashlib.sha256)
        tag.update(body)
        try:     # one send for a frame without a payload (small frames, one segment)
            if len(body):
                self.sock.sendall(lengths + data)
                self.sock.sendall(body)
                self.sock.sendall(tag.digest())
            else:
                self.sock.sendall(lengths + data + tag.digest())
        except OSError as exc:
            raise RemoteError(f"the connection broke while sending "
                              f"{header.get('call', 'a reply')}: {exc.strerror or exc}") \
                from None
        self._sent += 1

    def receive(self, *, check: Callable[[dict, int], None] | None = None
                ) -> tuple[dict, bytes]:
        """The next frame's header and payload. `check(header, payload length)` may
        refuse the frame (raising) before its payload is read."""
        lengths = self._exactly(_LENGTHS.size, "a frame's lengths", first=True)
        header_len, payload_len = _LENGTHS.unpack(lengths)
        if header_len > MAX_HEADER:
            raise RemoteError(f"a frame header of {header_len} bytes: at most {MAX_HEADER}")
        if payload_len > MAX_PAYLOAD:
            raise RemoteError(f"a payload of {payload_len:,} bytes: at most {MAX_PAYLOAD:,} "
                              "a frame")
        data = self._exactly(header_len, "a frame header")
        try:
            header = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict):
            raise RemoteError("a frame header that is not a JSON object")
        if check is not None:
            check(header, payload_len)
        payload = self._exactly(payload_len, "a payload") if payload_len else b""
        tag = self._exactly(MAC, "a frame's MAC")
        counter = struct.pack(">Q", self._received)
        want = _mac(self.key, self._in, counter, lengths, data, payload)
        if not hmac.compare_digest(tag, want):
            raise RemoteError("a frame whose MAC does not match: altered on the way, or "
                              "not from the peer that authenticated")
        self._received += 1
        return header, payload


def _handshake_server(sock: socket.socket, key: bytes) -> _Channel:
    challenge = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + challenge)
    plain = _Channel(sock, b"", sent=b"", received=b"")
    answer = plain._exactly(MAC + NONCE, "the client's answer")
    if not hmac.compare_digest(answer[:MAC], _mac(key, b"client", challenge)):
        sock.sendall(b"\x00")
        raise RemoteError("a client that does not hold the key: refused")
    theirs = answer[MAC:]
    sock.sendall(b"\x01" + _mac(key, b"server", theirs))
    session = _mac(key, b"session", challenge, theirs)
    return _Channel(sock, session, sent=b"s", received=b"c")


def _handshake_client(sock: socket.socket, key: bytes) -> _Channel:
    plain = _Channel(sock, b"", sent=b"", received=b"")
    hello = plain._exactly(len(MAGIC) + NONCE, "the server's greeting")
    if hello[:len(MAGIC)] != MAGIC:
        raise RemoteError(f"the peer is not a vdla server (it greeted {hello[:16]!r})")
    challenge, mine = hello[len(MAGIC):], secrets.token_bytes(NONCE)
    sock.sendall(_mac(key, b"client", challenge) + mine)
    verdict = plain._exactly(1, "the server's verdict")
    if verdict != b"\x01":
        raise RemoteError("the server refused the key: check --key-file or $VDLA_REMOTE_KEY")
    proof = plain._exactly(MAC, "the server's proof")
    if not hmac.compare_digest(proof, _mac(key, b"server", mine)):
        raise RemoteError("the server does not hold the key: not the server you meant")
    session = _mac(key, b"session", challenge, mine)
    return _Channel(sock, session, sent=b"c", received=b"s")


# --- the server ------------------------------------------------------------------------------

def serve(open_device: Callable[[], Device], *, host: str = "0.0.0.0", port: int = 9091,
          key: bytes, log: Callable[[str], None] = print, connections: int | None = None,
          ready: Callable[[int], None] | None = None) -> None:
    """Serve the device `open_device()` gives (opened once) to one client at a time.

    host, port : where to listen (port 0: any free one, `ready` is told which)
    key : the shared key (`read_key`)
    connections : stop after this many (None: serve until interrupted)
    Each client's allocations are freed when it disconnects."""
    device = open_device()
    with socket.create_server((host, port)) as server:
        if ready is not None:
            ready(server.getsockname()[1])
        log(f"vdla serve: {device.backend} device, config {device.config.name}, on "
            f"{host}:{server.getsockname()[1]}")
        served = 0
        try:
            while connections is None or served < connections:
                sock, peer = server.accept()
                served += 1
                with sock:
                    sock.settimeout(60.0)   # a client gone quiet frees the device
                    _serve_one(device, sock, key, f"{peer[0]}:{peer[1]}", log)
        finally:
            device.close()


def _serve_one(device: Device, sock: socket.socket, key: bytes, peer: str, log) -> None:
    owned: set[int] = set()
    try:
        channel = _handshake_server(sock, key)
    except RemoteError as exc:
        log(f"{peer}: {exc}")
        return
    log(f"{peer}: connected")
    try:
        while True:
            try:
                header, payload = channel.receive(check=lambda h, n: _check(device, h, n))
            except Closed:
                return
            except RemoteError as exc:      # refused or cut short: no way to resume
                log(f"{peer}: {exc}")
                _reply_error(channel, exc)
                _drain(sock)
                return
            call = header.get("call")
            if call == "close":
                return
            try:
                reply, data = _dispatch(device, call, header, payload, owned)
            except Exception as exc:    # the device's own errors go back to the client
                _reply_error(channel, exc)
                continue
            channel.send({"ok": True, **reply}, data)
    finally:
        for addr in owned:
            device.free(addr)
        log(f"{peer}: disconnected, {len(owned)} blocks freed")


def _drain(sock: socket.socket, seconds: float = 1.0) -> None:
    """Close our side and read what the client still sends (a payload refused unread),
    for a moment: closing with unread bytes resets the connection, and the client would
    lose the reply that says why."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(seconds)
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


def _reply_error(channel: _Channel, exc: BaseException) -> None:
    try:
        channel.send({"ok": False, "error": type(exc).__name__, "message": str(exc)})
    except RemoteError:
        pass


def _int(header: dict, name: str) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RemoteError(f"call {header.get('call')!r}: {name} must be a non-negative "
                          f"integer, not {value!r}")
    return value


def _check(device: Device, header: dict, payload: int) -> None:
    """Refuse a frame before its payload is read: only ``write`` carries one, exactly as
    long as it says, inside one block the device allocated."""
    if header.get("call") == "write":
        addr, nbytes = _int(header, "addr"), _int(header, "nbytes")
        if payload != nbytes:
            raise RemoteError(f"a write of {nbytes:,} bytes with a payload of {payload:,}")
        if not device.allocator.contains(addr, nbytes):
            raise RemoteError(f"a write of {nbytes:,} bytes at {addr:#x}, not inside one "
                              "allocated block: refused before reading it")
    elif payload:
        raise RemoteError(f"call {header.get('call')!r} carries no payload, not {payload:,} "
                          "bytes")


def _dispatch(device: Device, call, header: dict, payload: bytes,
              owned: set[int]) -> tuple[dict, bytes]:
    if call == "config":
        return {"config": device.config.to_dict(), "backend": device.backend,
                "dram_size": device.dram_size, "base": device.base}, b""
    if call == "alloc":
        nbytes = _int(header, "nbytes")
        if not 0 < nbytes <= device.dram_size:
            raise ValueError(f"alloc of {nbytes:,} bytes: the device has {device.dram_size:,}")
        addr = device.alloc(nbytes)
        owned.add(addr)
        return {"addr": addr}, b""
    if call == "free":
        addr = _int(header, "addr")
        if addr not in owned:
            raise ValueError(f"address {addr:#x} is not a block this client allocated")
        device.free(addr)
        owned.discard(addr)
        return {}, b""
    if call == "write":
        device.write(_int(header, "addr"), np.frombuffer(payload, dtype=np.uint8))
        return {}, b""
    if call == "read":
        nbytes = _int(header, "nbytes")
        if nbytes > MAX_PAYLOAD:
            raise ValueError(f"a read of {nbytes:,} bytes: at most {MAX_PAYLOAD:,} a call")
        return {}, device.read(_int(header, "addr"), nbytes).tobytes()
    if call == "run":
        stats = device.run(_int(header, "insn_addr"), _int(header, "insn_count"))
        return {"stats": {k: (v.item() if hasattr(v, "item") else v)
                          for k, v in stats.items()}}, b""
    raise ValueError(f"unknown call {call!r}: config, alloc, free, write, read, run or close")


# --- the client ------------------------------------------------------------------------------

class RemoteDevice(Device):
    """The device ``vdla serve`` serves at `address` (``HOST:PORT``).

    key : the shared key (`read_key`)
    timeout : seconds to wait for any answer (a run included) before `RemoteError`
    The config and `base` are the server's device's (``config``); `backend` says it is
    remote and what."""

    def __init__(self, address: str, *, key: bytes, timeout: float = 120.0):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--remote {address!r}: give HOST:PORT")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as exc:
            raise RemoteError(f"cannot connect to {address}: {exc.strerror or exc}") from None
        self.address = address
        try:
            self.channel = _handshake_client(self.sock, key)
            info = self._call({"call": "config"})[0]
        except BaseException:
            self.sock.close()
            raise
        self.backend = f"remote {info['backend']}"
        # The server's device's base (a board's DMA region), which a device script's
        # addresses and programs move by (`vdla.deploy.board.player`); 0 from an older server.
        self.base = int(info.get("base", 0))
        super().__init__(HardwareConfig.from_dict(info["config"]), int(info["dram_size"]))

    def _call(self, header: dict, payload: bytes | np.ndarray = b"") -> tuple[dict, bytes]:
        try:
            self.channel.send(header, payload)
            reply, data = self.channel.receive()
        except RemoteError as exc:
            raise RemoteError(f"{self.address}: no answer to {header['call']}: {exc}") \
                from None
        if not reply.get("ok"):
            raise RemoteError(f"{self.address}: {header['call']} failed on the server: "
                              f"{reply.get('error')}: {reply.get('message')}")
        return reply, data

    def alloc(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"alloc size must be a positive integer, not {nbytes!r}")
        return int(self._call({"call": "alloc", "nbytes": nbytes})[0]["addr"])

    def free(self, addr: int):
        self._call({"call": "free", "addr": int(addr)})

    def _check_range(self, addr: int, nbytes: int, what: str):
        pass     # the server checks against its own blocks

    def _write(self, addr: int, raw: np.ndarray):
        self._call({"call": "write", "addr": addr, "nbytes": len(raw)}, raw)

    def _read(self, addr: int, nbytes: int) -> np.ndarray:
        data = self._call({"call": "read", "addr": addr, "nbytes": nbytes})[1]
        return np.frombuffer(data, dtype=np.uint8).copy()

    def run(self, insn_addr: int, insn_count: int) -> dict:
        """As `Device.run`, on the server's device with its own checks and limits (a
        board's timeout); ``wall_seconds`` is the server's where it reports one."""
        start = time.perf_counter()
        stats = self._call({"call": "run", "insn_addr": int(insn_addr),
                            "insn_count": int(insn_count)})[0]["stats"]
        stats.setdefault("wall_seconds", time.perf_counter() - start)
        return in_stat_order(stats)

    def close(self):
        sock, self.sock = getattr(self, "sock", None), None
        if sock is not None:
            try:
                self.channel.send({"call": "close"})
            except RemoteError:
                pass
            sock.close()
