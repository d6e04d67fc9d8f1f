"""AXI4 and AXI4-Lite bus signatures, and the accelerator's internal DRAM client ports.

The accelerator talks to DRAM through one AXI4 master. Inside, each module that moves
data owns a simpler *client* port: a read client asks for bursts (`ReadClientSignature`)
and receives the beats back in order; the store module's write client
(`WriteClientSignature`) sends bursts and their beats and counts the responses.
`ReadArbiter` multiplexes the read clients onto the master's read channels with one AXI
ID per client, so several bursts of several clients can be outstanding at once.

Signals keep AXI's names (``araddr``, ``rvalid``, ...) so that the flattened Verilog
ports read ``m_axi__araddr`` and bus models (cocotbext-axi) and vendor tools find them.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "AXI_BURST_INCR", "AXI_MAX_BURST", "AXI_4K",
    "AxiSignature", "AxiLiteSignature",
    "ReadRequest", "ReadBeat", "WriteRequest", "WriteBeat",
    "ReadClientSignature", "WriteClientSignature", "ReadArbiter",
    "connect_read_client", "connect_write_client",
]

AXI_BURST_INCR = 0b01
AXI_MAX_BURST = 256  # beats of one AXI4 INCR burst
AXI_4K = 4096        # a burst must not cross a 4 KiB boundary


def _check_width(what: str, value, low: int, high: int, pow2: bool = False):
    if (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
            or (pow2 and value & (value - 1))):
        kind = "a power of two" if pow2 else "an integer"
        raise TypeError(f"{what} must be {kind} from {low} to {high}, not {value!r}")


class AxiSignature(wiring.Signature):
    """AXI4 (full) bus, seen from the master.

    Parameters
    ----------
    addr_width : int
        Byte-address width (12 to 64).
    data_width : int
        Data bus width in bits (32 to 1024, power of two).
    id_width : int
        Transaction ID width (1 to 16).

    Members (``Out`` = driven by the master)
    ----------------------------------------
    aw{id,addr,len,size,burst,valid} : Out, awready : In
    w{data,strb,last,valid} : Out, wready : In
    b{id,resp,valid} : In, bready : Out
    ar{id,addr,len,size,burst,valid} : Out, arready : In
    r{id,data,resp,last,valid} : In, rready : Out
    """

    def __init__(self, *, addr_width: int, data_width: int, id_width: int):
        _check_width("AXI address width", addr_width, 12, 64)
        _check_width("AXI data width", data_width, 32, 1024, pow2=True)
        _check_width("AXI ID width", id_width, 1, 16)
        self._addr_width, self._data_width, self._id_width = addr_width, data_width, id_width
        members = {}
        for ch in ("aw", "ar"):
            members.update({
                f"{ch}id": Out(id_width), f"{ch}addr": Out(addr_width), f"{ch}len": Out(8),
                f"{ch}size": Out(3), f"{ch}burst": Out(2), f"{ch}valid": Out(1),
                f"{ch}ready": In(1),
            })
        members.update({
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })
        super().__init__(members)

    addr_width = property(lambda self: self._addr_width)
    data_width = property(lambda self: self._data_width)
    id_width = property(lambda self: self._id_width)

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width and other.id_width == self.id_width)

    def __repr__(self):
        return (f"AxiSignature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite bus, seen from the master (the host); the accelerator flips it.

    Parameters
    ----------
    addr_width : int
        Byte-address width of the register window (4 to 32).
    data_width : int
        32 (AXI4-Lite allows 64; the register map is 32-bit).
    """

    def __init__(self, *, addr_width: int, data_width: int = 32):
        _check_width("AXI-Lite address width", addr_width, 4, 32)
        if data_width != 32:
            raise TypeError(f"AXI-Lite data width must be 32, not {data_width!r}")
        self._addr_width, self._data_width = addr_width, data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    data_width = property(lambda self: self._data_width)

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __repr__(self):
        return f"AxiLiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"


# --- internal client ports ------------------------------------------------------------------

def ReadRequest(addr_width: int) -> data.StructLayout:
    """One read burst: a bus-aligned byte address and ``beats - 1`` (AXI's len)."""
    return data.StructLayout({"addr": unsigned(addr_width), "len": unsigned(8)})


def ReadBeat(data_width: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(data_width), "last": unsigned(1)})


WriteRequest = ReadRequest


def WriteBeat(data_width: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(data_width), "strb": unsigned(data_width // 8),
                              "last": unsigned(1)})


class ReadClientSignature(wiring.Signature):
    """A module's read port to DRAM, seen from the module.

    Members
    -------
    req : Out(stream.Signature(ReadRequest))
        Burst requests; bursts must be legal AXI (at most 256 beats, inside one 4 KiB page).
    beat : In(stream.Signature(ReadBeat))
        The data of the requested bursts, in request order. A client should accept beats
        promptly: the read channel is shared and a stalled beat stalls every client.
    """

    def __init__(self, *, addr_width: int, data_width: int):
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "req": Out(stream.Signature(ReadRequest(addr_width))),
            "beat": In(stream.Signature(ReadBeat(data_width))),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)


class WriteClientSignature(wiring.Signature):
    """A module's write port to DRAM, seen from the module.

    Members
    -------
    req : Out(stream.Signature(WriteRequest))
        Burst requests (address and ``beats - 1``), legal AXI bursts.
    beat : Out(stream.Signature(WriteBeat))
        The beats of the requested bursts, in order; ``last`` ends each burst.
    resp : In(stream.Signature(2))
        One AXI write response (``bresp``) per burst; a burst is in DRAM once answered.
    """

    def __init__(self, *, addr_width: int, data_width: int):
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "req": Out(stream.Signature(WriteRequest(addr_width))),
            "beat": Out(stream.Signature(WriteBeat(data_width))),
            "resp": In(stream.Signature(2)),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)


