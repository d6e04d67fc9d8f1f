"""A deploy bundle's runner (`vdla.deploy.board.runner`, what run.py does) given
malformed or hostile files: every one an error on one line, ``run.py: error: ...``, and
exit status 1, never a traceback; a manifest naming files outside the bundle (``..``,
absolute paths, symbolic links out) refused before anything is read; and the board
runtime's device (`RegionDevice`) refusing a program whose DMA reaches outside the
blocks the script placed. The "board" is the functional simulator behind the control
window and a DMA region in this process (`FunctionalBoard`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundles import copy_of
from vdla.config import HardwareConfig
from vdla.deploy.board.dma import DmaOutsideBlocks
from vdla.deploy.board.hardware import Accelerator, DmaMemory, Mmio, RegionDevice
from vdla.deploy.board.manifest import INTEGRITY, MANIFEST, file_hashes
from vdla.deploy.board.runner import main as run_bundle
from vdla.isa import Finish, Program, Store
from vdla.isa.encoding import decode_stream
from vdla.isa.registers import ACCEL_ID, CTRL_START, REGISTERS, REGMAP_VERSION, STATUS_DONE
from vdla.runtime import open as open_device
from vdla.sim import FunctionalSimulator


class ArrayMemory(DmaMemory):
    """A DMA region at bus address 0: a numpy array, no caches to keep."""

    def __init__(self, size: int):
        self.physical_address, self.array = 0, np.zeros(size, np.uint8)

    def flush(self, offset, nbytes):
        pass

    def invalidate(self, offset, nbytes):
        pass


class FunctionalBoard(Mmio):
    """A control window whose accelerator is the functional simulator over `memory`:
    START runs the program at once, so CTRL reads done."""

    def __init__(self, config, memory: ArrayMemory):
        self.simulator, self.registers = FunctionalSimulator(config, memory.array), {}

    def read(self, offset):
        return {REGISTERS["ID"][0]: ACCEL_ID, REGISTERS["VERSION"][0]: REGMAP_VERSION,
                REGISTERS["CTRL"][0]: STATUS_DONE}.get(offset, 0)

    def write(self, offset, value):
        self.registers[offset] = value
        if offset == REGISTERS["CTRL"][0] and value & CTRL_START:
            self.simulator.run_from_dram(self.registers[REGISTERS["INSN_ADDR"][0]],
                                         self.registers[REGISTERS["INSN_COUNT"][0]])


def region_device(config, manifest, size, timeout):
    """run.py's device opener: the board runtime's own device over `FunctionalBoard`."""
    memory = ArrayMemory(size)
    return RegionDevice(config, Accelerator(FunctionalBoard(config, memory), memory,
                                            timeout=timeout))


def functional_device(config, manifest, size, timeout):
    """run.py's device opener: vdla's functional device (its allocator, its checks)."""
    return open_device(config, "functional", dram_size=max(size, 1 << 20))


@pytest.fixture(scope="module")
def bundle(small_cnn_bundle, tmp_path_factory):
    return copy_of(small_cnn_bundle, tmp_path_factory)


@pytest.fixture
def copy(bundle, tmp_path):
    folder = tmp_path / "bundle"
    shutil.copytree(bundle, folder, symlinks=True)
    return folder


def rehash(folder: Path) -> None:
    """The manifest's hashes made to match the files again (as one who edits a bundle
    would: the hashes guard against accidents, not against that)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = file_hashes(folder)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_npz(path: Path, change) -> None:
    with np.load(path) as npz:
        arrays = {name: npz[name] for name in npz.files}
    change(arrays)
    np.savez(path, **arrays)


def run(folder: Path, capsys, opener=functional_device, argv=()) -> tuple[int, str]:
    """run.py's work on `folder`: (exit status, stderr)."""
    status = run_bundle(list(argv), bundle=folder, open_device=opener)
    return status, capsys.readouterr().err


def test_the_example_runs_on_the_board_runtimes_own_device(copy, capsys):
    """The control: the bundle as written, bit-exact on `RegionDevice`."""
    assert run_bundle([], bundle=copy, open_device=region_device) == 0
    assert "the bundled example: bit-exact" in capsys.readouterr().out


def model_json(change):
    return lambda folder: edit_json(folder / "model" / "model.json", change)


def model_npz(change):
    return lambda folder: edit_npz(folder / "model" / "model.npz", change)


