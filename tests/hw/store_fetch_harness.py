"""Amaranth wrappers that put the store module, the fetch module and the queues between
cocotb and real bus models (cocotbext-axi's `AxiRam` on the ``axi`` master port)."""

from __future__ import annotations

import types

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw_harnesses import axi_read_master, axi_signature
from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.axi import connect_write_client
from vdla.hw.dma import DRAM_ADDR_WIDTH
from vdla.hw.queues import CommandQueue, DepQueue, TokenSignature
from vdla.hw.sram import Sram


class StoreHarness(wiring.Component):
    """`StoreModule` with the out SRAM, a testbench write port into it (``out_waddr``,
    ``out_wdata``, ``out_wen``) and an AXI master whose read channels are idle."""

    def __init__(self, cfg: HardwareConfig):
        from vdla.hw.store import StoreModule
        self.cfg = cfg
        self.store = StoreModule(cfg)
        super().__init__({
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_prev": In(TokenSignature()),
            "push_prev": Out(TokenSignature()),
            "axi": Out(axi_signature(cfg)),
            "busy": Out(1),
            "wait_pop_prev": Out(1),
            "out_waddr": In(range(cfg.out_depth)),
            "out_wdata": In(cfg.out_elem_bytes * 8),
            "out_wen": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.store = store = self.store
        wiring.connect(m, wiring.flipped(self.insn), store.insn)
        wiring.connect(m, wiring.flipped(self.pop_prev), store.pop_prev)
        wiring.connect(m, store.push_prev, wiring.flipped(self.push_prev))
        m.d.comb += [self.busy.eq(store.busy), self.wait_pop_prev.eq(store.wait_pop_prev)]
        connect_write_client(m, store.write, self.axi)
        out = Sram("out", depth=cfg.out_depth, elem_bits=cfg.out_elem_bytes * 8)
        out.elaborate(m, types.SimpleNamespace(addr=self.out_waddr, data=self.out_wdata,
                                               en=self.out_wen))
        out.connect_read(m, store.out)
        return m


class FetchHarness(wiring.Component):
    """`FetchModule` behind a one-client `ReadArbiter`, with the three command streams
    as top-level ports (the testbench drives their ``ready``)."""

    def __init__(self, cfg: HardwareConfig):
        from vdla.hw.fetch import FetchModule
        self.cfg = cfg
        self.fetch = FetchModule(cfg)
        super().__init__({
            "start": In(1),
            "insn_addr": In(DRAM_ADDR_WIDTH),
            "insn_count": In(32),
            "busy": Out(1),
            "axi": Out(axi_signature(cfg)),
            "load_cmd": Out(stream.Signature(INSN_BITS)),
            "compute_cmd": Out(stream.Signature(INSN_BITS)),
            "store_cmd": Out(stream.Signature(INSN_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.fetch = fetch = self.fetch
        axi_read_master(m, fetch.read, self.axi, cfg)
        m.d.comb += [fetch.start.eq(self.start), fetch.insn_addr.eq(self.insn_addr),
                     fetch.insn_count.eq(self.insn_count), self.busy.eq(fetch.busy)]
        for name in ("load_cmd", "compute_cmd", "store_cmd"):
            wiring.connect(m, getattr(fetch, name), wiring.flipped(getattr(self, name)))
        return m


class QueueHarness(wiring.Component):
    """Two `DepQueue`s (``small``: `small_depth` tokens, ``big``: `big_depth`) and a
    `CommandQueue` (``cmd``: `cmd_depth` instructions), each with its ports on top."""

    def __init__(self, *, small_depth: int, big_depth: int, cmd_depth: int):
        self.depths = dict(small=small_depth, big=big_depth)
        self.cmd_depth = cmd_depth
        members = {}
        for name, depth in self.depths.items():
            members.update({f"{name}_push": In(TokenSignature()),
                            f"{name}_pop": Out(TokenSignature()),
                            f"{name}_level": Out(range(depth + 1))})
        members.update({"cmd_w": In(stream.Signature(INSN_BITS)),
                        "cmd_r": Out(stream.Signature(INSN_BITS)),
                        "cmd_level": Out(range(cmd_depth + 1))})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for name, depth in self.depths.items():
            m.submodules[name] = queue = DepQueue(depth)
            wiring.connect(m, wiring.flipped(getattr(self, f"{name}_push")), queue.push)
            wiring.connect(m, queue.pop, wiring.flipped(getattr(self, f"{name}_pop")))
            m.d.comb += getattr(self, f"{name}_level").eq(queue.level)
        m.submodules.cmd = cmd = CommandQueue(self.cmd_depth)
        wiring.connect(m, wiring.flipped(self.cmd_w), cmd.w)
        wiring.connect(m, cmd.r, wiring.flipped(self.cmd_r))
        m.d.comb += self.cmd_level.eq(cmd.level)
        return m