def connect_read_client(m: Module, outer, inner):
    """Join read client `inner` (an engine's port) to `outer` (its module's port)."""
    m.d.comb += [outer.req.payload.eq(inner.req.payload), outer.req.valid.eq(inner.req.valid),
                 inner.req.ready.eq(outer.req.ready),
                 inner.beat.payload.eq(outer.beat.payload), inner.beat.valid.eq(outer.beat.valid),
                 outer.beat.ready.eq(inner.beat.ready)]


def connect_write_client(m: Module, client, axi, *, id_value: int = 0):
    """Drive the write channels of AXI master `axi` from write client `client`."""
    bus_bytes = len(axi.wdata) // 8
    m.d.comb += [
        axi.awid.eq(id_value), axi.awaddr.eq(client.req.payload.addr),
        axi.awlen.eq(client.req.payload.len), axi.awsize.eq(bus_bytes.bit_length() - 1),
        axi.awburst.eq(AXI_BURST_INCR), axi.awvalid.eq(client.req.valid),
        client.req.ready.eq(axi.awready),
        axi.wdata.eq(client.beat.payload.data), axi.wstrb.eq(client.beat.payload.strb),
        axi.wlast.eq(client.beat.payload.last), axi.wvalid.eq(client.beat.valid),
        client.beat.ready.eq(axi.wready),
        client.resp.payload.eq(axi.bresp), client.resp.valid.eq(axi.bvalid),
        axi.bready.eq(client.resp.ready),
    ]


class ReadArbiter(wiring.Component):
    """Shares the read channels of one AXI4 master among several read clients.

    Client ``i`` issues its bursts with ARID ``i``; round-robin arbitration picks the
    next request; returning beats are routed by RID. The slave may keep many bursts in
    flight and return different IDs out of order; each client sees its own in order.

    Parameters
    ----------
    n_clients : int
        Number of read clients (1 to 2**id_width).
    addr_width, data_width, id_width : int
        Of the AXI bus.

    Ports
    -----
    clients[i] : In(ReadClientSignature), one per client (the client is the initiator).
    axi : Out(AxiSignature); only its read channels are driven here (write channels are
        left for the write client).
    """

    def __init__(self, *, n_clients: int, addr_width: int, data_width: int, id_width: int):
        if not 1 <= n_clients <= 1 << id_width:
            raise TypeError(f"ReadArbiter needs 1 to {1 << id_width} clients with "
                            f"{id_width}-bit IDs, not {n_clients!r}")
        self.n_clients = n_clients
        self._bus = dict(addr_width=addr_width, data_width=data_width)
        members = {f"client{i}": In(ReadClientSignature(**self._bus)) for i in range(n_clients)}
        members["axi"] = Out(AxiSignature(addr_width=addr_width, data_width=data_width,
                                          id_width=id_width))
        super().__init__(members)

    @property
    def clients(self):
        return [getattr(self, f"client{i}") for i in range(self.n_clients)]

    def elaborate(self, platform):
        m = Module()
        axi, clients, n = self.axi, self.clients, self.n_clients
        bus_bytes = self._bus["data_width"] // 8

        # Round-robin: `last` is the client granted most recently; the search starts after it.
        # (At least one bit: a zero-width signal becomes a `[-1:0]` vector in Verilog.)
        width = range(max(n, 2))
        last = Signal(width, init=n - 1)
        choice = Signal(width)
        any_valid = Signal()
        # AXI wants ARVALID's payload stable until ARREADY: hold a grant that is waiting.
        held = Signal()
        held_grant = Signal(width)
        grant = Signal(width)
        for offset in reversed(range(1, n + 1)):
            # Later assignments win, so iterate from farthest to nearest candidate.
            idx = Signal(width, name=f"rr_candidate{offset}")
            m.d.comb += idx.eq(Mux(last + offset >= n, last + offset - n, last + offset))
            with m.Switch(idx):
                for i, client in enumerate(clients):
                    with m.Case(i):
                        with m.If(client.req.valid):
                            m.d.comb += [choice.eq(i), any_valid.eq(1)]

        with m.Switch(grant):
            for i, client in enumerate(clients):
                with m.Case(i):
                    m.d.comb += [
                        axi.araddr.eq(client.req.payload.addr),
                        axi.arlen.eq(client.req.payload.len),
                        client.req.ready.eq(axi.arready),
                    ]
        m.d.comb += [
            axi.arid.eq(grant), axi.arvalid.eq(held | any_valid),
            axi.arsize.eq(bus_bytes.bit_length() - 1), axi.arburst.eq(AXI_BURST_INCR),
        ]
        m.d.comb += grant.eq(Mux(held, held_grant, choice))
        m.d.sync += [held.eq(axi.arvalid & ~axi.arready), held_grant.eq(grant)]
        with m.If(axi.arvalid & axi.arready):
            m.d.sync += last.eq(grant)

        for i, client in enumerate(clients):
            m.d.comb += [
                client.beat.payload.data.eq(axi.rdata),
                client.beat.payload.last.eq(axi.rlast),
                client.beat.valid.eq(axi.rvalid & (axi.rid == i)),
            ]
        with m.Switch(axi.rid):
            for i, client in enumerate(clients):
                with m.Case(i):
                    m.d.comb += axi.rready.eq(client.beat.ready)
        return m
