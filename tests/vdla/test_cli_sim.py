"""`vdla sim`: run an assembled program with a DRAM image, print or dump the results, and
its errors, on the functional backend and on the real Verilator backend."""

import json

import numpy as np
import pytest

import vdla
from vdla import cli
from vdla.cli import sim as sim_cmd
from vdla.cli import main
from vdla.isa import Program, Uop, encode_uops
from vdla.runtime import BACKENDS, FunctionalDevice
from vdla_testing import load_acc_insn

CFG = vdla.HardwareConfig()
N = 4  # accumulator elements of batch x block_out int32
ACC_ADDR, UOP_ADDR, OUT_ADDR = 0, 512, 768  # byte addresses inside the image
IMAGE_BYTES = OUT_ADDR + N * CFG.out_elem_bytes


def program_text(imm: int = 3, finish: bool = True) -> str:
    """LOAD UOP and ACC from the image, ALU ADD imm, STORE to the image, FINISH."""
    acc = load_acc_insn(CFG, ACC_ADDR, y_size=1, x_size=N, x_stride=N)
    lines = [
        f"LOAD UOP dram_base={UOP_ADDR // CFG.uop_bytes} y_size=1 x_size=1 x_stride=1",
        f"LOAD ACC dram_base={acc['dram_base']} y_size=1 x_size={N} x_stride={N}",
        f"ALU ADD use_imm imm={imm} uop_end=1 iter_out={N} iter_in=1 dst_factor_out=1 push_next",
        f"STORE dram_base={OUT_ADDR // CFG.out_elem_bytes} y_size=1 x_size={N} x_stride={N} "
        "pop_prev push_prev",
    ]
    if finish:
        lines.append("FINISH pop_next")
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    """(assembly path, binary path, image path, acc data) for `program_text()`."""
    rng = np.random.default_rng(7)
    acc = rng.integers(-2**31, 2**31, size=(N, CFG.batch, CFG.block_out),
                       dtype=np.int64).astype(np.int32)
    image = np.zeros(IMAGE_BYTES, np.uint8)
    image[ACC_ADDR:ACC_ADDR + acc.nbytes] = acc.view(np.uint8).reshape(-1)
    uops = np.frombuffer(encode_uops([Uop(0, 0)], CFG), np.uint8)
    image[UOP_ADDR:UOP_ADDR + len(uops)] = uops
    asm, binary, img = tmp_path / "p.asm", tmp_path / "p.bin", tmp_path / "image.bin"
    asm.write_text(program_text())
    binary.write_bytes(Program.from_asm(program_text(), CFG).to_bytes())
    img.write_bytes(image.tobytes())
    return asm, binary, img, acc


def sim(*args: str) -> int:
    """`vdla sim` on the functional backend, whatever the default."""
    return main(["sim", "--backend", "functional", *map(str, args)])


def expected_out(acc: np.ndarray, imm: int = 3) -> np.ndarray:
    """What STORE writes: acc + imm with int32 wrap-around, narrowed to int8."""
    return (acc.astype(np.int64) + imm).astype(np.int32).astype(np.int8)


def test_asm_input_and_dump(files, tmp_path, capsys):
    asm, binary, img, acc = files
    dump = tmp_path / "out" / "dram.bin"
    dump.parent.mkdir()     # an output file's folder must exist (test_cli_outputs.py)
    assert sim(asm, "--dram", img, "--dump", dump) == 0
    captured = capsys.readouterr()
    insn_addr = 1024  # the image (832 bytes) rounded up to dram_alignment
    assert vdla.runtime.dram_alignment(CFG) == 256
    header, *rows = captured.out.splitlines()
    assert header == (f"{asm}: 5 instructions at DRAM {insn_addr:#x}, image {IMAGE_BYTES} bytes "
                      f"at 0x0, config {CFG.name}, functional backend")
    *rows, wall, note = rows
    table = dict(row.split() for row in rows)
    assert table["alu_uops"] == str(N) and table["instructions"] == "5"
    assert wall.split()[:2] == ["wall", "time"] and wall.endswith(" ms")
    assert len({len(row) for row in rows}) == 1  # values right-aligned in one column
    # The cycle counters (None on this backend) are named in a note, not rows of "None".
    assert "cycles" not in table and note.startswith("  (no cycles, fetch_busy")
    assert note.endswith("the functional backend has no clock; --backend verilator counts "
                         "them)")
    assert f"wrote DRAM 0x0..{insn_addr + 80:#x}" in captured.err

    dram = np.fromfile(dump, np.uint8)
    assert len(dram) == insn_addr + 5 * 16
    out = dram[OUT_ADDR:OUT_ADDR + N * CFG.out_elem_bytes].view(np.int8)
    np.testing.assert_array_equal(out.reshape(acc.shape), expected_out(acc))
    image = np.fromfile(img, np.uint8)
    np.testing.assert_array_equal(dram[:OUT_ADDR], image[:OUT_ADDR])  # inputs untouched
    assert dram[insn_addr:].tobytes() == binary.read_bytes()  # the program where it ran


