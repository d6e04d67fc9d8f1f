"""`ComputeModule` between cocotb and bus models, with the SRAMs the top would give it.

The inp and wgt SRAMs are written through testbench back doors (the load module's job in
the accelerator); the out SRAM and, through the module's probe port, the acc SRAM are
read back through testbench read ports.

The inp, wgt and out SRAMs here hold only `TB_ROWS` elements: the testbench keeps its
indices below that, and full-size memories would only slow the build (converting the
zero initial contents of a 256 KiB wgt SRAM alone takes seconds). `index_overflow` flags
any index the module presents at or above `TB_ROWS`, so an index with wrong high bits
cannot alias a valid row unnoticed. The acc and uop SRAMs are the module's own, full size.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw_harnesses import axi_read_master, axi_signature, sram_probe
from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.queues import TokenSignature
from vdla.hw.sram import Sram

#: Rows of the harness's inp, wgt and out SRAMs (indices the testbench may use).
TB_ROWS = 64


class ComputeHarness(wiring.Component):
    """`ComputeModule(probes=True)` with inp/wgt/out SRAMs, an AXI master and probes.

    Ports
    -----
    insn, pop_prev, pop_next : In; push_prev, push_next : Out
        The module's command queue head and token queues.
    axi : Out(AxiSignature), prefix ``axi_`` in the Verilog (for cocotbext-axi's AxiRam).
    inp_waddr, inp_wdata, inp_wen / wgt_waddr, wgt_wdata, wgt_wen : In
        Back-door write ports of the inp and wgt SRAMs (one element per cycle).
    acc_addr : In, acc_data : Out; out_addr : In, out_data : Out
        Read ports into the acc and out SRAMs (data one cycle after the address).
    index_overflow : Out(1)
        Sticky: the module addressed inp or wgt, or wrote out, at or above `TB_ROWS`.
    finish, busy, gemm_active, alu_active, wait_pop_prev, wait_pop_next : Out(1)
    """

    def __init__(self, cfg: HardwareConfig, arithmetic="packed"):
        from vdla.hw.compute import ComputeModule
        self.cfg = cfg
        self.compute = ComputeModule(cfg, probes=True, arithmetic=arithmetic)
        super().__init__({
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_prev": In(TokenSignature()), "push_prev": Out(TokenSignature()),
            "pop_next": In(TokenSignature()), "push_next": Out(TokenSignature()),
            "axi": Out(axi_signature(cfg)),
            "inp_waddr": In(range(TB_ROWS)), "inp_wdata": In(cfg.inp_elem_bytes * 8),
            "inp_wen": In(1),
            "wgt_waddr": In(range(TB_ROWS)), "wgt_wdata": In(cfg.wgt_elem_bytes * 8),
            "wgt_wen": In(1),
            "acc_addr": In(range(cfg.acc_depth)), "acc_data": Out(cfg.acc_elem_bytes * 8),
            "out_addr": In(range(TB_ROWS)), "out_data": Out(cfg.out_elem_bytes * 8),
            "index_overflow": Out(1),
            "finish": Out(1), "busy": Out(1), "gemm_active": Out(1), "alu_active": Out(1),
            "wait_pop_prev": Out(1), "wait_pop_next": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.compute = compute = self.compute
        axi_read_master(m, compute.read, self.axi, cfg)
        wiring.connect(m, wiring.flipped(self.insn), compute.insn)
        for name in ("pop_prev", "pop_next"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(compute, name))
        for name in ("push_prev", "push_next"):
            wiring.connect(m, getattr(compute, name), wiring.flipped(getattr(self, name)))
        for name in ("finish", "busy", "gemm_active", "alu_active", "wait_pop_prev",
                     "wait_pop_next"):
            m.d.comb += getattr(self, name).eq(getattr(compute, name))
        m.d.comb += [compute.acc_probe_addr.eq(self.acc_addr),
                     self.acc_data.eq(compute.acc_probe_data)]

        # Full-width indices from the module; the memories take their low bits.
        for name, elem_bytes in (("inp", cfg.inp_elem_bytes), ("wgt", cfg.wgt_elem_bytes)):
            sram = Sram(name, depth=TB_ROWS, elem_bits=elem_bytes * 8)
            sram.elaborate(m, SimpleNamespace(addr=getattr(self, f"{name}_waddr"),
                                              data=getattr(self, f"{name}_wdata"),
                                              en=getattr(self, f"{name}_wen")))
            sram.connect_read(m, getattr(compute, name))
        out = Sram("out", depth=TB_ROWS, elem_bits=cfg.out_elem_bytes * 8)
        out.elaborate(m, compute.out)
        sram_probe(m, out, self.out_addr, self.out_data)

        overflow = Signal()
        with m.If((compute.inp.addr >= TB_ROWS) | (compute.wgt.addr >= TB_ROWS)
                  | (compute.out.en.any() & (compute.out.addr >= TB_ROWS))):
            m.d.sync += overflow.eq(1)
        m.d.comb += self.index_overflow.eq(overflow)
        return m
