"""cocotb testbench of the compute module (LOAD UOP/ACC/TAB, GEMM, ALU with TAB and DIV,
FINISH, tokens).

Every instruction also runs in the functional simulator, on the same DRAM image and the
same inp/wgt contents (written into the hardware through back doors and into the
simulator's arrays), and the acc and out SRAMs are compared with the simulator's.
"""

from __future__ import annotations

import dataclasses
import random

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from cocotb_harness import start_clock, testbench_config
from vdla.config import TABLE_ENTRIES, AluOp
from vdla.hw.divider_pipeline import DST_AGES, LATENCY, SRC_AGES
from vdla.isa import Alu, Finish, Gemm, Load, Uop, encode, encode_uops
from vdla.sim import FunctionalSimulator

DRAM_BYTES = 1 << 18
UOP_AREA = 0             # micro-op tables (byte address)
ACC_AREA = 1 << 16       # accumulator images
TAB_AREA = 1 << 17       # lookup tables (32-bit entries)
ROWS = 32                # inp, wgt and acc rows the tests use (below the harness's TB_ROWS)
INT32_EDGES = [-2**31, -2**31 + 1, -1, 0, 1, 2**31 - 1]


class Bench:
    """The DUT with its AXI RAM, and the functional simulator holding the same state."""

    def __init__(self, dut, cfg, ram, image, rng):
        self.dut, self.cfg, self.ram, self.image, self.rng = dut, cfg, ram, image, rng
        self.sim = FunctionalSimulator(cfg, image)   # shares `image` as its DRAM

    def write_dram(self, addr: int, blob: bytes):
        self.ram.write(addr, blob)
        self.image[addr:addr + len(blob)] = np.frombuffer(blob, dtype=np.uint8)

    async def issue(self, insns, *, monitor=None):
        """Run `insns` back to back in the DUT (each presented as soon as the previous
        retires) and in the simulator; returns the cycle of each retirement.
        `monitor(cycle)` is called in every cycle's read-only phase."""
        dut, cfg = self.dut, self.cfg
        insns = list(insns)
        words = [encode(insn, cfg) for insn in insns]
        retired, index, cycle, taken = [], 0, 0, False
        dut.insn__payload.value = words[0]
        dut.insn__valid.value = 1
        while True:
            await RisingEdge(dut.clk)
            cycle += 1
            if taken:
                index += 1
                if index == len(words):
                    dut.insn__valid.value = 0
                    break
                dut.insn__payload.value = words[index]
            await ReadOnly()
            if monitor:
                monitor(cycle)
            taken = bool(dut.insn__ready.value)
            if taken:
                retired.append(cycle)
            elif cycle > 200_000:
                raise AssertionError(f"{insns[index]} not retired after {cycle} cycles")
        self.sim.run([*insns, Finish()])
        return retired

    async def write_operands(self, name: str, values: np.ndarray):
        """Write int8 tiles `values` into inp or wgt rows 0.. (DUT back door and sim)."""
        dut = self.dut
        addr, data, en = (getattr(dut, f"{name}_{s}") for s in ("waddr", "wdata", "wen"))
        getattr(self.sim, name)[:len(values)] = values
        for row, tile in enumerate(values):
            addr.value, data.value, en.value = row, int.from_bytes(tile.tobytes(), "little"), 1
            await RisingEdge(dut.clk)
        en.value = 0

    async def random_operands(self):
        """Random int8 tiles in inp and wgt rows 0..ROWS-1."""
        c = self.cfg
        gen = np.random.default_rng(self.rng.randrange(2**32))
        for name, shape in (("inp", (c.batch, c.block_in)), ("wgt", (c.block_out, c.block_in))):
            await self.write_operands(name, gen.integers(-128, 128, (ROWS, *shape), dtype=np.int8))

    def acc_image(self, values: np.ndarray) -> Load:
        """Put int32 accumulator tiles in DRAM; the LOAD ACC that writes them to acc
        rows 0.."""
        self.write_dram(ACC_AREA, np.asarray(values, dtype="<i4").tobytes())
        return Load(memory_type="ACC", sram_base=0, dram_base=ACC_AREA // self.cfg.acc_elem_bytes,
                    y_size=1, x_size=len(values), x_stride=len(values))

    def table_image(self, entries: np.ndarray, *, dram_base: int = 0) -> Load:
        """Put int32 table entries in DRAM at entry `dram_base` of the table area; the
        LOAD TAB that writes them to table entries 0.. (one row)."""
        self.write_dram(TAB_AREA + 4 * dram_base, np.asarray(entries, dtype="<i4").tobytes())
        return Load(memory_type="TAB", sram_base=0, dram_base=TAB_AREA // 4 + dram_base,
                    y_size=1, x_size=len(entries), x_stride=len(entries))

    def random_table(self) -> Load:
        """A LOAD TAB of a whole table of random 32-bit entries (each keeps 18 bits)."""
        gen = np.random.default_rng(self.rng.randrange(2**32))
        return self.table_image(gen.integers(-2**31, 2**31, TABLE_ENTRIES))

    def uop_table(self, uops, *, sram_base: int = 0, dram_base: int = 0) -> Load:
        """Put micro-ops in DRAM at element `dram_base`; the LOAD UOP to `sram_base`."""
        blob = encode_uops(uops, self.cfg)
        self.write_dram(UOP_AREA + dram_base * self.cfg.uop_bytes, blob)
        return Load(memory_type="UOP", sram_base=sram_base, dram_base=dram_base, y_size=1,
                    x_size=len(uops), x_stride=len(uops))

    async def read_rows(self, begin: int = 0, end: int = ROWS):
        """acc and out rows [begin, end) through the probes, one row per cycle."""
        dut, c = self.dut, self.cfg
        acc, out = [], []
        dut.acc_addr.value = dut.out_addr.value = begin
        await RisingEdge(dut.clk)
        for row in range(begin, end):
            if row + 1 < end:
                dut.acc_addr.value = dut.out_addr.value = row + 1
            await ReadOnly()
            acc.append(int(dut.acc_data.value).to_bytes(c.acc_elem_bytes, "little"))
            out.append(int(dut.out_data.value).to_bytes(c.out_elem_bytes, "little"))
            await RisingEdge(dut.clk)
        acc = np.frombuffer(b"".join(acc), "<i4").reshape(-1, c.batch, c.block_out)
        out = np.frombuffer(b"".join(out), np.int8).reshape(-1, c.batch, c.block_out)
        return acc, out

    async def adopt_rows(self):
        """Give the simulator the DUT's acc and out rows (left by earlier tests)."""
        acc, out = await self.read_rows()
        self.sim.acc[:ROWS], self.sim.out[:ROWS] = acc, out

    async def check(self, what: str, begin: int = 0, end: int = ROWS):
        acc, out = await self.read_rows(begin, end)
        assert not self.dut.index_overflow.value, f"{what}: an index reached past TB_ROWS"
        for name, got, want in (("acc", acc, self.sim.acc), ("out", out, self.sim.out)):
            want = want[begin:end]
            bad = np.argwhere(got != want)
            assert not len(bad), (
                f"{what}: {len(bad)} wrong {name} lanes; first at row {begin + bad[0][0]}: "
                f"got {got[tuple(bad[0])]} want {want[tuple(bad[0])]}\n"
                f"got row {got[bad[0][0]].tolist()}\nwant row {want[bad[0][0]].tolist()}")


