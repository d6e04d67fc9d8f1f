"""The default choosers' answers remembered on disk (`common.remembered_schedule`,
`vdla._memo`): the same schedule as the search, a new entry for a new key or new
code, nothing trusted that does not check, all under ``$VDLA_CACHE``."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest

import vdla
from vdla import _keys, _memo
from vdla.compiler.frontend.workloads import ConvWorkload, workload_graph
from vdla.compiler.targets.vdla import Conv2dLayer, Conv2dSchedule, conv_layer, pool
from vdla.compiler.targets.vdla.common import SCHEDULE_CACHE
from vdla.compiler.targets.vdla.conv_layer import choose_conv2d
from vdla.compiler.targets.vdla.pool import Pool2dLayer, choose_pool2d

DEFAULT = vdla.HardwareConfig()
#: A layer whose search is quick, with two threads by default.
SMALL = ConvWorkload(14, 14, 64, 64, 3, 1, 1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh $VDLA_CACHE, and the choosers' in-process caches empty before and after."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    choose_conv2d.cache_clear()
    choose_pool2d.cache_clear()
    yield tmp_path / "cache"
    choose_conv2d.cache_clear()
    choose_pool2d.cache_clear()


def small_layer(config=DEFAULT) -> Conv2dLayer:
    graph, _ = workload_graph(SMALL)
    return Conv2dLayer.from_node(graph.node("conv"), graph, config)


def entries(cache) -> list:
    return sorted((cache / SCHEDULE_CACHE).glob("*/*.json"))


def from_disk_only(monkeypatch):
    """Make the conv search fail, so that a choice can only come from the disk."""
    def search(*args):
        raise AssertionError("searched instead of reading the cache")
    monkeypatch.setattr(conv_layer, "_search_conv2d", search)


def conv_entry(layer, config, nthreads=None):
    """The entry of `choose_conv2d`'s answer: keyed on the code of its module (the
    chooser's `choose` is a function of `conv_layer`)."""
    return _memo.entry_path(SCHEDULE_CACHE, "conv2d",
                            {"layer": layer, "config": config.to_dict(),
                             "options": {"nthreads": nthreads}}, conv_layer)


def test_a_remembered_choice_is_the_searched_one(cache, monkeypatch):
    layer = small_layer()
    threads = ((1, 1), (2, 1), (1, 2))
    searched = conv_layer._search_conv2d(layer, DEFAULT, None, threads)
    assert choose_conv2d(layer, DEFAULT) == searched
    [entry] = entries(cache)
    assert entry == conv_entry(layer, DEFAULT)
    assert json.loads(entry.read_text())["value"]["tile_co"] == searched.tile_co
    choose_conv2d.cache_clear()
    from_disk_only(monkeypatch)
    assert choose_conv2d(layer, DEFAULT) == searched     # a new process would see this


def test_the_pool_chooser_is_remembered_too(cache, monkeypatch):
    layer = Pool2dLayer(kind="max", n=1, c=64, h=112, w=112, kernel_h=3, kernel_w=3,
                        stride_h=2, stride_w=2, pad_top=1, pad_left=1, out_h=56, out_w=56,
                        batch_blocks=1, blocks=4)
    searched = pool._search_pool2d(layer, DEFAULT)
    assert choose_pool2d(layer, DEFAULT) == searched
    assert len(entries(cache)) == 1
    choose_pool2d.cache_clear()
    monkeypatch.setattr(pool, "_search_pool2d", lambda *args: pytest.fail("searched"))
    assert choose_pool2d(layer, DEFAULT) == searched


def test_another_config_layer_or_thread_count_is_another_entry(cache):
    layer = small_layer()
    narrow = DEFAULT.replace(dram_bytes_per_cycle=1.0)
    first = choose_conv2d(layer, DEFAULT)
    choose_conv2d(layer, narrow)
    one = choose_conv2d(layer, DEFAULT, nthreads=1)
    assert one.nthreads == 1 != first.nthreads
    other_layer = small_layer(DEFAULT.replace(acc_buff_size=64 * 1024))
    assert other_layer == layer      # the layer is the same; the config is not
    choose_conv2d(layer, DEFAULT.replace(acc_buff_size=64 * 1024))
    assert len(entries(cache)) == 4
    assert conv_entry(layer, narrow) != conv_entry(layer, DEFAULT)


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],                          # cut short
    lambda text: "not json at all",
    lambda text: "[]",
    lambda text: json.dumps({**json.loads(text),                  # fails its checksum
                             "value": {**json.loads(text)["value"], "tile_h": 1}}),
])
def test_a_damaged_entry_is_chosen_again_and_rewritten(cache, damage):
    layer = small_layer()
    chosen = choose_conv2d(layer, DEFAULT)
    entry = conv_entry(layer, DEFAULT)
    good = entry.read_text()
    entry.write_text(damage(good))
    choose_conv2d.cache_clear()
    assert choose_conv2d(layer, DEFAULT) == chosen
    assert entry.read_text() == good


