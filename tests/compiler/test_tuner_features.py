"""Feature sets for cost models across layers and configs (`vdla.compiler.tuner.features`,
`vdla.compiler.targets.vdla.features`)."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

import vdla
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.features import CONV2D, conv2d_values
from vdla.compiler.tuner.features import Feature, FeatureSet

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tuner.md"

#: (version, fingerprint) of every shipped feature set: a change to the features that
#: does not bump the version fails here, before a trained model reads the wrong meaning.
PINNED = {"vdla.conv2d": (1, "a7ce37cbeb3f")}

CONFIGS = [vdla.HardwareConfig(),
           vdla.HardwareConfig(block_in=8, block_out=8, uop_buff_size=4096,
                               inp_buff_size=8192, wgt_buff_size=32768,
                               acc_buff_size=32768, alu_hold=True)]


def test_the_version_is_pinned_to_the_names():
    assert (CONV2D.version, CONV2D.fingerprint()) == PINNED[CONV2D.name]


def test_every_feature_is_documented_on_the_tuner_page():
    text = DOCS.read_text()
    missing = [n for n in CONV2D.names if not re.search(rf"`{n}`", text)]
    assert not missing, f"docs/tuner.md lacks {missing}"


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "8x8"])
@pytest.mark.parametrize("spec", ["C2", "C5", "C11"])
def test_every_schedule_of_a_layer_has_a_finite_vector(spec, config):
    task = tasks_from_workload(spec, VdlaTarget(config))[0]
    space = task.space()
    rows = np.array([CONV2D.vector(conv2d_values(task.layer, s, config, task.estimate(s)))
                     for s in space])
    assert rows.shape == (len(space), len(CONV2D.names)) and np.isfinite(rows).all()
    column = dict(zip(CONV2D.names, rows.T))
    for b in ("inp", "wgt", "acc", "out", "uop"):   # the space holds schedules that fit
        assert (column[f"fill_{b}"] <= 1).all() and (column[f"fill_{b}"] >= 0).all()
    shares = sum(column[f"est_{p}"] for p in ("gemm", "epilogue", "load", "store"))
    assert np.allclose(shares, 1.0)
    assert (column["log_est_over_ideal"] >= 0).all()   # nothing beats the ideal
    # The workload and the config are the same for every schedule; the schedule's are not.
    for name in ("log_macs", "log_block_in", "alu_hold"):
        assert len(set(column[name])) == 1
    for name in ("log_tile_h", "fill_inp", "log_est_over_ideal"):
        assert len(set(column[name])) > 1
    assert column["log_block_in"][0] == math.log2(config.block_in)


def test_one_schedule_reads_the_same_layer_alike_on_two_configs():
    """The workload's features do not depend on the config, its ideal cycles do."""
    values = []
    for config in CONFIGS:
        task = tasks_from_workload("C5", VdlaTarget(config))[0]
        s = task.default_schedule()
        values.append(conv2d_values(task.layer, s, config, task.estimate(s)))
    default, small = values
    assert default["log_macs"] == small["log_macs"]
    assert small["log_ideal_cycles"] - default["log_ideal_cycles"] == pytest.approx(2.0)
    assert (default["alu_hold"], small["alu_hold"]) == (0.0, 1.0)


def test_a_feature_set_refuses_bad_vectors_and_definitions():
    fs = FeatureSet("t", 1, (Feature("a", "one"), Feature("b", "two")))
    assert fs.vector({"a": 1, "b": 2.5}).tolist() == [1.0, 2.5]
    with pytest.raises(ValueError, match=r"missing \['b'\]; not in the set \['c'\]"):
        fs.vector({"a": 1, "c": 2})
    with pytest.raises(ValueError, match="not finite: b=nan"):
        fs.vector({"a": 1, "b": float("nan")})
    with pytest.raises(ValueError, match=r"named twice: \['a'\]"):
        FeatureSet("t", 1, (Feature("a", "one"), Feature("a", "two")))
    with pytest.raises(ValueError, match=r"without a doc: \['b'\]"):
        FeatureSet("t", 1, (Feature("a", "one"), Feature("b", " ")))
    assert fs.table().splitlines()[2] == "| `a` | one |"


# --- the CPU target's ----------------------------------------------------------------------

def test_the_cpu_feature_sets_are_pinned_and_documented():
    from vdla.compiler.targets.cpu.features import (CONV2D as CPU_CONV, DENSE as CPU_DENSE,
                                                    MATMUL as CPU_MATMUL)

    text = DOCS.read_text()
    for fs, version, fingerprint in ((CPU_CONV, 4, "c667c598d5f9"),
                                     (CPU_DENSE, 3, "fee42d3b864f"),
                                     (CPU_MATMUL, 2, "d4a21c245f2c")):
        assert (fs.version, fs.fingerprint()) == (version, fingerprint), fs.name
        missing = [n for n in fs.names if not re.search(rf"`{n}`", text)]
        assert not missing, f"docs/tuner.md lacks {fs.name}'s {missing}"


def test_cpu_features_read_the_instruction_set_and_the_schedule():
    """The same layer on each instruction set this machine runs: finite vectors that
    differ in the platform's features; two schedules differ in the schedule's."""
    from vdla.compiler import targets

    from vdla.compiler.targets.cpu.isa import ISAS
    from vdla.compiler.targets.cpu.target import machine_features

    found = {}
    runs = sum(isa.runs_on(machine_features()) for isa in ISAS.values())
    for target in targets.get("cpu").platforms(runs):
        [task] = tasks_from_workload("14,14,32,64,3,1,1", target)
        space = task.space()
        vectors = np.array([task.feature_set.vector(task.transfer_features(s))
                            for s in space[:50]])
        assert np.isfinite(vectors).all() and len(np.unique(vectors, axis=0)) > 1
        names = task.feature_set.names
        found[task.isa] = vectors[0][[names.index("log_vector_lanes"),
                                      names.index("int8_dot")]]
    assert len({tuple(v) for v in found.values()}) == len(found)   # one point per ISA