async def setup(dut, seed: int) -> Bench:
    cfg = testbench_config()
    await start_clock(dut)
    ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, size=DRAM_BYTES)
    image = np.random.default_rng(seed).integers(0, 256, DRAM_BYTES, dtype=np.uint8)
    ram.write(0, image.tobytes())
    dut.insn__valid.value = 0
    for name in ("pop_prev", "pop_next"):
        getattr(dut, f"{name}__valid").value = 0
    for name in ("push_prev", "push_next"):
        getattr(dut, f"{name}__ready").value = 1
    for name in ("inp_wen", "wgt_wen"):
        getattr(dut, name).value = 0
    bench = Bench(dut, cfg, ram, image, random.Random(seed))
    await bench.adopt_rows()
    return bench


def random_uops(rng, n, *, high=16, repeat=0.4):
    """`n` micro-ops with fields below `high`; a dst repeats the previous one with
    probability `repeat` (back-to-back work on one row)."""
    uops = []
    for _ in range(n):
        dst = uops[-1].dst if uops and rng.random() < repeat else rng.randrange(high)
        uops.append(Uop(dst=dst, src=rng.randrange(high), wgt=rng.randrange(high)))
    return uops


def random_acc(rng, cfg, rows=ROWS):
    """Accumulator tiles mixing full-range values, small ones, int32 edges and every SHR
    amount (-32..31), so MIN/MAX/SHR/MUL and the wrap-around all see interesting data."""
    gen = np.random.default_rng(rng.randrange(2**32))
    lanes = rows * cfg.batch * cfg.block_out
    pools = [gen.integers(-2**31, 2**31, lanes), gen.integers(-300, 300, lanes),
             np.resize(np.array(INT32_EDGES), lanes), np.resize(np.arange(-32, 32), lanes)]
    which = gen.integers(0, len(pools), lanes)
    values = np.choose(which, pools)
    return values.astype(np.int64).astype(np.int32).reshape(rows, cfg.batch, cfg.block_out)


def loop_fields(rng, prefixes):
    """Random loop bounds and factors keeping every index below ROWS (fields < 16)."""
    fields = dict(iter_out=rng.randint(1, 3), iter_in=rng.randint(1, 3))
    for prefix in prefixes:
        fields[f"{prefix}_factor_out"] = rng.randrange(4)
        fields[f"{prefix}_factor_in"] = rng.randrange(4)
    return fields


