"""Convolution schedules of the CPU target: the knobs, their checks, the
default chooser and the space the tuner searches.

A convolution (`vdla.compiler.targets.cpu.conv`) computes the output as a grid of
pixels (each output row padded to the input's row pitch) times output channels. Its
`ConvSchedule`:

    vl       lanes per vector (16: 512-bit, 8: 256-bit): the vector width
    mr       output channels held in registers (the register tile's rows)
    nv       vectors of pixels held in registers (tile_w = nv * vl pixels)
    tile_co  output channels per parallel work item (a multiple of mr)
    tile_h   output rows per parallel work item
    tile_ci  input channels summed per pass over the accumulators (the rest of a
             group's channels in later passes, the partial sums kept in scratch)
    order    within a work item: "co" (channel tiles outer, pixel blocks inner: the
             weights stay in cache) or "px" (pixel blocks outer: the input stays)
    unroll   unroll factor of the input-channel loop
    parallel which loops OpenMP splits: "all" (groups x channel tiles x row tiles),
             "co" (channel tiles; rows in each thread), "h" (row tiles) or "none" (one
             thread: for layers too small to pay for starting the others)
    lanes    what the vectors run along: "px" (pixels, as above) or "co" (output
             channels: float32 pointwise layers only, `vdla.compiler.targets.cpu.pointwise`;
             there the register tile is mr pixels (a multiple of 8) by nv vectors of
             channels, and tile_co a multiple of nv * vl)
    layout   "plain" (NCHW) or "nchwc" (blocked, `vdla.compiler.targets.cpu.blocked`:
             mr pixels by nv channel vectors, every input channel in one pass)
    wino     0 (direct) or 2: Winograd F(2x2, 3x3) on the blocked layout
             (`vdla.compiler.targets.cpu.winograd`; mr is then 2x2 tiles)

Packing: the weights are packed for the schedule (``[group][channel tile][input
channels][tap][mr]``, int8 ones four input channels to a 32-bit word), the input is
repacked once per run (padded, split by stride phase, int8 four channels to a pixel).

The dense layers' `DenseSchedule` is `vdla.compiler.targets.cpu.dense_schedule`'s, the
batched matrix products' `MatmulSchedule` `vdla.compiler.targets.cpu.matmul_schedule`'s
(they share `MAX_TILE`, `tile_fits`, `check_int` and `knobs_from_dict`).

`ScheduleError` (a ValueError) names the knob, its value and what is allowed.

The default choosers take the machine as a `MachineCosts` (`machine.MachineModel.costs`:
FMA lanes a cycle at each vector width, L1d and L2 a core), `NOMINAL` when none is given:
the AMD EPYC host whose measurements set the rules and constants below.

Why this module is long: one `ConvSchedule` covers every convolution kernel (pixel
vectors, channel vectors on plain layouts, blocked layouts), and its checks, the
default chooser and the tuner's space of each kernel share the register budget
(`tile_fits`) and the work and cache terms of the chooser's cost model; split, the three
would import each other's private helpers.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts

__all__ = ["ConvSchedule", "LANES", "LAYOUTS", "MAX_TILE", "ORDERS", "PARALLEL",
           "SERIAL_MACS", "ScheduleError", "SpaceBlock", "UNROLLS", "blocked_fits",
           "check_int", "choose_conv", "conv_blocks", "conv_space", "cost_terms",
           "estimate_conv", "flattens", "input_block", "knobs_from_dict", "tile_fits",
           "WINOGRAD", "winograd_fits"]

ORDERS = ("co", "px")
LANES = ("px", "co")
#: Activation layouts (`vdla.compiler.targets.cpu.layout`): plain NCHW, or NCHW{vl}c.
LAYOUTS = ("plain", "nchwc")
PARALLEL = ("all", "co", "h", "none")
#: Below this many multiply-adds a layer runs on one thread by default: starting and
#: joining the OpenMP team (some microseconds) costs more than the second core saves.
SERIAL_MACS = 150_000
UNROLLS = (1, 2, 4)
#: Accumulator registers a register tile may use at most (the rest hold the input
#: vectors and the loop's pointers).
MAX_TILE = {32: 28, 16: 12}


class ScheduleError(ValueError):
    """A schedule that does not fit its op: the message names the knob and the value."""


def check_int(name: str, value, low: int, high: int | None = None, *,
              what: str = "") -> int:
    """`value` of knob `name` when it is an integer in [low, high]; else `ScheduleError`
    naming the knob, the value and the range (`what` adds to the message)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"schedule knob {name} must be an integer, not {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ScheduleError(f"schedule knob {name}={value} is out of range: it must be "
                            f"{allowed}{what}")
    return value


def tile_fits(mr: int, nv: int, isa: Isa) -> bool:
    """Whether a register tile of mr x nv accumulators, plus nv vectors loaded per step,
    fits `isa`'s vector registers (two are left for the broadcast and the compiler)."""
    return mr * nv <= MAX_TILE[isa.registers] and mr * nv + nv <= isa.registers - 2


def _heights(conv) -> list[int]:
    """Rows per work item the chooser and the tuner consider."""
    return sorted({h for h in _HEIGHTS + (conv.ho,) if h <= conv.ho})