def first_step(kind, change):
    def edit(data):
        change(next(s for s in data["steps"] if s["do"] == kind))
    return model_json(edit)


def corrupt_program(arrays):
    arrays["blob6"] = np.frombuffer(b"\xff" * 16 * 4, np.uint8)


# (name, how the files change, whether the manifest is rehashed, what the error says)
MALFORMED = [
    ("manifest not JSON", lambda f: (f / MANIFEST).write_text("{"), False, "no bundle manifest"),
    ("manifest a list", lambda f: (f / MANIFEST).write_text("[]"), False,
     "a JSON object is needed, not a list"),
    ("manifest nested deep", lambda f: (f / MANIFEST).write_text("[" * 100_000), False,
     "no bundle manifest"),
    ("files a list", lambda f: edit_json(f / MANIFEST, lambda m: m.update(files=[])), False,
     "'files' must be a JSON object, not []"),
    ("register base text", lambda f: edit_json(f / MANIFEST, lambda m: m.update(
        register_base="0x43c00000")), False, "'register_base' must be a JSON integer"),
    ("hash not hex", lambda f: edit_json(f / MANIFEST, lambda m: m["files"].update(
        {"run.py": "zz"})), False, "SHA-256 'zz' is not 64 hex digits"),
    ("model.json not JSON", lambda f: (f / "model" / "model.json").write_text("{"), True,
     "not a device script"),
    ("steps an object", model_json(lambda d: d.update(steps={})), True,
     "steps must be a list of JSON objects"),
    ("step without at", first_step("alloc", lambda s: s.pop("at")), True,
     "step 0 (alloc): at must be an integer of at least 0, not None"),
    ("bytes as text", first_step("alloc", lambda s: s.update(bytes="ten")), True,
     "step 0 (alloc): bytes must be an integer of at least 1, not 'ten'"),
    ("tensor out of range", first_step("input", lambda s: s.update(tensor=99)), True,
     "tensor 99 of 1"),
    ("count negative", first_step("run", lambda s: s.update(count=-5)), True,
     "count must be an integer of at least 1, not -5"),
    ("unknown step", first_step("run", lambda s: s.update(do="jump")), True,
     "unknown kind 'jump'"),
    ("config missing", model_json(lambda d: d.pop("config")), True, "bad config"),
    ("scale missing", model_json(lambda d: d["inputs"][0]["quantize"].pop("scale")), True,
     "inputs[0]: quantize scale must be a positive number, not None"),
    ("shape text", model_json(lambda d: d["outputs"][0].update(shape="1x10")), True,
     "outputs[0]: shape must be a list of non-negative integers"),
    ("dram_bytes negative", model_json(lambda d: d.update(dram_bytes=-1)), True,
     "dram_bytes must be an integer of at least 0"),
    ("model.npz garbage", lambda f: (f / "model" / "model.npz").write_bytes(b"PK\x03\x04" * 9),
     True, "not a device script"),
    ("blob missing", model_npz(lambda a: a.pop("blob1")), True,
     "array 'blob1' is not in model.npz"),
    ("map of floats", model_npz(lambda a: a.update(output0_map=a["output0_map"] * 0.5)),
     True, "is float64, not an integer array"),
    ("map out of range", model_npz(lambda a: a.update(output0_map=a["output0_map"] + 10**6)),
     True, "holds indices"),
    ("input map out of range",
     model_npz(lambda a: a.update(input0_map0=a["input0_map0"] + 10**6)), True,
     "holds indices"),
    ("example without the input", lambda f: edit_npz(f / "model" / "example.npz",
                                                     lambda a: a.pop("input")), True,
     "no array for the model's input(s) ['input']"),
    ("program of bad words", model_npz(corrupt_program), True, ""),
    ("bitstream manifest broken", lambda f: (f / "project" / "manifest.json").write_text("7"),
     True, "bitstream manifest"),
]


@pytest.mark.parametrize("opener", [functional_device, region_device],
                         ids=["functional", "board-runtime"])
@pytest.mark.parametrize("name, change, hashed, says", MALFORMED,
                         ids=[m[0] for m in MALFORMED])
def test_a_malformed_bundle_file_is_one_error_line(copy, capsys, opener, name, change, hashed,
                                                   says):
    change(copy)
    if hashed:
        rehash(copy)
    status, err = run(copy, capsys, opener)
    assert status == 1
    assert err.startswith("run.py: error: ") and says in err and "Traceback" not in err, err
    assert err.count("\n") == 1


