"""The device API over the network: a board's accelerator served by ``vdla serve``, used
from a workstation as any device (`RemoteDevice`), so that ``vdla run MODEL --remote
HOST:PORT`` compiles here and runs there.

    new_key("vdla-key")                                             # once: two files
    serve(vdla.boards.get("pynq-z1").open_hardware,
          key=read_server_key("vdla-key"))                          # on the board
    with RemoteDevice("board:9091", key=read_key("client.key")) as dev: ...   # anywhere

What crosses the wire is the device API's own calls (``open``, ``config``, ``alloc``,
``free``, ``write``, ``read``, ``run``) with their numbers and bytes, nothing that runs:
no pickle, no code. The workstation's session drives them as it drives a local device,
so a model runs on the board exactly as in a simulator (its ops' programs and data at
the same offsets).

Three modules do the work:

- `vdla.runtime.remote_keys`: the key folder ``vdla serve --new-key DIR`` writes (a TLS
  certificate and a shared key), and the checks on reading it;
- `vdla.runtime.remote_wire`: TLS 1.3 with the server's certificate pinned by the
  client, the shared key's challenge-response inside it, frames with MACs checked
  before anything in them is parsed, deadlines on every read and write;
- `vdla.runtime.remote_server`: the server: connections in threads with a handshake
  deadline, one session holding the device (others told they are busy, or queued),
  a session's memory isolated and zeroed, its budgets of micro-ops and wall time;
- `vdla.runtime.remote_scrub`: the program that zeroes the accelerator's on-chip SRAMs
  between sessions, run on the device itself.

docs/boards.md, "Security", says what this protects and what it does not.
"""

from __future__ import annotations

import socket
import ssl
import time

import numpy as np

from vdla.config import HardwareConfig
from vdla.runtime.device import Device, in_stat_order
from vdla.runtime.remote_keys import (RemoteKey, ServerKey, client_context, new_key, pin,
                                      read_key, read_server_key)
from vdla.runtime.remote_server import BudgetExceeded, Busy, Limits, NotCleared, serve
from vdla.runtime.remote_wire import (MAX_HEADER, MAX_PAYLOAD, Closed, Deadline, RemoteError,
                                      TimedOut, handshake_client)

__all__ = ["BudgetExceeded", "Busy", "Closed", "Limits", "MAX_HEADER", "MAX_PAYLOAD",
           "NotCleared", "RemoteDevice", "RemoteError", "RemoteKey", "ServerKey", "TimedOut",
           "new_key", "read_key", "read_server_key", "serve"]

#: The errors a server names in its reply that the client raises as their own class.
_ERRORS = {"Busy": Busy, "BudgetExceeded": BudgetExceeded, "NotCleared": NotCleared}


class RemoteDevice(Device):
    """The device ``vdla serve`` serves at `address` (``HOST:PORT``).

    key : the client's key (`read_key`): the shared key and the server's certificate
        fingerprint, which the server must match
    timeout : seconds to wait for any answer (a run included) before `RemoteError`
    wait : seconds to wait for the device while another session holds it (0: `Busy` at
        once, naming that session and how long it has held the device)
    The config and `base` are the server's device's; `backend` says it is remote and
    what; `limits` the session's budgets as the server reports them.
    """

    def __init__(self, address: str, *, key: RemoteKey, timeout: float = 120.0,
                 wait: float = 0.0):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--remote {address!r}: give HOST:PORT (a port of 1..65535)")
        if not isinstance(key, RemoteKey):
            raise TypeError(f"key must be a RemoteKey (read_key), not {type(key).__name__}")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise ValueError(f"wait must be a number of seconds of at least 0, not {wait!r}")
        self.address, self.timeout = address, float(timeout)
        host = host.strip("[]")     # an IPv6 address in brackets
        try:
            raw = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as exc:
            raise RemoteError(f"cannot connect to {address}: {exc.strerror or exc}") from None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small frames
            self.sock = client_context().wrap_socket(raw)
        except (OSError, ssl.SSLError) as exc:
            raw.close()
            raise RemoteError(f"{address}: the TLS handshake failed: {exc}; is it a vdla "
                              "serve of this version?") from None
        try:
            try:
                pin(self.sock, key.fingerprint, address)
            except ValueError as exc:
                raise RemoteError(str(exc)) from None
            self.channel = handshake_client(self.sock, key.key,
                                            Deadline(timeout, "answer from the server"))
            info = self._call({"call": "open", "wait": float(wait)}, extra=float(wait))[0]
        except BaseException:
            self.sock.close()
            raise
        self.backend = f"remote {info['backend']}"
        # The server's device's base (a board's DMA region), which a device script's
        # addresses and programs move by (`vdla.deploy.board.player`).
        self.base = int(info.get("base", 0))
        self.limits = info.get("limits", {})
        super().__init__(HardwareConfig.from_dict(info["config"]), int(info["dram_size"]))

    def _call(self, header: dict, payload: bytes | np.ndarray = b"", *,
              extra: float = 0.0) -> tuple[dict, bytes]:
        deadline = Deadline(self.timeout + extra, "answer from the server")
        try:
            self.channel.send(header, payload, deadline=deadline)
            reply, data = self.channel.receive(deadline)
        except RemoteError as exc:
            raise RemoteError(f"{self.address}: no answer to {header['call']}: {exc}") \
                from None
        if not reply.get("ok"):
            error = str(reply.get("error"))
            cls = _ERRORS.get(error, RemoteError)
            if cls is not RemoteError:
                raise cls(f"{self.address}: {reply.get('message')}")
            raise RemoteError(f"{self.address}: {header['call']} failed on the server: "
                              f"{error}: {reply.get('message')}")
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
        """As `Device.run`, on the server's device with its own checks and limits (the
        program's memory, the session's budgets, a board's timeout); ``wall_seconds``
        is the server's where it reports one."""
        start = time.perf_counter()
        stats = self._call({"call": "run", "insn_addr": int(insn_addr),
                            "insn_count": int(insn_count)})[0]["stats"]
        stats.setdefault("wall_seconds", time.perf_counter() - start)
        return in_stat_order(stats)

    def close(self):
        sock, self.sock = getattr(self, "sock", None), None
        if sock is not None:
            try:
                self.channel.send({"call": "close"}, deadline=Deadline(1.0, "close"))
            except (RemoteError, AttributeError):
                pass
            sock.close()
