"""The server half of `vdla.runtime.remote`: ``vdla serve``'s loop, its sessions, and what
one client may take of the device.

**Connections.** The listener accepts at once and hands each connection to its own
thread, so no connection waits on another's. A connection has `Limits.handshake_seconds`
from its accept for the TLS handshake, the key's proof and its first call (``open``);
past it, or on anything wrong, it is closed with one line in the log. At most
`Limits.max_connections` are handled at once: past that the oldest connection that has
not proved the key is dropped for the new one, so idle connections cannot fill the
server, and an authenticated client is never dropped for an unauthenticated one.

**Sessions.** One session holds the device at a time (`DeviceQueue`). Another client
is told at once ``busy: a session from ADDR has held the device for N s``, or, if its
``open`` asks to wait, waits in a queue of at most `Limits.max_waiting` clients for at
most the seconds it asked (`Limits.max_wait_seconds` at most). A session's client must
send each call, whole, within `Limits.idle_seconds` of the previous reply and take each
reply within as long; past that it is dropped and the device is free again.

**Isolation.** A session reaches only the blocks it allocated: a write or read must lie
inside one of them; a program's instructions and every LOAD and STORE must lie inside
them (`vdla.deploy.board.dma.check_dma`, before the program starts). Every block is
zeroed when allocated and again when freed or when the session ends, so no session sees
another's data, whatever the backend and however the last session ended. The on-chip
SRAMs (micro-ops, inputs, weights, accumulators, outputs) are zeroed too, by a program
run on the device itself (`vdla.runtime.remote_scrub`) when the server starts and after
every session, before the next gets the device; if that fails, no session is opened
again until the server is restarted.

**Budgets.** A session's programs may run `Limits.max_uops` micro-ops (instructions,
GEMM and ALU micro-ops, counted from the program before it starts:
`vdla.sim.counters.work_counters`) and move `Limits.max_dma_bytes` in all, within
`Limits.session_seconds` of wall time. A run that would pass a budget is refused before
it starts, with the budget and what is left named; a call after the wall time is
answered with that error and the session ends. On a board a run is also stopped at the
session's end (its timeout); on a simulator a run once started finishes, bounded by the
micro-op budget.

Nothing a client sends ends the server: every connection's error, whatever it is,
ends that connection only.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import socket
import threading
import time
from typing import Callable

import numpy as np

from vdla.deploy.board.dma import Blocks, check_dma
from vdla.isa import INSN_BYTES
from vdla.isa.encoding import decode_stream
from vdla.runtime.device import Device, dram_alignment
from vdla.runtime.remote_keys import ServerKey
from vdla.runtime.remote_scrub import scrub
from vdla.runtime.remote_wire import (MAX_PAYLOAD, Channel, Closed, Deadline, RemoteError,
                                      TimedOut, handshake_server)
from vdla.sim.counters import work_counters

__all__ = ["BudgetExceeded", "Busy", "DeviceQueue", "Limits", "NotCleared", "serve"]

#: Bytes zeroed per write when a block is cleared (a board's block may be the region).
_ZERO_CHUNK = 16 << 20


class Busy(RemoteError):
    """Another session holds the device (and the client would not, or could no longer,
    wait)."""


class BudgetExceeded(RemoteError):
    """A run (or call) past the session's budget."""


