"""Dependency tokens around shared SRAM regions: the one place emitters decide them.

The load, compute and store modules run decoupled; the only thing that orders them is
the four token queues (`ProgramBuilder.dep_push` / `dep_pop`). A program that overlaps
tiles (virtual threads, ping-pong buffers) needs a token for every hazard on every
region of a buffer:

* **RAW load -> compute**: compute reads what load wrote (`loaded` / `wait_loaded`);
* **WAR compute -> load**: load overwrites a region compute has read (`read` records the
  last reader; `load_into` waits for it);
* **RAW compute -> store**: store reads what compute wrote (`computed` /
  `wait_computed`);
* **WAR store -> compute**: compute overwrites a region store has read (`stored` records
  the last store; `compute_into` waits for it).

A WAR token is pushed only when a later instruction waits for it: `read` and `stored`
remember the instruction, and `load_into` / `compute_into` set its push flag then
(`ProgramBuilder.push_at`). So no token is ever left in a queue at FINISH, and an emitter
never has to know whether a region is used again. Queues are first in, first out and
tokens carry no data, so the k-th pop of a queue waits for its k-th push: the builder
refuses a push that would land before one already made on the same queue, which is the
case where a wait would silently pair with the wrong region.

`PingPong` is the other half of overlapping tiles: equal regions of one SRAM that
consecutive tiles (or virtual threads) use in turn.

Used by every emitter: the compiler's conv2d and pool lowerings and the runtime's
hand-written blocked GEMM.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable

from vdla.isa import Program
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder

__all__ = ["PingPong", "RegionTokens"]


@dataclasses.dataclass(frozen=True)
class PingPong:
    """`count` equal regions of `size` SRAM elements each, used in turn.

    size : elements per region
    count : regions (2 for ping-pong buffers, or one per virtual thread)
    """

    size: int
    count: int = 2

    def __post_init__(self):
        if self.size < 0 or self.count < 1:
            raise ValueError(f"PingPong needs size >= 0 and count >= 1, not size={self.size}, "
                             f"count={self.count}")

    def base(self, k: int) -> int:
        """First element of the region that user `k` (a tile's position, a thread) takes."""
        return (k % self.count) * self.size

    @property
    def total(self) -> int:
        """Elements all regions take together."""
        return self.size * self.count


class RegionTokens:
    """The dependency tokens of one program's buffer regions (see the module docstring).

    builder : the `ProgramBuilder` the program is appended to; this object only adds
        dependency flags (and the no-ops that carry them) to what the emitter appends.
    Regions are any hashable names the emitter chooses (``("inp", thread)``, a ping-pong
    index, ...): one name per set of SRAM elements that one token guards.
    """

    def __init__(self, builder: ProgramBuilder):
        self.builder = builder
        self._last_reader: dict[Hashable, int] = {}    # region -> compute insn index
        self._last_store: dict[Hashable, int] = {}     # region -> store insn index

    # --- load -> compute (inputs and weights) ---------------------------------------------

    def load_into(self, region: Hashable):
        """Before the loads that overwrite `region`: wait until compute has read what it
        held (nothing to wait for on its first use)."""
        reader = self._last_reader.pop(region, None)
        if reader is not None:
            self.builder.push_at(reader, COMPUTE, LOAD)
            self.builder.dep_pop(COMPUTE, LOAD)

    def loaded(self):
        """After the loads of a step: compute may read them."""
        self.builder.dep_push(LOAD, COMPUTE)

    def wait_loaded(self):
        """Before the compute instruction that reads the last `loaded` step."""
        self.builder.dep_pop(LOAD, COMPUTE)

    def read(self, region: Hashable):
        """The compute instruction just appended is the last to read `region` before it
        is loaded again."""
        self._last_reader[region] = self.builder.last_index(COMPUTE)

    # --- compute -> store (accumulators and outputs) ----------------------------------------

    def compute_into(self, region: Hashable):
        """Before the compute instruction that overwrites `region`: wait until store has
        read what it held (nothing to wait for on its first use)."""
        store = self._last_store.pop(region, None)
        if store is not None:
            self.builder.push_at(store, STORE, COMPUTE)
            self.builder.dep_pop(STORE, COMPUTE)

    def computed(self):
        """After the compute instructions whose results the next stores read."""
        self.builder.dep_push(COMPUTE, STORE)

    def wait_computed(self):
        """Before the stores of the last `computed` step."""
        self.builder.dep_pop(COMPUTE, STORE)

    def stored(self, region: Hashable):
        """The store just appended is the last to read `region` before compute writes it
        again."""
        self._last_store[region] = self.builder.last_index(STORE)

    # --- end --------------------------------------------------------------------------------

    def finish(self) -> Program:
        """Append FINISH, which waits for the last store (the store module runs in order,
        so for all of them: the host sees done only when the output is in DRAM)."""
        self.builder.dep_push(STORE, COMPUTE)
        self.builder.dep_pop(STORE, COMPUTE)
        return self.builder.finish()