def test_binary_input_json_and_insn_addr(files, tmp_path, capsys):
    asm, binary, img, acc = files
    dump = tmp_path / "dram.bin"
    assert main(["asm", str(asm), "-o", str(binary)]) == 0  # as `vdla asm` writes it
    capsys.readouterr()
    assert sim(binary, "--dram", img, "--json", "--insn-addr", "0x4000", "--dump", dump,
               "--dram-size", str(1 << 20)) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"program", "backend", "config", "instructions", "stats", "wall_seconds"}
    assert data["program"] == str(binary) and data["backend"] == "functional"
    assert data["config"] == CFG.name and data["instructions"] == 5
    assert data["stats"]["alu_uops"] == N and data["stats"]["store_bytes_out"] == N * 16
    assert data["wall_seconds"] > 0
    dram = np.fromfile(dump, np.uint8)
    assert len(dram) == 0x4000 + 80
    out = dram[OUT_ADDR:OUT_ADDR + N * CFG.out_elem_bytes].view(np.int8)
    np.testing.assert_array_equal(out.reshape(acc.shape), expected_out(acc))
    assert not dram[IMAGE_BYTES:0x4000].any()


def test_program_without_an_image(tmp_path, capsys):
    src = tmp_path / "nop.s"
    src.write_text("LOAD UOP\nFINISH\n")
    assert sim(src, "--json") == 0
    assert json.loads(capsys.readouterr().out)["stats"]["instructions"] == 2


def test_default_backend_is_one_constant():
    assert sim_cmd.DEFAULT_BACKEND in BACKENDS
    sub = cli.build_parser().parse_args(["sim", "p.bin"])
    assert sub.backend == sim_cmd.DEFAULT_BACKEND


def error_of(capsys, *args) -> str:
    assert sim(*args) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("vdla: error: ") and "Traceback" not in captured.err
    return captured.err


def test_input_errors(files, tmp_path, capsys):
    asm, binary, img, _ = files
    assert "cannot read" in error_of(capsys, tmp_path / "missing.bin")
    assert "cannot read" in error_of(capsys, asm, "--dram", tmp_path / "missing.img")
    empty = tmp_path / "empty.img"
    empty.write_bytes(b"")
    assert f"DRAM image '{empty}' is empty" in error_of(capsys, asm, "--dram", empty)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 17)
    err = error_of(capsys, odd)
    assert str(odd) in err and "multiple of 16 bytes" in err
    no_finish = tmp_path / "nofinish.asm"
    no_finish.write_text(program_text(finish=False))
    err = error_of(capsys, no_finish, "--dram", img)
    assert "does not end in FINISH" in err and "STORE" in err
    blank = tmp_path / "blank.asm"
    blank.write_text("# nothing\n")
    assert "no instructions" in error_of(capsys, blank)
    bad = tmp_path / "bad.s"
    bad.write_text("FINISH\nGEMM uop_end=70000\n")
    assert f"{bad}:2:" in error_of(capsys, bad)


def test_layout_errors(files, tmp_path, capsys):
    asm, _, img, _ = files
    dump = tmp_path / "dram.bin"
    err = error_of(capsys, asm, "--dram", img, "--insn-addr", "0x100", "--dump", dump)
    assert "overlap the DRAM image at 0x0..0x340" in err and "at least 0x340" in err
    assert "multiple of 16" in error_of(capsys, asm, "--dram", img, "--insn-addr", "0x408")
    err = error_of(capsys, asm, "--dram", img, "--dram-size", "65536", "--insn-addr", "0x10000")
    assert "need 65616 bytes" in err and "--dram-size" in err
    assert "dram_size" in error_of(capsys, asm, "--dram-size", "1000")
    assert not dump.exists()


def test_run_errors(files, tmp_path, capsys):
    _, _, img, _ = files
    deadlock = tmp_path / "deadlock.asm"
    deadlock.write_text("STORE pop_prev push_prev\nFINISH pop_next\n")
    dump = tmp_path / "dram.bin"
    err = error_of(capsys, deadlock, "--dump", dump)
    assert "deadlock" in err and "store waits at instruction 0" in err
    assert not dump.exists()
    outside = tmp_path / "outside.asm"
    outside.write_text(f"LOAD ACC dram_base={(1 << 20) // 64} y_size=1 x_size=1 x_stride=1\n"
                       "FINISH\n")
    assert "instruction 0" in error_of(capsys, outside, "--dram-size", str(1 << 20))


