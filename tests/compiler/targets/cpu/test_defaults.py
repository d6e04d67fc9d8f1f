"""The CPU target's default schedules read the machine (`MachineModel.costs`): the costs a
machine model gives, the defaults that differ between machines as their facts say
(this project's AVX2 host as measured; an AMD Zen 4 with AVX-512 and an Intel Sapphire
Rapids written from published specs, bench/machines/), the costs threaded from
`CpuTarget` into its tasks and a training set's platforms, and the cost models'
machine features."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from script_loading import load_script
from vdla.compiler.targets.cpu import fusion
from vdla.compiler.targets.cpu.features import CONV2D, DENSE, MATMUL, conv2d_values
from vdla.compiler.targets.cpu.isa import get as get_isa
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineModel, machine_model
from vdla.compiler.targets.cpu.matmul_schedule import MatmulShape, choose_matmul
from vdla.compiler.targets.cpu.dense_schedule import choose_dense
from vdla.compiler.targets.cpu.schedule import choose_conv, estimate_conv
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape
from vdla.compiler.targets.cpu.target import CpuTarget
from vdla.compiler.tuner.workload_tasks import tasks_from_workload

MACHINES = Path(__file__).resolve().parents[4] / "bench" / "machines"


def _model(name: str) -> MachineModel:
    return MachineModel.from_dict(json.loads((MACHINES / name).read_text())["model"])


def this_host() -> MachineModel:
    """This project's 2-core AMD EPYC host (Zen 4 class, 1 MiB L2 a core, AVX2 only: the
    hypervisor hides AVX-512), as `machine_model` measured it on 2026-11-29."""
    return _model("amd_epyc_avx2_measured.json")


def zen4() -> MachineModel:
    """An AMD EPYC 9654 (Zen 4) with AVX-512, written from published specs, not measured:
    one 512-bit FMA a cycle as two 256-bit halves, 32 KiB L1d and 1 MiB L2 a core."""
    return _model("amd_zen4_genoa_published.json")


def sapphire_rapids() -> MachineModel:
    """An Intel Xeon Platinum 8480+ (Sapphire Rapids), written from published specs, not
    measured: two 512-bit FMA ports, 48 KiB L1d and 2 MiB L2 a core, AMX."""
    return _model("intel_sapphire_rapids_published.json")


def intel_host() -> MachineModel:
    """This project's 2-core Intel Xeon host (Sapphire Rapids class, AMX), as
    `machine_model` measured it on 2026-11-30."""
    return _model("intel_xeon_amx_measured.json")


AVX512, AVX2 = get_isa("avx512vnni"), get_isa("avx2")


def _conv(c, h, o, k, s=1, groups=1, dtype="float32") -> ConvShape:
    return ConvShape(n=1, c=c, h=h, w=h, o=o, groups=groups, kh=k, kw=k, sh=s, sw=s,
                     pt=k // 2, pl=k // 2, pb=k // 2, pr=k // 2, dtype=dtype)


def test_the_machines_costs():
    here, amd, intel = this_host().costs(), zen4().costs(), sapphire_rapids().costs()
    # Zen 4: the same lanes a cycle at both widths; the AVX2 host measured 256 bits only,
    # and its 512-bit rate is taken to be the same (a 512-bit FMA as two halves)
    assert amd.fma_lanes == here.fma_lanes == NOMINAL.fma_lanes == ((512, 16.0), (256, 16.0))
    assert intel.fma_lanes == ((512, 32.0), (256, 16.0))
    assert (here.l1d, here.l2, amd.l1d, amd.l2) == (32 << 10, 1 << 20, 32 << 10, 1 << 20)
    assert (intel.l1d, intel.l2, intel.amx, amd.amx) == (48 << 10, 2 << 20, True, False)
    assert here.int8_path == "vpmaddubsw+vpmaddwd" and 20 < here.int8_macs < 26
    assert (amd.int8_macs, intel.int8_macs) == (64.0, 128.0)
    # the chooser's work scale: the old 16 / vl where the FMAs are Zen 4's, half of it at
    # 512 bits on two full-width ports
    assert [NOMINAL.work_scale(vl) for vl in (16, 8)] == [1.0, 2.0]
    assert [here.work_scale(vl) for vl in (16, 8)] == [1.0, 2.0]
    assert [intel.work_scale(vl) for vl in (16, 8)] == [0.5, 2.0]
    assert [m.vector_isa() for m in (this_host(), zen4(), sapphire_rapids())] == [
        "avx2", "avx512vnni", "avx512vnni"]


def test_the_measured_intel_host_reads_as_its_published_class():
    """The Intel host as measured: the costs the published Sapphire Rapids gives (two
    512-bit FMA ports, rounded; its caches; AMX granted), VNNI's int8 path measured."""
    measured, published = intel_host(), sapphire_rapids()
    here, spec = measured.costs(), published.costs()
    assert here.fma_lanes == spec.fma_lanes == ((512, 32.0), (256, 16.0))
    assert (here.l1d, here.l2, here.amx) == (spec.l1d, spec.l2, True)
    assert here.int8_path == "vpdpbusd" and measured.amx_usable
    assert [here.work_scale(vl) for vl in (16, 8)] == [0.5, 2.0]


