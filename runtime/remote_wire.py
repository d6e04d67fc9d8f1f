"""The wire of `vdla.runtime.remote`: frames, their MACs, the key handshake and the
deadlines every read and write runs under. Both ends use it; nothing here knows what a
call does.

**The handshake** (inside TLS, `vdla.runtime.remote_keys`): the server sends `MAGIC`
and a random challenge; the client answers HMAC-SHA256(key, "client" + challenge) and
its own challenge; the server answers ``\\x01`` and HMAC-SHA256(key, "server" + the
client's challenge), or ``\\x00`` and closes. Each side proves it holds the key without
sending it. Every message of it has a fixed size, so nothing a peer sends before it
has proved the key is parsed.

**Frames.** ``[4-byte header length][8-byte payload length][JSON header][32-byte header
MAC]`` then, when the payload length is not 0, ``[payload][32-byte payload MAC]``,
big-endian. The header MAC covers the direction, the frame's counter, the lengths and
the header; the payload MAC the header MAC and the payload. A receiver checks the
lengths against `MAX_HEADER` and `MAX_PAYLOAD` (before reading further), the header's
MAC (before parsing it), the header's JSON (bounded: `_parse_header`), then lets its
caller refuse the frame from its header (before the payload is read), then reads the
payload and checks its MAC. The MACs are under a key derived from both challenges, so
a frame cannot be forged, altered, replayed or reordered even by whoever terminates the
TLS connection without the key.

**Deadlines.** Every read and write runs under a `Deadline`, an absolute time: the
socket's timeout is set to what is left before each system call, so a peer that sends
(or reads) one byte at a time cannot stretch it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from typing import Callable

import numpy as np

__all__ = ["Closed", "Deadline", "MAC", "MAGIC", "MAX_HEADER", "MAX_PAYLOAD", "NONCE",
           "Channel", "RemoteError", "TimedOut", "handshake_client", "handshake_server",
           "mac"]

#: The protocol's greeting (2: inside TLS, the header's MAC before its payload).
MAGIC = b"VDLA-REMOTE/2\n"
#: Largest JSON header a peer may send (a call's header is under 200 bytes, the
#: config's reply a few KiB).
MAX_HEADER = 64 << 10
#: Largest payload a peer may send (a model's weights go in several writes).
MAX_PAYLOAD = 256 << 20
#: Bytes of each side's random challenge, and of a MAC (HMAC-SHA256).
NONCE = 32
MAC = 32
#: Digits an integer of a header may have: 2**64 has 20.
MAX_DIGITS = 20
_LENGTHS = struct.Struct(">IQ")
#: Bytes per system call when sending or receiving a large payload, so that the deadline
#: is checked between them.
_CHUNK = 1 << 20


class RemoteError(RuntimeError):
    """The remote call failed: refused, failed on the server (its error named), or the
    connection broke."""


class Closed(RemoteError):
    """The peer closed the connection between two frames."""


class TimedOut(RemoteError):
    """The peer did not send (or take) what was expected before the deadline."""


class Deadline:
    """An absolute time by which something must be done.

    seconds : from now; None for no deadline (a blocking wait)
    what : what must be done by then, for the error (``"the handshake"``)
    """

    def __init__(self, seconds: float | None, what: str = "an answer"):
        self.seconds, self.what = seconds, what
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds left (None: no deadline); `TimedOut` once there are none."""
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimedOut(f"no {self.what} within {self.seconds:g} s")
        return left


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of `parts`, concatenated, under `key`."""
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits: at most {MAX_DIGITS}")
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _parse_header(data: bytes) -> dict:
    """A frame header's JSON object; `RemoteError` for anything else. Bounded: integers
    of at most `MAX_DIGITS` digits (Python's own limit, 4,300, raises deep in `int`),
    and nesting past the interpreter's recursion limit is an error, not a crash."""
    try:
        header = json.loads(data, parse_int=_bounded_int, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:     # UnicodeDecodeError is a ValueError
        raise RemoteError(f"a frame header that is not valid JSON: {str(exc)[:120]}") \
            from None
    if not isinstance(header, dict):
        raise RemoteError(f"a frame header that is a JSON {type(header).__name__}, not an "
                          "object")
    return header


class Channel:
    """Frames over a connected socket (a TLS one in use), each with its MACs under `key`
    and a counter per direction.

    sock : the connected socket
    key : the session key (`handshake_server`, `handshake_client`)
    sent, received : the direction labels mixed into the MACs (``b"s"``, ``b"c"``)
    """

    def __init__(self, sock: socket.socket, key: bytes, *, sent: bytes, received: bytes):
        self.sock, self.key = sock, key
        self._out, self._in = sent, received
        self._sent = self._received = 0

    def exactly(self, n: int, what: str, deadline: Deadline, *, first: bool = False
                ) -> bytearray:
        """`n` bytes from the peer by `deadline`. `Closed` when the peer closed the
        connection before the first byte of a frame (`first`), `TimedOut` past the
        deadline, `RemoteError` for a connection broken or cut short (naming how much
        arrived)."""
        return receive_exactly(self.sock, n, what, deadline, first=first)

    def pack(self, data: bytes, payload=b"") -> tuple[bytes, memoryview | bytes, bytes]:
        """The next frame, of header bytes `data` (JSON, as `send` writes it) and
        `payload`, as (lengths, header and its MAC; the payload; the payload's MAC or
        b""), counted as sent. (A test writes frames by hand with it.)"""
        body = memoryview(payload).cast("B") if len(payload) else b""
        lengths = _LENGTHS.pack(len(data), len(body))
        counter = struct.pack(">Q", self._sent)
        head_tag = mac(self.key, self._out, counter, lengths, data)
        tail = b""
        if len(body):
            tag = hmac.new(self.key, head_tag, hashlib.sha256)
            tag.update(body)
            tail = tag.digest()
        self._sent += 1
        return lengths + data + head_tag, body, tail

    def send(self, header: dict, payload: bytes | np.ndarray = b"", *,
             deadline: Deadline) -> None:
        """Send one frame by `deadline`; `RemoteError` (`TimedOut`) when the connection
        breaks or the peer does not take it in time."""
        head, body, tail = self.pack(json.dumps(header, separators=(",", ":")).encode(),
                                     payload)
        what = f"{header.get('call', 'a reply')}"
        if len(body):
            send_all(self.sock, head, what, deadline)
            send_all(self.sock, body, what, deadline)
            send_all(self.sock, tail, what, deadline)
        else:   # one segment for a small frame
            send_all(self.sock, head, what, deadline)

    def receive(self, deadline: Deadline, *,
                check: Callable[[dict, int], None] | None = None) -> tuple[dict, bytes]:
        """The next frame's header and payload, by `deadline`. `check(header, payload
        length)` may refuse the frame (raising) after its header's MAC and JSON are
        checked, before its payload is read."""
        lengths = self.exactly(_LENGTHS.size, "a frame", deadline, first=True)
        header_len, payload_len = _LENGTHS.unpack(lengths)
        if header_len > MAX_HEADER:
            raise RemoteError(f"a frame header of {header_len:,} bytes: at most "
                              f"{MAX_HEADER:,}")
        if payload_len > MAX_PAYLOAD:
            raise RemoteError(f"a payload of {payload_len:,} bytes: at most {MAX_PAYLOAD:,} "
                              "a frame")
        data = self.exactly(header_len + MAC, "a frame header", deadline)
        data, head_tag = data[:header_len], data[header_len:]
        counter = struct.pack(">Q", self._received)
        if not hmac.compare_digest(head_tag, mac(self.key, self._in, counter, lengths,
                                                 data)):
            raise RemoteError("a frame whose MAC does not match: altered on the way, or not "
                              "from the peer that authenticated")
        header = _parse_header(data)
        if check is not None:
            check(header, payload_len)
        payload = b""
        if payload_len:
            payload = self.exactly(payload_len, "a payload", deadline)
            tag = self.exactly(MAC, "a payload's MAC", deadline)
            if not hmac.compare_digest(tag, mac(self.key, head_tag, payload)):
                raise RemoteError("a payload whose MAC does not match: altered on the way")
        self._received += 1
        return header, payload


def receive_exactly(sock: socket.socket, n: int, what: str, deadline: Deadline, *,
                    first: bool = False) -> bytearray:
    """`n` bytes from `sock` by `deadline` (`Channel.exactly`)."""
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        try:
            sock.settimeout(deadline.left())
            chunk = sock.recv_into(view[got:], min(n - got, _CHUNK))
        except (TimeoutError, TimedOut):
            came = f" ({got} of {n} bytes of {what} came)" if got else ""
            raise TimedOut(f"no {deadline.what} within {deadline.seconds:g} s{came}") \
                from None
        except OSError as exc:      # ssl.SSLError included
            raise RemoteError(f"the connection broke while receiving {what}: "
                              f"{exc.strerror or exc}") from None
        if not chunk:
            if first and not got:
                raise Closed("the peer closed the connection")
            raise RemoteError(f"the peer closed the connection with {what} cut short "
                              f"({got} of {n} bytes)")
        got += chunk
    return buffer       # not copied to bytes: a payload may be 256 MiB


def send_all(sock: socket.socket, data, what: str, deadline: Deadline) -> None:
    """All of `data` to `sock` by `deadline`, a chunk per system call."""
    view, sent = memoryview(data).cast("B"), 0
    while sent < len(view):
        try:
            sock.settimeout(deadline.left())
            sent += sock.send(view[sent:sent + _CHUNK])
        except (TimeoutError, TimedOut):
            raise TimedOut(f"the peer did not take {what} within {deadline.seconds:g} s") \
                from None
        except OSError as exc:
            raise RemoteError(f"the connection broke while sending {what}: "
                              f"{exc.strerror or exc}") from None


def handshake_server(sock: socket.socket, key: bytes, deadline: Deadline) -> Channel:
    """The server's half of the handshake (module docstring); the session's `Channel`.
    `RemoteError` for a client that does not hold the key (told so) or is too slow."""
    challenge = secrets.token_bytes(NONCE)
    send_all(sock, MAGIC + challenge, "the greeting", deadline)
    answer = receive_exactly(sock, MAC + NONCE, "the client's answer", deadline)
    if not hmac.compare_digest(answer[:MAC], mac(key, b"client", challenge)):
        try:
            send_all(sock, b"\x00", "the verdict", deadline)
        except RemoteError:
            pass        # gone already: the refusal stands
        raise RemoteError("a client that does not hold the key: refused")
    theirs = answer[MAC:]
    send_all(sock, b"\x01" + mac(key, b"server", theirs), "the verdict", deadline)
    return Channel(sock, mac(key, b"session", challenge, theirs), sent=b"s", received=b"c")


def handshake_client(sock: socket.socket, key: bytes, deadline: Deadline) -> Channel:
    """The client's half of the handshake; the session's `Channel`. `RemoteError` for a
    peer that is not a vdla server, refuses the key, or does not hold it."""
    hello = receive_exactly(sock, len(MAGIC) + NONCE, "the server's greeting", deadline)
    if hello[:len(MAGIC)] != MAGIC:
        raise RemoteError(f"the peer is not a vdla server of this version (it greeted "
                          f"{hello[:16]!r}, not {MAGIC!r})")
    challenge, mine = hello[len(MAGIC):], secrets.token_bytes(NONCE)
    send_all(sock, mac(key, b"client", challenge) + mine, "the answer", deadline)
    verdict = receive_exactly(sock, 1, "the server's verdict", deadline)
    if verdict != b"\x01":
        raise RemoteError("the server refused the key: check --key-file (the client.key "
                          "`vdla serve --new-key` wrote beside the server's)")
    proof = receive_exactly(sock, MAC, "the server's proof", deadline)
    if not hmac.compare_digest(proof, mac(key, b"server", mine)):
        raise RemoteError("the server does not hold the key: not the server you meant")
    return Channel(sock, mac(key, b"session", challenge, mine), sent=b"c", received=b"s")
