"""Small Amaranth wrappers that put one module between cocotb and real bus models.

Each wrapper exposes the module's queues and token ports as top-level streams, joins its
DRAM client to an AXI4 master (for cocotbext-axi's `AxiRam`), and gives the testbench a
read port into every SRAM the module writes, so results are checked in the SRAMs
themselves rather than through the module's own outputs.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.axi import AxiSignature, ReadArbiter
from vdla.hw.dma import DRAM_ADDR_WIDTH
from vdla.hw.queues import TokenSignature
from vdla.hw.sram import Sram
from vdla.hw.top import AXI_ID_WIDTH



def axi_signature(cfg: HardwareConfig) -> AxiSignature:
    return AxiSignature(addr_width=DRAM_ADDR_WIDTH, data_width=cfg.dram_bus_width,
                        id_width=AXI_ID_WIDTH)


def axi_read_master(m: Module, client, axi, cfg: HardwareConfig):
    """Serve one module's read client through a one-client `ReadArbiter` on `axi` (the
    harness's own AXI master port)."""
    m.submodules.arbiter = arbiter = ReadArbiter(
        n_clients=1, addr_width=DRAM_ADDR_WIDTH, data_width=cfg.dram_bus_width,
        id_width=AXI_ID_WIDTH)
    wiring.connect(m, client, arbiter.client0)
    wiring.connect(m, arbiter.axi, wiring.flipped(axi))


def sram_probe(m: Module, sram: Sram, addr, data):
    """Connect a testbench read port (`addr` in, `data` out one cycle later)."""
    port = sram.read_port()
    m.d.comb += [port.addr.eq(addr), data.eq(port.data)]


class LoadHarness(wiring.Component):
    """`LoadModule` with its inp and wgt SRAMs, an AXI master and SRAM probes."""

    def __init__(self, cfg: HardwareConfig):
        from vdla.hw.load import LoadModule
        self.cfg = cfg
        self.load = LoadModule(cfg)
        super().__init__({
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_next": In(TokenSignature()),
            "push_next": Out(TokenSignature()),
            "axi": Out(axi_signature(cfg)),
            "busy": Out(1),
            "inp_addr": In(range(cfg.inp_depth)), "inp_data": Out(cfg.inp_elem_bytes * 8),
            "wgt_addr": In(range(cfg.wgt_depth)), "wgt_data": Out(cfg.wgt_elem_bytes * 8),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.load = load = self.load
        axi_read_master(m, load.read, self.axi, cfg)
        wiring.connect(m, wiring.flipped(self.insn), load.insn)
        wiring.connect(m, wiring.flipped(self.pop_next), load.pop_next)
        wiring.connect(m, load.push_next, wiring.flipped(self.push_next))
        m.d.comb += self.busy.eq(load.busy)
        inp = Sram("inp", depth=cfg.inp_depth, elem_bits=cfg.inp_elem_bytes * 8,
                   lanes=load.inp.signature.lanes)
        wgt = Sram("wgt", depth=cfg.wgt_depth, elem_bits=cfg.wgt_elem_bytes * 8,
                   lanes=load.wgt.signature.lanes)
        inp.elaborate(m, load.inp)
        wgt.elaborate(m, load.wgt)
        sram_probe(m, inp, self.inp_addr, self.inp_data)
        sram_probe(m, wgt, self.wgt_addr, self.wgt_data)
        return m


#: The configs the hardware is tested and linted with (the default and at least
#: batch 2, block 8, block 32, small buffers, and MUL on/off).
HW_CONFIGS = {
    "default": HardwareConfig(),
    "batch2": HardwareConfig(batch=2),
    "block8": HardwareConfig(block_in=8, block_out=8, inp_buff_size=8 * 1024,
                             wgt_buff_size=32 * 1024, acc_buff_size=32 * 1024),
    "block32": HardwareConfig(block_in=32, block_out=32),
    "small": HardwareConfig(uop_buff_size=4 * 1024, inp_buff_size=4 * 1024,
                            wgt_buff_size=16 * 1024, acc_buff_size=8 * 1024,
                            cmd_queue_depth=8, token_queue_depth=4),
    "mul-bus128": HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"},
                                 dram_bus_width=128),
    # The extensions past VTA (the ALU's REQ, lookup table TAB and DIV, alu_hold).
    "extended": HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ", "TAB", "DIV"},
                               alu_hold=True),
    # ... with the pipelined divider.
    "extended-divp": HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ", "TAB", "DIV"},
                                    alu_hold=True, div_pipeline=True),
    # The depthwise window: two inp rows a column (r = 2) and plain columns past 2T; one
    # row a column (r = 1) with every column in the window (T = block_in / 2).
    "dw3": HardwareConfig(block_in=8, block_out=16, dw_taps=3, inp_buff_size=8 * 1024,
                          wgt_buff_size=32 * 1024, acc_buff_size=32 * 1024),
    "dw4-r1": HardwareConfig(block_in=8, block_out=8, dw_taps=4, inp_buff_size=8 * 1024,
                             wgt_buff_size=32 * 1024, acc_buff_size=32 * 1024),
}


#: Bus widths beside the 64 and 128 bits above, for the modules that adapt to the bus:
#: narrower than an instruction (32), several out elements per beat (256 with 8-byte
#: elements), and the widest allowed (1024).
BUS_CONFIGS = {
    "bus32": HardwareConfig(dram_bus_width=32),
    "block8-bus256": HW_CONFIGS["block8"].replace(dram_bus_width=256),
    "bus1024": HardwareConfig(block_in=4, block_out=4, uop_buff_size=4096, inp_buff_size=4096,
                              wgt_buff_size=4096, acc_buff_size=4096, dram_bus_width=1024),
}
