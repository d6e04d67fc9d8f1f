"""ONNX conformance, as onnxruntime's and TVM's CI do it: onnx's own backend test cases, run
through `from_onnx` and the float reference.

The cases are those the installed onnx package ships: its node tests
(`onnx.backend.test.case.node.collect_testcases`) and the model folders of
``onnx/backend/test/data/pytorch-converted`` and ``pytorch-operator`` (model.onnx and
test_data_set_*/{input,output}_*.pb). A case is in scope when every node of its graph is an
op type of the default domain that the importer lists (`supported_ops`: layer operators,
and operators it evaluates only on constants). Each must either

* import and match the expected outputs within onnx's own backend tolerance (rtol 1e-3,
  atol 1e-7, with the same shape and dtype), or
* be refused with an `OnnxImportError` listed, with the gist of its reason, in
  ``onnx_conformance_refusals.txt`` next to this file. The message must name where (the
  node, its index and op type; or the graph input or the model).

Anything else fails: a refusal not listed, or listed with another reason; a listed case
that now imports ("remove it from the expected-refusal list"); a wrong result; and any
exception other than `OnnxImportError`, on import or on the reference (a crash).

Models of opsets 1-6 are upgraded to opset 7 on import with onnx's version converter
(`vdla.compiler.frontend.onnx_import.loader.upgrade`).

With onnx 1.23.2: 974 cases in scope; 407 pass (56 of them upgraded from opsets below
7), 567 refused (`test_the_counts_in_the_docstring_are_current` keeps these numbers honest).
The operators of sequence models (LayerNormalization, Gather, Slice, Split, Where, Erf,
Pow, the reductions, ...) brought 330 cases into scope.

Time, measured on a shared two-core machine: the module takes about 20 s of CPU, 14 s of
it collecting onnx's node cases, once per process (onnx computes every case's expected
outputs when it loads them, most of it in its Python pooling reference for the large 3-D
AveragePool, LpPool and MaxPool cases: inherent to collect_testcases); the 646 tests of
the CNN operators took about 6 s together, the slowest
(pytorch-operator/test_operator_conv) under 1 s; the 330 cases the sequence operators
added are as small.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vdla.compiler.frontend.onnx_import import MIN_OPSET, OnnxImportError, from_onnx, supported_ops
from vdla.compiler.reference import run_reference

#: onnx's backend test tolerance (onnx.backend.test.runner, and each node TestCase).
RTOL, ATOL = 1e-3, 1e-7
#: The model folders of onnx's test data run here (the others are large real models).
MODEL_KINDS = ("pytorch-converted", "pytorch-operator")
REFUSALS_FILE = Path(__file__).with_name("onnx_conformance_refusals.txt")
#: Where a refusal must say it happened: a node, the model, a graph input or output, or
#: an initializer.
WHERE = re.compile(r"node '[^']*' \(#\d+, [A-Za-z]+\)|'the given ModelProto'|"
                   r"graph (input|output) '|initializer '")


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    folder: Path | None = None                 # a model folder's test data; None: node case
    data_sets: list | None = None              # a node case's [(inputs, outputs)]

    def opset(self) -> int:
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))

    def data(self) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        if self.folder is None:
            return [([_array(x) for x in ins], [_array(y) for y in outs])
                    for ins, outs in self.data_sets]
        return [(_read_pbs(d, "input"), _read_pbs(d, "output"))
                for d in sorted(self.folder.glob("test_data_set_*"))]


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _read_pbs(folder: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    arrays = []
    for f in files:
        tensor = onnx.TensorProto()
        tensor.ParseFromString(f.read_bytes())
        arrays.append(numpy_helper.to_array(tensor))
    return arrays


def in_scope(model: onnx.ModelProto) -> bool:
    """Every node of `model` is a default-domain op type the importer lists."""
    ops = set(supported_ops())
    return all(n.domain in ("", "ai.onnx") and n.op_type in ops for n in model.graph.node)


@functools.cache
def cases() -> dict[str, Case]:
    """The in-scope cases by name (node cases by their own name, model folders as
    ``kind/name``)."""
    # Only the collection step imports onnx's case modules, which compute every case's
    # expected outputs (with numpy warnings about overflows in casts: not ours).
    from onnx.backend.test.case.node import collect_testcases

    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in collect_testcases(None):
            if in_scope(case.model):
                # Every node case uses onnx's tolerance; a different one would need a look.
                assert (case.rtol, case.atol) == (RTOL, ATOL), case.name
                found[case.name] = Case(case.name, case.model, data_sets=case.data_sets)
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    for kind in MODEL_KINDS:
        for folder in sorted((data / kind).iterdir()):
            model = onnx.load(str(folder / "model.onnx"))
            if in_scope(model):
                found[f"{kind}/{folder.name}"] = Case(f"{kind}/{folder.name}", model, folder)
    return found


@functools.cache
def expected_refusals() -> dict[str, str]:
    """name -> the gist of its refusal: a text each refusal's message must contain."""
    refusals = {}
    for number, line in enumerate(REFUSALS_FILE.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, gist = line.partition(": ")
        if not sep or not gist.strip():
            raise ValueError(f"{REFUSALS_FILE.name}:{number}: {line!r} is not 'name: gist'")
        if name in refusals:
            raise ValueError(f"{REFUSALS_FILE.name}:{number}: {name} is listed twice")
        refusals[name] = gist.strip()
    return refusals


def run_case(case: Case) -> tuple[str, str, int | None]:
    """("pass" or "refused", the refusal's message or '', the opset the model was
    upgraded from or None). A wrong result fails an assertion; any exception other than
    the importer's refusal propagates."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            graph = from_onnx(case.model)
        except OnnxImportError as exc:
            return "refused", str(exc), None
    upgraded = graph.metadata["onnx"]["upgraded_from"]
    if upgraded is not None:
        # The upgrade is announced, naming both opsets.
        assert any(f"upgraded from opset {upgraded} to {MIN_OPSET} with onnx's version "
                   "converter" in str(w.message) for w in caught), [str(w) for w in caught]
    data = case.data()
    assert data, f"{case.name} has no test data"
    for k, (inputs, outputs) in enumerate(data):
        assert len(inputs) == len(graph.inputs), (graph.inputs, len(inputs))
        got = run_reference(graph, dict(zip(graph.inputs, inputs)))
        assert len(outputs) == len(graph.outputs), (graph.outputs, len(outputs))
        for name, want in zip(graph.outputs, outputs):
            value = got[name]
            where = f"{case.name}, data set {k}, output {name!r}"
            assert value.shape == want.shape, f"{where}: shape {value.shape} != {want.shape}"
            assert value.dtype == want.dtype, f"{where}: dtype {value.dtype} != {want.dtype}"
            np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL, err_msg=where)
    return "pass", "", upgraded


@pytest.mark.parametrize("name", sorted(cases()))
def test_onnx_backend_case(name):
    case = cases()[name]
    gist = expected_refusals().get(name)
    outcome, message, _ = run_case(case)
    if outcome == "pass":
        assert gist is None, (f"{name} now imports and matches onnx's expected outputs: "
                              f"remove it from the expected-refusal list {REFUSALS_FILE.name} "
                              f"(it was refused for: {gist})")
        return
    assert gist is not None, (f"{name} is refused: {message}\nIf that is right, add it to "
                              f"{REFUSALS_FILE.name} with the gist of the reason")
    assert gist in message, (f"{name} is refused for another reason than the one "
                             f"{REFUSALS_FILE.name} lists:\n  got:      {message}\n"
                             f"  expected: ...{gist}...")
    # A clear refusal says where.
    assert WHERE.search(message), f"{name}: the refusal does not say where: {message}"


def test_every_expected_refusal_is_a_case_in_scope():
    stale = sorted(set(expected_refusals()) - set(cases()))
    assert not stale, (f"{REFUSALS_FILE.name} lists cases that onnx no longer has, or that "
                       f"are out of scope (an op type the importer does not list): {stale}")


def test_the_counts_in_the_docstring_are_current():
    """The counts the module docstring gives, from the case list and the refusal list (the
    parametrized test checks each case against them)."""
    refused = expected_refusals()
    passing = [c for name, c in cases().items() if name not in refused]
    upgraded = [c for c in passing if c.opset() < MIN_OPSET]
    counts = (f"{len(cases())} cases in scope; {len(passing)} pass ({len(upgraded)} of them "
              f"upgraded from opsets below {MIN_OPSET}), {len(refused)} refused")
    assert counts in " ".join(__doc__.split()), f"update the module docstring's counts: {counts}"
