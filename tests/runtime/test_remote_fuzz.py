"""Fuzzing the remote server's protocol: a seeded generator plays connection patterns
against a live server on 127.0.0.1 (the functional simulator behind it, short
deadlines), each a stream of malformed frames or bytes, then checks that the server
never died and that a real client's run afterwards is bit-exact.

The patterns: bytes that are not TLS; TLS then garbage in place of the key's answer;
idle and trickling connections, left open or reset; authenticated sessions sending
calls with fields of every wrong type and range, unknown calls, payloads that do not
match, random instruction words and random programs to run, headers of valid MAC but
invalid JSON, frames with a wrong MAC, cut short or of impossible lengths, and resets
with a reply unread. The counts (frames sent, connection patterns, server deaths and
the final bit-exact run) go to the fuzz summary (tests/fuzzing.py), so CI's output says
how much was tried. A fixed seed and pattern count keep it reproducible; a time cap
keeps CI bounded on a slow machine (the counts say how far it got).
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from fuzzing import count
from remote_testing import (CFG, LiveServer, bit_exact_run, make_keys, raw_frame, reset,
                            session, tcp, tls)
from vdla.isa import Finish, Gemm, Load, MemoryType, Program, Store
from vdla.runtime.remote import Limits
from vdla.runtime.remote_wire import Deadline, RemoteError

SEED = 20261129
PATTERNS = 4000
SECONDS = 30.0
DRAM = 16 << 20
CALLS = ("config", "alloc", "free", "write", "read", "run", "open", "close!", "", None, 7)


def _value(rng: random.Random):
    """A header field's value: mostly plausible integers, else any JSON kind."""
    return rng.choice([
        lambda: rng.randrange(0, 1 << 12), lambda: rng.randrange(0, DRAM * 2),
        lambda: rng.choice([-1, 0, 1, 1 << 63, (1 << 64) - 1, 10 ** 19]),
        lambda: rng.random() * 1e9, lambda: rng.choice([True, False, None]),
        lambda: "x" * rng.randrange(0, 50), lambda: [rng.randrange(9)] * rng.randrange(4),
        lambda: {"a": rng.randrange(9)},
    ])()


def _random_header(rng: random.Random, blocks: list[int]) -> dict:
    header = {"call": rng.choice(CALLS)}
    for name in rng.sample(["addr", "nbytes", "insn_addr", "insn_count", "wait", "x"],
                           rng.randrange(0, 4)):
        header[name] = rng.choice(blocks) if blocks and rng.random() < 0.5 else _value(rng)
    return header


