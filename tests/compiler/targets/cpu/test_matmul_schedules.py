"""The batched matrix products' schedules (`vdla.compiler.targets.cpu.matmul_schedule`)
against the reference: every schedule of the tuner's space of a few shapes, on every
instruction set this machine runs, int8 (``qmatmul``) bit-exact and float32 within
tolerance. The shapes: broadcast batch axes with odd sizes and 5 rows (AVX2's int16
pairs by default), one row, 3 rows with one B for every batch (both AVX2's nibbles by
default), and a transposed B large enough that the team starts (two threads), so that
each knob is exercised where it changes the C: the register tile, the reduction's
unroll, the split and AVX2's int8 path. Then: the default schedule is the kernels' old tile, knobs that
do not fit are refused by name, and the tuner's tasks of a product cover the space."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.targets.cpu.isa import get as get_isa
from vdla.compiler.targets.cpu.library import build_kernels, call, load
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.matmul_schedule import (MatmulSchedule, MatmulShape,
                                                       choose_matmul, matmul_blocks)
from vdla.compiler.targets.cpu.schedule import ScheduleError
from vdla.compiler.tuner.space import Block, ProductSpace

from .test_cpu_ops import ISAS  # the instruction sets this machine's compiler offers

THREADS = 2
TOLERANCE = 1e-5

#: (A's shape, B's shape, transpose_b): B's shape is as given (n, k rows when transposed).
SHAPES = {"broadcast": ((2, 1, 5, 13), (1, 3, 13, 19), False),
          "one_row": ((2, 1, 33), (2, 33, 21), False),
          "three_rows": ((3, 3, 10), (10, 7), False),
          "team": ((1, 2, 9, 250), (1, 2, 17, 250), True)}


def product(name: str, dtype: str, seed: int = 0):
    """A one-node graph of `SHAPES[name]` (float32: B untransposed) and its feed."""
    a, b, trans = SHAPES[name]
    if dtype == "float32" and trans:
        b = b[:-2] + (b[-1], b[-2])
    g = Graph(f"{name}_{dtype}")
    x0, x1 = g.add_input("x0", a, dtype), g.add_input("x1", b, dtype)
    attrs = (dict(transpose_b=trans, multiplier=None, shift=(9,), out_min=-120, out_max=110)
             if dtype == "int8" else {})
    g.set_outputs([g.add_node("qmatmul" if dtype == "int8" else "matmul", [x0, x1],
                              name="op", **attrs)])
    rng = np.random.default_rng(seed)
    if dtype == "int8":
        feed = {n: rng.integers(-128, 128, g.tensors[n].shape).astype(np.int8)
                for n in ("x0", "x1")}
    else:
        feed = {n: rng.standard_normal(g.tensors[n].shape).astype(np.float32)
                for n in ("x0", "x1")}
    return g, feed


def space(shape: MatmulShape, isa) -> ProductSpace:
    return ProductSpace(MatmulSchedule, [Block(f, a) for f, a in matmul_blocks(shape, isa)])


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("isa_name", ISAS)
def test_every_schedule_of_the_space_matches_the_reference(isa_name, name, dtype):
    isa = get_isa(isa_name)
    g, feed = product(name, dtype)
    node = g.node("op")
    want = run_reference(g, feed)[g.outputs[0]]
    schedules = list(space(MatmulShape.from_node(node, g), isa))
    assert len(schedules) == len(set(schedules)) > 10
    kernels = [node_kernel(node, g, isa, schedule=s, threads=THREADS)[0] for s in schedules]
    lib = load(build_kernels(kernels, isa, name=f"test_matmul_schedules_{name}_{dtype}"))
    lib.vdla_set_threads(THREADS)
    t = g.tensors[g.outputs[0]]
    for schedule, kernel in zip(schedules, kernels):
        out = np.full(t.shape, 99, DTYPES[t.dtype])
        call(lib, kernel, [feed[n] for n in kernel.inputs], out, threads=THREADS)
        if dtype == "int8":
            np.testing.assert_array_equal(out, want, err_msg=str(schedule))
        else:
            err = np.abs(out.astype(np.float64) - want).max() / np.abs(want).max()
            assert err < TOLERANCE, f"{schedule}: relative error {err:.3g}"


def test_each_knob_changes_the_c_where_it_applies():
    """The team's knob matters only past `PARALLEL_MACS`; AVX2's int8 path and the
    unroll always; the default's unroll of 1 writes no pragma (its C as it was)."""
    isa = get_isa("avx2")
    g, _ = product("team", "int8")
    node = g.node("op")
    default = choose_matmul(MatmulShape.from_node(node, g), isa)
    unrolled = MatmulSchedule(8, 4, 2, 4, "all", 1)
    text = {s: node_kernel(node, g, isa, schedule=s)[0].body for s in (
        default, MatmulSchedule(8, 4, 2, 1, "none", 1), unrolled,
        MatmulSchedule(8, 4, 2, 1, "all", 0))}
    assert len(set(text.values())) == 4
    reduction = "#pragma GCC unroll 4\n    for (int q = 0;"
    assert reduction in text[unrolled] and reduction not in text[default]


