"""`Accelerator`: the whole design, as a board or a simulator sees it."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vdla.config import HardwareConfig
from vdla.hw.axi import AxiLiteSignature, AxiSignature, ReadArbiter, connect_write_client
from vdla.hw.compute import ComputeModule, GemmArithmetic, native_gemm_ports
from vdla.hw.compute import gemm_arithmetic as gemm_arithmetic_of
from vdla.hw.control import ControlRegisters
from vdla.hw.dma import DRAM_ADDR_WIDTH
from vdla.hw.fetch import FetchModule
from vdla.hw.gemm_forms import native_gemm_memories
from vdla.hw.load import LoadModule
from vdla.hw.queues import CommandQueue, DepQueue
from vdla.hw.sram import Sram
from vdla.hw.store import StoreModule
from vdla.isa.registers import CONTROL_ADDR_WIDTH, STATE_BITS

__all__ = ["Accelerator", "AXI_ID_WIDTH", "READ_CLIENTS"]

#: Read clients of the DRAM master, by AXI ID.
READ_CLIENTS = ("fetch", "load", "compute")
AXI_ID_WIDTH = 2


class Accelerator(wiring.Component):
    """The VTA-style accelerator for one `HardwareConfig`.

    Fetch reads the instruction stream and routes each instruction into the load,
    compute or store command queue; the three modules run decoupled and synchronise only
    through the four dependency-token queues. The inp and wgt SRAMs sit between load and
    compute, the out SRAM between compute and store; the uop and acc SRAMs are inside
    compute. One AXI4 master serves every DRAM access (reads arbitrated with one ID per
    client; the store module is the only writer).

    Parameters
    ----------
    config : HardwareConfig
    gemm_arithmetic : GemmArithmetic or its value ("packed", "wide", "native")
        How the GEMM core's multipliers and adder trees are written (same results and
        cycles): PACKED for synthesis (the default), WIDE for a faster Verilator model,
        NATIVE for the fastest, whose products, and the wgt and inp SRAMs they read,
        the simulator holds (it adds the ports `native_gemm_ports` names).

    Ports
    -----
    s_axi_ctrl : In(AxiLiteSignature(addr_width=12))
        Control registers (`vdla.isa.registers` has the map).
    m_axi : Out(AxiSignature(addr_width=32, data_width=config.dram_bus_width, id_width=2))
        DRAM.
    irq : Out(1)
        High while a finished run's done flag is set (level interrupt for a host that
        does not poll).
    state : Out(32)
        The units' live state (`vdla.isa.registers.STATE_BITS`), also readable as the STATE
        register: for a logic analyser on a board, and for the simulator's watchdog and
        busy timeline. A board may leave it unconnected.
    """

    def __init__(self, config: HardwareConfig | None = None, *,
                 gemm_arithmetic: GemmArithmetic | str = GemmArithmetic.PACKED):
        config = HardwareConfig() if config is None else config
        if not isinstance(config, HardwareConfig):
            self._MustUse__silence = True  # a design that failed to construct is not "unused"
            raise TypeError(f"Accelerator needs a HardwareConfig, not {config!r}")
        try:
            self.gemm_arithmetic = gemm_arithmetic_of(gemm_arithmetic)
        except ValueError:
            self._MustUse__silence = True
            raise
        self.config = config
        members = {
            "s_axi_ctrl": In(AxiLiteSignature(addr_width=CONTROL_ADDR_WIDTH)),
            "m_axi": Out(AxiSignature(addr_width=DRAM_ADDR_WIDTH,
                                      data_width=config.dram_bus_width, id_width=AXI_ID_WIDTH)),
            "irq": Out(1),
            "state": Out(32),
        }
        if self.gemm_arithmetic is GemmArithmetic.NATIVE:   # the simulator's GEMM ports
            members.update({name: (In if name.endswith("sums") else Out)(width)
                            for name, width in native_gemm_ports(config).items()})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        m.submodules.control = control = ControlRegisters()
        m.submodules.fetch = fetch = FetchModule(cfg)
        m.submodules.load = load = LoadModule(cfg)
        m.submodules.compute = compute = ComputeModule(cfg, arithmetic=self.gemm_arithmetic)
        native = self.gemm_arithmetic is GemmArithmetic.NATIVE
        if native:
            m.d.comb += [self.native_gemm_read.eq(compute.native_gemm_read),
                         self.native_gemm_wgt_addr.eq(compute.wgt.addr),
                         compute.native_gemm_sums.eq(self.native_gemm_sums)]
            if cfg.dw_taps:
                m.d.comb += self.native_gemm_x.eq(compute.native_gemm_x)
            else:
                m.d.comb += self.native_gemm_inp_addr.eq(compute.inp.addr)
        m.submodules.store = store = StoreModule(cfg)
        m.submodules.arbiter = arbiter = ReadArbiter(
            n_clients=len(READ_CLIENTS), addr_width=DRAM_ADDR_WIDTH,
            data_width=cfg.dram_bus_width, id_width=AXI_ID_WIDTH)

        # The NATIVE form's simulator drives the bus inputs a cycle ahead (`_latched`).
        s_axi_ctrl = _latched(m, self.s_axi_ctrl, "s_axi_ctrl") if native else self.s_axi_ctrl
        m_axi = _latched(m, self.m_axi, "m_axi") if native else self.m_axi
        wiring.connect(m, wiring.flipped(s_axi_ctrl), control.bus)
        m.d.comb += [fetch.start.eq(control.start), fetch.insn_addr.eq(control.insn_addr),
                     fetch.insn_count.eq(control.insn_count), control.finish.eq(compute.finish)]
        m.d.comb += self.irq.eq(control.done)

        state = {}   # STATE_BITS name -> signal

        # Command queues between fetch and the modules.
        for name, module in (("load", load), ("compute", compute), ("store", store)):
            queue = CommandQueue(cfg.cmd_queue_depth)
            m.submodules[f"{name}_cmd_queue"] = queue
            cmd = getattr(fetch, f"{name}_cmd")
            wiring.connect(m, cmd, queue.w)
            wiring.connect(m, queue.r, module.insn)
            state[f"{name}_busy"] = module.busy
            state[f"{name}_pending"] = module.insn.valid
            state[f"wait_space_{name}_cmd"] = cmd.valid & ~cmd.ready
            m.d.comb += [
                getattr(control, f"event_{name}_insns").eq(module.insn.valid & module.insn.ready),
            ]
        m.d.comb += control.event_fetched_insns.eq(
            sum(getattr(fetch, f"{n}_cmd").valid & getattr(fetch, f"{n}_cmd").ready
                for n in ("load", "compute", "store")) != 0)
        state["fetch_busy"] = fetch.busy

        # Dependency-token queues: producer push port -> queue -> consumer pop port.
        for name, producer, consumer in (
                ("load_compute", load.push_next, compute.pop_prev),
                ("compute_load", compute.push_prev, load.pop_next),
                ("compute_store", compute.push_next, store.pop_prev),
                ("store_compute", store.push_prev, compute.pop_next)):
            queue = DepQueue(cfg.token_queue_depth)
            m.submodules[f"{name}_tokens"] = queue
            wiring.connect(m, producer, queue.push)
            wiring.connect(m, queue.pop, consumer)
            # A producer offers a token only while it pushes, so an offer not taken is a
            # wait for room.
            state[f"wait_space_{name}"] = producer.valid & ~producer.ready
            state[f"tokens_{name}"] = queue.pop.valid
        state["wait_token_compute_load"] = load.wait_pop_next
        state["wait_token_load_compute"] = compute.wait_pop_prev
        state["wait_token_store_compute"] = compute.wait_pop_next
        state["wait_token_compute_store"] = store.wait_pop_prev
        assert state.keys() == STATE_BITS.keys(), state.keys() ^ STATE_BITS.keys()
        bits = [Const(0, 1)] * len(self.state)   # one assignment, not one per bit
        for name, (bit, _) in STATE_BITS.items():
            bits[bit] = state[name]
        m.d.comb += self.state.eq(Cat(*bits))
        m.d.comb += control.state.eq(self.state)

        # SRAMs shared between modules. The NATIVE form leaves inp and wgt, or some of
        # them, to the harness (`native_gemm_memories`): their write ports go out of the
        # top, and they have no read ports here.
        harness_held = native_gemm_memories(cfg) if native else {}
        for name, write, read in (("inp", load.inp, compute.inp), ("wgt", load.wgt, compute.wgt)):
            if name in harness_held:
                m.d.comb += [
                    getattr(self, f"native_{name}_write_addr").eq(write.addr),
                    getattr(self, f"native_{name}_write_en").eq(write.en),
                    getattr(self, f"native_{name}_write_word").eq(write.data),
                ]
                continue
            sram = Sram(name, depth=write.signature.depth,
                        elem_bits=write.signature.elem_bits, lanes=write.signature.lanes)
            sram.elaborate(m, write)
            sram.connect_read(m, read)
        out = Sram("out", depth=cfg.out_depth, elem_bits=cfg.out_elem_bytes * 8)
        out.elaborate(m, compute.out)
        out.connect_read(m, store.out)

        # DRAM: reads arbitrated by ID, writes from the store module only.
        for client, module in zip(arbiter.clients, (fetch, load, compute)):
            wiring.connect(m, module.read, client)
        axi = m_axi
        arb = arbiter.axi
        for name in ("arid", "araddr", "arlen", "arsize", "arburst", "arvalid", "rready"):
            m.d.comb += getattr(axi, name).eq(getattr(arb, name))
        for name in ("arready", "rid", "rdata", "rresp", "rlast", "rvalid"):
            m.d.comb += getattr(arb, name).eq(getattr(axi, name))
        connect_write_client(m, store.write, axi)

        # Performance counters.
        bus_bytes = cfg.dram_bus_width // 8
        m.d.comb += [
            control.event_fetch_busy.eq(fetch.busy),
            control.event_load_busy.eq(load.busy),
            control.event_compute_busy.eq(compute.busy),
            control.event_store_busy.eq(store.busy),
            control.event_gemm_active.eq(compute.gemm_active),
            control.event_alu_active.eq(compute.alu_active),
            control.event_stall_load_compute.eq(compute.wait_pop_prev),
            control.event_stall_compute_load.eq(load.wait_pop_next),
            control.event_stall_compute_store.eq(store.wait_pop_prev),
            control.event_stall_store_compute.eq(compute.wait_pop_next),
            control.bytes_read.eq((axi.rvalid & axi.rready) * bus_bytes),
            control.bytes_written.eq((axi.wvalid & axi.wready) * bus_bytes),
        ]
        return m


def _latched(m: Module, port, name: str):
    """A stand-in for interface `port` of the top whose inputs reach the design through a
    register, for the NATIVE form's simulator, which drives each input a cycle ahead:
    the value for cycle t + 1 before the edge that ends cycle t. The design sees every
    input in the same cycle as it would without the registers, and no logic depends on
    a top-level input any more, only on registers. Verilator evaluates logic that
    depends on inputs twice a cycle: before the edge, for the inputs the harness has
    just set, and again after it, since the registers it also reads have changed. Here
    everything is evaluated once, after the edge (`vdla.sim.verilator`'s harness then
    never runs the input region). The registers have no reset, so their D inputs are
    the ports themselves."""
    inner = port.signature.create(path=(f"{name}_latched",))
    for path, member, value in port.signature.flatten(port):
        inner_value = inner
        for step in path:
            inner_value = getattr(inner_value, step)
        if member.flow == In:
            held = Signal.like(value, reset_less=True, name=f"{'__'.join(map(str, path))}_q")
            m.d.sync += held.eq(value)
            m.d.comb += inner_value.eq(held)
        else:
            m.d.comb += value.eq(inner_value)
    return inner
