"""Dependency tokens around SRAM regions (`vdla.runtime.tokens`) and the builder's
`push_at`: tokens only where something waits, queues kept first in first out, and
programs that run on the functional simulator without a deadlock or a leftover token."""

import numpy as np
import pytest

import vdla
from vdla.isa import Gemm, Load, MemoryType, Store, Uop, encode_uops
from vdla.runtime import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.tokens import PingPong, RegionTokens
from vdla.sim import FunctionalSimulator

CFG = vdla.HardwareConfig()


def test_ping_pong_regions():
    regions = PingPong(100)
    assert [regions.base(k) for k in range(5)] == [0, 100, 0, 100, 0]
    assert regions.total == 200
    assert [PingPong(7, 3).base(k) for k in range(4)] == [0, 7, 14, 0]
    with pytest.raises(ValueError, match="size >= 0 and count >= 1"):
        PingPong(4, 0)


def test_push_at_sets_an_earlier_instruction_and_keeps_queues_in_order():
    p = ProgramBuilder(CFG)
    first = p.gemm(reset_reg=True, uop_end=1, iter_out=1, iter_in=1)
    second = p.gemm(reset_reg=True, uop_end=1, iter_out=1, iter_in=1)
    load = p.load(MemoryType.INP, y_size=1, x_size=1, x_stride=1)
    with pytest.raises(ValueError, match=f"instruction {load} is not a compute instruction"):
        p.push_at(load, COMPUTE, LOAD)
    p.push_at(second, COMPUTE, LOAD)
    with pytest.raises(ValueError, match="already pushes a compute->load token"):
        p.push_at(second, COMPUTE, LOAD)
    # A token from `first` would sit behind `second`'s in the queue: the pop meant for it
    # would take the other one.
    with pytest.raises(ValueError, match="would come after the one instruction 1 pushes"):
        p.push_at(first, COMPUTE, LOAD)
    assert p.last_index(COMPUTE) == second and p.last_index(LOAD) == load
    with pytest.raises(ValueError, match="no store instruction yet"):
        p.last_index(STORE)


def _tiles_program(tiles: int, regions: int) -> tuple:
    """A program that copies `tiles` tiles through `regions` ping-pong regions of the inp
    buffer (load, GEMM with identity weights, store), its tokens from `RegionTokens`.
    Returns (program, builder flags per instruction)."""
    p = ProgramBuilder(CFG)
    tokens = RegionTokens(p)
    inp, acc = PingPong(1, regions), PingPong(1, regions)
    p.load(MemoryType.UOP, dram_base=0, y_size=1, x_size=regions, x_stride=regions)
    p.load(MemoryType.WGT, dram_base=1, y_size=1, x_size=1, x_stride=1)
    for k in range(tiles):
        tokens.load_into(("inp", inp.base(k)))
        p.load(MemoryType.INP, sram_base=inp.base(k), dram_base=2 + k, y_size=1, x_size=1,
               x_stride=1)
        tokens.loaded()
        tokens.wait_loaded()
        tokens.compute_into(("acc", acc.base(k)))
        p.gemm(reset_reg=True, uop_bgn=k % regions, uop_end=k % regions + 1, iter_out=1,
               iter_in=1)
        p.gemm(uop_bgn=k % regions, uop_end=k % regions + 1, iter_out=1, iter_in=1)
        tokens.read(("inp", inp.base(k)))
        tokens.computed()
        tokens.wait_computed()
        p.store(sram_base=acc.base(k), dram_base=64 + k, y_size=1, x_size=1, x_stride=1)
        tokens.stored(("acc", acc.base(k)))
    return tokens.finish()


@pytest.mark.parametrize("regions", [1, 2, 3])
def test_region_tokens_make_programs_that_run(regions):
    tiles = 6
    program = _tiles_program(tiles, regions)
    loads = [i for i in program if isinstance(i, Load) and i.memory_type == MemoryType.INP]
    gemms = [i for i in program if isinstance(i, Gemm) and not i.reset_reg]
    stores = [i for i in program if isinstance(i, Store) and i.x_size]
    # A load waits only when its region was read before; a GEMM pushes only when its
    # region is loaded again; the same for the stores' regions.
    assert [i.pop_next for i in loads] == [k >= regions for k in range(tiles)]
    assert [i.push_prev for i in gemms] == [k + regions < tiles for k in range(tiles)]
    assert [i.push_prev for i in stores[:-1]] == [k + regions < tiles
                                                  for k in range(tiles - 1)]
    assert stores[-1].push_prev                      # FINISH waits for the last store

    # Run it: identity weights copy each tile through the accumulators.
    dram = np.zeros(1 << 16, np.uint8)
    sim = FunctionalSimulator(CFG, dram)
    uops = encode_uops([Uop(dst=acc, src=inp, wgt=0) for acc, inp in
                        zip(range(regions), range(regions))], CFG)
    dram[:len(uops)] = np.frombuffer(uops, np.uint8)
    w = np.eye(CFG.block_out, CFG.block_in, dtype=np.int8)
    dram[CFG.wgt_elem_bytes:2 * CFG.wgt_elem_bytes] = w.view(np.uint8).ravel()
    x = np.random.default_rng(0).integers(-128, 128, (tiles, CFG.block_in), np.int8)
    base = 2 * CFG.inp_elem_bytes
    dram[base:base + x.nbytes] = x.view(np.uint8).ravel()
    sim.run(program)
    out = dram[64 * CFG.out_elem_bytes:(64 + tiles) * CFG.out_elem_bytes].view(np.int8)
    np.testing.assert_array_equal(out.reshape(tiles, -1), x)


def test_a_wait_out_of_queue_order_is_refused():
    """Two regions read in one order but reloaded in the other: the second wait would pair
    with the wrong token, and the builder says so while the program is built."""
    p = ProgramBuilder(CFG)
    tokens = RegionTokens(p)
    for region in ("a", "b"):
        tokens.load_into(region)
        p.load(MemoryType.INP, y_size=1, x_size=1, x_stride=1)
        tokens.loaded()
        tokens.wait_loaded()
        p.gemm(reset_reg=True, uop_end=1, iter_out=1, iter_in=1)
        tokens.read(region)
    tokens.load_into("b")
    with pytest.raises(ValueError, match="tokens are first in, first out"):
        tokens.load_into("a")