class NotCleared(RemoteError):
    """The device's on-chip buffers could not be cleared after a session: no session is
    opened on it again (the next could read what the last left)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """What one connection or session may take of the server (module docstring).

    handshake_seconds : from accept to the first call answered: TLS, the key, ``open``
    idle_seconds : the longest a session's client may take to send a call or take a reply
    session_seconds : wall time a session may hold the device
    max_uops : instructions plus GEMM and ALU micro-ops a session's programs may run (500
        million: a few minutes of the functional simulator, 5 s of a 100 MHz board)
    max_dma_bytes : bytes a session's programs' LOADs and STOREs may move
    max_waiting : clients that may wait for the device at once
    max_wait_seconds : the longest one may wait
    max_connections : connections handled at once
    """

    handshake_seconds: float = 5.0
    idle_seconds: float = 60.0
    session_seconds: float = 3600.0
    max_uops: int = 500_000_000
    max_dma_bytes: int = 64 << 30
    max_waiting: int = 4
    max_wait_seconds: float = 600.0
    max_connections: int = 64

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            whole = field.type in (int, "int")
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or (whole and not isinstance(value, int)) or not value > 0
                    or value != value or value == float("inf")):
                raise ValueError(f"{field.name} must be a positive "
                                 f"{'integer' if whole else 'number of seconds'}, "
                                 f"not {value!r}")
        if self.max_connections < self.max_waiting + 2:
            raise ValueError(f"max_connections ({self.max_connections}) must leave room for "
                             f"the session and the {self.max_waiting} waiting: at least "
                             f"{self.max_waiting + 2}")


class DeviceQueue:
    """Who holds the device, and who waits for it (first come, first served).

    max_waiting : clients that may wait at once
    """

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._holder: tuple[str, float] | None = None     # (peer, since: monotonic)
        self._waiting: collections.deque = collections.deque()

    def _busy(self) -> str:
        peer, since = self._holder
        return (f"busy: a session from {peer} has held the device for "
                f"{time.monotonic() - since:.0f} s")

    def acquire(self, peer: str, wait: float) -> None:
        """Hold the device for `peer`, waiting up to `wait` seconds behind the holder and
        those waiting before; `Busy` (naming the holder and for how long) if it cannot."""
        with self._cond:
            if self._holder is None and not self._waiting:
                self._holder = (peer, time.monotonic())
                return
            if wait <= 0:
                raise Busy(self._busy())
            if len(self._waiting) >= self.max_waiting:
                raise Busy(f"{self._busy()}; {len(self._waiting)} clients wait already (at "
                           "most that many may)")
            ticket = object()
            self._waiting.append(ticket)
            end = time.monotonic() + wait
            try:
                while self._holder is not None or self._waiting[0] is not ticket:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise Busy(f"{self._busy()}; waited {wait:g} s")
                    self._cond.wait(left)
                self._holder = (peer, time.monotonic())
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._holder = None
            self._cond.notify_all()


class _Link:
    """One connection: its socket (TLS once wrapped), peer, and whether it proved the key."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self.since, self.authenticated = time.monotonic(), False

    def drop(self) -> None:
        """Cut the connection from another thread: the thread reading it sees the end."""
        try:    # the plain socket's shutdown: an SSL socket's own would tear its state
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass


