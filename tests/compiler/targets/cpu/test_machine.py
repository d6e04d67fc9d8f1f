"""The CPU target's machine model (`vdla.compiler.targets.cpu.machine`, measured by
`machine_bench`): /proc/cpuinfo and sysfs read from fixture text (an AMD EPYC with AVX2,
an Intel Sapphire Rapids with AMX), the derived figures, the JSON round trip, the cache
(measured once, then read; a damaged or foreign file measured again; two processes
measure once), the real microbenchmark on this machine, the AMX probe's build, and
`vdla targets`' machine block."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from vdla.cli import main
from vdla.compiler import targets
from vdla.compiler.targets.cpu import machine, machine_bench
from vdla.compiler.targets.cpu.build import BASE_FLAGS, CompilerNotFound, find_c_compiler
from vdla.compiler.targets.cpu.machine import Cache, MachineModel
from vdla.compiler.targets.cpu.machine_bench import Figures

EPYC_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
              "clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm "
              "constant_tsc rep_good nopl pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe "
              "popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a "
              "bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni "
              "xsaveopt xsavec xgetbv1 xsaves clzero vaes vpclmulqdq rdpid fsrm")
SPR_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
             "clflush dts acpi mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm "
             "constant_tsc pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt "
             "aes xsave avx f16c rdrand lahf_lm abm bmi1 avx2 smep bmi2 erms invpcid "
             "avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni "
             "avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 "
             "avx512vbmi umip pku avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
             "avx512_bitalg avx512_vpopcntdq la57 rdpid movdiri movdir64b serialize "
             "tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities")


def _cpuinfo(vendor: str, name: str, flags: str, cores: int, threads: int) -> str:
    """/proc/cpuinfo of one socket: `cores` cores of `threads` threads each, numbered as
    Linux numbers them (every core's first thread, then every core's second)."""
    blocks = []
    for t in range(threads):
        for c in range(cores):
            blocks.append(f"processor\t: {t * cores + c}\nvendor_id\t: {vendor}\n"
                          f"cpu family\t: 25\nmodel name\t: {name}\nphysical id\t: 0\n"
                          f"siblings\t: {cores * threads}\ncore id\t\t: {c}\n"
                          f"cpu cores\t: {cores}\nflags\t\t: {flags}\n")
    return "\n".join(blocks) + "\n"


EPYC = _cpuinfo("AuthenticAMD", "AMD EPYC 7763 64-Core Processor", EPYC_FLAGS, 4, 2)
SPR = _cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", SPR_FLAGS, 56, 2)


def _sysfs(folder: Path, caches: list[tuple[int, str, str, str]]) -> Path:
    """A cpu0/cache folder: one index folder per (level, type, size, shared_cpu_list); a
    field of None is a file left out."""
    for i, fields in enumerate(caches):
        index = folder / f"index{i}"
        index.mkdir(parents=True)
        for name, value in zip(("level", "type", "size", "shared_cpu_list"), fields):
            if value is not None:
                (index / name).write_text(f"{value}\n")
    return folder


EPYC_CACHES = [(1, "Data", "32K", "0,4"), (1, "Instruction", "32K", "0,4"),
               (2, "Unified", "512K", "0,4"), (3, "Unified", "32768K", "0-3,4-7")]
SPR_CACHES = [(1, "Data", "48K", "0,56"), (1, "Instruction", "32K", "0,56"),
              (2, "Unified", "2048K", "0,56"), (3, "Unified", "107520K", "0-111")]


def _model(tmp_path: Path, text: str, caches, cpus=None) -> MachineModel:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cpuinfo").write_text(text)
    return machine.read_machine(tmp_path / "cpuinfo", _sysfs(tmp_path / "cache", caches),
                                cpus=cpus)


# --- reading /proc/cpuinfo and sysfs ------------------------------------------------------

def test_an_amd_epyc_with_avx2_is_read(tmp_path):
    model = _model(tmp_path, EPYC, EPYC_CACHES, cpus=set(range(8)))
    assert (model.model_name, model.vendor) == ("AMD EPYC 7763 64-Core Processor",
                                                "AuthenticAMD")
    assert (model.logical_cpus, model.cores, model.threads_per_core) == (8, 4, 2)
    assert model.flags == ("avx2", "fma")
    assert model.l1d == Cache(32 << 10, 2) and model.l2 == Cache(512 << 10, 2)
    assert model.l3 == Cache(32 << 20, 8)
    assert model.vector_bits == 256 and not model.has_amx
    assert model.amx_tiles is None and model.figures is None
    lines = model.lines()
    assert lines[1] == ("caches: L1d 32 KiB per core, L2 512 KiB per core, L3 32 MiB shared "
                        "by 8 CPUs")
    assert "ISA: avx2 fma" in lines and "AMX: none" in lines
    assert "figures: not measured" in lines


def test_an_intel_sapphire_rapids_with_amx_is_read(tmp_path):
    model = _model(tmp_path, SPR, SPR_CACHES, cpus=set(range(112)))
    assert model.vendor == "GenuineIntel" and model.cores == 56
    assert model.flags == machine.ISA_FLAGS         # every flag that matters
    assert model.vector_bits == 512
    assert model.l1d == Cache(48 << 10, 2) and model.l3 == Cache(105 << 20, 112)
    # AMX is listed, but nothing probed it: not usable until a tile ran
    assert model.has("amx_tile") and not model.has_amx
    assert "AMX: listed, tile limits not read" in " ".join(model.lines())
    probed = dataclasses.replace(model, amx_max_rows=16, amx_bytes_per_row=64, amx_tiles=8,
                                 amx_usable=True)
    assert probed.has_amx
    assert "AMX int8/bf16: 8 tiles of 16 rows x 64 bytes (tiles run here)" in probed.lines()
    refused = dataclasses.replace(probed, amx_usable=False)
    assert not refused.has_amx and "the OS refuses the tile state" in refused.lines()[3]


def test_the_cpus_this_process_may_use_are_counted(tmp_path):
    # CPUs 0 and 56 are the two threads of core 0; 1 is core 1
    model = _model(tmp_path, SPR, SPR_CACHES, cpus={0, 56, 1})
    assert (model.logical_cpus, model.cores) == (3, 2)


def test_missing_or_odd_sysfs_files_are_unknown_caches(tmp_path):
    folder = _sysfs(tmp_path / "cache", [(1, "Data", "32K", "0"), (2, "Unified", None, "0"),
                                         (3, "Unified", "lots", "0-7")])
    assert machine.read_caches(folder) == {"l1d": Cache(32 << 10, 1), "l2": None, "l3": None}
    assert machine.read_caches(tmp_path / "nowhere") == {"l1d": None, "l2": None, "l3": None}
    # no cpuinfo at all: a model all the same
    model = machine.read_machine(tmp_path / "no-cpuinfo", tmp_path / "nowhere", cpus={0})
    assert model.model_name == "unknown CPU" and model.flags == () and model.vector_bits == 128


def test_cpu_lists():
    assert machine.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert machine.parse_cpu_list("5") == {5}


# --- derived figures and the JSON round trip ---------------------------------------------

def _figures(clock=2.0, fma512=None, fma256=32.0, int8=("vpdpbusd", 512, 128.0)) -> Figures:
    return Figures(clock_ghz=clock, tsc_ghz=2.1, fma512_per_ns=fma512, fma256_per_ns=fma256,
                   int8_path=int8[0], int8_bits=int8[1], int8_macs_per_ns=int8[2],
                   read_gb_s=12.5, seconds=0.4)


@pytest.mark.parametrize("fma512, fma256, ports512, ports256", [
    (64.0, 32.0, 2, 2),         # Sapphire Rapids: two 512-bit ports
    (32.0, 32.0, 1, 2),         # Zen 4: a 512-bit FMA as two 256-bit halves
    (None, 32.0, None, 2),      # AVX2 only
])
def test_fma_ports_from_fmas_per_cycle(tmp_path, fma512, fma256, ports512, ports256):
    model = dataclasses.replace(_model(tmp_path, SPR, SPR_CACHES),
                                figures=_figures(fma512=fma512, fma256=fma256))
    assert model.fma_ports(256) == ports256
    assert model.fma_ports() == (ports512 or ports256)
    assert model.fma_bits() == (512 if fma512 else 256)
    assert model.gflops == 2 * (fma512 or fma256)
    text = "\n".join(model.lines())
    assert f"{model.fma_ports()} x {model.fma_bits()}-bit" in text
    assert "vpdpbusd 512-bit: 128.0 GMAC/s per core" in text
    no_clock = dataclasses.replace(model, figures=_figures(clock=None, fma512=fma512))
    assert no_clock.fma_ports() is None and no_clock.gflops is not None


def test_the_model_round_trips_through_json(tmp_path):
    model = dataclasses.replace(_model(tmp_path, SPR, SPR_CACHES), amx_max_rows=16,
                                amx_bytes_per_row=64, amx_tiles=8, amx_usable=True,
                                figures=_figures(fma512=64.0))
    again = MachineModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model and isinstance(again.flags, tuple)
    bare = _model(tmp_path / "bare", EPYC, [])
    assert MachineModel.from_dict(json.loads(json.dumps(bare.to_dict()))) == bare


@pytest.mark.parametrize("damage", [
    lambda d: d.pop("cores"),
    lambda d: d.update(extra=1),
    lambda d: d.update(cores=True),
    lambda d: d.update(cores="2"),
    lambda d: d.update(flags=["avx2", "sse9"]),
    lambda d: d.update(l1d={"size": 1}),
    lambda d: d["figures"].update(clock_ghz="fast"),
    lambda d: d.update(figures=[]),
])
def test_a_damaged_dict_is_refused(tmp_path, damage):
    data = dataclasses.replace(_model(tmp_path, EPYC, EPYC_CACHES),
                               figures=_figures()).to_dict()
    damage(data)
    with pytest.raises(ValueError):
        MachineModel.from_dict(data)


# --- the cache --------------------------------------------------------------------------

def _measure(cache: Path, **kwargs) -> tuple[MachineModel, list[str]]:
    said: list[str] = []
    model = machine.machine_model(cache=cache, log=said.append, **kwargs)
    return model, said


def _measured(said: list[str]) -> bool:
    return any(line.startswith("measuring this machine") for line in said)


def test_measured_once_then_read(tmp_path):
    first, said = _measure(tmp_path)
    assert _measured(said)
    path = machine.cache_file(first, tmp_path)
    assert path.parent == tmp_path / "machine" and path.is_file()
    record = json.loads(path.read_text())
    assert record["key"] == path.stem and record["format"] == machine.FORMAT
    assert MachineModel.from_dict(record["model"]) == first
    again, said = _measure(tmp_path)
    assert again == first and not _measured(said)
    # written atomically: no temporary file is left beside it
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".")) \
        == [path.name]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    # asked to measure again, it does, and rewrites the file
    fresh, said = _measure(tmp_path, use_cache=False)
    assert _measured(said) and fresh.identity() == first.identity()
    assert json.loads(path.read_text())["model"] == fresh.to_dict()


@pytest.mark.parametrize("how", ["garbage", "truncated", "another key", "another machine"])
def test_a_damaged_or_foreign_file_is_measured_again(tmp_path, how):
    model, _ = _measure(tmp_path)
    path = machine.cache_file(model, tmp_path)
    record = json.loads(path.read_text())
    if how == "garbage":
        path.write_text("{not json")
    elif how == "truncated":
        path.write_text(path.read_text()[:200])
    elif how == "another key":
        path.write_text(json.dumps(record | {"key": "0" * 32}))
    else:                   # another CPU's figures under this key: never trusted
        record["model"]["model_name"] = "Some Other CPU"
        record["model"]["figures"]["fma256_per_ns"] = 1e6
        path.write_text(json.dumps(record))
    again, said = _measure(tmp_path)
    assert _measured(said) and any("damaged or another machine's" in s for s in said)
    assert again.identity() == model.identity()
    assert again.model_name != "Some Other CPU"
    assert MachineModel.from_dict(json.loads(path.read_text())["model"]) == again


def test_the_key_covers_the_cpu_and_its_count(tmp_path):
    model = machine.read_machine()
    keys = {machine.cache_file(m, tmp_path) for m in (
        model, dataclasses.replace(model, model_name=model.model_name + " v2"),
        dataclasses.replace(model, logical_cpus=model.logical_cpus + 1),
        dataclasses.replace(model, vendor="Other"))}
    assert len(keys) == 4
    # the figures are not part of the key: the file is found whatever they say
    assert machine.cache_file(dataclasses.replace(model, figures=_figures()), tmp_path) \
        == machine.cache_file(model, tmp_path)


def test_two_processes_measure_once(tmp_path):
    code = ("import sys; from vdla.compiler.targets.cpu import machine; "
            "machine.machine_model(cache=sys.argv[1], log=print)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(out.count("measuring this machine") for out in outs) == 1, outs


# --- the real microbenchmark and probe on this machine -----------------------------------

@pytest.fixture(scope="module")
def here(tmp_path_factory) -> MachineModel:
    try:
        find_c_compiler()
    except CompilerNotFound as e:
        pytest.skip(str(e))
    return machine.machine_model(cache=tmp_path_factory.mktemp("machine"))


def test_the_microbenchmark_gives_plausible_figures(here):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the benchmark's kernels are x86's; this is {platform.machine()}")
    f = here.figures
    assert 0.3 < f.clock_ghz < 7 and 0.3 < f.tsc_ghz < 7
    assert 1 <= here.fma_ports() <= 4, here.lines()
    # the ports are a whole number of vectors a cycle, measured to within a quarter
    lanes = here.fma_bits() // 32
    assert abs(here.fma_per_cycle() / lanes - here.fma_ports()) < 0.25 * here.fma_ports()
    assert here.fma_bits() == (512 if here.has("avx512f") else 256)
    assert f.int8_macs_per_ns > 0 and f.int8_bits in (256, 512)
    assert f.int8_path == ("vpdpbusd" if here.has("avx512_vnni") or here.has("avx_vnni")
                           else "vpmaddubsw+vpmaddwd")
    assert f.read_gb_s > 0.5
    assert f.seconds < 3


def test_amx_fields_follow_the_flags(here):
    if here.has("amx_tile"):
        assert here.amx_tiles and here.amx_max_rows and here.amx_bytes_per_row
        assert here.amx_usable is not None
    else:
        assert (here.amx_max_rows, here.amx_bytes_per_row, here.amx_tiles,
                here.amx_usable) == (None,) * 4
        assert not here.has_amx and "AMX: none" in here.lines()


def test_the_amx_probe_builds_even_without_amx(tmp_path):
    try:
        cc = find_c_compiler()
    except CompilerNotFound as e:
        pytest.skip(str(e))
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"AMX is x86's; this is {platform.machine()}")
    empty = tmp_path / "empty.c"
    empty.write_text("int vdla_nothing;\n")
    takes = subprocess.run([cc, *machine_bench.AMX_BUILD_FLAGS, "-c", str(empty), "-o",
                            str(tmp_path / "empty.o")], capture_output=True, text=True)
    if takes.returncode != 0:
        pytest.skip(f"{cc} lacks -mamx-tile: {takes.stderr.strip()}")
    program = machine_bench.build_amx_probe(tmp_path, cc)
    assert program.is_file() and os.access(program, os.X_OK)
    # its tile test is compiled in: the instructions are in the program
    text = subprocess.run([cc, *BASE_FLAGS, *machine_bench.AMX_BUILD_FLAGS, "-S", "-o", "-",
                           str(tmp_path / machine_bench.PROBE_SOURCE)], capture_output=True,
                          text=True, check=True).stdout
    assert "ldtilecfg" in text and "tilerelease" in text


# --- vdla targets ---------------------------------------------------------------------------

def test_vdla_targets_shows_the_machine(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("\ncpu: "):].split("\n\n")[0]
    model = machine.machine_model()             # what the command read or measured
    assert f"  machine: {model.model_name} ({model.vendor})" in block
    assert "    caches: L1d" in block and "\n    AMX" in block   # "AMX: none" or its tiles
    if model.gflops is not None:
        assert "GFLOP/s per core" in block and "GMAC/s per core" in block
    path = str(machine.cache_file(model)).replace(os.path.expanduser("~"), "~", 1)
    assert f"cached in {path}" in block
    assert main(["targets", "--json"]) == 0
    found = {t["name"]: t for t in json.loads(capsys.readouterr().out)}
    assert MachineModel.from_dict(found["cpu"]["machine"]["model"]) == model
    assert found["host"]["machine"] is None


def test_without_a_compiler_the_machine_is_read_not_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    cpu = targets.get("cpu", threads=1)
    found = cpu.machine()
    assert found["cache_file"] is None and "no-such-cc" in found["error"]
    model = MachineModel.from_dict(found["model"])
    assert model.figures is None and model.identity() == machine.read_machine()
    lines = cpu.machine_lines(found)
    assert lines[-1].startswith("not measured: $CC is ") and "figures: not measured" in lines
    assert not (tmp_path / "cache" / "machine").exists() or \
        not list((tmp_path / "cache" / "machine").glob("*.json"))
    # another CPU's platform describes no machine here
    assert targets.get("cpu", isa="avx2", cpu="Some Other CPU").machine() is None