def test_a_machine_without_figures_gets_the_nominal_rates_and_its_caches():
    bare = dataclasses.replace(sapphire_rapids(), figures=None)
    costs = bare.costs()
    assert costs.fma_lanes == NOMINAL.fma_lanes and costs.int8_macs is None
    assert (costs.l1d, costs.l2) == (48 << 10, 2 << 20)
    unknown = dataclasses.replace(bare, l1d=None, l2=None)
    assert (unknown.costs().l1d, unknown.costs().l2) == (NOMINAL.l1d, NOMINAL.l2)


#: Layers of ResNet-18, ResNet-50 and MobileNet-v1 (float32 and int8, with depthwise).
LAYERS = [_conv(c, h, o, k, s, g, d) for d in ("float32", "int8")
          for c, h, o, k, s, g in ((64, 56, 64, 3, 1, 1), (128, 28, 128, 3, 1, 1),
                                   (256, 14, 256, 3, 1, 1), (512, 7, 2048, 1, 1, 1),
                                   (3, 224, 64, 7, 2, 1), (128, 56, 128, 3, 1, 128),
                                   (1024, 7, 1024, 3, 1, 1024), (256, 28, 256, 1, 1, 1))]


@pytest.mark.parametrize("blocked", [True, False])
def test_the_machine_the_constants_came_from_keeps_its_defaults(blocked):
    """A Zen 4 with AVX-512 reads as `NOMINAL`: every default is the constants' (and on
    the AVX2 host as measured, the same as with no figures)."""
    for conv in LAYERS:
        for isa, model in ((AVX512, zen4()), (AVX2, this_host())):
            assert (choose_conv(conv, isa, 2, blocked=blocked, costs=model.costs())
                    == choose_conv(conv, isa, 2, blocked=blocked))


def test_sapphire_rapids_defaults_differ_as_its_facts_say():
    amd, intel = zen4().costs(), sapphire_rapids().costs()

    def both(conv, **kw):
        return [choose_conv(conv, AVX512, 2, costs=c, **kw) for c in (amd, intel)]

    # Two full-width 512-bit ports: a 56-wide depthwise row in 512-bit vectors (64
    # lanes at 32 a cycle) beats 256-bit ones that pad nothing (56 at 16); on Zen 4 the
    # widths run level, so the one that pads least
    a, b = both(_conv(128, 56, 128, 3, 1, 128), blocked=False)
    assert (a.vl, b.vl) == (8, 16)
    a, b = both(_conv(1024, 7, 1024, 3, 1, 1024, "int8"), blocked=False)
    assert (a.vl, b.vl) == (8, 16)
    # L1d: a depthwise work item's rows stay in 48 KiB where 32 KiB take half of them
    a, b = both(_conv(32, 96, 32, 3, 1, 32), blocked=False)
    assert (a.tile_h, b.tile_h) == (48, 96)
    # L2: 590 KB of int8 3x3 weights leave half of Zen 4's 1 MiB, so one row tile reads
    # them once; Sapphire Rapids' 2 MiB keeps them, and rows split freely
    a, b = both(_conv(256, 14, 256, 3, 1, 1, "int8"), blocked=False)
    assert a.tile_h == 14 and b.tile_h < 14
    # ... and 1 MB of 1x1 weights: Zen 4 streams them in behind a wide tile (4 pixel
    # vectors), Sapphire Rapids keeps them cached and takes the one-vector tile
    a, b = both(_conv(512, 7, 2048, 1, 1, 1, "int8"), blocked=False)
    assert (a.nv, b.nv) == (4, 1)
    # the same schedule costs half the multiply-add cycles on two 512-bit ports
    conv = _conv(256, 14, 256, 3)
    s = choose_conv(conv, AVX512, 1, blocked=False)
    assert estimate_conv(conv, s, 1, intel) < 0.6 * estimate_conv(conv, s, 1, amd)
    # the fused pairs' sizes follow L2: Sapphire Rapids' bands are twice Zen 4's
    assert fusion._bands(112, 4 << 20, 2, intel)[1] * 2 == fusion._bands(112, 4 << 20, 2,
                                                                          amd)[1]