class _Server:
    """What `serve` shares between its connections' threads.

    device : the device served; key : the server's key; limits : `Limits`
    log : receives one line per event
    """

    def __init__(self, device: Device, key: ServerKey, limits: Limits,
                 log: Callable[[str], None]):
        self.device, self.key, self.limits, self.log = device, key, limits, log
        self.queue = DeviceQueue(limits.max_waiting)
        self._links: dict[int, _Link] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: Why the device's buffers are not known to be clear (None while they are).
        self.not_cleared: str | None = None

    def clear_device(self) -> str:
        """Zero the device's on-chip SRAMs (`vdla.runtime.remote_scrub.scrub`); what it
        cost, or why it failed (then `not_cleared` holds the reason and every later
        ``open`` is refused with it). Called with the device held, or before serving."""
        if self.not_cleared is not None:
            return f"NOT CLEARED: {self.not_cleared}"
        try:
            return scrub(self.device).describe()
        except Exception as exc:    # the device is then in a state nobody may inherit
            self.not_cleared = (f"clearing the accelerator's on-chip buffers failed "
                                f"({type(exc).__name__}: {exc}); restart vdla serve")
            return f"NOT CLEARED: {self.not_cleared}"

    def settle_device(self) -> None:
        """Wait, up to `Limits.idle_seconds`, for a run the device still runs (a board's
        stopped at its timeout: `vdla.deploy.board_device.BoardDevice.wait_idle`); if it
        does not end, `not_cleared` says so. A simulator's run has ended with its call."""
        wait_idle = getattr(self.device, "wait_idle", None)
        if wait_idle is None or self.not_cleared is not None:
            return
        try:
            idle = wait_idle(self.limits.idle_seconds)
        except Exception as exc:    # a device gone wrong: as a run that will not end
            idle, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = f"still running {self.limits.idle_seconds:g} s after the session ended"
        if not idle:
            self.not_cleared = (f"the accelerator did not stop ({why}); reload the "
                                "bitstream, which resets it, and restart vdla serve")

    def admit(self, sock: socket.socket, peer: str) -> None:
        """Handle the new connection `sock` in a thread of its own, within
        `Limits.max_connections` (module docstring)."""
        link = _Link(sock, peer)
        with self._lock:
            if len(self._links) >= self.limits.max_connections:
                pending = [old for old in self._links.values() if not old.authenticated]
                if not pending:
                    sock.close()
                    self.log(f"{peer}: refused: {len(self._links)} connections, all "
                             "authenticated, are the most this server handles at once")
                    return
                oldest = min(pending, key=lambda old: old.since)
                oldest.drop()
                self.log(f"{oldest.peer}: dropped before it proved the key: the server "
                         f"handles {self.limits.max_connections} connections at once")
            self._links[id(link)] = link
        thread = threading.Thread(target=self._connection, args=(link,), daemon=True,
                                  name=f"vdla serve {peer}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self) -> None:
        """Until every connection's thread has ended."""
        for thread in list(self._threads):
            thread.join()

    def _connection(self, link: _Link) -> None:
        try:
            self._serve(link)
        except RemoteError as exc:
            self.log(f"{link.peer}: {exc}")
        except Exception as exc:     # whatever it is, it ends this connection only
            self.log(f"{link.peer}: closed on an internal error: {type(exc).__name__}: {exc}")
        finally:
            try:
                link.sock.close()
            except OSError:
                pass
            with self._lock:
                self._links.pop(id(link), None)

    def _serve(self, link: _Link) -> None:
        limits = self.limits
        deadline = Deadline(limits.handshake_seconds, "complete handshake")
        try:
            # A call waits for its answer: no Nagle delay on the small frames.
            link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link.sock.settimeout(deadline.left())
            link.sock = self.key.context.wrap_socket(link.sock, server_side=True,
                                                     do_handshake_on_connect=False)
            link.sock.do_handshake()
        except TimeoutError:
            raise TimedOut(f"no TLS handshake within {deadline.seconds:g} s") from None
        except OSError as exc:     # ssl.SSLError included
            raise RemoteError(f"TLS handshake failed: {exc.strerror or exc}") from None
        channel = handshake_server(link.sock, self.key.key, deadline)
        link.authenticated = True       # never dropped for a newcomer from now on
        header, _ = channel.receive(deadline, check=_no_payload)
        wait = header.get("wait", 0)
        if header.get("call") != "open" or isinstance(wait, bool) or not isinstance(
                wait, (int, float)) or not 0 <= wait < float("inf"):
            error = RemoteError(f"the first call must be open, with wait a number of seconds "
                                f"of at least 0, not {str(header)[:100]}")
            _reply_error(channel, error, limits.idle_seconds)
            raise error
        try:
            self.queue.acquire(link.peer, min(float(wait), limits.max_wait_seconds))
        except Busy as exc:
            _reply_error(channel, exc, limits.idle_seconds)
            raise
        if self.not_cleared is not None:
            self.queue.release()
            error = NotCleared(f"refused: {self.not_cleared}")
            _reply_error(channel, error, limits.idle_seconds)
            raise error
        session = _Session(self, channel, link)
        try:
            self.log(f"{link.peer}: session opened")
            channel.send({"ok": True, **session.info()},
                         deadline=Deadline(limits.idle_seconds, "the reply taken"))
            session.serve()
        finally:
            # However the session ended, the next finds DRAM and the SRAMs zeroed. A
            # board's run stopped at its timeout still runs: it could write both.
            self.settle_device()
            count = session.clear()
            cleared = self.clear_device()
            self.log(f"{link.peer}: session closed, {count} blocks zeroed and freed, "
                     f"{cleared} ({session.uops:,} micro-ops run)")
            self.queue.release()


def _no_payload(header: dict, payload: int) -> None:
    if payload:
        raise RemoteError(f"call {str(header.get('call'))[:40]!r} carries no payload, not "
                          f"{payload:,} bytes")


def _reply_error(channel: Channel, exc: BaseException, seconds: float) -> None:
    try:
        channel.send({"ok": False, "error": type(exc).__name__, "message": str(exc)},
                     deadline=Deadline(seconds, "the error taken"))
    except RemoteError:
        pass        # the peer is gone: the log line says why it was refused


def _drain(sock: socket.socket, seconds: float = 0.5) -> None:
    """Close our side and read what the client still sends (a payload refused unread),
    for a moment: closing with unread bytes resets the connection, and the client would
    lose the reply that says why."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            if not sock.recv(1 << 16):
                break
    except OSError:
        pass


def _int(header: dict, name: str, low: int = 0) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"call {str(header.get('call'))[:40]!r}: {name} must be an integer "
                         f"of at least {low}, not {str(value)[:40]}")
    return value


class _Session:
    """The session of `link`, holding the server's device (module docstring)."""

    def __init__(self, server: _Server, channel: Channel, link: _Link):
        self.server, self.device, self.limits = server, server.device, server.limits
        self.channel, self.peer, self.link = channel, link.peer, link
        self.blocks: dict[int, int] = {}        # address -> bytes held (whole alignments)
        self.uops = self.dma_bytes = 0
        self.start = time.monotonic()
        self.align = dram_alignment(self.device.config)
        self.takes_timeout = "timeout" in inspect.signature(self.device.run).parameters

    def info(self) -> dict:
        device, limits = self.device, self.limits
        return {"config": device.config.to_dict(), "backend": device.backend,
                "dram_size": device.dram_size, "base": device.base,
                "limits": {"session_seconds": limits.session_seconds,
                           "idle_seconds": limits.idle_seconds, "max_uops": limits.max_uops,
                           "max_dma_bytes": limits.max_dma_bytes}}

    def serve(self) -> None:
        idle = self.limits.idle_seconds
        while True:
            try:
                header, payload = self.channel.receive(Deadline(idle, "call"),
                                                       check=self._check)
            except Closed:
                return
            except RemoteError as exc:   # refused, cut short or too slow: cannot resume
                self.server.log(f"{self.peer}: {exc}")
                _reply_error(self.channel, exc, 1.0)
                if not isinstance(exc, TimedOut):
                    _drain(self.link.sock)
                return
            call = header.get("call")
            if call == "close":
                return
            spent = time.monotonic() - self.start
            if spent > self.limits.session_seconds:
                error = BudgetExceeded(
                    f"the session's wall time of {self.limits.session_seconds:g} s is spent "
                    f"({spent:.0f} s): the session ends; open another")
                self.server.log(f"{self.peer}: {error}")
                _reply_error(self.channel, error, idle)
                return
            try:
                reply, data = self._dispatch(call, header, payload)
            except Exception as exc:    # the call's own errors go back to the client
                _reply_error(self.channel, exc, idle)
                continue
            self.channel.send({"ok": True, **reply}, data,
                              deadline=Deadline(idle, "the reply taken"))

    def _holds(self, addr: int, nbytes: int) -> bool:
        """Whether [addr, addr + nbytes) lies inside one block of this session."""
        length = self.blocks.get(addr)
        if length is not None:
            return nbytes <= length
        return any(start <= addr and addr + nbytes <= start + length
                   for start, length in self.blocks.items())

    def _check(self, header: dict, payload: int) -> None:
        """Refuse a frame before its payload is read: only ``write`` carries one, exactly
        as long as it says, inside one block this session allocated."""
        if header.get("call") == "write":
            try:
                addr, nbytes = _int(header, "addr"), _int(header, "nbytes")
            except ValueError as exc:       # its payload (if any) cannot be skipped
                raise RemoteError(str(exc)) from None
            if payload != nbytes:
                raise RemoteError(f"a write of {nbytes:,} bytes with a payload of {payload:,}")
            if not self._holds(addr, nbytes):
                raise RemoteError(f"a write of {nbytes:,} bytes at {addr:#x}, not inside one "
                                  "block this session allocated: refused before reading it")
        else:
            _no_payload(header, payload)

    def _dispatch(self, call, header: dict, payload) -> tuple[dict, bytes]:
        device = self.device
        if call == "config":
            return self.info(), b""
        if call == "alloc":
            nbytes = _int(header, "nbytes", 1)
            if nbytes > device.dram_size:
                raise ValueError(f"alloc of {nbytes:,} bytes: the device has "
                                 f"{device.dram_size:,}")
            addr = device.alloc(nbytes)
            self.blocks[addr] = -(-nbytes // self.align) * self.align
            self._zero(addr)
            return {"addr": addr}, b""
        if call == "free":
            addr = _int(header, "addr")
            if addr not in self.blocks:
                raise ValueError(f"address {addr:#x} is not a block this session allocated")
            self._zero(addr)
            device.free(addr)
            del self.blocks[addr]
            return {}, b""
        if call == "write":
            device.write(header["addr"], np.frombuffer(payload, dtype=np.uint8))
            return {}, b""
        if call == "read":
            addr, nbytes = _int(header, "addr"), _int(header, "nbytes")
            if nbytes > MAX_PAYLOAD:
                raise ValueError(f"a read of {nbytes:,} bytes: at most {MAX_PAYLOAD:,} a call")
            if not self._holds(addr, nbytes):
                raise ValueError(f"a read of {nbytes:,} bytes at {addr:#x}, not inside one "
                                 "block this session allocated")
            return {}, device.read(addr, nbytes).tobytes()
        if call == "run":
            return {"stats": self._run(_int(header, "insn_addr"),
                                       _int(header, "insn_count", 1))}, b""
        raise ValueError(f"unknown call {str(call)[:40]!r}: config, alloc, free, write, read, "
                         "run or close")

    def _run(self, insn_addr: int, insn_count: int) -> dict:
        """Check the program (its memory, then the budgets) and run it."""
        device, limits = self.device, self.limits
        blocks = Blocks(self.blocks)
        end = insn_addr + insn_count * INSN_BYTES
        if not blocks.covers(insn_addr, end) or insn_count * INSN_BYTES > MAX_PAYLOAD:
            raise ValueError(f"the program's {insn_count:,} instructions at "
                             f"{insn_addr:#x}..{end:#x} are not inside memory this session "
                             "allocated")
        encoded = self._program_bytes(insn_addr, end)
        insns = decode_stream(encoded, device.config)
        check_dma(insns, device.config, blocks, insn_addr=insn_addr, insn_count=insn_count)
        work = work_counters(insns, device.config)
        uops = work["instructions"] + work["gemm_uops"] + work["alu_uops"]
        dma = work["dram_bytes_read"] + work["dram_bytes_written"]
        for used, need, most, what in ((self.uops, uops, limits.max_uops, "micro-ops "
                                        "(instructions, GEMM and ALU micro-ops)"),
                                       (self.dma_bytes, dma, limits.max_dma_bytes,
                                        "bytes of DMA")):
            if used + need > most:
                raise BudgetExceeded(
                    f"this run needs {need:,} {what}; the session has run {used:,} of its "
                    f"budget of {most:,} (the server's limit): refused before it started")
        left = limits.session_seconds - (time.monotonic() - self.start)
        self.uops, self.dma_bytes = self.uops + uops, self.dma_bytes + dma
        if self.takes_timeout:      # a board's run is stopped at the session's end
            stats = device.run(insn_addr, insn_count,
                               timeout=max(0.001, min(device.timeout, left)))
        else:
            stats = device.run(insn_addr, insn_count)
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in stats.items()}

    def _program_bytes(self, begin: int, end: int) -> bytes:
        """The bytes [begin, end), read block by block (a program may span adjacent
        blocks, each read checked by the device as its own)."""
        parts = []
        for start in sorted(self.blocks):
            stop = start + self.blocks[start]
            if stop <= begin or start >= end:
                continue
            lo, hi = max(begin, start), min(end, stop)
            parts.append(self.device.read(lo, hi - lo).tobytes())
        return b"".join(parts)

    def _zero(self, addr: int) -> None:
        """Overwrite block `addr` of this session with zeros."""
        length = self.blocks[addr]
        zeros = np.zeros(min(length, _ZERO_CHUNK), np.uint8)
        for offset in range(0, length, _ZERO_CHUNK):
            self.device.write(addr + offset, zeros[:min(_ZERO_CHUNK, length - offset)])

    def clear(self) -> int:
        """Zero and free every block of this session (at its end, however it ended);
        how many there were."""
        count = len(self.blocks)
        for addr in list(self.blocks):
            try:
                self._zero(addr)
                self.device.free(addr)
            except Exception as exc:    # a device gone wrong: said, and the rest still freed
                self.server.log(f"{self.peer}: clearing block {addr:#x} failed: {exc}")
            del self.blocks[addr]
        return count


def serve(open_device: Callable[[], Device], *, key: ServerKey, host: str = "127.0.0.1",
          port: int = 9091, log: Callable[[str], None] = print,
          connections: int | None = None, ready: Callable[[int], None] | None = None,
          limits: Limits | None = None) -> None:
    """Serve the device `open_device()` gives (opened once) to one session at a time.

    open_device : opens the device (a board's, a simulator's)
    key : the server's key (`vdla.runtime.remote_keys.read_server_key`)
    host, port : where to listen (127.0.0.1 by default: other machines only when asked;
        port 0: any free one, `ready` is told which)
    log : receives one line per event (a connection refused, a session opened or closed)
    connections : stop after this many connections, once they have ended (None: serve
        until interrupted)
    ready : called with the port once listening
    limits : what a connection and a session may take (`Limits`; its defaults if None)
    """
    limits = Limits() if limits is None else limits
    device = open_device()
    server = _Server(device, key, limits, log)
    try:
        # What a program run before the server started left in the SRAMs (a board's
        # last user, a bundle's run) is no session's to read either.
        cleared = server.clear_device()
        if server.not_cleared is not None:
            raise NotCleared(f"vdla serve: {server.not_cleared}")
        with socket.create_server((host, port), backlog=128) as listener:
            if ready is not None:
                ready(listener.getsockname()[1])
            log(f"vdla serve: {device.backend} device, config {device.config.name}, on "
                f"{host}:{listener.getsockname()[1]} (TLS, certificate "
                f"{key.fingerprint[:16]}...); {cleared}")
            accepted = 0
            while connections is None or accepted < connections:
                try:
                    sock, peer = listener.accept()
                except OSError as exc:     # out of descriptors, a connection aborted
                    log(f"vdla serve: accept failed: {exc.strerror or exc}")
                    time.sleep(0.05)
                    continue
                accepted += 1
                try:
                    server.admit(sock, f"{peer[0]}:{peer[1]}")
                except Exception as exc:   # no thread to be had: this connection only
                    sock.close()
                    log(f"{peer[0]}:{peer[1]}: refused: {exc}")
            server.wait()
    finally:
        device.close()