@cocotb.test()
async def gemm_matches_functional_simulator(dut):
    bench = await setup(dut, seed=1)
    rng = bench.rng
    await bench.random_operands()
    await bench.issue([bench.acc_image(random_acc(rng, bench.cfg))])
    await bench.check("LOAD ACC")
    trials = [
        # The same row accumulated by every micro-op and iteration, back to back.
        (dict(uops=[Uop(dst=3, src=s, wgt=s + 1) for s in range(4)]),
         dict(iter_out=2, iter_in=3)),
        # A reset, then accumulation into the reset rows.
        (dict(uops=[Uop(dst=d, src=0, wgt=0) for d in range(6)], reset_reg=True),
         dict(iter_out=1, iter_in=2, dst_factor_in=6)),
        # No work: nothing changes.
        (dict(uops=[Uop(dst=1, src=1, wgt=1)]), dict(iter_out=0, iter_in=3)),
    ]
    for _ in range(12):
        trials.append((dict(uops=random_uops(rng, rng.randint(1, 8)),
                            reset_reg=rng.random() < 0.15),
                       loop_fields(rng, ("dst", "src", "wgt"))))
    for n, (spec, loops) in enumerate(trials):
        uops = spec["uops"]
        base = rng.randrange(64)          # odd and even micro-op addresses
        load = bench.uop_table(uops, sram_base=base, dram_base=rng.randrange(256))
        gemm = Gemm(uop_bgn=base, uop_end=base + len(uops),
                    reset_reg=spec.get("reset_reg", False), **loops)
        await bench.issue([load, gemm])
        await bench.check(f"GEMM trial {n} {gemm} uops {uops}")


def alu_cases(rng, cfg):
    """(uops, Alu fields) of every op in the config: immediates (every SHR amount edge,
    including values whose low 6 bits wrap), vectors, chains on one row, resets."""
    cases = []
    chain = [Uop(dst=4, src=5), Uop(dst=4, src=4), Uop(dst=6, src=4), Uop(dst=4, src=6)]
    for op in sorted(cfg.alu_ops):
        imms = [rng.randint(-2**15, 2**15 - 1) for _ in range(2)]
        if op == AluOp.SHR:
            imms = [-32, -31, -17, -1, 0, 1, 7, 31, 32, 63, -33, 2**15 - 1, -2**15]
        elif op == AluOp.MUL:
            imms += [-1, 0, 2**15 - 1, -2**15]
        elif op == AluOp.REQ:   # shift 5:0 and lo 15:8: edges of both
            imms += [0, 31, -1, 0x7F00 | 5, -0x8000 | 60, 0x0100 | 33]
        elif op == AluOp.DIV:   # divisors not positive, 1, small, the largest
            imms += [0, -1, 1, 3, 127, 2**15 - 1]
        for imm in imms:
            cases.append((random_uops(rng, rng.randint(1, 5), repeat=0.3),
                          dict(alu_opcode=op, use_imm=True, imm=imm,
                               **loop_fields(rng, ("dst", "src")))))
        for _ in range(2):
            cases.append((random_uops(rng, rng.randint(1, 6), repeat=0.3),
                          dict(alu_opcode=op, **loop_fields(rng, ("dst", "src")))))
        cases.append((chain, dict(alu_opcode=op, iter_out=2, iter_in=1)))
        if cfg.alu_hold:
            # The shape whose operand row alu_hold holds: one micro-op, src fixed in the
            # inner loop, its row often among the destinations.
            for _ in range(3):
                fields = loop_fields(rng, ("dst", "src")) | dict(
                    src_factor_in=0, iter_out=rng.randint(1, 3), iter_in=rng.randint(2, 4))
                dst = rng.randrange(8)
                cases.append(([Uop(dst=dst, src=dst + rng.randrange(3))],
                              dict(alu_opcode=op, **fields)))
    cases.append((random_uops(rng, 4), dict(alu_opcode=AluOp.ADD, reset_reg=True,
                                             **loop_fields(rng, ("dst", "src")))))
    return cases


@cocotb.test()
async def alu_matches_functional_simulator(dut):
    bench = await setup(dut, seed=2)
    rng = bench.rng
    for n, (uops, fields) in enumerate(alu_cases(rng, bench.cfg)):
        if n % 4 == 0:   # fresh values: repeated shifts and MINs would flatten them
            await bench.issue([bench.acc_image(random_acc(rng, bench.cfg))])
        if n % 8 == 0 and AluOp.TAB in bench.cfg.alu_ops:   # and a fresh table
            await bench.issue([bench.random_table()])
        base = rng.randrange(64)
        alu = Alu(uop_bgn=base, uop_end=base + len(uops), **fields)
        await bench.issue([bench.uop_table(uops, sram_base=base, dram_base=rng.randrange(256)),
                           alu])
        await bench.check(f"ALU case {n} {alu} uops {uops}")