@pytest.mark.parametrize("isa_name, rows, want", [
    ("avx2", 3, MatmulSchedule(8, 4, 2, 1, "all", 0)),
    ("avx2", 5, MatmulSchedule(8, 4, 2, 1, "all", 1)),
    ("portable", 5, MatmulSchedule(8, 4, 2, 1, "all", 0)),
    ("avx512vnni", 5, MatmulSchedule(16, 6, 2, 1, "all", 0))])
def test_the_default_is_the_old_tile(isa_name, rows, want):
    shape = MatmulShape(batches=2, m=rows, k=16, n=40, dtype="int8")
    assert choose_matmul(shape, get_isa(isa_name)) == want
    floats = MatmulShape(batches=2, m=rows, k=16, n=40, dtype="float32")
    assert choose_matmul(floats, get_isa(isa_name)).wide == 0


def test_knobs_that_do_not_fit_are_refused_by_name():
    avx2, portable = get_isa("avx2"), get_isa("portable")
    shape = MatmulShape(batches=1, m=8, k=16, n=40, dtype="int8")
    for bad, knob in ((MatmulSchedule(16, 4, 2), "vl"), (MatmulSchedule(8, 9, 1), "mr"),
                      (MatmulSchedule(8, 1, 5), "nv"), (MatmulSchedule(8, 6, 2, 3), "unroll"),
                      (MatmulSchedule(8, 4, 2, 1, "h"), "parallel"),
                      (MatmulSchedule(8, 4, 3), "mr=4, nv=3")):
        with pytest.raises(ScheduleError, match=knob):
            bad.check(shape, avx2)
    with pytest.raises(ScheduleError, match="wide"):
        MatmulSchedule(8, 4, 2, 1, "all", 1).check(shape, portable)
    with pytest.raises(ScheduleError, match="needs the fields"):
        MatmulSchedule.from_dict({"vl": 8})
    assert MatmulSchedule.from_dict({"vl": 8, "mr": 4, "nv": 2}) == MatmulSchedule(8, 4, 2)


def test_a_product_is_a_tuning_task_over_its_space():
    """`CpuTask` of a qmatmul node: its default first in a space without repeats, the
    knobs' features finite, a schedule's records dict read back, and a measurement
    checked against the reference."""
    from vdla.compiler import targets

    target = targets.get("cpu", threads=1, isa="portable")
    g, _ = product("three_rows", "int8")
    [task] = target.tasks(g)
    assert task.workload["op"] == "matmul" and task.describe().startswith("int8 3 x 3x10")
    space = task.space()
    assert task.default_schedule() in space and len(space) == len(set(space))
    vectors = np.array([task.feature_set.vector(task.transfer_features(s)) for s in space])
    assert np.isfinite(vectors).all() and len(np.unique(vectors, axis=0)) == len(space)
    s = space[len(space) // 2]
    assert task.schedule_from_dict(task.schedule_to_dict(s)) == s
    assert task.measure(s).ok
