"""`vdla.sim.timeline.Timeline` on hand-built STATE change arrays: intervals, labels,
overlap, input checks and the Chrome/Perfetto trace JSON."""

import json

import numpy as np
import pytest

from vdla.isa.registers import STATE_BITS
from vdla.isa import Finish, Gemm, Load, MemoryType, Store, format_insn
from vdla.sim.timeline import UNITS, Timeline


def state(*names: str) -> int:
    """The STATE word with the named bits set."""
    return sum(1 << STATE_BITS[name][0] for name in names)


def changes(*rows) -> np.ndarray:
    """Rows (cycle, bit names...) as the backend's uint64 array."""
    return np.array([[cycle, state(*names)] for cycle, *names in rows], dtype=np.uint64)


# load busy 0..10, compute busy 5..20 (waiting for a load->compute token 2..5 first),
# store busy 22..24 after waiting for a compute->store token 20..22; the run ends at 25.
OVERLAP = changes(
    (0, "fetch_busy", "load_busy"),
    (2, "fetch_busy", "load_busy", "compute_pending", "wait_token_load_compute"),
    (5, "load_busy", "compute_busy", "tokens_load_compute"),
    (10, "compute_busy"),
    (20, "store_pending", "wait_token_compute_store"),
    (22, "store_busy", "tokens_compute_store"),
    (24,),
)

# A program and a run of it: load busy [0,4) [6,9); compute [2,5) [10,12) [14,15);
# store [12,14). Compute waits for load's token [5,10); load waits for room [7,9).
PROGRAM = [
    Load(memory_type=MemoryType.INP, y_size=1, x_size=2, x_stride=2, push_next=True),  # 0 load
    Load(memory_type=MemoryType.UOP, y_size=1, x_size=1, x_stride=1),   # 1 compute
    Gemm(uop_end=1, iter_out=4, iter_in=1, pop_prev=True, push_next=True),  # 2 compute
    Store(dram_base=8, y_size=1, x_size=4, x_stride=4, pop_prev=True),  # 3 store
    Load(memory_type=MemoryType.WGT, y_size=1, x_size=1, x_stride=1),   # 4 load
    Finish(),                                                           # 5 compute
]
RUN = changes(
    (0, "load_busy"),
    (2, "load_busy", "compute_busy"),
    (4, "compute_busy"),
    (5, "wait_token_load_compute"),
    (6, "load_busy", "wait_token_load_compute"),
    (7, "load_busy", "wait_token_load_compute", "wait_space_load_compute"),
    (9, "wait_token_load_compute"),
    (10, "compute_busy"),
    (12, "store_busy"),
    (14, "compute_busy"),
    (15,),
)


def test_intervals_busy_and_overlap():
    t = Timeline(OVERLAP, 25)
    assert t.intervals("load") == [(0, 10, "")]
    assert t.intervals("compute") == [(5, 20, "")]
    assert t.intervals("store") == [(22, 24, "")]
    assert t.intervals("fetch") == [(0, 5, "")]
    assert t.intervals("compute", "wait_token_load_compute") == [(2, 5, "")]
    assert t.intervals("store", "compute_pending") == [(2, 5, "")]
    assert t.busy_cycles("load") == 10 and t.busy_cycles("compute") == 15
    assert t.overlap_cycles("load", "compute") == 5 == t.overlap_cycles("compute", "load")
    assert t.overlap_cycles("compute", "store") == 0
    assert t.bit_cycles("wait_token_compute_store") == 2
    assert t.end_cycle == 25 and "25 cycles" in repr(t)


def test_a_bit_set_until_the_end_and_a_change_at_the_end():
    t = Timeline([[0, state("load_busy")], [3, 0], [7, state("load_busy")]], 12)
    assert t.intervals("load") == [(0, 3, ""), (7, 12, "")]
    # A last change exactly at end_cycle lasts no cycle: no empty interval.
    t = Timeline(np.array([[0, 0], [4, state("store_busy")]], dtype=np.int64), 4)
    assert t.intervals("store") == [] and t.busy_cycles("store") == 0


def test_labels_follow_program_order_per_module():
    t = Timeline(RUN, 16, insns=PROGRAM)
    text = {i: format_insn(insn) for i, insn in enumerate(PROGRAM)}
    assert t.intervals("load") == [(0, 4, f"0: {text[0]}"), (6, 9, f"4: {text[4]}")]
    assert t.intervals("compute") == [(2, 5, f"1: {text[1]}"), (10, 12, f"2: {text[2]}"),
                                      (14, 15, "5: FINISH")]
    assert t.intervals("store") == [(12, 14, f"3: {text[3]}")]
    # A token wait belongs to the instruction about to run; a wait for room to the one
    # pushing. Fetch has no labels.
    assert t.intervals("compute", "wait_token_load_compute") == [(5, 10, f"2: {text[2]}")]
    assert t.intervals("load", "wait_space_load_compute") == [(7, 9, f"4: {text[4]}")]
    assert t.intervals("fetch", "load_busy")[0][2] == ""
    assert t.overlap_cycles("load", "compute") == 2


def test_long_labels_are_shortened():
    gemm = Gemm(uop_bgn=1, uop_end=2, iter_out=3, iter_in=4, dst_factor_out=5, dst_factor_in=6,
                src_factor_out=7, src_factor_in=8, wgt_factor_out=9, wgt_factor_in=10)
    label = Timeline([[0, state("compute_busy")]], 5, insns=[gemm]).intervals("compute")[0][2]
    assert label.startswith("0: GEMM uop_bgn=1") and label.endswith("...")
    assert len(label) < len(format_insn(gemm))