def _random_program(rng: random.Random, block: int) -> bytes:
    """Instruction words: random bits, or LOADs/STOREs/GEMMs with random fields near
    the block (some inside it, some out)."""
    if rng.random() < 0.4:
        return os.urandom(16 * rng.randrange(1, 8))
    insns = []
    for _ in range(rng.randrange(1, 6)):
        base = max(0, block // 16 + rng.randrange(-64, 256))
        kind = rng.randrange(3)
        if kind == 0:
            insns.append(Load(memory_type=rng.choice([MemoryType.INP, MemoryType.UOP]),
                              dram_base=base, y_size=rng.randrange(0, 3),
                              x_size=rng.randrange(0, 4), x_stride=rng.randrange(0, 5)))
        elif kind == 1:
            insns.append(Store(dram_base=base, y_size=rng.randrange(0, 3),
                               x_size=rng.randrange(0, 4), x_stride=rng.randrange(0, 5)))
        else:
            insns.append(Gemm(uop_bgn=0, uop_end=rng.randrange(0, 3),
                              iter_out=rng.randrange(0, 1 << 14),
                              iter_in=rng.randrange(0, 1 << 14)))
    insns.append(Finish())
    return Program(tuple(insns), CFG).to_bytes()


def _end(rng: random.Random, sock, channel) -> int:
    """End a session as a broken or hostile client may; the frames sent."""
    how = rng.randrange(7)
    if how == 0:
        sock.sendall(raw_frame(channel, b'{"call":"close"}'))
    elif how == 1:
        sock.sendall(raw_frame(channel, b'{"call":"config"}', good_mac=False))
    elif how == 2:
        sock.sendall(raw_frame(channel, rng.choice([b"[" * 50_000, b"1" * 6_000, b"{"]),
                               good_mac=rng.random() < 0.7))
    elif how == 3:     # impossible lengths
        sock.sendall(rng.choice([(1 << 31).to_bytes(4, "big"), b"\0\0\0\x10"])
                     + rng.randrange(1 << 64).to_bytes(8, "big"))
    elif how == 4:     # cut short
        sock.sendall(raw_frame(channel, b'{"call":"config"}')[:rng.randrange(1, 40)])
    elif how == 5:     # a read's reply left unread
        sock.sendall(raw_frame(channel, json.dumps(
            {"call": "read", "addr": 256, "nbytes": 1 << 20}).encode()))
    if rng.random() < 0.5:
        reset(sock)
    else:
        sock.close()
    return int(how != 6)


def _session(rng: random.Random, server, keys) -> int:
    sock, channel, _ = session(server.address, keys.client, wait=5)
    frames, blocks = 1, []
    for _ in range(rng.randrange(1, 25)):
        roll = rng.random()
        if roll < 0.15:
            nbytes = rng.choice([16, 256, 4096, 1 << 20])
            channel.send({"call": "alloc", "nbytes": nbytes}, deadline=Deadline(5))
            reply, _ = channel.receive(Deadline(10))
            if reply.get("ok"):
                blocks.append(reply["addr"])
        elif roll < 0.3 and blocks:     # a program, written and run
            block = rng.choice(blocks)
            program = _random_program(rng, block)
            channel.send({"call": "write", "addr": block, "nbytes": len(program)}, program,
                         deadline=Deadline(5))
            channel.receive(Deadline(10))
            channel.send({"call": "run", "insn_addr": block,
                          "insn_count": len(program) // 16}, deadline=Deadline(5))
            channel.receive(Deadline(30))
            frames += 1
        elif roll < 0.4 and blocks:     # a payload that is not what the header says
            payload = os.urandom(rng.randrange(1, 64))
            data = json.dumps({"call": "write", "addr": rng.choice(blocks),
                               "nbytes": len(payload) + rng.choice([-1, 1, 1000])}).encode()
            sock.sendall(raw_frame(channel, data, payload))
            return frames + 1 + _end(rng, sock, channel)
        else:
            header = _random_header(rng, blocks)
            if header["call"] in ("close!", "open"):
                header["call"] = "close" if rng.random() < 0.3 else "open"
            if header["call"] == "close":
                channel.send(header, deadline=Deadline(5))
                sock.close()
                return frames + 1
            channel.send(header, deadline=Deadline(5))
            reply, _ = channel.receive(Deadline(30))
            assert "ok" in reply
        frames += 1
    return frames + _end(rng, sock, channel)


def _before_the_key(rng: random.Random, server, idle: list) -> int:
    kind = rng.randrange(5)
    if kind == 0:       # not TLS
        sock = tcp(server.address)
        sock.sendall(os.urandom(rng.randrange(1, 2000)))
    elif kind == 1:     # TLS, then garbage for the key's answer
        sock = tls(server.address)
        sock.sendall(os.urandom(rng.choice([1, 63, 64, 65, 500])))
    elif kind == 2:     # idle, kept open until the end (the deadline drops it)
        idle.append(tcp(server.address) if rng.random() < 0.5 else tls(server.address))
        return 0
    elif kind == 3:     # a trickle
        sock = tcp(server.address)
        for _ in range(3):
            sock.send(os.urandom(1))
            time.sleep(0.001)
    else:               # connect and reset at once
        sock = tcp(server.address)
    if rng.random() < 0.5:
        reset(sock)
    else:
        sock.close()
    return int(kind != 4)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys") / "vdla-key")


def test_the_server_survives_malformed_frames_and_connection_patterns(keys):
    server = LiveServer(keys, dram_size=DRAM, limits=Limits(
        handshake_seconds=0.5, idle_seconds=2, max_uops=2_000_000, max_dma_bytes=64 << 20,
        max_connections=32))
    rng = random.Random(SEED)
    frames = patterns = 0
    idle: list = []
    end = time.monotonic() + SECONDS
    while patterns < PATTERNS and time.monotonic() < end:
        try:
            if rng.random() < 0.5:
                frames += _before_the_key(rng, server, idle)
            else:
                frames += _session(rng, server, keys)
        except (RemoteError, OSError):
            pass        # the server hung up on a pattern: what it should do
        patterns += 1
        if len(idle) > 40:
            for sock in idle:
                sock.close()
            idle.clear()
    for sock in idle:
        sock.close()
    deaths = 0 if server.alive() else 1
    exact = bit_exact_run(server.address, keys.client)
    count("remote protocol: frames", frames)
    count("remote protocol: connection patterns", patterns)
    count("remote protocol: server deaths", deaths)
    count("remote protocol: bit-exact runs after", int(exact))
    assert deaths == 0 and exact
    assert frames > 2000 and patterns >= PATTERNS // 2
    internal = [line for line in server.log if "internal error" in line]
    assert not internal, internal[:5]