@cocotb.test()
async def loads_of_uop_and_acc(dut):
    """LOAD UOP at odd and even DRAM and SRAM bases (and 2-D), checked by running the
    loaded micro-ops; LOAD ACC with padding, and a no-op LOAD."""
    bench = await setup(dut, seed=3)
    rng, cfg = bench.rng, bench.cfg
    await bench.issue([bench.acc_image(random_acc(rng, cfg))])
    for dram_base, sram_base, count in [(0, 0, 4), (1, 0, 3), (0, 1, 5), (1, 1, 2), (7, 6, 9),
                                        (2, 3, 1)]:
        # Distinct dst and src: a wrongly loaded micro-op changes a different row.
        dst = rng.sample(range(ROWS), count)
        uops = [Uop(dst=d, src=rng.randrange(ROWS)) for d in dst]
        load = bench.uop_table(uops, sram_base=sram_base, dram_base=dram_base)
        add = Alu(alu_opcode="ADD", uop_bgn=sram_base, uop_end=sram_base + count,
                  iter_out=1, iter_in=1)
        await bench.issue([load, add])
        await bench.check(f"LOAD UOP dram {dram_base} sram {sram_base} x {count}")
    # Two rows of three micro-ops, five apart in DRAM.
    table = [Uop(dst=d, src=rng.randrange(ROWS)) for d in rng.sample(range(ROWS), 10)]
    bench.uop_table(table, dram_base=11)
    load = Load(memory_type="UOP", sram_base=20, dram_base=11, y_size=2, x_size=3, x_stride=5)
    add = Alu(alu_opcode="ADD", uop_bgn=20, uop_end=26, iter_out=1, iter_in=1)
    await bench.issue([load, add])
    await bench.check("2-D LOAD UOP")

    # LOAD ACC with every pad: 4 rows of 6 tiles = 24 rows from row 3.
    values = random_acc(rng, cfg, rows=12)
    bench.write_dram(ACC_AREA, values.astype("<i4").tobytes())
    padded = Load(memory_type="ACC", sram_base=3, dram_base=ACC_AREA // cfg.acc_elem_bytes + 1,
                  y_size=2, x_size=3, x_stride=5, y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=2)
    await bench.issue([padded])
    await bench.check("padded LOAD ACC")
    noop = Load(memory_type="ACC", sram_base=0, dram_base=0, y_size=3, x_size=0, x_stride=0)
    await bench.issue([noop])
    await bench.check("no-op LOAD ACC")


async def timed(bench, insn, active):
    """Cycles from the retirement of a no-op LOAD to that of `insn` right behind it, and
    the cycles `active` (a DUT signal) was high meanwhile."""
    seen = []
    noop = Load(memory_type="UOP", sram_base=0, dram_base=0, y_size=0, x_size=0, x_stride=0)
    retired = await bench.issue([noop, insn], monitor=lambda c: seen.append(int(active.value)))
    return retired[1] - retired[0], sum(seen)


# Measured: N + 8 cycles retire to retire, for GEMM and ALU alike (1 to pop and start,
# N to issue, 5 pipeline stages to the last write, 1 to see the pipeline empty, 1 to push
# and retire). A vector-operand ALU micro-op takes two cycles (one acc read port, see
# hw/compute.py): 2N + 7.
CYCLE_OVERHEAD_LIMIT = 20