def test_insns_that_did_not_run_are_rejected():
    with pytest.raises(ValueError, match="3 load busy intervals .* only 2 instructions to load"):
        Timeline(changes((0, "load_busy"), (1,), (2, "load_busy"), (3,), (4, "load_busy")), 5,
                 insns=PROGRAM)
    with pytest.raises(TypeError, match=r"insns\[1\]"):
        Timeline(RUN, 16, insns=[Finish(), "FINISH"])


@pytest.mark.parametrize("array, end, error, match", [
    (np.zeros(4, np.uint64), 5, ValueError, r"shape \(N, 2\)"),
    (np.zeros((3, 3), np.uint64), 5, ValueError, r"shape \(N, 2\)"),
    (np.zeros((0, 2), np.uint64), 5, ValueError, r"N >= 1"),
    (np.zeros((2, 2), np.float64), 5, TypeError, "integers"),
    (np.array([[0, 0], [5, 1], [3, 0]]), 9, ValueError, "row 2 is at cycle 3, after cycle 5"),
    (np.array([[0, 0], [5, 1], [5, 0]]), 9, ValueError, "increase strictly"),
    (np.array([[2, 0], [5, 1]]), 9, ValueError, "cycle 0"),
    (np.array([[0, 0], [5, 1]]), 4, ValueError, "before the last change"),
    (np.array([[0, -1]]), 4, ValueError, "negative"),
    (np.array([[0, 1 << 32]]), 4, ValueError, "32 bits"),
    (np.array([[0, 0]]), 4.0, TypeError, "end_cycle"),
], ids=["1d", "3cols", "empty", "float", "unsorted", "repeated", "start", "end", "negative",
        "wide", "end-float"])
def test_malformed_input(array, end, error, match):
    with pytest.raises(error, match=match):
        Timeline(array, end)


def test_bad_arguments():
    with pytest.raises(ValueError, match="clock_mhz"):
        Timeline(OVERLAP, 25, clock_mhz=0)
    t = Timeline(OVERLAP, 25)
    with pytest.raises(ValueError, match="unknown unit 'gemm'; units: fetch, load"):
        t.intervals("gemm")
    with pytest.raises(ValueError, match="unknown STATE bit 'load_idle'"):
        t.intervals("load", "load_idle")
    with pytest.raises(ValueError, match="unknown unit"):
        t.overlap_cycles("load", "dma")
    assert not t.changes.flags.writeable


def test_chrome_trace_structure(tmp_path):
    t = Timeline(RUN, 16, insns=PROGRAM, clock_mhz=200.0)
    trace = t.to_chrome_trace()
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] == "ns"
    assert trace["otherData"]["clock_mhz"] == 200.0 and trace["otherData"]["cycles"] == 16
    assert trace["otherData"]["busy_cycles"] == {u: t.busy_cycles(u) for u in UNITS}
    events = trace["traceEvents"]
    for event in events:  # what Perfetto's JSON importer needs
        assert {"name", "ph", "ts", "pid", "tid"} <= set(event), event
        assert event["pid"] == 1
        if event["ph"] == "X":
            assert event["dur"] > 0
    meta = [e for e in events if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0,
            "args": {"name": "vdla accelerator"}} in meta
    tracks = {e["args"]["name"]: e["tid"] for e in meta if e["name"] == "thread_name"}
    assert list(tracks) == ["fetch", "load", "load wait load->compute space", "compute",
                            "compute wait load->compute token", "store"]
    order = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert [order[tid] for tid in tracks.values()] == sorted(order.values())

    def slices(track):
        return [e for e in events if e["ph"] == "X" and e["tid"] == tracks[track]]

    load = slices("load")
    assert [e["name"] for e in load] == [f"0: {format_insn(PROGRAM[0])}",
                                         f"4: {format_insn(PROGRAM[4])}"]
    assert load[1]["ts"] == pytest.approx(6 / 200) and load[1]["dur"] == pytest.approx(3 / 200)
    assert load[1]["args"] == {"start_cycle": 6, "end_cycle": 9, "cycles": 3, "insn_index": 4,
                               "insn": format_insn(PROGRAM[4])}
    assert load[0]["cat"] == "busy"
    wait, = slices("compute wait load->compute token")
    assert wait["name"] == "wait load->compute token" and wait["cat"] == "wait"
    assert wait["args"]["insn_index"] == 2 and wait["args"]["cycles"] == 5
    assert slices("fetch") == []
    counters = [e for e in events if e["ph"] == "C"]
    assert counters[0]["ts"] == 0 and set(counters[0]["args"]) == {
        "load->compute", "compute->load", "compute->store", "store->compute"}
    assert counters[-1]["ts"] == pytest.approx(16 / 200)

    path = tmp_path / "trace" / "run.json"
    assert t.save(path) == path
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary left


def test_trace_without_insns_names_slices_by_unit():
    events = Timeline(OVERLAP, 25).to_chrome_trace()["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X" and e["cat"] == "busy"}
    assert names == {"fetch busy", "load busy", "compute busy", "store busy"}
    # A sample at each change of the token bits (0, 5, 10, 22, 24) and one at the end.
    counters = [e for e in events if e["ph"] == "C"]
    assert [e["ts"] * 100 for e in counters] == pytest.approx([0, 5, 10, 22, 24, 25])
    assert [e["args"]["load->compute"] for e in counters] == [0, 1, 0, 0, 0, 0]
    assert [e["args"]["compute->store"] for e in counters] == [0, 0, 0, 1, 0, 0]
