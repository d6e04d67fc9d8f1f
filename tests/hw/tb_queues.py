"""cocotb testbench of the dependency-token queues and a command queue.

The harness holds two `DepQueue`s (``small`` and ``big``, depths from ``VDLA_QUEUE_DEPTHS``)
and a `CommandQueue` (``cmd``). Each cycle's handshakes are checked against a counter
model: ``push.ready`` falls exactly at the depth (unless a pop frees a place in the same
cycle), ``pop.valid`` exactly at empty, and ``level`` follows.
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from cocotb_harness import start_clock, testbench_env


async def setup(dut):
    await start_clock(dut)
    for name in ("small", "big"):
        getattr(dut, f"{name}_push__valid").value = 0
        getattr(dut, f"{name}_pop__ready").value = 0
    dut.cmd_w__valid.value = 0
    dut.cmd_r__ready.value = 0
    await RisingEdge(dut.clk)
    return testbench_env("VDLA_QUEUE_DEPTHS")


class TokenQueueModel:
    def __init__(self, dut, name, depth):
        self.push_valid = getattr(dut, f"{name}_push__valid")
        self.push_ready = getattr(dut, f"{name}_push__ready")
        self.pop_valid = getattr(dut, f"{name}_pop__valid")
        self.pop_ready = getattr(dut, f"{name}_pop__ready")
        self.level = getattr(dut, f"{name}_level")
        self.name, self.depth, self.count = name, depth, 0

    async def cycle(self, dut, push: bool, pop: bool):
        """Drive one cycle of push/pop requests and check the queue against the model;
        returns (pushed, popped)."""
        self.push_valid.value = push
        self.pop_ready.value = pop
        await ReadOnly()
        n = self.count
        assert int(self.level.value) == n, f"{self.name}: level {int(self.level.value)}, want {n}"
        assert bool(self.pop_valid.value) == (n > 0), f"{self.name}: pop.valid wrong at {n}"
        want_ready = n < self.depth or pop
        assert bool(self.push_ready.value) == want_ready, (
            f"{self.name}: push.ready={int(self.push_ready.value)} at level {n} of "
            f"{self.depth} with pop.ready={int(pop)}")
        pushed = push and want_ready
        popped = pop and n > 0
        self.count += pushed - popped
        await RisingEdge(dut.clk)
        return pushed, popped


@cocotb.test()
async def token_queues_fill_and_drain(dut):
    depths = await setup(dut)
    for name in ("small", "big"):
        depth = depths[name]
        q = TokenQueueModel(dut, name, depth)
        # Push until full: the queue takes exactly `depth` tokens.
        taken = 0
        for _ in range(depth + 3):
            pushed, _ = await q.cycle(dut, push=True, pop=False)
            taken += pushed
        assert taken == depth and q.count == depth
        # Full: a push and a pop in the same cycle both happen and the level stays.
        for _ in range(3):
            assert await q.cycle(dut, push=True, pop=True) == (True, True)
        assert q.count == depth
        # Pop until empty: exactly `depth` tokens come out.
        popped_total = 0
        for _ in range(depth + 3):
            _, popped = await q.cycle(dut, push=False, pop=True)
            popped_total += popped
        assert popped_total == depth and q.count == 0
        # Empty: a pop cannot happen, the push does; then at one token both happen.
        assert await q.cycle(dut, push=True, pop=True) == (True, False)
        assert await q.cycle(dut, push=True, pop=True) == (True, True)
        assert q.count == 1
        assert await q.cycle(dut, push=False, pop=True) == (False, True)
        await q.cycle(dut, push=False, pop=False)


@cocotb.test()
async def token_queues_random_traffic(dut):
    depths = await setup(dut)
    rng = random.Random(5)
    for name in ("small", "big"):
        depth = depths[name]
        q = TokenQueueModel(dut, name, depth)
        # Phases biased towards pushing, then popping, so both ends are reached.
        for bias in (0.8, 0.2, 0.5):
            for _ in range(min(4 * depth, 600)):
                await q.cycle(dut, push=rng.random() < bias, pop=rng.random() < 1 - bias)
        while q.count:
            await q.cycle(dut, push=False, pop=True)


@cocotb.test()
async def command_queue_keeps_order(dut):
    depths = await setup(dut)
    depth = depths["cmd"]
    rng = random.Random(6)
    words = [rng.getrandbits(128) for _ in range(200)]
    sent, got, level = 0, [], 0
    full_seen = False
    for cycle in range(5000):
        if len(got) == len(words):
            break
        bias = 0.9 if (cycle // 50) % 2 == 0 else 0.3   # alternate filling and draining
        w_valid = sent < len(words) and rng.random() < bias
        dut.cmd_w__valid.value = w_valid
        dut.cmd_w__payload.value = words[sent] if sent < len(words) else 0
        dut.cmd_r__ready.value = rng.random() >= bias
        await ReadOnly()
        level = int(dut.cmd_level.value)
        assert level <= depth
        assert bool(dut.cmd_w__ready.value) == (level < depth), f"w.ready wrong at level {level}"
        full_seen |= level == depth
        if w_valid and dut.cmd_w__ready.value:
            sent += 1
        if dut.cmd_r__valid.value and dut.cmd_r__ready.value:
            got.append(int(dut.cmd_r__payload.value))
        await RisingEdge(dut.clk)
    assert got == words, f"{len(got)} of {len(words)} commands out, or out of order"
    assert full_seen, "the command queue never filled"