def test_the_avx2_host_and_sapphire_rapids_differ_in_vector_width():
    here, intel = this_host(), sapphire_rapids()
    for conv in LAYERS:
        a = choose_conv(conv, get_isa(here.vector_isa()), 2, costs=here.costs())
        b = choose_conv(conv, get_isa(intel.vector_isa()), 2, costs=intel.costs())
        assert (a.vl, b.vl) == (8, 16), conv
    dense = DenseShape(n=1, k=512, o=1000, dtype="float32")
    assert [choose_dense(dense, isa, m.costs()).vl
            for isa, m in ((AVX2, here), (AVX512, intel))] == [8, 16]
    product = MatmulShape(batches=2, m=128, k=64, n=128, dtype="int8")
    a, b = (choose_matmul(product, isa, m.costs()) for isa, m in ((AVX2, here),
                                                                  (AVX512, intel)))
    assert (a.vl, a.mr, a.wide, b.vl, b.mr, b.wide) == (8, 4, 1, 16, 6, 0)


def test_the_target_gives_its_machine_to_its_tasks_and_platforms():
    model = sapphire_rapids()
    target = CpuTarget(threads=2, isa="avx512vnni", cpu=model.model_name,
                       machine=model.to_dict())
    assert target.costs == model.costs()
    params = target.platform_params()
    assert params["machine"] == model.to_dict()
    again = CpuTarget.from_platform(json.loads(json.dumps(params)))
    assert again.costs == target.costs
    nominal = CpuTarget.from_platform({k: v for k, v in params.items() if k != "machine"})
    assert nominal.costs == NOMINAL and "machine" not in nominal.platform_params()
    # a depthwise layer with two outputs a channel (no blocked layout): its task's default
    # is the machine's, and its memo key names the machine
    zen = CpuTarget(threads=2, isa="avx512vnni", cpu="AMD EPYC 9654",
                    machine=zen4().to_dict())
    spec = "56,56,64,128,3,1,1,64"
    (a,), (b,) = (tasks_from_workload(spec, t, precision="float32") for t in (zen, target))
    assert (a.costs, b.costs) == (zen.costs, target.costs)
    assert (a.default_schedule().vl, b.default_schedule().vl) == (8, 16)
    assert a.platform_key()["machine"] != b.platform_key()["machine"]
    with pytest.raises(ValueError, match="give its cpu"):
        CpuTarget(machine=model.to_dict())


def test_this_machines_target_reads_its_measured_model():
    target = CpuTarget(threads=2)
    assert target.costs == machine_model().costs()
    assert MachineModel.from_dict(target.platform_params()["machine"]).costs() == target.costs


