"""`vdla run` on models whose inputs are not one float tensor: token ids and attention
masks it generates itself (ids inside the embedding table, masks of ones), inputs a user
gives in an .npz file (`--input`), with clear errors for a bad file; and
`--float-nonlinear`, which keeps softmax, LayerNorm, GELU and attention in float."""

import json
import re

import numpy as np
import pytest

from vdla.cli import main
from vdla.compiler import pipeline

MODEL = "bert_tiny"


def report(tmp_path, capsys, *args: str) -> dict:
    out = tmp_path / "out.json"
    assert main(["run", MODEL, "--target", "host", *args, "--json", str(out)]) == 0
    assert "bit-exact vs the quantized reference: yes" in capsys.readouterr().out
    return json.loads(out.read_text())


def test_generated_ids_lie_inside_the_vocabulary_and_the_mask_is_ones():
    model = pipeline.load_model(MODEL)
    ids, mask = model.feed["input_ids"], model.feed["attention_mask"]
    vocab = model.graph.tensors["embeddings.word_embeddings.weight"].shape[0]
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < vocab
    assert len(np.unique(ids)) > 10          # drawn, not one id repeated
    assert mask.dtype == np.int64 and (mask == 1).all()
    assert "input_ids" in model.input_note and "attention_mask" in model.input_note


def test_run_takes_its_inputs_from_an_npz_file(tmp_path, capsys):
    path = tmp_path / "in.npz"
    mask = np.ones((1, 128), np.int64)
    mask[0, 100:] = 0
    np.savez(path, input_ids=(np.arange(128, dtype=np.int64) * 7).reshape(1, 128),
             attention_mask=mask)
    got = report(tmp_path, capsys, "--input", str(path))
    assert got["input"] == "the arrays of in.npz"
    plain = report(tmp_path, capsys)
    assert plain["input"] != got["input"]


@pytest.mark.parametrize("arrays, message", [
    ({"input_ids": np.full((1, 128), 99999, np.int64),
      "attention_mask": np.ones((1, 128), np.int64)},
     r"index 99999 in 'input_ids' is outside \[-30522, 30522\)"),
    ({"input_ids": np.zeros((1, 128), np.int64)}, r"missing input\(s\) \['attention_mask'\]"),
    ({"input_ids": np.zeros((1, 12), np.int64), "attention_mask": np.ones((1, 12), np.int64)},
     r"input 'input_ids' has shape \(1, 12\); the graph expects \(1, 128\)"),
    (None, "not a readable .npz file"),
])
def test_a_bad_input_file_is_a_clear_error(tmp_path, capsys, arrays, message):
    path = tmp_path / "in.npz"
    if arrays is None:
        path.write_bytes(b"not a zip file")
    else:
        np.savez(path, **arrays)
    assert main(["run", MODEL, "--target", "host", "--input", str(path)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(message, err), err


def test_float_nonlinear_keeps_the_nonlinear_ops_in_float(tmp_path, capsys):
    integer = report(tmp_path, capsys)
    float_ = report(tmp_path, capsys, "--float-nonlinear")
    ops = lambda r: {o["op"] for o in r["ops"]}              # noqa: E731
    assert "qattention" in ops(integer) and "qlayer_norm" in ops(integer)
    assert "attention" in ops(float_) and "layer_norm" in ops(float_)
    assert not {"qattention", "qlayer_norm", "qgelu", "qsoftmax"} & ops(float_)


def test_compare_takes_the_same_inputs_and_float_option(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "in.npz"
    np.savez(path, input_ids=np.ones((1, 128), np.int64), attention_mask=np.ones((1, 128),
                                                                                  np.int64))
    assert main(["compare", MODEL, "--targets", "host", "--input", str(path),
                 "--float-nonlinear", "--json", "c.json"]) == 0
    got = json.loads((tmp_path / "c.json").read_text())
    assert got["input"] == "the arrays of in.npz" and got["integer_nonlinear"] is False
