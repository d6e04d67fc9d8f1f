"""The compute module: LOADs of UOP, ACC (and TAB), GEMM, ALU and FINISH.

Instructions run one after another (`InsnSequencer`: pop, execute, push). A LOAD of UOP
or ACC goes to one of two `LoadDma` engines (a LOAD of TAB to a third, on a config with
the ALU's table, `vdla.hw.table`); GEMM and ALU go to the *micro-op engine*,
which walks the loop nest ``for o < iter_out: for i < iter_in: for u in uop_bgn..uop_end-1``
and issues one micro-op per cycle into a pipeline shared by the GEMM core and the ALU:

====  ==========  ==================================================================
cyc   stage       work
====  ==========  ==================================================================
0     fetch       uop SRAM read at ``u``; the loop offsets travel alongside
1     index       dst/src/wgt = micro-op field + o·factor_out + i·factor_in
2     operand     inp SRAM read at src, wgt SRAM read at wgt
3     multiply    batch × block_out × block_in int8 products (two per multiplier);
                  a vector ALU micro-op reads acc[src] here
4     reduce      adder trees over block_in; acc SRAM read at dst
5     write       acc[dst] = acc[dst] + sum (GEMM) or op(acc[dst], imm | acc[src]) (ALU;
                  TAB reads each lane's table here); out[dst] = the low 8 bits; zeros
                  for reset_reg
====  ==========  ==================================================================

A dw GEMM's micro-op (`HardwareConfig.dw_taps`) is several *beats*, one inp row read
each; only its last goes past the multiply stage (`vdla.hw.dw_window`).

The uop and acc SRAMs (and the ALU's table) live here; inp, wgt (read) and out (written)
live in the top.

The acc SRAM has ONE read port. A second one would make synthesis duplicate the whole
acc buffer (another 128 KiB, about 30 BRAM36 for the default config), and the default
design would no longer fit the xc7z020's 140 BRAM36. GEMM and ALU with an immediate read
only acc[dst] and issue one micro-op per cycle; an ALU micro-op with a vector operand
reads acc[src] too, so the engine issues those every second cycle and the src read takes
the port in the free cycle before the dst read. (Compilers use vector ALU ops for
residual adds and the like, a small share of the work.)
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from vdla.config import INSN_BITS, TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.hw.axi import ReadClientSignature, connect_read_client
from vdla.hw.divider_pipeline import dividers, uop_lookahead
from vdla.hw.dma import DRAM_ADDR_WIDTH, LoadDma, SramReadSignature, SramWriteSignature
from vdla.hw.dw_window import DwBeats, DwWindow
from vdla.hw.gemm_forms import (PACK_SHIFT, GemmArithmetic, adder_tree, gemm_arithmetic,
                                lut_product, native_gemm_ports, packed_products, registered,
                                unpack_products, widened)
from vdla.hw.layouts import MemoryType, Opcode, dma_command, insn_layout, uop_view_layout
from vdla.hw.queues import TokenSignature
from vdla.hw.sequencer import InsnSequencer
from vdla.hw.sram import Sram
from vdla.hw.table import LaneTables

__all__ = ["ComputeModule", "GemmArithmetic", "PACK_SHIFT", "gemm_arithmetic", "lut_product",
           "native_gemm_ports", "packed_products", "unpack_products"]


class ComputeModule(wiring.Component):
    """Executes the compute command queue: LOAD UOP/ACC/TAB, GEMM, ALU and FINISH.

    Parameters
    ----------
    config : HardwareConfig
    probes : bool
        Add a read port into the acc SRAM for testbenches (``acc_probe_addr``,
        ``acc_probe_data``); off in the accelerator.

    Ports
    -----
    insn : In(stream.Signature(128))
        The compute command queue's head; retired after the instruction's token pushes.
    pop_prev : In(TokenSignature())
        Tokens from the load module (load->compute: inp/wgt data is in its SRAM).
    push_prev : Out(TokenSignature())
        Tokens to the load module (compute->load: inp/wgt space may be reused).
    pop_next : In(TokenSignature())
        Tokens from the store module (store->compute: out space may be reused).
    push_next : Out(TokenSignature())
        Tokens to the store module (compute->store: the out data is written).
    read : Out(ReadClientSignature)
        DRAM reads of LOAD UOP and LOAD ACC (and LOAD TAB, with TAB in ``alu_ops``).
    inp : Out(SramReadSignature(inp_depth, inp_elem_bytes * 8))
        Read port of the inp SRAM (a batch × block_in int8 tile per element).
    wgt : Out(SramReadSignature(wgt_depth, wgt_elem_bytes * 8))
        Read port of the wgt SRAM (a block_out × block_in int8 tile per element).
    out : Out(SramWriteSignature(out_depth, out_elem_bytes * 8))
        Write port of the out SRAM: every GEMM/ALU result narrowed to 8 bits per lane.
    finish : Out(1)
        Pulses in the cycle a FINISH retires (after its token pushes).
    busy : Out(1)
        An instruction is executing or pushing its tokens.
    gemm_active, alu_active : Out(1)
        A GEMM (ALU) micro-op that is not a reset entered the pipeline this cycle; a dw
        micro-op counts once, at its last beat (micro-ops, as `vdla.sim.counters` counts).
    wait_pop_prev, wait_pop_next : Out(1)
        The head instruction waits for a token on that queue.
    acc_probe_addr : In(range(acc_depth)), acc_probe_data : Out(acc_elem_bytes * 8)
        Only with ``probes``: a synchronous read port into the acc SRAM.
    native_gemm_read : Out(1), native_gemm_x : Out, native_gemm_sums : In
        Only in the NATIVE form (`native_gemm_ports`; ``native_gemm_x`` with a dw
        window only). The form reads neither ``wgt.data`` nor, without a dw window,
        ``inp.data``: the harness reads those rows at ``wgt.addr`` and ``inp.addr``.
    """

    def __init__(self, config: HardwareConfig, *, probes: bool = False,
                 arithmetic: GemmArithmetic | str = GemmArithmetic.PACKED):
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"ComputeModule needs a HardwareConfig, not {config!r}")
        self.config = config
        self.arithmetic = gemm_arithmetic(arithmetic)
        self.probes = bool(probes)
        cfg = config
        self._dma = {
            MemoryType.UOP: LoadDma(cfg, elem_bytes=cfg.uop_bytes, depth=cfg.uop_depth),
            MemoryType.ACC: LoadDma(cfg, elem_bytes=cfg.acc_elem_bytes, depth=cfg.acc_depth),
        }
        if AluOp.TAB in cfg.alu_ops:   # the ALU's table: 32-bit entries, one a cycle
            self._dma[MemoryType.TAB] = LoadDma(cfg, elem_bytes=4, depth=TABLE_ENTRIES)
        members = {
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_prev": In(TokenSignature()),
            "push_prev": Out(TokenSignature()),
            "pop_next": In(TokenSignature()),
            "push_next": Out(TokenSignature()),
            "read": Out(ReadClientSignature(addr_width=DRAM_ADDR_WIDTH,
                                            data_width=cfg.dram_bus_width)),
            "inp": Out(SramReadSignature(depth=cfg.inp_depth, elem_bits=cfg.inp_elem_bytes * 8)),
            "wgt": Out(SramReadSignature(depth=cfg.wgt_depth, elem_bits=cfg.wgt_elem_bytes * 8)),
            "out": Out(SramWriteSignature(depth=cfg.out_depth, elem_bits=cfg.out_elem_bytes * 8)),
            "finish": Out(1),
            "busy": Out(1),
            "gemm_active": Out(1),
            "alu_active": Out(1),
            "wait_pop_prev": Out(1),
            "wait_pop_next": Out(1),
        }
        if self.probes:
            members["acc_probe_addr"] = In(range(cfg.acc_depth))
            members["acc_probe_data"] = Out(cfg.acc_elem_bytes * 8)
        if self.arithmetic is GemmArithmetic.NATIVE:
            # The top puts the inp and wgt read addresses on its own ports.
            widths = native_gemm_ports(cfg)
            members.update({name: (In if name == "native_gemm_sums" else Out)(width)
                            for name, width in widths.items() if not name.endswith("_addr")})
        super().__init__(members)

    def _native_products(self, m: Module, lane_input, read, per_lane: bool):
        """The NATIVE form: the harness reads the operand stage's rows when `read` (see
        `GemmArithmetic`) and gives back every lane's sum of products. With a dw window
        (`per_lane`) the x operand is every lane's own inputs, lane by lane, out of the
        reduce stage."""
        cfg = self.config
        m.d.comb += self.native_gemm_read.eq(read)
        if per_lane:
            m.d.comb += self.native_gemm_x.eq(
                Cat(*(lane_input(b, n, k).as_unsigned() for b in range(cfg.batch)
                      for n in range(cfg.block_out) for k in range(cfg.block_in))))
        return self.native_gemm_sums

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        seq = InsnSequencer(cfg, self.insn,
                            pops={"pop_prev": self.pop_prev, "pop_next": self.pop_next},
                            pushes={"push_prev": self.push_prev, "push_next": self.push_next},
                            name="compute")
        seq.elaborate(m)
        m.d.comb += [self.busy.eq(seq.busy),
                     self.wait_pop_prev.eq(seq.waiting["pop_prev"]),
                     self.wait_pop_next.eq(seq.waiting["pop_next"])]
        opcode = seq.header.opcode
        load = data.View(insn_layout(cfg, "LOAD"), self.insn.payload)
        m.d.comb += self.finish.eq(self.insn.valid & self.insn.ready & (opcode == Opcode.FINISH))

        # --- SRAMs ---------------------------------------------------------------------
        uop_dma, acc_dma = self._dma[MemoryType.UOP], self._dma[MemoryType.ACC]
        uop_sram = Sram("uop", depth=cfg.uop_depth, elem_bits=cfg.uop_bits,
                        lanes=uop_dma.sram.signature.lanes)
        acc_sram = Sram("acc", depth=cfg.acc_depth, elem_bits=cfg.acc_elem_bytes * 8,
                        lanes=acc_dma.sram.signature.lanes)
        uop_sram.elaborate(m, uop_dma.sram)
        # The acc write port is shared by the ACC DMA and the pipeline's write stage; they
        # never overlap, as instructions run one at a time and each drains first.
        acc_write = acc_sram.signature.create(path=("acc_write",))
        acc_sram.elaborate(m, acc_write)
        uop_read = uop_sram.read_port()
        # The acc read port is transparent: see the hazard note at the write stage.
        acc_read = acc_sram.read_port(transparent=True)
        if self.probes:
            acc_sram.connect_read(m, SimpleNamespace(addr=self.acc_probe_addr,
                                                     data=self.acc_probe_data))

        # --- LOAD UOP / LOAD ACC (/ LOAD TAB) ------------------------------------------
        is_load = opcode == Opcode.LOAD
        for mem, dma in self._dma.items():
            m.submodules[f"dma_{mem.name.lower()}"] = dma
            m.d.comb += dma.cmd.payload.eq(dma_command(load))
            m.d.comb += dma.cmd.valid.eq(seq.first & is_load & (load.memory_type == mem))
        # One DMA runs at a time: the read port follows the instruction's memory type.
        tab_dma = self._dma.get(MemoryType.TAB)
        with m.If(load.memory_type == MemoryType.ACC):
            connect_read_client(m, self.read, acc_dma.read)
        if tab_dma is not None:
            with m.Elif(load.memory_type == MemoryType.TAB):
                connect_read_client(m, self.read, tab_dma.read)
        with m.Else():
            connect_read_client(m, self.read, uop_dma.read)

        # --- micro-op engine -------------------------------------------------------------
        gemm = data.View(insn_layout(cfg, "GEMM"), self.insn.payload)
        alu = data.View(insn_layout(cfg, "ALU"), self.insn.payload)
        is_gemm, is_alu_insn = opcode == Opcode.GEMM, opcode == Opcode.ALU
        # Index widths: dst is an acc index, src an inp (GEMM) or acc (ALU) index, wgt a
        # wgt index. Offsets wrap at the SRAM depth, like the addresses they make.
        widths = {"dst": cfg.log_acc_depth, "src": cfg.uop_src_bits, "wgt": cfg.log_wgt_depth}

        # Instruction-wide controls, held from start until the pipeline has drained.
        is_alu = Signal()
        reset = Signal()
        alu_op = Signal.like(alu.alu_opcode)
        use_imm = Signal()
        imm = Signal(signed(cfg.acc_width))
        running = Signal()                      # the engine has micro-ops left to issue
        vector = Signal()                       # ALU with an acc[src] operand: every 2nd cycle
        skip = Signal()                         # the vector ALU's cycle without an issue
        issue = Signal()                        # a micro-op enters the pipeline this cycle
        divide = dividers(cfg)                  # DIV's engine, if the config has DIV
        free = ~(vector & skip)   # a DIV micro-op also waits for the division before it:
        m.d.comb += issue.eq(running & (free if divide is None
                                        else Mux(divide.insn, divide.ready, free)))
        u = Signal(range(cfg.uop_depth))
        u_bgn = Signal.like(u)
        u_last = Signal.like(u)
        o = Signal.like(gemm.iter_out)
        o_last = Signal.like(o)
        i = Signal.like(gemm.iter_in)
        i_last = Signal.like(i)
        factor_out = {f: Signal(w, name=f"{f}_factor_out") for f, w in widths.items()}
        factor_in = {f: Signal(w, name=f"{f}_factor_in") for f, w in widths.items()}
        base_out = {f: Signal(w, name=f"{f}_base_out") for f, w in widths.items()}  # o·f_out
        offset = {f: Signal(w, name=f"{f}_offset") for f, w in widths.items()}  # + i·f_in

        hold = Signal()                         # alu_hold: the operand row is held
        src_moves = Signal()                    # ...and read again each outer iteration
        if cfg.alu_hold:
            with m.If(running & vector):
                with m.If(~hold | skip):
                    m.d.sync += skip.eq(~skip)
                with m.Else():
                    # Issuing: the next micro-op needs a free cycle before it only if it
                    # starts an outer iteration whose operand row is another.
                    m.d.sync += skip.eq((i == i_last) & (o != o_last) & src_moves)
        else:
            with m.If(running & vector):
                m.d.sync += skip.eq(~skip)

        # dw micro-ops are beats (`vdla.hw.dw_window.DwBeats`); counters move on the last.
        beats = (DwBeats(cfg).elaborate(m, issue=issue, pass_end=u == u_last, start=seq.start,
                                        dw_insn=is_gemm & gemm.dw & ~gemm.reset_reg)
                 if cfg.dw_taps else None)
        advance = issue & beats.last if beats else issue
        with m.If(advance):
            # Running offsets instead of multipliers: each loop step adds a factor.
            with m.If(u != u_last):
                m.d.sync += u.eq(u + 1)
            with m.Else():
                m.d.sync += u.eq(u_bgn)
                with m.If(i != i_last):
                    m.d.sync += i.eq(i + 1)
                    m.d.sync += [offset[f].eq(offset[f] + factor_in[f]) for f in widths]
                with m.Else():
                    m.d.sync += i.eq(0)
                    with m.If(o != o_last):
                        m.d.sync += o.eq(o + 1)
                        for f in widths:
                            m.d.sync += [base_out[f].eq(base_out[f] + factor_out[f]),
                                         offset[f].eq(base_out[f] + factor_out[f])]
                    with m.Else():
                        m.d.sync += running.eq(0)

        # The instruction is latched when its tokens are popped, so the first micro-op
        # issues in the first executing cycle. The engine is idle then: the previous
        # instruction completed (drained) before it retired.
        starting = seq.start & (is_gemm | is_alu_insn)
        with m.If(starting):
            has_work = (gemm.iter_out != 0) & (gemm.iter_in != 0) & (gemm.uop_end > gemm.uop_bgn)
            m.d.sync += [
                running.eq(has_work), is_alu.eq(is_alu_insn), reset.eq(gemm.reset_reg),
                vector.eq(is_alu_insn & ~alu.use_imm & ~gemm.reset_reg), skip.eq(0),
                alu_op.eq(alu.alu_opcode), use_imm.eq(alu.use_imm), imm.eq(alu.imm),
                u.eq(gemm.uop_bgn), u_bgn.eq(gemm.uop_bgn), u_last.eq(gemm.uop_end - 1),
                o.eq(0), o_last.eq(gemm.iter_out - 1), i.eq(0), i_last.eq(gemm.iter_in - 1),
                factor_out["dst"].eq(gemm.dst_factor_out), factor_in["dst"].eq(gemm.dst_factor_in),
                factor_out["src"].eq(Mux(is_alu_insn, alu.src_factor_out, gemm.src_factor_out)),
                factor_in["src"].eq(Mux(is_alu_insn, alu.src_factor_in, gemm.src_factor_in)),
                # The ALU has no wgt index (those bits hold its opcode and immediate).
                factor_out["wgt"].eq(Mux(is_alu_insn, 0, gemm.wgt_factor_out)),
                factor_in["wgt"].eq(Mux(is_alu_insn, 0, gemm.wgt_factor_in)),
            ]
            m.d.sync += [base_out[f].eq(0) for f in widths]
            m.d.sync += [offset[f].eq(0) for f in widths]
            if cfg.alu_hold:   # `vdla.sim.functional.holds_operand`
                m.d.sync += [hold.eq((gemm.uop_end == gemm.uop_bgn + 1)
                                     & (alu.src_factor_in == 0)),
                             src_moves.eq(alu.src_factor_out != 0)]
        uop_word, rows = uop_read.data, {}   # the pipelined divider reads micro-ops early
        if cfg.div_pipeline:
            uop_word, rows = uop_lookahead(m, cfg, uop_read, offset, Mux(starting, gemm.uop_bgn,
                                           Mux(advance, Mux(u != u_last, u + 1, u_bgn), u)))
        else:
            m.d.comb += uop_read.addr.eq(u)
        if divide is not None:   # DIV reads acc[src] as `vdla.sim.functional.holds_operand` says
            divide.engine(m, start=starting, issue=issue, **rows,
                          is_div=is_alu_insn & ~gemm.reset_reg & (alu.alu_opcode == AluOp.DIV),
                          reads_src=vector & (~hold | ((i == 0) & (src_moves | (o == 0)))))
        m.d.comb += [self.gemm_active.eq(advance & ~is_alu & ~reset),
                     self.alu_active.eq(issue & is_alu & ~reset)]

        # --- stage 0, fetch: read the micro-op -------------------------------------------
        index_valid = Signal()
        index_offset = {f: Signal(w, name=f"index_{f}_offset") for f, w in widths.items()}
        m.d.sync += index_valid.eq(issue)
        # A dw beat reads src + its row offset (0 outside dw GEMMs).
        m.d.sync += [index_offset[f].eq(offset[f] + beats.beat if beats and f == "src"
                                        else offset[f]) for f in widths]

        # --- stage 1, index: micro-op field + loop offset ----------------------------------
        uop = data.View(uop_view_layout(cfg), uop_word)
        operand_valid = Signal()
        operand_index = {f: Signal(w, name=f"operand_{f}") for f, w in widths.items()}
        m.d.sync += operand_valid.eq(index_valid)
        m.d.sync += [operand_index[f].eq(getattr(uop, f) + index_offset[f]) for f in widths]

        # --- stage 2, operand: read inp and wgt -------------------------------------------
        m.d.comb += [self.inp.addr.eq(operand_index["src"]),
                     self.wgt.addr.eq(operand_index["wgt"])]
        multiply_valid = Signal()
        multiply_dst = Signal(widths["dst"])
        multiply_src = Signal(widths["src"])
        m.d.sync += [multiply_valid.eq(operand_valid), multiply_dst.eq(operand_index["dst"]),
                     multiply_src.eq(operand_index["src"])]

        # --- stage 3, multiply -------------------------------------------------------------
        # Datapath registers (products, sums, src_data) have no reset: the stage valid
        # bits, which do, say when they hold anything. This is what DSP slices want (their
        # pipeline registers have no logic reset), and it saves the simulator a reset mux
        # per register.
        inp_bits, wgt_bits = cfg.inp_width, cfg.wgt_width
        x = [[self.inp.data.word_select(b * cfg.block_in + k, inp_bits).as_signed()
              for k in range(cfg.block_in)] for b in range(cfg.batch)]
        w = [[self.wgt.data.word_select(n * cfg.block_in + k, wgt_bits).as_signed()
              for k in range(cfg.block_in)] for n in range(cfg.block_out)]
        native = self.arithmetic is GemmArithmetic.NATIVE
        wide = self.arithmetic is GemmArithmetic.WIDE or native
        packed = not wide and cfg.gemm_products_per_multiplier == 2   # `dsp_pack`
        if wide and not (native and not beats):
            # The stage registers the operands (the SRAM words) rather than the products,
            # and the reduce stage multiplies and adds: the same sums in the same cycle,
            # with 256 fewer registers for Verilator to store and reload every cycle.
            # (NATIVE keeps only a dw window's inp operands, which feed the window; the
            # harness reads the rest out of the SRAMs itself.)
            inp_q = Signal.like(self.inp.data, reset_less=True, name="inp_operands")
            m.d.sync += inp_q.eq(self.inp.data)
            x = [[inp_q.word_select(b * cfg.block_in + k, inp_bits).as_signed()
                  for k in range(cfg.block_in)] for b in range(cfg.batch)]
        if wide and not native:
            wgt_q = Signal.like(self.wgt.data, reset_less=True, name="wgt_operands")
            m.d.sync += wgt_q.eq(self.wgt.data)
            w = [[wgt_q.word_select(n * cfg.block_in + k, wgt_bits).as_signed()
                  for k in range(cfg.block_in)] for n in range(cfg.block_out)]
            # Each operand sign-extended once to the accumulator width; products and sums
            # then wrap at that width, which is exact (|x·w| <= 2**14, and the sums wrap
            # at the accumulator width anyway).
            bits = cfg.acc_width
            x = [[widened(m, v, bits, f"x_b{b}_k{k}") for k, v in enumerate(row)]
                 for b, row in enumerate(x)]
            w = [[widened(m, v, bits, f"w_n{n}_k{k}") for k, v in enumerate(row)]
                 for n, row in enumerate(w)]
        # Lane n's column-k multiplier input; dw beats' rows shift into the window here.
        lane_input = (DwWindow(cfg, self.inp.data, multiply_valid & beats.dw, registered=wide)
                      .elaborate(m, beats.dw, x,
                                 cfg.acc_width if wide and not native else inp_bits)
                      if beats else lambda b, n, k: x[b][k])
        if native:
            native_sums = self._native_products(m, lane_input, operand_valid, bool(beats))
        # product[b][n][k] -> its multiplier output register; with packing, lanes 2j and
        # 2j+1 share one register holding the packed product. Past `gemm_dsp_limit`
        # multipliers, a pair (a product, unpacked) is LUT-built products in registers.
        registers = {}
        dsp_left = cfg.gemm_dsp_limit or None
        for b in range(cfg.batch if not native else 0):
            for k in range(cfg.block_in):
                if packed:
                    for j in range(cfg.block_out // 2):
                        xin = lane_input(b, 2 * j, k)   # lanes 2j and 2j+1 share it
                        if dsp_left is not None and dsp_left <= 0:
                            registers[b, j, k] = tuple(
                                registered(m, lut_product(xin, w[2 * j + h][k]),
                                                 f"lutmul_b{b}_n{2 * j + h}_k{k}")
                                for h in (0, 1))
                            continue
                        if dsp_left is not None:
                            dsp_left -= 1
                        value = packed_products(xin, w[2 * j][k], w[2 * j + 1][k])
                        reg = Signal(signed(len(value)), name=f"mul_b{b}_n{2 * j}_k{k}",
                                     reset_less=True)
                        m.d.sync += reg.eq(value)
                        registers[b, j, k] = reg
                else:
                    for n in range(cfg.block_out):
                        value = lane_input(b, n, k) * w[n][k]
                        if wide:
                            registers[b, n, k] = value[:cfg.acc_width].as_signed()
                            continue
                        if dsp_left is not None and dsp_left <= 0:
                            registers[b, n, k] = registered(
                                m, lut_product(lane_input(b, n, k), w[n][k]),
                                f"lutmul_b{b}_n{n}_k{k}")
                            continue
                        if dsp_left is not None:
                            dsp_left -= 1
                        reg = Signal(signed(len(value)), name=f"mul_b{b}_n{n}_k{k}",
                                     reset_less=True)
                        m.d.sync += reg.eq(value)
                        registers[b, n, k] = reg
        reduce_valid = Signal()
        reduce_dst = Signal(widths["dst"])
        m.d.sync += [reduce_valid.eq(multiply_valid), reduce_dst.eq(multiply_dst)]
        if beats:   # a dw micro-op's beats before its last only fill the window
            m.d.sync += reduce_valid.eq(multiply_valid & beats.multiply_last)

        # --- stage 4, reduce: adder trees; read the accumulators -------------------------
        lanes = cfg.batch * cfg.block_out
        products = [[[None] * cfg.block_in for _ in range(cfg.block_out)] for _ in range(cfg.batch)]
        for (b, n, k), reg in registers.items():
            if packed:
                products[b][2 * n][k], products[b][2 * n + 1][k] = (
                    reg if isinstance(reg, tuple) else unpack_products(reg))
            else:
                products[b][n][k] = reg
        write_valid = Signal()
        write_dst = Signal(widths["dst"])
        sums = [Signal(signed(cfg.acc_width), name=f"sum{lane}", reset_less=True)
                for lane in range(lanes)]
        m.d.sync += [write_valid.eq(reduce_valid), write_dst.eq(reduce_dst)]
        for b in range(cfg.batch):
            for n in range(cfg.block_out):
                lane = b * cfg.block_out + n
                if native:
                    tree = native_sums.word_select(lane, cfg.acc_width).as_signed()
                else:
                    tree = adder_tree(products[b][n], wrap=cfg.acc_width if wide else None)
                m.d.sync += sums[lane].eq(tree)
        # One acc read port: the dst read of the micro-op in this stage, else the src read
        # of a vector ALU micro-op in the multiply stage (vector micro-ops are two cycles
        # apart, so the stage after one is empty and the port is free for it).
        m.d.comb += acc_read.addr.eq(Mux(reduce_valid, reduce_dst, multiply_src))
        src_data = Signal.like(acc_read.data, reset_less=True)   # acc[src], a cycle early
        if cfg.alu_hold:
            # Captured only after a src read, so that it holds for the micro-ops that
            # follow without one (a read happens exactly when the reduce stage is empty).
            src_read = Signal()
            m.d.sync += src_read.eq(~reduce_valid & multiply_valid if divide is None
                                    else ~reduce_valid & multiply_valid & divide.src_read)
            with m.If(src_read):
                m.d.sync += src_data.eq(acc_read.data)
        else:
            m.d.sync += src_data.eq(acc_read.data)

        # --- stage 5, write: accumulate or apply the ALU op ------------------------------
        # Hazards: micro-op k reads acc[dst] in stage 4 (cycle t) and writes it in stage 5
        # (cycle t+1); micro-op k+1 reads in cycle t+1, the cycle k writes. The read
        # port is transparent to the write port, so k+1 gets k's new value; micro-op
        # k+2 reads after the write has landed. Back-to-back accumulation into one row
        # therefore needs no stall and no forwarding logic of its own. A vector ALU
        # micro-op k+1 (two cycles behind k) reads acc[src] in cycle t+1 too, the cycle
        # k writes, so chains through src see k's result the same way. This holds only
        # because each read is exactly one cycle before the write it may depend on:
        # keep it so when adding stages.
        acc_bits = cfg.acc_width
        # Each lane's result and its narrowing are gathered and assigned once (a simulator
        # then assigns each vector once, not once per lane).
        result = Signal(acc_sram.signature.elem_bits)
        results, narrowed = [], []
        # TAB: each lane's table, read asynchronously in this stage (`vdla.hw.table`
        # says why one copy per lane and why an asynchronous read).
        tables = LaneTables(cfg).elaborate(m, tab_dma.sram) if tab_dma is not None else None
        operands = []   # each lane's (acc[dst], operand), for DIV
        for lane in range(lanes):
            a = acc_read.data.word_select(lane, acc_bits).as_signed()
            src_value = src_data.word_select(lane, acc_bits).as_signed()
            operand = Mux(use_imm, imm, src_value)
            operands.append((a, operand))
            entry = None
            if tables is not None:   # the index: the difference's low 8 bits, 8-bit wide
                m.d.comb += tables[lane].addr.eq(operand[:8] - a[:8])
                entry = tables[lane].data
            value = Signal(signed(acc_bits), name=f"result{lane}")
            with m.If(reset):
                m.d.comb += value.eq(0)
            with m.Elif(~is_alu):
                m.d.comb += value.eq(a + sums[lane])
            with m.Else():
                m.d.comb += value.eq(_alu_lane(m, cfg, alu_op, a, operand, lane, use_imm,
                                               entry))
            if AluOp.REQ in cfg.alu_ops:   # REQ clears the accumulator it narrows
                results.append(Mux(is_alu & ~reset & (alu_op == AluOp.REQ), 0, value))
            else:
                results.append(value)
            narrowed.append(value[:cfg.out_width])
        writes, row, result_value, out_value = write_valid, write_dst, Cat(*results), Cat(*narrowed)
        if divide is not None:   # a DIV writes when its division is done, not in this stage
            writes, row, result_value, out_value = divide.elaborate(
                m, operands, write_valid, write_dst, result_value, out_value)
        m.d.comb += [result.eq(result_value), self.out.data.eq(out_value)]
        with m.If(writes):
            m.d.comb += [acc_write.addr.eq(row), acc_write.data.eq(result),
                         acc_write.en.eq(Const(-1, len(acc_write.en)))]
        with m.Else():
            m.d.comb += [acc_write.addr.eq(acc_dma.sram.addr),
                         acc_write.data.eq(acc_dma.sram.data.replicate(acc_dma.lanes)),
                         acc_write.en.eq(acc_dma.sram.en)]
        m.d.comb += [self.out.addr.eq(row), self.out.en.eq(writes)]

        # --- completion ----------------------------------------------------------------
        # A GEMM/ALU is done once nothing is left to issue and its last write has landed
        # (all stages empty), so the tokens pushed after it guard written data.
        drained = ~running & ~index_valid & ~operand_valid & ~multiply_valid \
            & ~reduce_valid & ~write_valid
        if divide is not None:   # ... and the last division has written its result
            drained &= divide.idle
        with m.If(seq.executing):
            with m.Switch(opcode):
                with m.Case(Opcode.LOAD):
                    with m.Switch(load.memory_type):
                        with m.Case(MemoryType.UOP):
                            m.d.comb += seq.done.eq(uop_dma.done)
                        with m.Case(MemoryType.ACC):
                            m.d.comb += seq.done.eq(acc_dma.done)
                        if tab_dma is not None:
                            with m.Case(MemoryType.TAB):
                                m.d.comb += seq.done.eq(tab_dma.done)
                        with m.Default():  # INP/WGT are routed to the load module
                            m.d.comb += seq.done.eq(1)
                with m.Case(Opcode.GEMM, Opcode.ALU):
                    m.d.comb += seq.done.eq(drained)
                with m.Default():   # FINISH (and STORE, which never arrives here)
                    m.d.comb += seq.done.eq(1)
        return m


def _alu_lane(m: Module, cfg: HardwareConfig, op, a, b, lane: int, use_imm, entry=None):
    """One int32 ALU lane: ``op(a, b)`` with the functional simulator's wrap-around;
    `entry` is the lane's table entry at (b - a) mod 256 (TAB, on a config with it)."""
    bits = cfg.acc_width
    value = Signal(signed(bits), name=f"alu{lane}")
    # SHR's amount is b's low log2(bits)+1 bits as a signed number (-32..31 for int32):
    # negative amounts shift left, and -bits shifts everything out.
    amount_bits = exact_log2(bits) + 1
    amount = b[:amount_bits].as_signed()
    left = Signal(range(bits + 1), name=f"alu{lane}_left")    # 1..bits when shifting left
    m.d.comb += left.eq(-amount)
    shifted_left = Mux(left == bits, 0, (a << left[:amount_bits - 1])[:bits])
    shifted = Mux(amount[-1], shifted_left, a >> amount[:amount_bits - 1])
    with m.Switch(op):
        with m.Case(AluOp.MIN):
            m.d.comb += value.eq(Mux(a < b, a, b))
        with m.Case(AluOp.MAX):
            m.d.comb += value.eq(Mux(a > b, a, b))
        with m.Case(AluOp.ADD):
            m.d.comb += value.eq(a + b)
        with m.Case(AluOp.SHR):
            m.d.comb += value.eq(shifted)
        if AluOp.MUL in cfg.alu_ops:
            with m.Case(AluOp.MUL):
                m.d.comb += value.eq(a * b)   # the low bits of the product
        if AluOp.REQ in cfg.alu_ops:
            with m.Case(AluOp.REQ):
                # The shift, then min(max(., lo), hi) with int8 bounds from the operand
                # word (hi is 127 with an immediate, whose 16 bits hold shift and lo).
                lo = b[8:16].as_signed()
                hi = Mux(use_imm, 127, b[16:24].as_signed())
                as_int32 = Signal(signed(bits), name=f"alu{lane}_req")  # a left shift
                m.d.comb += as_int32.eq(shifted)                    # is its low 32 bits
                low_clamped = Mux(as_int32 < lo, lo, as_int32)
                m.d.comb += value.eq(Mux(low_clamped > hi, hi, low_clamped))
        if AluOp.TAB in cfg.alu_ops:
            with m.Case(AluOp.TAB):
                m.d.comb += value.eq(entry)   # signed: the entry sign-extended
        with m.Default():  # an op this config lacks (the encoder rejects it): unchanged
            m.d.comb += value.eq(a)
    return value