def test_an_entry_whose_schedule_does_not_serve_the_layer_is_not_trusted(cache):
    layer = small_layer()
    chosen = choose_conv2d(layer, DEFAULT)
    single = choose_conv2d(layer, DEFAULT, nthreads=1)
    # Whole entries with valid checksums: a schedule that overflows the buffers, one that
    # is no schedule, and one with two threads where one was asked for.
    assert chosen.nthreads == 2 and single.nthreads == 1
    overflows = {"tile_h": 14, "tile_w": 14, "tile_ci": 4, "tile_co": 4, "oc_nthread": 2,
                 "h_nthread": 1}
    assert not Conv2dSchedule(**overflows).fits(layer, DEFAULT)
    two = dict(chosen.__dict__)
    for nthreads, want, values in [(None, chosen, [overflows, {"tile_h": 7}]),
                                   (1, single, [overflows, {"tile_h": 7}, two])]:
        for value in values:
            _memo._write(conv_entry(layer, DEFAULT, nthreads), value)
            choose_conv2d.cache_clear()
            assert choose_conv2d(layer, DEFAULT, nthreads=nthreads) == want


def test_the_cache_is_under_vdla_cache(tmp_path, monkeypatch):
    for where in ("one", "two"):
        monkeypatch.setenv("VDLA_CACHE", str(tmp_path / where))
        choose_conv2d.cache_clear()
        choose_conv2d(small_layer(), DEFAULT)
        assert len(list((tmp_path / where / SCHEDULE_CACHE).glob("*/*.json"))) == 1
    choose_conv2d.cache_clear()


def test_changed_code_is_another_folder_and_old_folders_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    # The memo's code: a module of its own, loaded from a file the test edits.
    source = tmp_path / "memo_schedule_model.py"
    source.write_text("A = 1\n")
    spec = importlib.util.spec_from_file_location("memo_schedule_model", source)
    monkeypatch.setitem(sys.modules, "memo_schedule_model",
                        importlib.util.module_from_spec(spec))
    calls = []

    def answer(key):
        return _memo.remembered("memo", "kind", key, lambda: calls.append(key) or len(calls),
                                to_json=int, from_json=int, code="memo_schedule_model")

    assert [answer("x"), answer("x"), answer("y")] == [1, 1, 2]
    old = next((tmp_path / "cache" / "memo").iterdir())
    source.write_text("A = 2\n")
    _keys.forget()                      # a new process reads the edited source
    assert answer("x") == 3
    assert len(list((tmp_path / "cache" / "memo").iterdir())) == 2
    # A folder of other sources unwritten for STALE_DAYS goes when the next one is made.
    stale = 1e9
    os.utime(old, (stale, stale))
    source.write_text("A = 3\n")
    _keys.forget()
    assert answer("x") == 4
    assert not old.exists()
    assert len(list((tmp_path / "cache" / "memo").iterdir())) == 2
    # However recent, only the KEEP_VERSIONS most recently written others stay.
    memo = tmp_path / "cache" / "memo"
    for folder in memo.iterdir():                   # written before the ones below
        os.utime(folder, (time.time() - 5000,) * 2)
    folders = []
    for version in range(5, 5 + _memo.KEEP_VERSIONS + 2):
        before = set(memo.iterdir())
        source.write_text(f"A = {version}\n")
        _keys.forget()
        answer("x")
        [made] = set(memo.iterdir()) - before
        folders.append(made)
        recent = time.time() - 1000 + version      # written in the order they were made
        os.utime(made, (recent, recent))
    assert set(memo.iterdir()) == set(folders[-1 - _memo.KEEP_VERSIONS:])


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")          # a file where the cache folder would be
    monkeypatch.setenv("VDLA_CACHE", str(blocker))
    choose_conv2d.cache_clear()
    assert choose_conv2d(small_layer(), DEFAULT).fits(small_layer(), DEFAULT)
    choose_conv2d.cache_clear()