def knobs_from_dict(cls, data, what: str):
    """`cls` from its `to_dict` form, or `ScheduleError` naming the fields it needs.
    Fields with defaults may be missing (records written before the knob existed meant
    its default)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    needed = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    if not isinstance(data, dict) or not needed <= set(data) <= fields:
        raise ScheduleError(f"a CPU {what} schedule needs the fields {sorted(needed)} "
                            f"(and may have {sorted(fields - needed)}), not {data!r}")
    return cls(**data)


@dataclasses.dataclass(frozen=True)
class ConvSchedule:
    """See the module docstring."""

    vl: int
    mr: int
    nv: int
    tile_co: int
    tile_h: int
    tile_ci: int
    order: str = "co"
    unroll: int = 1
    parallel: str = "all"
    lanes: str = "px"
    layout: str = "plain"
    wino: int = 0

    @property
    def unit(self) -> int:
        """Output channels of one register tile."""
        return self.nv * self.vl if self.lanes == "co" else self.mr

    def check(self, conv, isa: Isa) -> "ConvSchedule":
        """This schedule, or `ScheduleError` naming the knob that does not fit `conv`
        (a `vdla.compiler.targets.cpu.conv.ConvShape`) on `isa`."""
        if self.lanes not in LANES:
            raise ScheduleError(f"schedule knob lanes={self.lanes!r}: allowed "
                                f"{list(LANES)}")
        if self.layout not in LAYOUTS:
            raise ScheduleError(f"schedule knob layout={self.layout!r}: allowed "
                                f"{list(LAYOUTS)}")
        if self.wino and self.layout != "nchwc":
            raise ScheduleError(f"schedule knob wino={self.wino!r} (Winograd) runs on the "
                                f"blocked layout: layout must be 'nchwc', not "
                                f"{self.layout!r}; allowed wino=0")
        if self.layout == "nchwc":
            return self._check_blocked(conv, isa)
        if self.lanes == "co" and not conv.pointwise:
            raise ScheduleError(
                f"schedule knob lanes='co' (vectors along output channels) needs a float32 "
                f"1x1 convolution with stride 1, no padding and one group, not "
                f"{conv.dtype} {conv.describe()} (pads {(conv.pt, conv.pl, conv.pb, conv.pr)}); "
                f"allowed lanes='px'")
        if self.vl not in isa.lanes:
            raise ScheduleError(f"schedule knob vl={self.vl!r} is not a vector width of "
                                f"the {isa.name} code: allowed {list(isa.lanes)}")
        budget = MAX_TILE[isa.registers]
        check_int("mr", self.mr, 1, 1 if conv.depthwise else budget,
                   what=" (a depthwise convolution computes one channel at a time)"
                   if conv.depthwise else "")
        if self.lanes == "co" and self.mr % 8:
            raise ScheduleError(f"schedule knob mr={self.mr!r} must be a multiple of 8 "
                                f"with lanes='co' (the tile is stored in 8x8 transposes)")
        self._check_registers(isa, "input")
        unit = self.unit
        unit_name = "nv * vl" if self.lanes == "co" else "mr"
        check_int("tile_co", self.tile_co, unit, None,
                   what=f" (at least {unit_name}={unit})")
        if self.tile_co % unit:
            raise ScheduleError(f"schedule knob tile_co={self.tile_co} must be a multiple "
                                f"of {unit_name}={unit}")
        if self.tile_co > conv.og_padded(unit):
            raise ScheduleError(f"schedule knob tile_co={self.tile_co} exceeds the "
                                f"{conv.og} output channels per group (rounded up to "
                                f"{unit_name}: {conv.og_padded(unit)})")
        check_int("tile_h", self.tile_h, 1, conv.ho,
                   what=f" (the output has {conv.ho} rows)")
        step = conv.ci_step
        check_int("tile_ci", self.tile_ci, step, conv.cg_padded,
                   what=f" (the group has {conv.cg} input channels"
                        + (f", padded to {conv.cg_padded}" if conv.cg_padded != conv.cg
                           else "") + ")")
        if self.tile_ci % step:
            raise ScheduleError(f"schedule knob tile_ci={self.tile_ci} must be a multiple "
                                f"of {step} (int8 sums four input channels per step)")
        return self._check_loops()

    def _check_loops(self) -> "ConvSchedule":
        """The loop knobs every layout shares: order, unroll and the split."""
        if self.order not in ORDERS:
            raise ScheduleError(f"schedule knob order={self.order!r}: allowed "
                                f"{list(ORDERS)}")
        if self.unroll not in UNROLLS:
            raise ScheduleError(f"schedule knob unroll={self.unroll!r}: allowed "
                                f"{list(UNROLLS)}")
        if self.parallel not in PARALLEL:
            raise ScheduleError(f"schedule knob parallel={self.parallel!r}: allowed "
                                f"{list(PARALLEL)}")
        return self

    def _check_registers(self, isa: Isa, loaded: str) -> None:
        """Whether the register tile (and its `loaded` vectors: the inputs or the weights
        each step loads) fits `isa`'s registers."""
        budget = MAX_TILE[isa.registers]
        check_int("nv", self.nv, 1, budget)
        if not tile_fits(self.mr, self.nv, isa):
            raise ScheduleError(
                f"schedule knobs mr={self.mr} and nv={self.nv} need {self.mr * self.nv} "
                f"accumulator and {self.nv} {loaded} registers; {isa.name} has "
                f"{isa.registers} vector registers (mr * nv <= {budget})")

    def _check_blocked(self, conv, isa: Isa) -> "ConvSchedule":
        """`check` for ``layout="nchwc"`` (`vdla.compiler.targets.cpu.blocked`): vectors
        along output channels, ``mr`` pixels by ``nv`` channel vectors."""
        if self.lanes != "co":
            raise ScheduleError(f"schedule knob layout='nchwc' runs vectors along output "
                                f"channels: lanes must be 'co', not {self.lanes!r}")
        if conv.groups != 1 and not conv.depthwise:
            raise ScheduleError(f"schedule knob layout='nchwc' needs one group or a "
                                f"depthwise convolution, not {conv.groups} groups of "
                                f"{conv.cg} channels; allowed layout='plain'")
        if conv.depthwise and (conv.og != 1 or self.nv != 1):
            raise ScheduleError(f"schedule knob layout='nchwc' runs a depthwise convolution "
                                f"with one output per channel (not {conv.og}) and one "
                                f"channel block per tile: nv must be 1, not {self.nv}")
        if self.vl not in isa.lanes:
            raise ScheduleError(f"schedule knob vl={self.vl!r} is not a vector width of "
                                f"the {isa.name} code: allowed {list(isa.lanes)}")
        check_int("mr", self.mr, 1, MAX_TILE[isa.registers],
                   what=" (output pixels in registers)")
        self._check_registers(isa, "weight")
        unit = self.unit
        channels = conv.o if conv.depthwise else conv.og
        top = -(-channels // unit) * unit
        check_int("tile_co", self.tile_co, unit, top,
                   what=f" (a multiple of nv * vl = {unit}, up to the {channels} output "
                        f"channels rounded up: {top})")
        if self.tile_co % unit:
            raise ScheduleError(f"schedule knob tile_co={self.tile_co} must be a multiple "
                                f"of nv * vl = {unit}")
        check_int("tile_h", self.tile_h, 1, conv.ho,
                   what=f" (the output has {conv.ho} rows)")
        if self.tile_ci != conv.cg_padded:
            raise ScheduleError(f"schedule knob tile_ci={self.tile_ci}: with "
                                f"layout='nchwc' every input channel is summed in registers "
                                f"in one pass, so tile_ci must be {conv.cg_padded}")
        if self.wino:
            self._check_winograd(conv, isa)
        return self._check_loops()

    def _check_winograd(self, conv, isa: Isa) -> None:
        """``wino=2`` (`vdla.compiler.targets.cpu.winograd`): a float32 3x3 layer with
        stride 1, no dilation, one group and a blocked input; one channel vector."""
        if self.wino not in WINOGRAD:
            raise ScheduleError(f"schedule knob wino={self.wino!r}: allowed "
                                f"{[0, *WINOGRAD]}")
        if not winograd_fits(conv, isa):
            raise ScheduleError(
                f"schedule knob wino={self.wino} (Winograd F(2x2,3x3)) needs a float32 3x3 "
                f"convolution with stride 1, no dilation, one group and at least "
                f"{_BLOCKED_MIN_CHANNELS} input channels, not {conv.dtype} "
                f"{conv.describe()}; allowed wino=0")
        if self.nv != 1:
            raise ScheduleError(f"schedule knob wino={self.wino} holds one channel vector "
                                f"per register tile: nv must be 1, not {self.nv}")

    def to_dict(self) -> dict:
        """The knobs by name; ``layout`` only when blocked and ``wino`` only when set,
        so that records and builds from before the knobs existed read and hash as they
        did."""
        out = dataclasses.asdict(self)
        if out["layout"] == "plain":
            del out["layout"]
        if not out["wino"]:
            del out["wino"]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ConvSchedule":
        return knobs_from_dict(cls, data, "conv")


def _blocks(total: int, size: int) -> int:
    return -(-total // size)


def _work(conv, mr: int, nv: int, vl: int, tile_h: int) -> int:
    """Vector multiply-adds of one image with register tile (mr, nv) and `tile_h` rows
    per work item: channels rounded up to mr, each item's grid rounded up to tiles."""
    block = nv * vl
    full, rest = divmod(conv.ho, tile_h)
    blocks = full * _blocks(tile_h * conv.grid_pitch, block)
    blocks += _blocks(rest * conv.grid_pitch, block) if rest else 0
    return conv.groups * conv.og_padded(mr) * blocks * nv * conv.reduction_steps


#: Measured on AVX-512 (a 16x1 tile beat every multi-vector tile on ResNet-18's layers):
#: a tile of one pixel vector by many channels runs fastest (one input load per step,
#: the weights broadcast from memory); each further vector costs about this much more
#: per multiply-add.
_NV_PENALTY = 0.15
_HEIGHTS = (1, 2, 4, 8, 16, 32)


#: Winograd F(2x2, 3x3)'s work against the direct convolution's: 16 multiply-adds per
#: 2x2 tile where the direct one does 36, plus the transforms (measured on ResNet-18's
#: float32 layers, AVX-512, 2 threads: 1.5-2.0x faster, about 0.55 of the time).
_WINOGRAD_WORK = 0.55


def estimate_conv(conv, s: ConvSchedule, threads: int = 2,
                  costs: MachineCosts = NOMINAL) -> float:
    """The chooser's cost of schedule `s`, in about cycles of one core of the machine
    `costs` describes (lower is better): padded vector multiply-adds scaled by its FMA
    rate for the width (`MachineCosts.work_scale`) over the threads (counting the idle
    ones of unbalanced work items), what extra pixel vectors cost, each tile's epilogue
    and loop start, reading beyond its L2 (`_restream`, `_first_block_stall`), and
    starting the OpenMP team."""
    items = conv.groups * _blocks(conv.og_padded(s.mr), s.tile_co) * _blocks(conv.ho, s.tile_h)
    team = 1 if s.parallel == "none" else threads
    balance = _blocks(items, team) * team / items
    cost = _work(conv, s.mr, s.nv, s.vl, s.tile_h) * (1 + _NV_PENALTY * (s.nv - 1))
    if s.wino:
        cost *= _WINOGRAD_WORK
    cost += 8 * conv.groups * conv.og_padded(s.mr) * s.nv * _blocks(
        conv.ho * conv.grid_pitch, s.nv * s.vl) / s.mr
    cost = cost * costs.work_scale(s.vl) * balance / team
    cost += (_restream(conv, s, costs) + _first_block_stall(conv, s, costs)) / team
    return cost + (0 if s.parallel == "none" else _TEAM_CYCLES)


def cost_terms(conv, s: ConvSchedule, costs: MachineCosts = NOMINAL) -> dict[str, float]:
    """Terms of `estimate_conv` for the learned models' features: ``work``, the register
    tiles' vector multiply-adds scaled by 16 / vl (padding included; the same on every
    machine); ``restream``, the cycles of reading weights and input again beyond the
    cache of the machine `costs` describes; ``stall``, the cycles a register tile waits
    for weights from memory there."""
    return {"work": _work(conv, s.mr, s.nv, s.vl, s.tile_h) * 16 / s.vl,
            "restream": _restream(conv, s, costs),
            "stall": _first_block_stall(conv, s, costs)}


#: Caches a layer's weights or input stay in across work items (bytes of a core's 1 MiB
#: L2: half of it, the other operand and the output take the rest; scaled to the
#: machine's L2, `MachineCosts.l2_bytes`), and bytes per cycle when they do not (from L3
#: or memory).
_CACHED = 512 * 1024
_STREAM_BYTES_PER_CYCLE = 12


#: Bytes per cycle a thread gets from memory while its register tile waits on them
#: (fitted: MobileNet-v1's 4 MB 7x7 float layer took 0.46 ms longer with its weights out
#: of cache, 1.27 bytes per thread-cycle; streaming alone reaches 28-32 GB/s).
_MEMORY_BYTES_PER_CYCLE = 1.25


#: Inputs up to this many bytes (of a 1 MiB L2) are re-read cheaply from L2 by narrow
#: channel tiles.
_SMALL_INPUT = 256 * 1024


def _first_block_stall(conv, s: ConvSchedule, costs: MachineCosts) -> float:
    """About the cycles a register tile waits for weights that come from memory: a
    channel tile's weights stream in while its first pixel block computes and stay in
    cache for the others, so a tile with few pixel blocks per row tile must hide the
    whole stream behind one block's work. Measured on MobileNet-v1's 7x7 1024->1024 float
    layer (4 MB of weights, 4 pixel blocks of one vector): 1.6-1.7x slower with its
    weights out of cache than in."""
    elem = 1 if conv.int8 else 4
    weights = conv.groups * conv.og_padded(s.mr) * conv.cg_padded * conv.kh * conv.kw * elem
    # Only 1x1, stride-1 layers with a small input: a wider tile of a kxk layer loads
    # every tap's shifted input vectors, and a narrower channel tile re-reads a large
    # input more often, which cost more than the wait (measured: ResNet-18's 7x7 3x3
    # float layers 1.45x slower with 4x4 tiles than with 16x1, ResNet-50's 2048->512
    # 1x1 and its strided 1x1 shortcut 1.2-1.3x slower; its 512->2048 1x1 1.34x faster).
    inputs = conv.cg_padded * conv.groups * conv.h * conv.w * elem
    if (weights <= costs.l2_bytes(_CACHED) or conv.kh * conv.kw != 1
            or conv.sh * conv.sw != 1 or inputs > costs.l2_bytes(_SMALL_INPUT)):
        return 0.0
    blocks = _blocks(min(s.tile_h, conv.ho) * conv.grid_pitch, s.nv * s.vl)
    stream = weights / _MEMORY_BYTES_PER_CYCLE * _blocks(conv.ho, s.tile_h)
    first = (_work(conv, s.mr, s.nv, s.vl, s.tile_h) * costs.work_scale(s.vl)
             / blocks)
    return max(0.0, stream - first)


def _restream(conv, s: ConvSchedule, costs: MachineCosts) -> float:
    """About the cycles spent reading weights and input again: every row tile reads all
    the weights of its channel tiles, every channel tile all the input of its rows; what
    exceeds `_CACHED` (scaled to the machine's L2) comes again from L3 or memory.
    Measured on MobileNet-v1's 7x7 1024->1024 float layer (4 MB of weights): split in 4
    row tiles it ran 1.7x slower in the model than alone, where the weights stay
    cached."""
    elem = 1 if conv.int8 else 4
    weights = conv.groups * conv.og_padded(s.mr) * conv.cg_padded * conv.kh * conv.kw * elem
    inputs = conv.groups * conv.cg_padded * conv.hq * conv.grid_pitch * len(conv.phases) * elem
    rows = _blocks(conv.ho, s.tile_h)
    channels = _blocks(conv.og_padded(s.mr), s.tile_co)
    extra = 0
    cached = costs.l2_bytes(_CACHED)
    if weights > cached:
        extra += (rows - 1) * weights
    if inputs > cached:
        extra += (channels - 1) * inputs
    return extra / _STREAM_BYTES_PER_CYCLE


#: What starting and joining an OpenMP team costs, in about cycles (some microseconds).
_TEAM_CYCLES = 15_000


def choose_conv(conv, isa: Isa, threads: int = 2, *, blocked: bool = True,
                costs: MachineCosts = NOMINAL) -> ConvSchedule:
    """The default schedule: the blocked layout where `blocked_fits` (and `blocked`),
    else the plain layout's register tile, rows per work item and channels per work
    item `estimate_conv` rates cheapest (channels per item: two register tiles), every
    input channel in one pass. `blocked=False` gives the plain layout's choice for every
    layer: what the target chose before it had blocked layouts (`bench/cpu_layers.py`
    compares the two).

    costs : the machine the schedule is for (`MachineModel.costs`; default `NOMINAL`,
        the AMD EPYC host the rules were measured on): its FMA rate at each vector
        width picks the width (`MachineCosts.vector_lanes`) and weighs the work against
        re-reading what leaves its L2; its L1d bounds a depthwise row tile."""
    vl = costs.vector_lanes(isa.lanes)
    if blocked and blocked_fits(conv, isa):
        return _choose_blocked(conv, isa, threads, vl)
    if conv.depthwise:
        return _choose_depthwise(conv, isa, threads, costs)
    if conv.pointwise and conv.h * conv.w <= _CHANNEL_LANES_PLANE:
        return _choose_channel_lanes(conv, isa, threads, vl)
    budget = MAX_TILE[isa.registers]
    heights = _heights(conv)
    top_mr = min(budget, 16 if isa.registers == 32 else 12, conv.og)
    best = None
    # One vector (many channels) or four (a whole small grid per tile): the tile shapes
    # that measured well; two and three vectors measured erratically (up to 1.9x slower).
    for mr, nv, tile_h in itertools.product(range(1, top_mr + 1), (1, 4), heights):
        if not tile_fits(mr, nv, isa):
            continue
        if conv.depthwise and mr > 1:
            continue
        tile_co = conv.og_padded(mr) if conv.depthwise else min(conv.og_padded(mr), 2 * mr)
        serial = conv.macs < SERIAL_MACS
        s = ConvSchedule(vl, mr, nv, tile_co, tile_h, conv.cg_padded,
                         parallel="none" if serial else "all")
        key = (estimate_conv(conv, s, threads, costs), -mr * nv, tile_h)
        if best is None or key < best[0]:
            best = (key, s)
    return best[1]


#: Input channels (per group) from which a one-group convolution reads a blocked input:
#: below it the channel block would be mostly padding (a 3-channel float32 stem layer,
#: padded to 16 channels, ran 3.8x slower than plain), so float32 reads the plain input
#: (`input_block`) and int8 keeps the plain layout.
_BLOCKED_MIN_CHANNELS = 8


def input_block(conv, vl: int) -> int:
    """The channel block a blocked one-group convolution reads its input in: `vl`, or 1
    (the plain layout, each channel a block of one) for a float32 layer with fewer than
    `_BLOCKED_MIN_CHANNELS` input channels (a model's RGB input)."""
    if not conv.int8 and not conv.depthwise and conv.cg < _BLOCKED_MIN_CHANNELS:
        return 1
    return vl


def flattens(conv) -> bool:
    """Whether a blocked kernel may cut `conv`'s plane in rows of any width
    (`vdla.compiler.targets.cpu.blocked`): a one-group 1x1 layer with stride 1 and no
    padding, whose input pixel p is its output pixel p."""
    return (conv.groups == 1 and not conv.depthwise and conv.kh == conv.kw == 1
            and conv.sh == conv.sw == 1 and not any((conv.pt, conv.pl, conv.pb, conv.pr)))


#: Winograd output tile sizes (``wino``): F(2x2, 3x3).
WINOGRAD = (2,)


def winograd_fits(conv, isa: Isa) -> bool:
    """Whether `conv` can run by Winograd's F(2x2, 3x3) on the blocked layout."""
    return (not conv.int8 and conv.groups == 1 and conv.kh == conv.kw == 3
            and conv.sh == conv.sw == 1 and conv.dh == conv.dw == 1
            and input_block(conv, isa.lanes[0]) != 1)


def blocked_fits(conv, isa: Isa) -> bool:
    """Whether the default chooser gives `conv` the blocked layout (`_choose_blocked`),
    and the tuner's space holds it (`conv_blocks`):
    a depthwise layer, a float32 one-group layer, or an int8 one with at least
    `_BLOCKED_MIN_CHANNELS` input channels (an input that may be negative is read as
    ``x + 128``; MobileNet-v2's expansion layers read the projections' signed sums, and
    a plain layer between blocked ones cost two conversions of a 6x-wide tensor)."""
    if conv.depthwise:
        return conv.og == 1
    if conv.groups != 1:
        return False
    return not conv.int8 or conv.cg >= _BLOCKED_MIN_CHANNELS


def _choose_blocked(conv, isa: Isa, threads: int, vl: int) -> ConvSchedule:
    """The blocked layout's default (measured on ResNet-18 and MobileNet-v1 at 2
    threads, AVX-512: 1.1-1.5x faster than the plain kernels on one-group layers, 2-5x
    on depthwise ones). One-group layers: a whole output row (up to the register budget:
    28 pixels on AVX-512) by one channel vector, each weight vector loaded once for that
    many broadcast multiply-adds (with the next tile's weights prefetched, this beat
    wider channel tiles on ResNet-18's 7x7 int8 layers too: 7x1 1.15x faster than 7x3);
    AVX2 differs (below). Depthwise layers: 8 pixels by one channel block. Work items are
    one register tile of channels by whole planes, cut in row tiles only when there are
    too few channel tiles for the team; `vl` lanes a vector (the block)."""
    budget = MAX_TILE[isa.registers]
    blocks = _blocks(conv.o if conv.depthwise else conv.og, vl)
    order, per_item, unroll = "co", 1, 1          # per_item: register tiles per work item
    if conv.depthwise:
        mr, nv = min(8, conv.wo), 1
    elif input_block(conv, vl) == 1:
        # A stem layer reading its plain input: 7 pixels by two channel vectors (ResNet's
        # 7x7 and MobileNet's 3x3 stride-2 stems, 1.45x faster than whole rows); fewer
        # pixels where the registers do not hold that (AVX2: 6 by 2).
        mr, nv = min(7, conv.wo), min(2, blocks)
        while not tile_fits(mr, nv, isa):
            mr -= 1
    elif winograd_fits(conv, isa):
        # Winograd F(2x2, 3x3): a register tile of as many 2x2 tiles as the registers
        # hold (1.5-2.0x faster than the direct kernel on ResNet-18's 3x3 float layers,
        # 56x56 to 7x7; AVX-512, 2 threads).
        return _choose_winograd(conv, isa, threads, vl)
    elif not conv.int8 and conv.kh == conv.kw == 1 and isa.registers == 32 and blocks > 1:
        # Float32 1x1 layers on AVX-512: 14 pixels by two channel vectors, each input
        # value read by two multiply-adds as a folded broadcast (`vf16_fma_bcast`), so
        # the input is read half as often as with one vector: MobileNet-v1 1.08x and
        # ResNet-50 1.05-1.07x faster in the whole graph (2 threads), though level with
        # one vector when a layer is timed alone. Two register tiles per work item, the
        # rows outer (`order="px"`: each input row serves both, and no prefetch of the
        # next tile's weights, which here cost more than it saved): MobileNet-v1 1.05x
        # faster again, ResNet-50 level.
        mr, nv = min(14, conv.ho * conv.wo if flattens(conv) else conv.wo), 2
        order, per_item = "px", min(2, _blocks(blocks, nv))
    elif isa.registers == 16 and blocks > 1 and conv.int8 and conv.kh * conv.kw > 1:
        mr, nv, per_item, unroll = _avx2_int8_taps_tile(conv)
        order = "px"
    elif isa.registers == 16 and blocks > 1:
        # AVX2: 6 pixels by two vectors, rows outer (a row by one vector spilled int8's
        # products), float32 unrolled twice; int8 layers of more than one tap differ
        # (`_avx2_int8_taps_tile`). bench/cpu_knobs.py, AMD EPYC AVX2: ResNet-50 /
        # MobileNet-v1 float32 1.14x / 1.15x (unrolled 1.06x / 1.04x more), int8 1.04x / 1.07x.
        mr, nv = min(6, conv.ho * conv.wo if flattens(conv) else conv.wo), 2
        order, per_item, unroll = "px", min(2, _blocks(blocks, nv)), 1 if conv.int8 else 2
    else:
        # A whole row, or for a 1x1 layer whose rows a tile can reach over
        # (`blocked._flattened`) as many pixels as the registers hold (MobileNet-v1's
        # 14x14 pointwise layers 1.04x faster than one row, its 7x7 ones level).
        mr, nv = min(budget, conv.ho * conv.wo if flattens(conv) else conv.wo), 1
    cts = _blocks(blocks, nv * per_item)
    tile_h = conv.ho
    if cts < 2 * threads:
        tile_h = _blocks(conv.ho, _blocks(2 * threads, cts))
    serial = conv.macs < SERIAL_MACS
    return ConvSchedule(vl, mr, nv, per_item * nv * vl, tile_h, conv.cg_padded, order,
                        unroll, "none" if serial else "all", lanes="co", layout="nchwc")


def _avx2_int8_taps_tile(conv) -> tuple[int, int, int, int]:
    """An AVX2 int8 layer of more than one tap: (mr, nv, register tiles per work item,
    unroll). Rows of up to 7 pixels are one tile of one channel vector; wider ones 2
    pixels by one vector, the reduction unrolled twice, one register tile per work item.
    bench/cpu_knobs.py --kernel 3x3, AMD EPYC AVX2, 2 threads: ResNet-18 int8 1.14x,
    ResNet-50 1.03x the whole graph against 6 x 2, whose twelve accumulators, two weight
    vectors, the broadcast and ``vpmaddubsw``'s product and ones leave AVX2's sixteen
    registers short (gcc wrote 183 vector spills to the stack in a 3x3 layer's 6 x 2
    kernel, 12 in its 2 x 1). On the 7x7 layers 7 x 1 measured 1.08x against 6 x 2 (a
    row of 7 is 6 + 1) alone, where 2 x 1 gained 1.02x."""
    if conv.wo <= 7:
        return conv.wo, 1, 2, 1
    return 2, 1, 1, 2


def _choose_winograd(conv, isa: Isa, threads: int, vl: int) -> ConvSchedule:
    """A Winograd layer's default: `MAX_TILE` tiles by one channel vector of `vl` lanes,
    one channel block per work item, whole planes unless there are too few blocks for
    the team."""
    blocks = _blocks(conv.og, vl)
    tile_h = conv.ho
    if blocks < 2 * threads:
        tile_h = 2 * _blocks(_blocks(conv.ho, 2), _blocks(2 * threads, blocks))
    return ConvSchedule(vl, MAX_TILE[isa.registers], 1, vl, min(tile_h, conv.ho),
                        conv.cg_padded, "co", 1, "all", lanes="co", layout="nchwc", wino=2)


#: Float32 pointwise layers with planes of up to this many pixels default to vectors
#: along output channels (`vdla.compiler.targets.cpu.pointwise`). Measured in MobileNet-v1
#: (AVX-512, 2 threads): its 14x14 and 7x7 layers 1.15-1.3x faster than with the best
#: pixel-vector tile; its 28x28 and larger ones 1.0-1.25x slower (or level, depending on
#: the machine's phase), so they keep pixel vectors.
_CHANNEL_LANES_PLANE = 256


def _choose_channel_lanes(conv, isa: Isa, threads: int, vl: int) -> ConvSchedule:
    """A small-plane pointwise layer's default: 8 pixels by one vector of channels,
    the input-channel loop unrolled twice, every input channel in one pass. In the model
    this narrow tile beat the wider ones (8x2, 8x3, 16x1: 1.05-1.3x slower): its weight
    panel (one vector of channels by the input channels) stays in L1 while the tile
    sweeps the pixels. Whole planes per work item unless there are too few channel
    tiles to share among the threads. `vl` lanes a vector."""
    tiles = _blocks(conv.og, vl)
    rows = _blocks(2 * threads, tiles) if tiles < 2 * threads else 1
    tile_h = next((h for h in reversed(_heights(conv)) if _blocks(conv.ho, h) >= rows), 1)
    serial = conv.macs < SERIAL_MACS
    return ConvSchedule(vl, 8, 1, vl, tile_h, conv.cg_padded, "co", 2,
                        "none" if serial else "all", lanes="co")


#: A depthwise work item's slice of its channel's planes should stay in L1 (bytes of a
#: 32 KiB L1d; scaled to the machine's, `MachineCosts.l1_bytes`).
_DEPTHWISE_LOCAL = 32 * 1024


def _choose_depthwise(conv, isa: Isa, threads: int, costs: MachineCosts) -> ConvSchedule:
    """A depthwise layer's default, after what the tuner found on MobileNet-v1 (default
    1.0-1.6x slower at 56x56 and up, 2.6-3.9x at 14x14 and 7x7 before this rule): the
    vector width whose padded output row takes the fewest cycles at the machine's FMA
    rate for it (where the widths run level, as on Zen 4, the one that pads least),
    enough vectors to cover the row (up to 4), and whole planes per work item unless a
    plane's slice would outgrow the machine's L1d."""
    vl = min(isa.lanes, key=lambda v: (_blocks(conv.wo, v) * v / costs.lanes_per_cycle(v),
                                       -v))
    nv = max(1, min(4, _blocks(conv.wo, vl)))
    elem = 1 if conv.int8 else 4
    reach = ((conv.kh - 1) * conv.dh) // conv.sh
    tile_h = conv.ho
    while tile_h > 1 and len(conv.phases) * (tile_h + reach) * conv.grid_pitch * elem \
            > costs.l1_bytes(_DEPTHWISE_LOCAL):
        tile_h = _blocks(tile_h, 2)
    serial = conv.macs < SERIAL_MACS
    return ConvSchedule(vl, 1, nv, conv.og_padded(1), tile_h, conv.cg_padded,
                        parallel="none" if serial else "all")


def conv_space(conv, isa: Isa) -> Iterator[ConvSchedule]:
    """Every schedule the tuner may try for `conv`, in a fixed order (the default
    chooser's choice among them): `conv_blocks`' products in turn."""
    for fixed, axes in conv_blocks(conv, isa):
        names = [name for name, _ in axes]
        for values in itertools.product(*(v for _, v in axes)):
            yield ConvSchedule(**fixed, **dict(zip(names, values)))


#: A block of a space: the fields it fixes, and each other field with its values, in
#: order (the last varies fastest). `CpuTask.space` keeps the blocks of a layer's space,
#: which reach a million schedules a model, rather than list them.
SpaceBlock = tuple[dict, tuple[tuple[str, tuple], ...]]


def conv_blocks(conv, isa: Isa) -> list[SpaceBlock]:
    """`conv`'s schedule space as products, one a register tile (vector width, rows,
    vectors, lanes) crossed with its cache tiles, loop orders, unrolls and splits."""
    budget = MAX_TILE[isa.registers]
    h_options = _heights(conv)
    if conv.depthwise:     # the default's halvings of the rows too
        h = conv.ho
        while h > 1:
            h = _blocks(h, 2)
            h_options = sorted(set(h_options) | {h})
    ci_options = tuple(sorted({c for c in (64, 128, 256, conv.cg_padded)
                               if conv.ci_step <= c <= conv.cg_padded and c % conv.ci_step == 0}))
    h_options = tuple(h_options)
    grid = conv.ho * conv.grid_pitch
    depthwise = conv.depthwise
    # A depthwise layer runs one loop order, no unroll, and no split by channel tiles.
    orders, unrolls = (("co",), (1,)) if depthwise else (ORDERS, UNROLLS[:2])
    parallels = tuple(p for p in PARALLEL if not (depthwise and p == "co"))
    blocks = []
    for vl in isa.lanes:
        for mr, nv in itertools.product(range(1, budget + 1), range(1, 7)):
            if not tile_fits(mr, nv, isa) or mr > conv.og:
                continue
            if (nv - 1) * vl >= grid or (depthwise and mr > 1):
                continue
            co_options = sorted({min(mr * k, conv.og_padded(mr)) for k in (1, 2, 4, 8)}
                                | {conv.og_padded(mr)})
            if depthwise:
                co_options = [conv.og_padded(mr)]
            blocks.append(({"vl": vl, "mr": mr, "nv": nv, "lanes": "px", "layout": "plain",
                            "wino": 0},
                           (("tile_co", tuple(co_options)), ("tile_h", h_options),
                            ("tile_ci", ci_options), ("order", orders), ("unroll", unrolls),
                            ("parallel", parallels))))
    if conv.pointwise:
        blocks += _channel_lanes_blocks(conv, isa, h_options, ci_options)
    # The blocked layout where the default chooser would take it: the int8 stems' (3
    # input channels) blocked kernels read 4-channel words of a plain input and ran
    # 3-4x slower than the plain ones (MobileNet-v1's stem 391 against 96 us at 2
    # threads), yet the learned model ranked them first, and `--chooser learned` picked
    # them on every int8 zoo model.
    if blocked_fits(conv, isa):
        blocks += _blocked_blocks(conv, isa, h_options)
    return blocks


#: Register tiles' pixel counts the tuner tries with the blocked layout (and the row's
#: width, where it fits): whole rows of ResNet's and MobileNet's 7, 14 and 28-wide planes.
_BLOCKED_PIXELS = (1, 2, 4, 6, 7, 8, 12, 14, 16, 28)


def _blocked_blocks(conv, isa: Isa, h_options) -> list[SpaceBlock]:
    """A convolution's schedules on the blocked layout: a register tile (vector width,
    pixels, channel vectors) crossed with channels and rows per work item, loop order,
    unroll and split; the default chooser's among them."""
    budget = MAX_TILE[isa.registers]
    # The default's rows per work item depend on the team: every team size's is here.
    chosen = [_choose_blocked(conv, isa, team, vl) for team in (1, 2, 4, 8, 16, 32, 64)
              for vl in isa.lanes]
    row = conv.ho * conv.wo if flattens(conv) else conv.wo     # a tile's pixels at most
    pixels = sorted({p for p in _BLOCKED_PIXELS + (min(row, budget),) if p <= row}
                    | {c.mr for c in chosen})
    heights = tuple(sorted(set(h_options) | {c.tile_h for c in chosen}))
    channels = conv.o if conv.depthwise else conv.og
    blocks = []
    for vl in isa.lanes:
        for mr, nv in itertools.product(pixels, (1,) if conv.depthwise else (1, 2, 3, 4)):
            width = nv * vl
            if not tile_fits(mr, nv, isa) or (nv - 1) * vl >= channels:
                continue
            top = _blocks(channels, width) * width
            co_options = tuple(sorted({min(width * k, top) for k in (1, 2, 4)}))
            for wino in (0, *WINOGRAD) if nv == 1 and winograd_fits(conv, isa) else (0,):
                blocks.append(({"vl": vl, "mr": mr, "nv": nv, "lanes": "co",
                                "layout": "nchwc", "wino": wino},
                               (("tile_co", co_options), ("tile_h", heights),
                                ("tile_ci", (conv.cg_padded,)),
                                ("order", ORDERS), ("unroll", UNROLLS[:2]),
                                ("parallel", PARALLEL))))
    return blocks


def _channel_lanes_blocks(conv, isa: Isa, h_options, ci_options) -> list[SpaceBlock]:
    """A pointwise layer's schedules with vectors along output channels."""
    blocks = []
    for vl in isa.lanes:
        for mr, nv in ((8, 1), (8, 2), (8, 3), (16, 1)):
            if not tile_fits(mr, nv, isa) or (nv - 1) * vl >= conv.og:
                continue
            width = nv * vl
            co_options = tuple(sorted({min(width * k, conv.og_padded(width))
                                       for k in (1, 2, 4)}))
            blocks.append(({"vl": vl, "mr": mr, "nv": nv, "lanes": "co", "layout": "plain",
                            "wino": 0},
                           (("tile_co", co_options), ("tile_h", h_options),
                            ("tile_ci", ci_options), ("order", ORDERS),
                            ("unroll", UNROLLS[:2]), ("parallel", PARALLEL))))
    return blocks
