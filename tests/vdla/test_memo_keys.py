"""The code a disk memo is keyed on, derived from the imports (`vdla._keys`): an edit to
a module the memo's code imports, at any depth, makes a new key (the memo misses and
computes again); an edit to a module it does not import keeps the key. The edits are
made to a copy of the package's source files, never to the checkout."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

import vdla
from vdla import _keys, _memo
from vdla.compiler import pipeline
from vdla.compiler.targets.cpu.tuning import CpuTask
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.conv_layer import choose_conv2d
from vdla.compiler.targets.vdla.pool import choose_pool2d
from vdla.compiler.targets.vdla.tuning import ConvTask
from vdla.compiler.tuner import candidates, pretrained_chooser
from vdla.compiler.tuner.cost_model import CostModel
from vdla.compiler.tuner.features import FeatureSet

#: The pretrained chooser's memo of a task's pick, as `pretrained_choice` derives it
#: (`candidates.memo_code`: a class stands for a task or model object of it).
CHOICE = {target: candidates.memo_code(task, pretrained_chooser.__name__, CostModel,
                                       FeatureSet)
          for target, task in (("vdla", ConvTask), ("cpu", CpuTask))}
#: The features and predictions of a task's space (`candidates.space_predictions`).
PREDICTIONS = candidates.memo_code(ConvTask, CostModel)

#: file (relative to the checkout) -> (text in it, what the edit makes it): a constant
#: of each module whose code decides a pick.
EDITS = {
    "compiler/tuner/candidates.py": ("CLIMB_TOP = 16", "CLIMB_TOP = 17"),
    "compiler/tuner/space.py": ("(moved < self.size)", "(moved <= self.size - 1)"),
    "compiler/tuner/cost_model.py": ("_CHUNK = 2048", "_CHUNK = 1024"),
    "compiler/targets/vdla/features.py": ('baseline=("log_est_over_ideal", "log_ideal_cycles")',
                                          'baseline=("log_ideal_cycles",)'),
    "compiler/targets/cpu/features.py": ("_PLATFORM = (", "_PLATFORM = ( "),
}
#: A module no memo's code imports: the CLI's Verilog command.
UNRELATED = "vdla/cli/verilog.py"


def copy_tree(dest: Path) -> dict[str, Path]:
    """A copy of every ``.py`` file of the installed package's folders under `dest`, laid
    out as in the checkout; its package -> folder map (as `package_dirs` gives)."""
    dirs = _keys.package_dirs()
    top = dirs["vdla"].parent
    copied = {}
    for name, folder in dirs.items():
        rel = folder.relative_to(top)
        for path in folder.glob("*.py"):
            target = dest / rel / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        copied[name] = dest / rel
    return copied


def edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel} no longer holds {old!r} once: update EDITS"
    path.write_text(text.replace(old, new))
    _keys.forget()          # what a new process would read


@pytest.fixture
def tree(tmp_path):
    """(root of a copy of the sources, its package -> folder map); digests forgotten
    before and after (the copy's files were read for them)."""
    _keys.forget()
    dirs = copy_tree(tmp_path / "src")
    yield tmp_path / "src", dirs
    _keys.forget()


def test_the_copy_derives_what_the_checkout_does(tree):
    root, dirs = tree
    for code in (*CHOICE.values(), PREDICTIONS, choose_conv2d):
        live, copy = _keys.code_files(code), _keys.code_files(code, dirs)
        assert sorted(live) == sorted(copy)
        # Keyed by module name and content, not path: the same code anywhere is one key.
        assert _keys.code_digest(code) == _keys.code_digest(code, dirs)


@pytest.mark.parametrize("rel", sorted(EDITS))
def test_an_edit_to_a_module_the_code_imports_is_a_new_key(tree, rel):
    root, dirs = tree
    codes = {"vdla": CHOICE["vdla"], "cpu": CHOICE["cpu"], "predictions": PREDICTIONS}
    before = {name: _keys.code_digest(code, dirs) for name, code in codes.items()}
    edit(root, rel, *EDITS[rel])
    after = {name: _keys.code_digest(code, dirs) for name, code in codes.items()}
    # Each target's pick depends on the tuner's modules and its own features, not on the
    # other target's; the predictions on everything but the pick's climb.
    other = "cpu" if "targets/vdla/" in rel else "vdla" if "targets/cpu/" in rel else None
    for name in codes:
        unchanged = name == other or (name == "predictions" and "targets/cpu/" in rel)
        assert (after[name] == before[name]) == unchanged, (rel, name)


def test_an_edit_to_a_module_nothing_imports_keeps_every_key(tree):
    root, dirs = tree
    codes = (*CHOICE.values(), PREDICTIONS, choose_conv2d, choose_pool2d,
             pipeline.quantize, _keys.Package("vdla.compiler.reference"))
    before = [_keys.code_digest(code, dirs) for code in codes]
    assert "vdla.cli.verilog" not in set().union(*(_keys.code_files(c, dirs) for c in codes))
    (root / UNRELATED).write_text((root / UNRELATED).read_text() + "\nEDITED = 1\n")
    _keys.forget()
    assert [_keys.code_digest(code, dirs) for code in codes] == before
    # Whereas the whole compiler package, which the compiled-model memo is keyed on,
    # imports the config, whose edit is a new key for every memo of the accelerator.
    compiler = _keys.Package("vdla.compiler")
    was = _keys.code_digest(compiler, dirs), _keys.code_digest(choose_conv2d, dirs)
    edit(root, "vdla/config.py", "from __future__ import annotations",
         "from __future__ import annotations  # edited")
    assert _keys.code_digest(compiler, dirs) != was[0]
    assert _keys.code_digest(choose_conv2d, dirs) != was[1]


def test_imports_are_read_wherever_they_are_written(tmp_path):
    """Imports inside functions and relative imports are followed; those under ``if
    TYPE_CHECKING:`` (never run) and a package's ``__init__`` on the way to a submodule
    are not; ``from x import y`` is the submodule ``x.y`` when there is one, else
    ``x``'s own name."""
    pkg = tmp_path / "vdla"
    files = {
        "__init__.py": "from vdla.base import VALUE\n",
        "base.py": "VALUE = 1\n",
        "sub/__init__.py": "import vdla.never\n",
        "sub/helper.py": "X = 2\n",
        "sub/names.py": "from .helper import X\n",
        "never.py": "",
        "typing_only.py": "",
        "main.py": ("from typing import TYPE_CHECKING\n"
                    "from vdla.sub import helper\n"
                    "from vdla import VALUE\n"
                    "if TYPE_CHECKING:\n    import vdla.typing_only\n"
                    "def late():\n    from .sub.names import X   # heavy, say\n"
                    "    return X\n"),
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    found = _keys.code_files("vdla.main", {"vdla": pkg})
    assert sorted(found) == ["vdla", "vdla.base", "vdla.main", "vdla.sub.helper",
                             "vdla.sub.names"]
    assert found["vdla.sub.names"] == pkg / "sub" / "names.py"
    assert sorted(_keys.code_files(_keys.Package("vdla.sub"), {"vdla": pkg})) == [
        "vdla.never", "vdla.sub", "vdla.sub.helper", "vdla.sub.names"]


def test_import_statements_are_kept_across_processes_and_checked(tmp_path, monkeypatch):
    """A warm process reads each file's imports from ``$VDLA_CACHE/imports`` instead of
    parsing it; an entry that fails its checksum is parsed again, never trusted."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    pkg = tmp_path / "vdla"
    pkg.mkdir()
    (pkg / "main.py").write_text("import vdla.dep\n")
    (pkg / "dep.py").write_text("")
    dirs = {"vdla": pkg}

    def derive() -> list[str]:
        monkeypatch.setattr(_keys, "_PARSED", {})      # a new process
        _keys.forget()
        return sorted(_keys.code_files("vdla.main", dirs))

    assert derive() == ["vdla.dep", "vdla.main"]
    entry = tmp_path / "cache" / _keys.IMPORTS_CACHE / f"{_keys.file_digest(pkg / 'main.py')}.json"
    assert entry.is_file()
    parse = _keys._statements
    monkeypatch.setattr(_keys, "_statements", lambda *a: pytest.fail("parsed again"))
    assert derive() == ["vdla.dep", "vdla.main"]
    stored = json.loads(entry.read_text())
    entry.write_text(json.dumps({**stored, "statements": []}))    # fails its checksum
    monkeypatch.setattr(_keys, "_statements", parse)
    assert derive() == ["vdla.dep", "vdla.main"]
    _keys.forget()


def test_a_wheel_without_pyproject_resolves_the_same_modules(tmp_path, monkeypatch):
    """Installed from a wheel every subpackage is a folder of ``vdla`` and there is no
    pyproject.toml: the derivation reads the package's own layout, and the same code
    is the same key."""
    dirs = _keys.package_dirs()
    site = tmp_path / "site-packages"
    for name, folder in dirs.items():
        dest = site.joinpath(*name.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for path in folder.glob("*.py"):
            shutil.copyfile(path, dest / path.name)
    spec = importlib.util.spec_from_file_location("wheel_keys", site / "vdla" / "_keys.py")
    wheel = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "wheel_keys", wheel)    # its dataclass looks it up
    spec.loader.exec_module(wheel)
    assert wheel.package_dirs() == {"vdla": site / "vdla"}
    code = ("vdla.compiler.tuner.pretrained_chooser", "vdla.compiler.targets.vdla.tuning")
    assert sorted(wheel.code_files(code)) == sorted(_keys.code_files(code))
    assert wheel.code_digest(code) == _keys.code_digest(code)


def test_what_names_no_code_is_refused():
    with pytest.raises(TypeError, match="a memo's code is a module"):
        _keys.code_digest(3)
    with pytest.raises(ValueError, match="'vdla.no_such_module', which has no source"):
        _keys.code_digest("vdla.no_such_module")
    with pytest.raises(ValueError, match="'vdla.config' is no package"):
        _keys.code_digest(_keys.Package("vdla.config"))
    with pytest.raises(ValueError, match="names no module"):
        _keys.code_digest(())


def climb_top(root: Path) -> int:
    """`CLIMB_TOP` as the copy's candidates.py sets it."""
    text = (root / "compiler/tuner/candidates.py").read_text()
    return int(re.search(r"^CLIMB_TOP = (\d+)", text, re.M).group(1))


@pytest.fixture
def copied_memo(tree, tmp_path, monkeypatch):
    """A fresh ``$VDLA_CACHE``, and every memo keyed on the copy's code."""
    root, dirs = tree
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_keys, "package_dirs", functools.cache(lambda: dirs))
    _keys.forget()
    return root


def test_a_remembered_answer_is_computed_again_after_an_edit(copied_memo):
    root = copied_memo
    calls = []

    def answer():
        return _memo.remembered("keys", "climb", {"what": "CLIMB_TOP"},
                                lambda: calls.append(1) or climb_top(root), to_json=int,
                                from_json=int, code=CHOICE["vdla"])

    assert [answer(), answer(), len(calls)] == [16, 16, 1]
    edit(root, UNRELATED, "from __future__ import annotations",
         "from __future__ import annotations  # edited")
    assert [answer(), len(calls)] == [16, 1]         # nothing it imports changed
    edit(root, "compiler/tuner/candidates.py", *EDITS["compiler/tuner/candidates.py"])
    assert [answer(), answer(), len(calls)] == [17, 17, 2]


def test_the_pretrained_choice_is_chosen_again_after_an_edit(copied_memo, monkeypatch):
    """The real memo end to end: `pretrained_choice` of a small convolution, read back
    from the disk, then chosen again once the copy's cost model changes."""
    root = copied_memo
    target = VdlaTarget(vdla.HardwareConfig(), backend="functional")
    task = target.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), target))[0]
    model = task.pretrained()
    code = candidates.memo_code(task, pretrained_chooser.__name__, model, model.feature_set)
    # The folder of this version of the code (beside the default chooser's, which the
    # task's default schedule fills).
    folder = lambda: root.parent / "cache" / "schedules" / _keys.code_digest(code)[:24]
    picked = pretrained_chooser.pretrained_choice(task)
    first = folder()
    assert len(list(first.glob("*.json"))) == 1
    ranked = []
    real = pretrained_chooser.Candidates
    monkeypatch.setattr(pretrained_chooser, "Candidates",
                        lambda *args, **kw: ranked.append(1) or real(*args, **kw))
    assert pretrained_chooser.pretrained_choice(task) == picked and not ranked
    edit(root, "compiler/tuner/cost_model.py", *EDITS["compiler/tuner/cost_model.py"])
    assert pretrained_chooser.pretrained_choice(task) == picked and ranked == [1]
    assert folder() != first and len(list(folder().glob("*.json"))) == 1
    assert first.is_dir()       # the old version's entries stay (pruned later)


def test_deriving_is_done_once_per_process():
    """The vdla chooser asks tens of thousands of times per model: after the first, a
    key costs a dictionary look-up, not a file read."""
    _keys.code_digest(choose_conv2d)
    before = _keys._roots_digest.cache_info().misses
    for _ in range(1000):
        _keys.code_digest(choose_conv2d)
    assert _keys._roots_digest.cache_info().misses == before


def test_no_memo_lists_its_source_files_by_hand():
    """Every memo derives its files (`code=`); no call site lists them."""
    for path in {p for folder in _keys.package_dirs().values() for p in folder.glob("*.py")}:
        text = path.read_text()
        assert "vdla._memo import" not in text or "sources=" not in text, path
    assert not hasattr(sys.modules["vdla.compiler.tuner.task"].TuneTask, "sources")
