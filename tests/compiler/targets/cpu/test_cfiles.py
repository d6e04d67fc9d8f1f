"""The CPU target's fixed text as files (`vdla.compiler.targets.cpu.cfiles`): every static
C file compiles on its own with the build's flags, every template is used and rendered
with no placeholder left, rendering refuses a missing or unknown value, the files are
package data, and no function of the target is too long to read beside the C it writes."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from vdla.compiler import targets
from vdla.compiler.targets.cpu import cfiles
from vdla.compiler.targets.cpu.build import (BASE_FLAGS, OPENMP_FLAG, CompilerNotFound,
                                             find_c_compiler, machine_features)
from vdla.compiler.targets.cpu.program import Program

from gemm_graphs import conv_graph

CPU = Path(cfiles.__file__).parent
ROOT = Path(__file__).resolve().parents[4]
STATIC_C = sorted(p.name for p in (CPU / "c").glob("*.c"))
TEMPLATES = sorted(p.name for p in (CPU / "c" / "templates").iterdir())

@pytest.fixture(scope="module")
def cc() -> str:
    try:
        return find_c_compiler()
    except CompilerNotFound as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def program() -> Program:
    """A one-conv program (no C build: only its text is looked at)."""
    g, _ = conv_graph(np.random.default_rng(0))
    target = targets.get("cpu", threads=2)
    nodes = list(g.nodes())
    kernels = {node.name: target.kernel(node, g)[0] for node in nodes}
    return Program.create(g, nodes, kernels, target.isa)


def test_the_files_are_there():
    assert STATIC_C == ["amx_probe.c", "loader.c", "machine_bench.c", "openmp_probe.c",
                        "runtime.c"]
    assert TEMPLATES == ["Makefile", "README.md", "program.mk", "run_model.c", "runner.c",
                         "vdla_model.h"]


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "no-openmp"])
@pytest.mark.parametrize("name", STATIC_C)
def test_static_c_compiles_on_its_own(cc, tmp_path, program, name, openmp):
    """``gcc -fsyntax-only`` with the build's flags, warnings as errors; ``loader.c``
    against a written ``vdla_model.h`` (the project's API header)."""
    if openmp and not machine_features(cc).openmp:
        pytest.skip(f"{cc} builds no OpenMP programs")
    if name == "openmp_probe.c" and not openmp:
        pytest.skip("the OpenMP probe means nothing without OpenMP")
    (tmp_path / "vdla_model.h").write_text(program.header("vdla_model.h"))
    command = [cc, "-fsyntax-only", *BASE_FLAGS, "-Werror", *([OPENMP_FLAG] if openmp else []),
               f"-I{CPU}", f"-I{tmp_path}", str(CPU / "c" / name)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "no-openmp"])
def test_the_written_project_compiles_without_warnings(cc, tmp_path, program, openmp):
    """Each C file of `vdla compile`'s project, as its Makefile compiles it (``make
    OPENMP=`` too: then only the ignored OpenMP pragmas may warn)."""
    if openmp and not machine_features(cc).openmp:
        pytest.skip(f"{cc} builds no OpenMP programs")
    out = program.write_project(tmp_path / "project")
    flags = [OPENMP_FLAG] if openmp else ["-Wno-unknown-pragmas"]
    for name in ("model.c", "loader.c", "run_model.c"):
        proc = subprocess.run([cc, "-fsyntax-only", *BASE_FLAGS, *program.isa.flags,
                               "-Werror", *flags, name], cwd=out, capture_output=True,
                              text=True)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr}"


def test_every_template_is_rendered_with_no_placeholder_left(program, tmp_path, monkeypatch):
    used = []
    read = cfiles.template_text
    monkeypatch.setattr(cfiles, "template_text", lambda name: used.append(name) or read(name))
    out = program.write_project(tmp_path / "project")
    assert sorted(set(used)) == TEMPLATES
    for path in sorted(out.iterdir()):
        if path.suffix != ".params":
            assert not cfiles.placeholders(path.read_text()), path.name
    assert "\nrun_model: run_model.c libvdla_model.a vdla_model.h\n" in (
        out / "Makefile").read_text()


def test_every_template_has_placeholders_and_static_files_none():
    for name in TEMPLATES:
        assert cfiles.placeholders(cfiles.template_text(name)), name
    for name in STATIC_C:
        assert not cfiles.placeholders(cfiles.static_text(name)), name


def test_render_refuses_missing_and_unknown_values():
    values = {key: "x" for key in cfiles.placeholders(cfiles.template_text("program.mk"))}
    assert cfiles.render("program.mk", **values).startswith("\nx: x.c x\n")
    missing = dict(values)
    del missing["STATIC"]
    with pytest.raises(cfiles.TemplateError, match=r"'program.mk': no value for @STATIC@"):
        cfiles.render("program.mk", **missing)
    with pytest.raises(cfiles.TemplateError,
                       match="values for placeholders it does not have: STATICK"):
        cfiles.render("program.mk", **values, STATICK="x")
    with pytest.raises(TypeError, match="@STATIC@ must be str or int, not NoneType"):
        cfiles.render("program.mk", **{**values, "STATIC": None})


def test_a_value_is_inserted_as_it_is():
    values = {key: "@PROGRAM@" for key in
              cfiles.placeholders(cfiles.template_text("program.mk"))}
    assert cfiles.render("program.mk", **values).startswith("\n@PROGRAM@: @PROGRAM@.c")


def test_the_files_are_package_data():
    """A non-editable install ships every file in c/ (pyproject's package-data)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = {path for pattern in setup["package-data"]["vdla.compiler.targets.cpu"]
               for path in CPU.glob(pattern)}
    files = {path for path in (CPU / "c").rglob("*") if path.is_file()}
    assert files and not files - shipped, sorted(files - shipped)