@pytest.mark.parametrize("option", [["--trace", "t.json"], ["--wave", "w.fst"]],
                         ids=lambda o: o[0])
def test_cycle_options_need_verilator(files, capsys, option):
    asm, *_ = files
    err = error_of(capsys, asm, *option)
    assert f"{option[0]} needs --backend verilator" in err


def test_max_cycles_bounds_the_work_on_every_backend(tmp_path, capsys):
    """--max-cycles also holds on the functional backend: a program whose work cannot
    fit is refused before it runs, naming the budget and how to raise it."""
    runaway = tmp_path / "runaway.asm"
    runaway.write_text("GEMM reset_reg uop_bgn=0 uop_end=1 iter_out=100 iter_in=100\n"
                       "FINISH\n")
    err = error_of(capsys, runaway, "--max-cycles", "5000")
    assert "needs at least 10,000 cycles, past the cycle budget of 5,000" in err
    assert "--max-cycles" in err
    assert main(["sim", str(runaway), "--max-cycles", "20000"]) == 0


def test_verilator_backend_trace_wave_and_dump(files, tmp_path, capsys):
    """The real Verilator backend: same DRAM as the functional run, cycle counters, a
    Perfetto trace with one slice per instruction, and a VCD waveform."""
    asm, _, img, acc = files
    trace, wave, dump = tmp_path / "t.json", tmp_path / "w.vcd", tmp_path / "dram.bin"
    assert main(["sim", str(asm), "--backend", "verilator", "--dram", str(img), "--dump",
                 str(dump), "--trace", str(trace), "--wave", str(wave),
                 "--max-cycles", "100000"]) == 0
    captured = capsys.readouterr()
    assert f"wrote the timeline to {trace}" in captured.err
    rows = captured.out.splitlines()
    assert rows[0].endswith("verilator backend")
    assert rows[1].split()[0] == "cycles" and int(rows[1].split()[1]) > 0
    assert "cycles/s" in rows[-1]
    dram = np.fromfile(dump, np.uint8)
    out = dram[OUT_ADDR:OUT_ADDR + N * CFG.out_elem_bytes].view(np.int8)
    np.testing.assert_array_equal(out.reshape(acc.shape), expected_out(acc))
    events = json.loads(trace.read_text())["traceEvents"]
    busy = sorted((e["ts"], e["name"]) for e in events if e["ph"] == "X" and e["cat"] == "busy"
                  and e["name"][0].isdigit())
    assert [name.split()[:2] for _, name in busy] == [
        ["0:", "LOAD"], ["1:", "LOAD"], ["2:", "ALU"], ["3:", "STORE"], ["4:", "FINISH"]]
    assert "$enddefinitions" in wave.read_text()


def test_verilator_json_has_every_counter(files, capsys):
    from vdla.isa.registers import COUNTERS
    asm, _, img, _ = files
    assert main(["sim", str(asm), "--backend", "verilator", "--dram", str(img), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert set(COUNTERS) <= set(stats) and stats["alu_active"] == N


def test_verilator_deadlock_from_the_cli(tmp_path, capsys):
    """A deadlock is found by validation before Verilator runs: the same message as the
    functional backend's, at once."""
    deadlock = tmp_path / "deadlock.asm"
    deadlock.write_text("STORE pop_prev push_prev\nFINISH pop_next\n")
    assert main(["sim", str(deadlock), "--backend", "verilator"]) == 1
    err = capsys.readouterr().err
    assert "deadlock" in err and "store waits at instruction 0" in err
    assert main(["sim", str(deadlock)]) == 1
    assert capsys.readouterr().err == err


def test_verilator_option_errors(files, capsys):
    asm, *_ = files
    for args, needle in ((["--wave", "w.txt"], "must end in .fst or .vcd"),
                         (["--max-cycles", "0"], "--max-cycles must be a positive integer")):
        assert main(["sim", str(asm), "--backend", "verilator", *args]) == 1
        assert needle in capsys.readouterr().err


def test_device_that_allocates_on_open(files, capsys, monkeypatch):
    class Busy(FunctionalDevice):
        def __init__(self, config, **options):
            super().__init__(config, dram_size=1 << 20)
            self.alloc(64)

    monkeypatch.setitem(BACKENDS, "verilator", Busy)
    asm, *_ = files
    assert main(["sim", str(asm), "--backend", "verilator"]) == 1
    assert "cannot be placed at address 0" in capsys.readouterr().err
