"""What the default conv2d chooser shares between configs, and that sharing changes no
answer: the timing model reads no buffer size (`timing.timing_key` is all it reads of a
config), the chooser's search over remembered spaces (`conv_layer._Space`) picks what a
plain scan of `schedule_space` picks, and the fit it tests with arrays is
`Conv2dSchedule.fits`."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import vdla
from gemm_graphs import conv_graph
from vdla.compiler.frontend.workloads import RESNET18, workload_graph
from vdla.compiler.targets.vdla import conv_layer
from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer, schedule_space
from vdla.compiler.targets.vdla.timing import FIT_ONLY, estimate_conv2d, timing_key

#: Config properties that are a buffer's size or follow from one (the fit's inputs).
BUFFER_DERIVED = {*FIT_ONLY, "out_buff_size", "inp_depth", "wgt_depth", "acc_depth",
                  "out_depth", "uop_depth", "log_inp_depth", "log_wgt_depth",
                  "log_acc_depth", "log_uop_depth", "uop_dst_bits", "uop_src_bits",
                  "uop_wgt_bits", "uop_bits"}

SMALL = vdla.HardwareConfig(inp_buff_size=16 * 1024, wgt_buff_size=64 * 1024,
                            acc_buff_size=32 * 1024, uop_buff_size=16 * 1024)
CONFIGS = [vdla.HardwareConfig(), SMALL, dataclasses.replace(SMALL, block_in=8, block_out=32),
           dataclasses.replace(SMALL, block_in=32, block_out=8),
           vdla.HardwareConfig(alu_ops=["MIN", "MAX", "ADD", "SHR", "REQ"], alu_hold=True)]


class Reading:
    """A config that records the attributes read of it."""

    def __init__(self, config):
        self._config, self.read = config, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._config, name)


def layers(config):
    """Layers of every kind the sweep meets: ResNet-18's 3x3, strided and 1x1, its
    stem (tap-packed where the config packs it), one with a fused residual."""
    out = []
    for name in ("C1", "C2", "C4", "C11"):
        graph, _ = workload_graph(RESNET18[name])
        out.append(Conv2dLayer.from_node(graph.node("conv"), graph, config))
    graph, _ = conv_graph(np.random.default_rng(0), residual=True)
    out.append(Conv2dLayer.from_node(graph.node("conv"), graph, config))
    return out


def some(schedules, n=40):
    """Every len/n-th of `schedules` (a spread over the space, cheap to estimate)."""
    schedules = list(schedules)
    return schedules[::max(1, len(schedules) // n)]


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_the_timing_model_reads_no_buffer_size(config):
    seen = set()
    for layer in layers(config):
        for s in some(schedule_space(layer, config, width_tiles=None)):
            reading = Reading(config)
            estimate_conv2d(layer, s, reading)
            seen |= reading.read
    assert seen, "the model read nothing of the config"
    # The micro-op width follows from the buffers' depths; it is in `timing_key`.
    assert seen & BUFFER_DERIVED <= {"uop_bytes"}, sorted(seen & BUFFER_DERIVED)


def test_configs_of_one_key_estimate_alike():
    other = dataclasses.replace(SMALL, inp_buff_size=64 * 1024, acc_buff_size=128 * 1024)
    assert timing_key(other) == timing_key(SMALL) == timing_key(vdla.HardwareConfig())
    assert timing_key(dataclasses.replace(SMALL, block_out=32)) != timing_key(SMALL)
    # Wider micro-ops (more index bits: a deeper acc buffer of narrower blocks) are
    # another key, as they are another table load.
    narrow = dataclasses.replace(SMALL, block_out=8)
    wide = dataclasses.replace(narrow, acc_buff_size=64 * 1024, wgt_buff_size=256 * 1024)
    assert wide.uop_bytes != narrow.uop_bytes and timing_key(wide) != timing_key(narrow)
    for layer in layers(SMALL):
        for s in some(schedule_space(layer, SMALL, width_tiles=None), 20):
            assert estimate_conv2d(layer, s, SMALL) == estimate_conv2d(layer, s, other)


def scan(layer, config, threads=((1, 1), (2, 1), (1, 2))):
    """The chooser as a plain scan of `schedule_space`: the first of the fewest cycles,
    ties to the larger tile, the widest few output-width tilings first."""
    for width_tiles in (4, None):
        best, best_key = None, None
        for s in schedule_space(layer, config, threads=threads, width_tiles=width_tiles):
            key = (estimate_conv2d(layer, s, config).cycles,
                   -s.tile_h * s.tile_w * s.tile_ci * s.tile_co)
            if best is None or key < best_key:
                best, best_key = s, key
        if best is not None:
            return best
    return None


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_the_search_picks_what_a_scan_picks(config, monkeypatch, tmp_path):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))     # the search runs, not the disk
    for layer in layers(config)[2:]:      # the small ones: a scan estimates every tiling
        for threads, nthreads in [(((1, 1), (2, 1), (1, 2)), None), (((1, 1),), 1)]:
            assert conv_layer._search_conv2d(layer, config, nthreads, threads) == \
                scan(layer, config, threads), (layer, nthreads)


def test_configs_that_share_a_space_fit_as_fits_says():
    """One `_Space` serves configs of one key with different buffers: its array fit is
    `Conv2dSchedule.fits` on each."""
    base = vdla.HardwareConfig()
    sizes = itertools.product((16 * 1024, 32 * 1024), (64 * 1024, 256 * 1024),
                              (32 * 1024, 128 * 1024))
    configs = [dataclasses.replace(base, inp_buff_size=i, wgt_buff_size=w, acc_buff_size=a)
               for i, w, a in sizes]
    graph, _ = workload_graph(RESNET18["C2"])
    layer = Conv2dLayer.from_node(graph.node("conv"), graph, base)
    threads = ((1, 1), (2, 1), (1, 2))
    assert len({timing_key(c) for c in configs}) == 1
    for config in configs:
        space = conv_layer._space(layer, config, threads, None)
        depth = np.array([d for _, d in space.tilings[0].needs(layer, config).values()])
        fit = space.ok & (space.need <= depth).all(axis=1)
        assert list(fit) == [t.fits(layer, config) for t in space.tilings]