def test_run_py_itself_exits_1_with_the_error(copy):
    (copy / MANIFEST).write_text("[]")
    proc = subprocess.run([sys.executable, str(copy / "run.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("run.py: error: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("listed", ["../../../../etc/passwd", "model/../../outside",
                                    "./run.py", "model//model.json", "lib\\vdla"])
def test_a_manifest_path_out_of_the_bundle_is_refused(copy, capsys, listed):
    edit_json(copy / MANIFEST, lambda m: m["files"].update({listed: "0" * 64}))
    status, err = run(copy, capsys)
    assert status == 1 and f"file {listed!r}: a manifest names files by their path inside " \
                           "the bundle" in err


def test_an_absolute_path_is_refused_without_a_digit_of_its_hash(copy, capsys, tmp_path):
    """The runner runs as root: a manifest naming another file (/etc/shadow) must not
    make it print a digest of that file."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000:0:99999:7:::\n")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    edit_json(copy / MANIFEST, lambda m: m["files"].update({str(secret): "1" * 64}))
    status, err = run(copy, capsys)
    assert status == 1 and "a manifest names files by their path inside the bundle" in err
    assert digest[:6] not in err


def test_a_symbolic_link_out_of_the_bundle_is_refused(copy, capsys, tmp_path):
    secret = tmp_path / "outside"
    secret.write_text("not the bundle's")
    (copy / "model" / "link").symlink_to(secret)
    edit_json(copy / MANIFEST, lambda m: m["files"].update({"model/link": "2" * 64}))
    status, err = run(copy, capsys)
    assert status == 1 and "'model/link' leads out of the bundle" in err


def test_the_manifest_says_what_its_hashes_guard_against(bundle):
    manifest = json.loads((bundle / MANIFEST).read_text())
    assert manifest["integrity"] == INTEGRITY
    assert "accidents" in INTEGRITY and "not against an attacker" in INTEGRITY
    assert "not against someone who can" in " ".join((bundle / "README.md").read_text().split())


def far_store(folder: Path, offset: int) -> None:
    """Make the first program's first STORE write at region offset `offset` instead."""
    def change(arrays):
        cfg = HardwareConfig.from_dict(
            json.loads((folder / "model" / "model.json").read_text())["config"])
        insns = decode_stream(arrays["blob6"].tobytes(), cfg)
        at = next(i for i, insn in enumerate(insns) if isinstance(insn, Store))
        insns[at] = dataclasses.replace(insns[at], dram_base=offset // cfg.out_elem_bytes)
        arrays["blob6"] = np.frombuffer(Program(tuple(insns), cfg).to_bytes(), np.uint8)
    edit_npz(folder / "model" / "model.npz", change)


def test_the_board_runtime_refuses_a_store_outside_the_placed_blocks(copy, capsys):
    """A script edited so that a program STOREs past its blocks (inside the DMA region):
    the board runtime refuses it before the accelerator starts, naming the instruction,
    as the server does."""
    far_store(copy, 3 << 20)
    rehash(copy)
    status, err = run(copy, capsys, region_device)
    assert status == 1
    assert re.search(r"run.py: error: instruction \d+ writes DRAM bytes 0x300000\.\.0x[0-9a-f]+, "
                     "outside the memory this session allocated", err), err


def test_region_device_checks_instructions_and_dma_against_placed_blocks():
    config = HardwareConfig()
    device = region_device(config, None, 1 << 20, 1.0)
    program = Program((Store(dram_base=0x8000 // config.out_elem_bytes, y_size=1, x_size=1,
                             x_stride=1), Finish()), config).to_bytes()
    insn_at = device.place(0x100, len(program))
    device.write(insn_at, program)
    with pytest.raises(DmaOutsideBlocks, match=r"instruction 0 writes DRAM bytes 0x8000"):
        device.run(insn_at, 2)
    with pytest.raises(DmaOutsideBlocks, match="the program's 4 instructions"):
        device.run(insn_at, 4)
    device.place(0x8000, 256)
    with pytest.raises(Exception) as error:   # now inside: the run starts (and the
        device.run(insn_at, 2)                # simulator refuses its tokens, not its DMA)
    assert not isinstance(error.value, DmaOutsideBlocks)
