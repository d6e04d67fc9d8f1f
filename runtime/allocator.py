"""First-fit DRAM allocator with coalescing free blocks."""

from __future__ import annotations

import bisect

__all__ = ["DramAllocator", "OutOfMemory"]


class OutOfMemory(MemoryError):
    """No free DRAM block is large enough."""


class DramAllocator:
    """Hands out aligned byte ranges of a DRAM of `size` bytes, from `base` upwards.

    Parameters
    ----------
    size : int
        Bytes of DRAM.
    alignment : int, power of two
        Every address returned is a multiple of it, and sizes are rounded up to it.
    base : int
        First usable address (a multiple of `alignment`); address 0 stays unused by
        default so that a forgotten address is not silently valid.
    """

    def __init__(self, size: int, *, alignment: int, base: int | None = None):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, not {alignment}")
        base = alignment if base is None else base
        if base % alignment or not 0 <= base < size:
            raise ValueError(f"base {base:#x} must be an aligned address inside DRAM "
                             f"(size {size:#x}, alignment {alignment})")
        self.size = size
        self.alignment = alignment
        self._free = [(base, size - base)]  # sorted (address, length)
        self._used: dict[int, int] = {}  # address -> length of each allocated block
        self._starts: list[int] = []      # the same addresses, sorted, for range checks

    def alloc(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"alloc size must be a positive integer, not {nbytes!r}")
        length = -(-nbytes // self.alignment) * self.alignment
        for position, (addr, free) in enumerate(self._free):
            if free >= length:
                if free == length:
                    del self._free[position]
                else:
                    self._free[position] = (addr + length, free - length)
                self._used[addr] = length
                bisect.insort(self._starts, addr)
                return addr
        largest = max((free for _, free in self._free), default=0)
        raise OutOfMemory(f"cannot allocate {nbytes} bytes of DRAM: the largest free block "
                          f"is {largest} bytes of {self.size} (free what is no longer used, "
                          "or open the device with a larger dram_size)")

    def free(self, addr: int):
        length = self._used.pop(addr, None)
        if length is None:
            raise ValueError(f"address {addr:#x} was not returned by alloc (or is freed already)")
        del self._starts[bisect.bisect_left(self._starts, addr)]
        position = bisect.bisect(self._free, (addr, 0))
        self._free.insert(position, (addr, length))
        # Merge with the following and the preceding block when adjacent.
        if position + 1 < len(self._free):
            a, n = self._free[position]
            b, m = self._free[position + 1]
            if a + n == b:
                self._free[position:position + 2] = [(a, n + m)]
        if position > 0:
            a, n = self._free[position - 1]
            b, m = self._free[position]
            if a + n == b:
                self._free[position - 1:position + 1] = [(a, n + m)]

    def contains(self, addr: int, nbytes: int) -> bool:
        """Whether [addr, addr + nbytes) lies inside one allocated block."""
        position = bisect.bisect_right(self._starts, addr) - 1
        if position < 0:
            return False
        start = self._starts[position]
        return addr + nbytes <= start + self._used[start]

    @property
    def bytes_in_use(self) -> int:
        return sum(self._used.values())
