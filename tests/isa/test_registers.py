"""The register map (`vdla.isa.registers`): plain data that host code reads without
Amaranth, and a window whose registers and counters are unique, aligned and inside it."""

from __future__ import annotations

import subprocess
import sys

from vdla.isa.registers import (ACCEL_ID, CONTROL_ADDR_WIDTH, COUNTERS, CTRL_START,
                                REGISTERS, STATE_BITS, STATUS_DONE, STATUS_RUNNING,
                                register_map)

WINDOW = 1 << CONTROL_ADDR_WIDTH


def test_host_side_modules_import_without_amaranth():
    probe = ("import sys, vdla.isa.registers, vdla.boards, vdla.sim.verilator, "
             "vdla.sim.timeline\n"
             "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'amaranth')\n"
             "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _words() -> dict[int, str]:
    """Every 32-bit word of the window in use: byte offset -> register name."""
    words: dict[int, str] = {}
    for name, (offset, _, _) in REGISTERS.items():
        assert offset not in words, f"{name} and {words[offset]} share {offset:#x}"
        words[offset] = name
    for name, (offset, _) in COUNTERS.items():
        for half, word in (("LO", offset), ("HI", offset + 4)):
            assert word not in words, f"counter {name} {half} overlaps {words[word]}"
            words[word] = f"{name.upper()}_{half}"
    return words


def test_registers_are_unique_aligned_and_inside_the_window():
    for name, (offset, access, text) in REGISTERS.items():
        assert offset % 4 == 0, f"{name} at {offset:#x} is not word aligned"
        assert 0 <= offset < WINDOW, f"{name} at {offset:#x} is outside the window"
        assert access in ("RO", "RW") and text
    offsets = [offset for offset, _, _ in REGISTERS.values()]
    assert len(set(offsets)) == len(offsets)


def test_counters_are_64_bit_pairs_clear_of_the_registers():
    words = _words()   # asserts that no two words overlap
    assert len(words) == len(REGISTERS) + 2 * len(COUNTERS)
    for name, (offset, text) in COUNTERS.items():
        assert offset % 8 == 0, f"counter {name} at {offset:#x} is not 64-bit aligned"
        assert 0 <= offset and offset + 8 <= WINDOW, f"counter {name} is outside the window"
        assert text
    assert "cycles" in COUNTERS


def test_state_bits_are_unique_and_fit_the_state_register():
    bits = [bit for bit, _ in STATE_BITS.values()]
    assert len(set(bits)) == len(bits)
    assert all(isinstance(bit, int) and 0 <= bit < 32 for bit in bits)
    assert all(text for _, text in STATE_BITS.values())


def test_ctrl_bits_and_the_id():
    assert CTRL_START == 1
    assert STATUS_RUNNING != STATUS_DONE and (STATUS_RUNNING | STATUS_DONE) < 4
    assert ACCEL_ID.to_bytes(4, "big") == b"VDLA"


def test_register_map_lists_every_register_and_both_counter_halves():
    rows = register_map()
    assert all(set(row) == {"name", "offset", "access", "description"} for row in rows)
    assert {row["offset"]: row["name"] for row in rows} == _words()
    assert len(rows) == len(REGISTERS) + 2 * len(COUNTERS)
    by_name = {row["name"]: row for row in rows}
    for name, (offset, access, _) in REGISTERS.items():
        assert (by_name[name]["offset"], by_name[name]["access"]) == (offset, access)
    for name, (offset, _) in COUNTERS.items():
        assert by_name[f"{name.upper()}_LO"]["offset"] == offset
        assert by_name[f"{name.upper()}_HI"]["offset"] == offset + 4
        assert by_name[f"{name.upper()}_LO"]["access"] == "RO"