@cocotb.test()
async def one_micro_op_per_cycle(dut):
    """GEMM and ALU instructions of N micro-ops take N plus a small constant cycles."""
    bench = await setup(dut, seed=4)
    rng, cfg = bench.rng, bench.cfg
    await bench.random_operands()
    await bench.issue([bench.acc_image(random_acc(rng, cfg)),
                       bench.uop_table(random_uops(rng, 1024, high=ROWS, repeat=0.2))])
    if AluOp.TAB in cfg.alu_ops:   # the DUT's table is what earlier tests left: refill it
        await bench.issue([bench.random_table()])
    for n in (1024, 2048):
        loops = dict(uop_bgn=0, uop_end=1024, iter_out=1, iter_in=n // 1024)
        add = Alu(alu_opcode="ADD", use_imm=True, imm=-7, **loops)
        add_vector = Alu(alu_opcode="ADD", use_imm=False, src_factor_in=1, **loops)
        timings = [("GEMM", Gemm(**loops), bench.dut.gemm_active, 1),
                   ("ALU", add, bench.dut.alu_active, 1),
                   ("vector ALU", add_vector, bench.dut.alu_active, 2)]
        if cfg.alu_hold:   # a held operand row: one micro-op a cycle (+1 per outer step)
            timings.append(("held vector ALU", Alu(
                alu_opcode="ADD", uop_bgn=0, uop_end=1, iter_out=2, iter_in=n // 2,
                src_factor_out=1, dst_factor_out=1), bench.dut.alu_active, 1))
        if AluOp.TAB in cfg.alu_ops:   # a lookup a micro-op, like any immediate op
            timings.append(("TAB", Alu(alu_opcode="TAB", use_imm=True, imm=3, **loops),
                            bench.dut.alu_active, 1))
        if cfg.dw_taps:   # r cycles a micro-op, T·r for the first of each pass
            r = cfg.dw_column_rows
            timings.append(("dw GEMM", Gemm(**loops, dw=True), bench.dut.gemm_active, r))
        for kind, insn, active, per_uop in timings:
            cycles, active_cycles = await timed(bench, insn, active)
            dut._log.info("%s of %d micro-ops: %d cycles retire to retire (%d·N + %d)",
                          kind, n, cycles, per_uop, cycles - per_uop * n)
            if kind == "dw GEMM":
                assert cycles == dw_cycles(cfg, insn) + DW_OVERHEAD, (kind, n, cycles)
            assert active_cycles == n, f"{kind} active for {active_cycles} cycles, not {n}"
            assert cycles <= per_uop * n + CYCLE_OVERHEAD_LIMIT, \
                f"{kind} of {n} micro-ops took {cycles}"
            await bench.check(f"{kind} of {n} micro-ops")


async def wait_cycles(dut, n):
    for _ in range(n):
        await RisingEdge(dut.clk)


@cocotb.test()
async def tokens_pop_before_and_push_after(dut):
    bench = await setup(dut, seed=5)
    rng, cfg = bench.rng, bench.cfg
    await bench.random_operands()
    uops = [Uop(dst=2, src=s, wgt=s) for s in range(4)] + [Uop(dst=9, src=5, wgt=6)]
    await bench.issue([bench.acc_image(random_acc(rng, cfg)), bench.uop_table(uops)])
    flags = dict(pop_prev=True, pop_next=True, push_prev=True, push_next=True)
    gemm = Gemm(uop_bgn=0, uop_end=len(uops), iter_out=1, iter_in=2, **flags)
    before = bench.sim.acc[9].copy()
    bench.sim.run([dataclasses.replace(gemm, **dict.fromkeys(flags, False)), Finish()])
    want_last = bench.sim.acc[9].reshape(-1)
    assert (want_last != before.reshape(-1)).any()

    # Pops: nothing runs until both tokens are there; both go in the same cycle.
    dut.acc_addr.value = 9                                        # the last micro-op's row
    dut.insn__payload.value = encode(gemm, cfg)
    dut.insn__valid.value = 1
    await wait_cycles(dut, 10)
    await ReadOnly()
    assert dut.wait_pop_prev.value and dut.wait_pop_next.value
    assert not dut.busy.value, "the GEMM started without its tokens"
    await RisingEdge(dut.clk)
    dut.pop_prev__valid.value = 1                                 # one of the two tokens
    await wait_cycles(dut, 5)
    await ReadOnly()
    assert not dut.busy.value and not dut.pop_prev__ready.value
    assert dut.wait_pop_next.value and not dut.wait_pop_prev.value
    await RisingEdge(dut.clk)
    dut.pop_next__valid.value = 1
    await ReadOnly()
    assert dut.pop_prev__ready.value and dut.pop_next__ready.value, "tokens not popped together"
    assert not dut.busy.value and not dut.gemm_active.value, "executed before popping"
    await RisingEdge(dut.clk)
    dut.pop_prev__valid.value = dut.pop_next__valid.value = 0

    # Pushes: only after the last write has landed.
    for cycle in range(100):
        await ReadOnly()
        if dut.push_prev__valid.value or dut.push_next__valid.value:
            break
        await RisingEdge(dut.clk)
    else:
        raise AssertionError("no token pushed")
    assert dut.push_prev__valid.value and dut.push_next__valid.value and dut.insn__ready.value
    assert not dut.gemm_active.value
    await RisingEdge(dut.clk)
    dut.insn__valid.value = 0
    await ReadOnly()   # the acc row as it was at the start of the push cycle
    got = np.frombuffer(int(dut.acc_data.value).to_bytes(cfg.acc_elem_bytes, "little"), "<i4")
    assert (got == want_last).all(), "tokens pushed before the last write landed"
    await RisingEdge(dut.clk)

    # A full queue holds the instruction (busy, not retired) until every push has room;
    # each token goes in exactly once.
    dut.push_prev__ready.value = dut.push_next__ready.value = 0
    alu = Alu(alu_opcode="ADD", use_imm=True, imm=1, uop_bgn=0, uop_end=2, iter_out=1,
              iter_in=1, push_prev=True, push_next=True)
    dut.insn__payload.value = encode(alu, cfg)
    dut.insn__valid.value = 1
    pushed = {"push_prev": 0, "push_next": 0}
    retired = None
    for cycle in range(40):
        if cycle == 20:
            dut.push_prev__ready.value = 1
        if cycle == 30:
            dut.push_next__ready.value = 1
        await ReadOnly()
        for name in pushed:
            pushed[name] += bool(getattr(dut, f"{name}__valid").value
                                 and getattr(dut, f"{name}__ready").value)
        if dut.insn__ready.value:
            retired = cycle
        if cycle == 19:
            assert dut.busy.value and not any(pushed.values()), "pushed into a full queue"
        if cycle == 29:
            assert pushed == {"push_prev": 1, "push_next": 0} and retired is None, \
                "retired with the compute->store queue full"
        await RisingEdge(dut.clk)
        if retired is not None:
            dut.insn__valid.value = 0
            break
    assert retired == 30 and pushed == {"push_prev": 1, "push_next": 1}, (retired, pushed)
    bench.sim.run([dataclasses.replace(alu, push_prev=False, push_next=False), Finish()])
    await bench.check("ALU after its pushes")

    # FINISH: `finish` pulses once, when it retires after its push.
    dut.push_next__ready.value = 0
    dut.insn__payload.value = encode(Finish(push_next=True), cfg)
    dut.insn__valid.value = 1
    pulses = []
    for cycle in range(12):
        if cycle == 8:
            dut.push_next__ready.value = 1
        await ReadOnly()
        pulses.append((cycle, int(dut.finish.value), int(dut.insn__ready.value)))
        await RisingEdge(dut.clk)
        if pulses[-1][2]:
            dut.insn__valid.value = 0
    assert [p for p in pulses if p[1]] == [(8, 1, 1)], pulses


#: Cycles from one retirement to the next besides the micro-op engine's (1 to pop and
#: start, 5 pipeline stages to the last write, 1 to see it drained, 1 to push and
#: retire): the same for a dw GEMM as for a plain one.
DW_OVERHEAD = 8


def dw_cycles(cfg, gemm: Gemm) -> int:
    """The micro-op engine's cycles for `gemm` by the depthwise window's contract
    (`vdla.sim.validate`): a dw micro-op costs T·r cycles if it is the first of its
    pass, else r; a reset (dw or not) and a plain GEMM 1 per micro-op."""
    passes = gemm.iter_out * gemm.iter_in
    uops = passes * (gemm.uop_end - gemm.uop_bgn)
    if not gemm.dw or gemm.reset_reg:
        return uops
    r = cfg.dw_column_rows
    return uops * r + passes * (cfg.dw_window_rows - r)


def dw_cases(rng, cfg):
    """(micro-ops, Gemm fields) for dw GEMMs: passes that slide the window (src + r per
    micro-op), srcs that jump (the window keeps its older columns: the stateful rule),
    one-micro-op passes, resets with dw, and plain GEMMs in between (the window must not
    leak into them). Every src plus the window's rows stays below ROWS."""
    r, reach = cfg.dw_column_rows, cfg.dw_window_rows - 1
    cases = []
    for _ in range(3):
        n, start = rng.randint(2, 6), rng.randrange(4)
        sliding = [Uop(dst=rng.randrange(16), src=start + u * r, wgt=rng.randrange(16))
                   for u in range(n)]
        cases.append((sliding, loop_fields(rng, ("dst", "src", "wgt")) | dict(dw=True)))
    for _ in range(4):
        cases.append((random_uops(rng, rng.randint(2, 6)),
                      loop_fields(rng, ("dst", "src", "wgt")) | dict(dw=True)))
    for _ in range(2):
        cases.append(([Uop(dst=rng.randrange(16), src=rng.randrange(16), wgt=rng.randrange(16))],
                       loop_fields(rng, ("dst", "src", "wgt")) | dict(dw=True)))
    cases.append((random_uops(rng, 4), loop_fields(rng, ("dst",)) | dict(dw=True, reset_reg=True)))
    cases.append((random_uops(rng, 5), loop_fields(rng, ("dst", "src", "wgt"))))
    cases.append((random_uops(rng, 3), dict(iter_out=3, iter_in=2, dw=True)))
    for uops, fields in cases:
        top = max(u.src for u in uops) + sum(
            (fields.get(f"iter_{loop}", 1) - 1) * fields.get(f"src_factor_{loop}", 0)
            for loop in ("out", "in"))
        assert top + reach < ROWS, (uops, fields)
    rng.shuffle(cases)
    return cases


@cocotb.test()
async def dw_gemm_matches_functional_simulator(dut):
    """The depthwise window (a config with dw_taps): results against the functional
    simulator, and each GEMM's cycles, retire to retire, against the contract."""
    bench = await setup(dut, seed=6)
    rng, cfg = bench.rng, bench.cfg
    if not cfg.dw_taps:
        dut._log.info("config %s has no depthwise window", cfg.name)
        return
    await bench.random_operands()
    await bench.issue([bench.acc_image(random_acc(rng, cfg))])
    for n, (uops, fields) in enumerate(dw_cases(rng, cfg)):
        if n % 4 == 0:
            await bench.issue([bench.acc_image(random_acc(rng, cfg))])
        base = rng.randrange(64)
        gemm = Gemm(uop_bgn=base, uop_end=base + len(uops), **fields)
        await bench.issue([bench.uop_table(uops, sram_base=base, dram_base=rng.randrange(256))])
        cycles, active = await timed(bench, gemm, dut.gemm_active)
        await bench.check(f"dw case {n} {gemm} uops {uops}")
        want_active = 0 if gemm.reset_reg else gemm.iter_out * gemm.iter_in * len(uops)
        assert active == want_active, f"dw case {n}: gemm_active {active}, not {want_active}"
        assert cycles == dw_cycles(cfg, gemm) + DW_OVERHEAD, (
            f"dw case {n} {gemm}: {cycles} cycles retire to retire, not "
            f"{dw_cycles(cfg, gemm)} + {DW_OVERHEAD}")


@cocotb.test()
async def table_loads_and_lookups(dut):
    """The ALU's table (a config with TAB): LOADs of TAB in strided 2-D pieces at odd DRAM
    and table bases (one over entries loaded before), each checked by looking every entry
    up (acc lanes 0..255, TAB by 0); lookups by negative immediates and acc operands, held
    ones with alu_hold; a LOAD of TAB takes one cycle an entry once its data arrives."""
    bench = await setup(dut, seed=7)
    rng, cfg = bench.rng, bench.cfg
    if AluOp.TAB not in cfg.alu_ops:
        dut._log.info("config %s has no lookup table", cfg.name)
        return
    gen = np.random.default_rng(7)
    lanes = cfg.batch * cfg.block_out
    every = np.arange(ROWS * lanes) % TABLE_ENTRIES
    index_rows = every.reshape(ROWS, cfg.batch, cfg.block_out)
    bench.write_dram(TAB_AREA, gen.integers(-2**31, 2**31, 4096).astype("<i4").tobytes())
    lookup = Alu(alu_opcode="TAB", use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=1,
                 iter_in=ROWS, dst_factor_in=1)
    await bench.issue([bench.uop_table([Uop(dst=0, src=0)])])
    pieces = [
        Load(memory_type="TAB", sram_base=0, dram_base=TAB_AREA // 4 + 1, y_size=4,
             x_size=64, x_stride=67),
        Load(memory_type="TAB", sram_base=37, dram_base=TAB_AREA // 4 + 1000, y_size=3,
             x_size=5, x_stride=9),
        Load(memory_type="TAB", sram_base=255, dram_base=TAB_AREA // 4 + 3, y_size=1,
             x_size=1, x_stride=1),
        Load(memory_type="TAB", sram_base=101, dram_base=TAB_AREA // 4 + 2000, y_size=2,
             x_size=77, x_stride=80),
    ]
    for piece in pieces:
        await bench.issue([piece, bench.acc_image(index_rows), lookup])
        await bench.check(f"TAB after {piece}")
        cycles = (await bench.issue([piece]))[0]   # measured: entries + 5
        entries = piece.y_size * piece.x_size
        dut._log.info("LOAD TAB of %d entries: %d cycles", entries, cycles)
        assert cycles <= entries + 8, f"{piece}: {cycles} cycles for {entries} entries"
    # Lookups of random lanes by immediates (both signs, the 16-bit edges) and by rows.
    for imm in (-1, -200, 2**15 - 1, -2**15, 129):
        await bench.issue([bench.acc_image(random_acc(rng, cfg)),
                           dataclasses.replace(lookup, imm=imm)])
        await bench.check(f"TAB by {imm}")
    uops = random_uops(rng, 5, repeat=0.3)
    await bench.issue([bench.acc_image(random_acc(rng, cfg)), bench.uop_table(uops),
                       Alu(alu_opcode="TAB", uop_bgn=0, uop_end=len(uops), iter_out=2,
                           iter_in=2, src_factor_in=1, dst_factor_out=3)])
    await bench.check("TAB by acc rows")
    held = Alu(alu_opcode="TAB", uop_bgn=0, uop_end=1, iter_out=2, iter_in=4,
               dst_factor_out=4, dst_factor_in=1, src_factor_out=1)
    await bench.issue([bench.acc_image(random_acc(rng, cfg)),
                       bench.uop_table([Uop(dst=2, src=4)]), held])
    await bench.check("TAB by a held row")


def divide_cycles(insn, uops: int, hold: bool) -> int:
    """Cycles, retire to retire, of a DIV instruction of `uops` micro-ops a pass by
    `vdla.hw.divider`'s docstring: 10 a micro-op, one more for each acc[src] read but
    the first, plus 8 (with `hold`, the config's alu_hold)."""
    n = insn.iter_out * insn.iter_in * uops
    if insn.use_imm:
        reads = 0
    elif uops == 1 and insn.src_factor_in == 0 and hold:
        reads = insn.iter_out if insn.src_factor_out else 1
    else:
        reads = n
    return 10 * n + max(reads - 1, 0) + 8


def pipelined_divide_cycles(insn, uops, cfg) -> int:
    """Cycles, retire to retire, of a DIV instruction with micro-ops `uops` on a config with
    the pipelined divider, by `vdla.hw.divider_pipeline`'s docstring: each micro-op issues
    in the first cycle after the previous one in which its dst row is no DIV's of the last
    DST_AGES cycles, the acc[src] row it reads (if it reads one) none of the last SRC_AGES
    cycles', and, when it reads acc[src], the cycle before is free; the last issue, plus
    17 (an ALU instruction's 8 past its last issue, 1 for that cycle, and LATENCY)."""
    depth = cfg.acc_depth
    held = (len(uops) == 1 and insn.src_factor_in == 0 and cfg.alu_hold and not insn.use_imm)
    issued = []   # (cycle, dst row)
    t = -1
    for o in range(insn.iter_out):
        for i in range(insn.iter_in):
            for uop in uops:
                dst = (uop.dst + o * insn.dst_factor_out + i * insn.dst_factor_in) % depth
                src = (uop.src + o * insn.src_factor_out + i * insn.src_factor_in) % depth
                reads = not insn.use_imm and (not held or (i == 0 and (
                    insn.src_factor_out != 0 or o == 0)))
                t += 1
                if reads and issued and issued[-1][0] == t - 1:
                    t += 1
                for when, row in issued:
                    if row == dst:
                        t = max(t, when + DST_AGES)
                    if reads and row == src:
                        t = max(t, when + SRC_AGES)
                issued.append((t, dst))
    return t + 1 + 8 + LATENCY


@cocotb.test()
async def divide_matches_functional_simulator_and_its_cycles(dut):
    """DIV (a config with it): by immediates, by acc rows (a chain through rows just
    divided), by a held row among its own destinations (with alu_hold), one row divided
    again and again, dividends and divisors of every sign and size; each instruction's
    cycles, retire to retire, are `divide_cycles`' (with the pipelined divider,
    `pipelined_divide_cycles`': N + 16 by an immediate, N + R + 15 by a held row read R
    times, 2 N + 15 by rows, without hazards) and alu_active counts one cycle a
    micro-op."""
    bench = await setup(dut, seed=8)
    rng, cfg = bench.rng, bench.cfg
    if AluOp.DIV not in cfg.alu_ops:
        dut._log.info("config %s has no divide", cfg.name)
        return
    gen = np.random.default_rng(8)
    lanes = (ROWS, cfg.batch, cfg.block_out)

    def rows():
        pools = [gen.integers(-2**31, 2**31, lanes), gen.integers(-50, 3000, lanes),
                 gen.integers(0, 1 << 20, lanes), gen.integers(-3, 40, lanes)]
        return np.choose(gen.integers(0, len(pools), lanes), pools).astype(np.int32)

    uops = [Uop(dst=d, src=16 + d) for d in range(4)] + [Uop(dst=4, src=5), Uop(dst=5, src=4)]
    held = [Uop(dst=6, src=7)]
    await bench.issue([bench.uop_table(uops), bench.uop_table(held, sram_base=8,
                                                              dram_base=300)])
    bench_uops = uops + [None, None] + held   # by SRAM address
    cases = [
        ("immediate", Alu(alu_opcode="DIV", use_imm=True, imm=7, uop_bgn=0, uop_end=1,
                          iter_out=2, iter_in=8, dst_factor_out=8, dst_factor_in=1), 1),
        ("immediate 0", Alu(alu_opcode="DIV", use_imm=True, imm=0, uop_bgn=0, uop_end=4,
                            iter_out=1, iter_in=1), 4),
        ("vector", Alu(alu_opcode="DIV", uop_bgn=0, uop_end=4, iter_out=2, iter_in=3,
                       dst_factor_in=1, src_factor_out=2), 4),
        ("vector chain", Alu(alu_opcode="DIV", uop_bgn=4, uop_end=6, iter_out=3, iter_in=1), 2),
        ("held, moving", Alu(alu_opcode="DIV", uop_bgn=8, uop_end=9, iter_out=3, iter_in=4,
                             dst_factor_out=4, dst_factor_in=1, src_factor_out=1), 1),
        ("held once", Alu(alu_opcode="DIV", uop_bgn=8, uop_end=9, iter_out=2, iter_in=4,
                          dst_factor_out=1, dst_factor_in=1), 1),
        ("reset", Alu(alu_opcode="DIV", reset_reg=True, uop_bgn=0, uop_end=4, iter_out=1,
                      iter_in=2, dst_factor_in=8), 4),
        # Hazards of a pipelined divider: one row again and again, rows 4 apart, and
        # rows 2 apart by a held row that they then divide (a softmax's shape, longer).
        ("one row", Alu(alu_opcode="DIV", use_imm=True, imm=3, uop_bgn=0, uop_end=1,
                        iter_out=1, iter_in=4), 1),
        ("rows 4 apart", Alu(alu_opcode="DIV", use_imm=True, imm=2, uop_bgn=0, uop_end=1,
                             iter_out=3, iter_in=4, dst_factor_in=1), 1),
        ("held, 16 rows", Alu(alu_opcode="DIV", uop_bgn=8, uop_end=9, iter_out=1,
                              iter_in=16, dst_factor_in=1), 1),
        ("vector, apart", Alu(alu_opcode="DIV", uop_bgn=0, uop_end=4, iter_out=2, iter_in=1,
                              dst_factor_out=4, src_factor_out=4), 4),
    ]
    # The pipelined divider's closed forms on the cases without hazards.
    pipelined = {"immediate": 16 + 16, "vector, apart": 2 * 8 + 15,
                 "held, 16 rows": 16 + 1 + 15}
    for kind, insn, n_uops in cases:
        await bench.issue([bench.acc_image(rows())])
        cycles, active = await timed(bench, insn, dut.alu_active)
        await bench.check(f"DIV {kind} {insn}")
        micro_ops = insn.iter_out * insn.iter_in * n_uops
        want = (micro_ops + 8 if insn.reset_reg
                else pipelined_divide_cycles(insn, bench_uops[insn.uop_bgn:insn.uop_end], cfg)
                if cfg.div_pipeline else divide_cycles(insn, n_uops, cfg.alu_hold))
        if cfg.div_pipeline and kind in pipelined and (kind != "held, 16 rows" or cfg.alu_hold):
            assert want == pipelined[kind], (kind, want)   # the model's closed forms
        dut._log.info("DIV %s, %d micro-ops: %d cycles retire to retire", kind, micro_ops,
                      cycles)
        assert active == (0 if insn.reset_reg else micro_ops), (kind, active)
        assert cycles == want, f"DIV {kind}: {cycles} cycles retire to retire, not {want}"
    # An ADD right behind a DIV reads the rows it divided.
    add = Alu(alu_opcode="ADD", uop_bgn=0, uop_end=4, iter_out=1, iter_in=1)
    await bench.issue([bench.acc_image(rows()), cases[2][1], add])
    await bench.check("ADD behind DIV")