def test_the_features_carry_the_machine():
    assert (CONV2D.version, DENSE.version, MATMUL.version) == (4, 3, 2)
    conv = _conv(256, 14, 256, 3)
    s = choose_conv(conv, AVX512, 1)
    values = {name: conv2d_values(conv, s, AVX512, 1, m.costs())
              for name, m in (("amd", zen4()), ("intel", sapphire_rapids()))}
    assert (values["amd"]["log_fma_lanes"], values["intel"]["log_fma_lanes"]) == (4.0, 5.0)
    assert (values["amd"]["log_int8_macs"], values["intel"]["log_int8_macs"]) == (6.0, 7.0)
    assert (values["amd"]["log_l2"], values["intel"]["log_l2"]) == (20.0, 21.0)
    assert (values["amd"]["amx"], values["intel"]["amx"]) == (0.0, 1.0)
    assert values["intel"]["log_est"] < values["amd"]["log_est"]
    # the AVX2 host on avx512vnni records (earlier sessions' EPYC with AVX-512): 16 lanes
    # a cycle at 512 bits, and VNNI's int8 rate from them (its benchmark measured AVX2's)
    host = conv2d_values(conv, s, AVX512, 1, this_host().costs())
    assert host["log_fma_lanes"] == 4.0 and host["log_int8_macs"] == 6.0
    avx2 = conv2d_values(conv, choose_conv(conv, AVX2, 1), AVX2, 1, this_host().costs())
    assert math.isclose(2 ** avx2["log_int8_macs"], this_host().costs().int8_macs)


def test_every_cpu_training_set_names_its_machine():
    datasets = MACHINES.parent / "datasets"
    manifests = sorted(datasets.glob("cpu_*.manifest.json"))
    assert manifests
    for path in manifests:
        data = json.loads(path.read_text())
        for params in data["platforms"].values():
            model = MachineModel.from_dict(params["machine"])
            assert model.model_name == params["cpu"], path.name


def test_the_defaults_bench_compares_the_machines(tmp_path, capsys):
    bench = load_script(MACHINES.parent / "cpu_defaults.py")
    assert bench.main(["--models", "mobilenet_v1", "--precision", "float32", "--threads",
                       "2", "--plain", "--machines",
                       str(MACHINES / "amd_zen4_genoa_published.json"),
                       str(MACHINES / "intel_sapphire_rapids_published.json"),
                       "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "written from published specs, not measured" in out and "(this machine)" in out
    (result,) = json.loads((tmp_path / "cpu_defaults.json").read_text())["results"]
    between = [row for row in result["rows"] if row["schedules"][1] != row["schedules"][2]]
    # Zen 4 against Sapphire Rapids: the plain depthwise layers' vector width
    assert len(between) == 4 and all("depthwise" in row["layer"] for row in between)
    assert all(row["schedules"][1].startswith("P vl8") and row["schedules"][2].startswith(
        "P vl16") for row in between)
    with pytest.raises(SystemExit):
        bench.main(["--machines", str(tmp_path / "cpu_defaults.json")])
    assert "not a machine model" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("c, h, o, k, s", [(64, 56, 64, 3, 1), (128, 28, 256, 3, 2),
                                           (512, 14, 512, 1, 1), (512, 7, 512, 3, 1)])
def test_avx2_blocked_tiles_are_six_pixels_by_two_vectors(dtype, c, h, o, k, s):
    """With 16 registers a one-group blocked direct convolution's default is 6 pixels by
    two channel vectors, rows outer, two tiles a work item, float32's reduction unrolled
    twice; int8 layers of more than one tap take one channel vector by 2 pixels (the
    reduction unrolled twice, one tile a work item) or by a whole row of up to 7; with
    AVX-512's 32 registers a whole row (or 14 pixels) by one or two vectors, not
    unrolled (`schedule._choose_blocked`)."""
    shape = _conv(c, h, o, k, s, dtype=dtype)
    avx2 = choose_conv(shape, AVX2, 2, costs=this_host().costs())
    if dtype == "float32" and k == 3 and s == 1:
        assert avx2.wino           # Winograd's own tile
        return
    assert (avx2.layout, avx2.wino, avx2.order) == ("nchwc", 0, "px")
    if dtype == "int8" and k > 1:
        wo = shape.wo
        assert (avx2.mr, avx2.nv, avx2.unroll) == ((wo, 1, 1) if wo <= 7 else (2, 1, 2))
        assert avx2.tile_co == (2 if wo <= 7 else 1) * avx2.vl
    else:
        assert (avx2.mr, avx2.nv) == (6, 2)
        assert avx2.tile_co == 4 * avx2.vl and avx2.unroll == (1 if dtype == "int8" else 2)
    wide = choose_conv(shape, AVX512, 2, costs=zen4().costs())
    assert wide.unroll == 1 and (wide.mr, wide.nv) != (6, 2)
