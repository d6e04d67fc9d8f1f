"""The load module: LOADs of INP and WGT from DRAM into their SRAMs."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.axi import ReadClientSignature, connect_read_client
from vdla.hw.dma import DRAM_ADDR_WIDTH, LoadDma
from vdla.hw.layouts import dma_command
from vdla.hw.layouts import MemoryType, insn_layout
from vdla.hw.queues import TokenSignature
from vdla.hw.sequencer import InsnSequencer

__all__ = ["LoadModule"]


class LoadModule(wiring.Component):
    """Executes the load command queue: 2-D LOADs of INP and WGT with zero padding.

    Parameters
    ----------
    config : HardwareConfig

    Ports
    -----
    insn : In(stream.Signature(128))
        The load command queue's head.
    pop_next : In(TokenSignature())
        Tokens from the compute module (compute->load: the SRAM region may be overwritten).
    push_next : Out(TokenSignature())
        Tokens to the compute module (load->compute: the data is in the SRAM).
    read : Out(ReadClientSignature)
        DRAM reads.
    inp, wgt : Out(SramWriteSignature)
        Write ports of the inp and wgt SRAMs (the wgt port writes one bus word per lane).
    busy : Out(1)
        An instruction is executing or pushing its tokens.
    wait_pop_next : Out(1)
        The head instruction waits for a compute->load token.
    """

    def __init__(self, config: HardwareConfig):
        self.config = config
        bus = dict(addr_width=DRAM_ADDR_WIDTH, data_width=config.dram_bus_width)
        self._dma = {
            MemoryType.INP: LoadDma(config, elem_bytes=config.inp_elem_bytes, depth=config.inp_depth),
            MemoryType.WGT: LoadDma(config, elem_bytes=config.wgt_elem_bytes, depth=config.wgt_depth),
        }
        super().__init__({
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_next": In(TokenSignature()),
            "push_next": Out(TokenSignature()),
            "read": Out(ReadClientSignature(**bus)),
            "inp": Out(self._dma[MemoryType.INP].sram.signature),
            "wgt": Out(self._dma[MemoryType.WGT].sram.signature),
            "busy": Out(1),
            "wait_pop_next": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        seq = InsnSequencer(cfg, self.insn, pops={"pop_next": self.pop_next},
                            pushes={"push_next": self.push_next}, name="load")
        seq.elaborate(m)
        m.d.comb += [self.busy.eq(seq.busy), self.wait_pop_next.eq(seq.waiting["pop_next"])]

        insn = data.View(insn_layout(cfg, "LOAD"), self.insn.payload)
        targets = {MemoryType.INP: self.inp, MemoryType.WGT: self.wgt}
        for mem, dma in self._dma.items():
            m.submodules[f"dma_{mem.name.lower()}"] = dma
            selected = insn.memory_type == mem
            m.d.comb += dma.cmd.payload.eq(dma_command(insn))
            m.d.comb += dma.cmd.valid.eq(seq.first & selected)
            wiring.connect(m, dma.sram, wiring.flipped(targets[mem]))
            with m.If(seq.executing & selected & dma.done):
                m.d.comb += seq.done.eq(1)

        # One DMA is active at a time: the read port follows the instruction's memory type.
        inp_dma, wgt_dma = self._dma[MemoryType.INP], self._dma[MemoryType.WGT]
        use_wgt = insn.memory_type == MemoryType.WGT
        with m.If(use_wgt):
            connect_read_client(m, self.read, wgt_dma.read)
        with m.Else():
            connect_read_client(m, self.read, inp_dma.read)

        # Other memory types never reach this module (fetch routes them to compute);
        # should one arrive, it completes as a no-op rather than hanging the queue.
        with m.If(seq.executing & (insn.memory_type != MemoryType.INP)
                  & (insn.memory_type != MemoryType.WGT)):
            m.d.comb += seq.done.eq(1)
        return m

