"""The Verilator model's optimisation levels (`vdla.sim.verilator.build`): a
profile-guided build trains, is cached apart, and runs programs exactly as the model
the rest of the suite builds (``lto``, tests/conftest.py). One real profile-guided
build of a small config, in a private cache."""

import json

import numpy as np
import pytest

import vdla
from program_gen import random_program
from vdla.runtime.kernels import BlockedGemm
from vdla.sim.verilator import BuildError, build_model
from vdla.sim.verilator import training
from vdla.sim.verilator.build import OPTIMISE_ENV, default_optimise, registered_reset

SMALL = vdla.HardwareConfig(block_in=8, block_out=8, uop_buff_size=4096, inp_buff_size=4096,
                            wgt_buff_size=16384, acc_buff_size=16384)


def run_programs(config, optimise, cache):
    """Counters and DRAM of a blocked GEMM and three random programs on a model built at
    `optimise`."""
    results = []
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (40, 64), dtype=np.int8)
    b = rng.integers(-128, 128, (24, 64), dtype=np.int8)
    with vdla.runtime.open(config, backend="verilator", dram_size=16 << 20, cache=cache,
                           optimise=optimise) as dev:
        with BlockedGemm(dev, a, b, shift=6, virtual_threads=2) as gemm:
            results.append((gemm.run(), gemm.result()))
        for seed in range(3):
            generated = random_program(dev, np.random.default_rng([seed, 38]), n_tiles=4,
                                       virtual_threads=1 + seed % 2)
            stats = dev.run(*dev.load_program(generated.program))
            results.append((stats, bytes(dev.dram)))
    return results


def test_profile_guided_model_runs_like_the_lto_model(tmp_path):
    cache = tmp_path / "cache"
    pgo = build_model(SMALL, cache=cache, optimise="pgo")
    lto = build_model(SMALL, cache=cache, optimise="lto")
    assert pgo.built and lto.built and pgo.key != lto.key
    entry = pgo.library.parent
    assert json.loads((entry / "entry.json").read_text())["optimise"] == "pgo"
    assert (entry / "training.log").exists()
    assert not build_model(SMALL, cache=cache, optimise="pgo").built
    for (stats_p, data_p), (stats_l, data_l) in zip(run_programs(SMALL, "pgo", cache),
                                                    run_programs(SMALL, "lto", cache)):
        stats_p.pop("wall_seconds"), stats_l.pop("wall_seconds")
        assert stats_p == stats_l
        assert np.array_equal(np.asarray(data_p), np.asarray(data_l))


def test_the_level_comes_from_the_environment_and_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv(OPTIMISE_ENV, "O3")
    assert default_optimise() == "O3"
    monkeypatch.setenv(OPTIMISE_ENV, "fast")
    with pytest.raises(ValueError, match=r"\$VDLA_VERILATOR_OPTIMISE must be one of O3, "
                                         r"lto, pgo, not 'fast'"):
        default_optimise()
    with pytest.raises(ValueError, match="optimise must be one of O3, lto, pgo, not 'O2'"):
        build_model(SMALL, cache=tmp_path, optimise="O2")


def test_a_failed_training_run_names_its_log(tmp_path):
    """The training run loads the instrumented library in a child process; one that
    cannot load it fails with the end of its log, and a build turns that into a
    BuildError (`build_model` catches `TrainingFailed`)."""
    assert not issubclass(training.TrainingFailed, BuildError)   # so the build wraps it
    log = tmp_path / "training.log"
    with pytest.raises(training.TrainingFailed, match="training run failed .exit status"):
        training.train(tmp_path / "missing" / "libvdla_sim.so", SMALL, log)
    assert "libvdla_sim.so" in log.read_text()


def test_the_reset_is_registered_for_verilator():
    """`registered_reset` puts the top's reset behind one register; Verilog that does not
    look as the generator writes it is refused, not half rewritten."""
    top = ("module vdla_accelerator(clk, rst, x);\n  input clk;\n  wire clk;\n"
           "  input rst;\n  wire rst;\n  sub u (\n    .clk(clk),\n    .rst(rst)\n  );\n"
           "endmodule\nmodule sub(clk, rst);\nendmodule\n")
    out = registered_reset(top)
    assert "always @(posedge clk) rst_q <= rst;" in out and ".rst(rst_q)" in out
    assert out.endswith("module sub(clk, rst);\nendmodule\n")   # other modules untouched
    with pytest.raises(BuildError, match="does not declare and pass on its reset"):
        registered_reset(top.replace("  wire rst;\n", ""))
    with pytest.raises(ValueError, match="reset must be one of registered, raw, not 'async'"):
        build_model(SMALL, reset="async")
