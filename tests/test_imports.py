"""The package's import structure: no import circles (not even through imports inside
functions), imports inside functions only for heavy dependencies and saying so, modules
small enough to read, and the light parts importable without Amaranth.

The modules are found from pyproject.toml's package-dir table (the one place the folders
are mapped to packages); every import of a ``vdla`` module is an edge, wherever it is
written, except those under ``if TYPE_CHECKING:`` (never executed)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Lines a module may have before it must say in its docstring why it is not split. (No
#: Python file of the repository may pass tests/test_repository.py's `HARD_MAX_LINES`,
#: 800, whatever its docstring says.)
MAX_LINES = 600
#: Lines a function of the compiler may have (longer: split it into named steps). The
#: hardware's `elaborate` methods are left out: each describes one module's logic.
MAX_FUNCTION_LINES = 120
LONG_REASON = "Why this module is long"


def _modules() -> dict[str, Path]:
    """module name -> source file, for every module of the distribution."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {}
    for package, folder in setup["package-dir"].items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path):
    """(line, module names, inside a function?) of every import statement in `path`,
    skipping ``if TYPE_CHECKING:`` blocks."""

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            if isinstance(child, ast.Import):
                yield child.lineno, [a.name for a in child.names], in_function
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
                names = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in MODULES
                         else child.module for a in child.names]
                yield child.lineno, names, in_function
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text()), False)


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for name, path in MODULES.items():
        for _, targets, _ in _imports(path):
            for target in targets:
                if target in MODULES and target != name:
                    graph.add_edge(name, target)
    return graph


def test_the_modules_are_found():
    assert {"vdla", "vdla.config", "vdla.compiler.ir.graph", "vdla.compiler.targets.base",
            "vdla.compiler.targets.vdla.target", "vdla.cli.run", "vdla.hw.top"} <= set(MODULES)
    assert len(MODULES) > 100


def test_no_import_circles():
    graph = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    described = []
    for component in circles:
        cycle = nx.find_cycle(graph.subgraph(component))
        described.append(" -> ".join([u for u, _ in cycle] + [cycle[0][0]]))
    assert not circles, "import circles:\n" + "\n".join(described)


def test_the_layers_point_one_way():
    """`hw` never reaches the compiler and the compiler never imports `hw` (it reaches
    the Verilog only through the simulator that builds it), the boards or the CLI; the
    front half never reaches a target, the tuner or the hardware config."""
    graph = import_graph()
    reach = {m: nx.descendants(graph, m) for m in MODULES}

    def offenders(source_prefix, banned_prefixes, edges=reach):
        return sorted((m, t) for m in MODULES if m.startswith(source_prefix)
                      for t in edges[m] if t.startswith(banned_prefixes))

    direct = {m: set(graph.successors(m)) for m in MODULES}
    assert not offenders("vdla.hw", ("vdla.compiler", "vdla.runtime", "vdla.cli"))
    assert not offenders("vdla.compiler", ("vdla.hw", "vdla.cli"), direct)
    assert not offenders("vdla.compiler", ("vdla.cli",))
    # A target may know the board catalog (the vdla target's --board: a board's config,
    # clock and memory timing), never what the boards generate (projects, estimates).
    assert not offenders("vdla.compiler", ("vdla.boards.estimate", "vdla.boards.project",
                                           "vdla.boards.wrapper"))
    front = ("vdla.compiler.ir", "vdla.compiler.reference", "vdla.compiler.frontend",
             "vdla.compiler.passes")
    for part in front:
        assert not offenders(part, ("vdla.compiler.targets", "vdla.compiler.tuner",
                                    "vdla.compiler.pipeline")), part
        # Free of the hardware config: quantization takes a requantization mode.
        assert not offenders(part, ("vdla.config",), direct), part
    # The tuner and the pipeline see targets only through the interface.
    assert not offenders("vdla.compiler.tuner", ("vdla.compiler.targets",))
    assert not offenders("vdla.compiler.pipeline", ("vdla.compiler.targets.vdla",))
    assert not offenders("vdla.cli", ("vdla.compiler.targets.vdla",))
    # The boards import no part of the compiler.
    assert not offenders("vdla.boards", ("vdla.compiler",), direct)
    # What runs on a board (the deploy bundle carries it) reaches only vdla's light core:
    # the config and its extensions, the ISA, the atomic file writes, and itself.
    board_side = {t for m, t in offenders("vdla.deploy.board.", ("vdla",))}
    assert board_side <= {"vdla", "vdla.config", "vdla.extensions", "vdla._fileio",
                          "vdla.deploy", "vdla.deploy.board"} | {
        t for t in board_side if t.startswith(("vdla.isa", "vdla.deploy.board."))}, board_side
    # Nothing in the compiler writes bundles (the command line does).
    assert not offenders("vdla.compiler", ("vdla.deploy.bundle_writer",))


#: The target folders under `vdla.compiler.targets` (a module outside them is the
#: interface: base, model, registry, options).
TARGET_FOLDERS = sorted({m.split(".")[3] for m in MODULES
                         if m.startswith("vdla.compiler.targets.") and m.count(".") >= 4}
                        | {"host"})


def test_targets_stay_behind_the_interface():
    """The command line imports no target's internals (it reaches targets through the
    registry and the interface; at most a target package's own public face, its
    ``__init__``, as ``vdla roofline`` does the GPU's), and no target imports another
    target (each is one folder behind the interface)."""
    graph = import_graph()
    cli = sorted((m, t) for m in MODULES if m.startswith("vdla.cli")
                 for t in graph.successors(m)
                 if any(t.startswith(f"vdla.compiler.targets.{f}.") for f in TARGET_FOLDERS))
    assert not cli, f"the CLI imports target internals: {cli}"
    crossing = []
    for folder in TARGET_FOLDERS:
        mine = f"vdla.compiler.targets.{folder}"
        for m in MODULES:
            if m != mine and not m.startswith(mine + "."):
                continue
            for t in graph.successors(m):
                for other in TARGET_FOLDERS:
                    theirs = f"vdla.compiler.targets.{other}"
                    if other != folder and (t == theirs or t.startswith(theirs + ".")):
                        crossing.append((m, t))
    assert not crossing, f"targets importing other targets: {sorted(crossing)}"


def test_the_cli_names_no_target():
    """What remains of target names in the command line is defaults and help text: no
    comparison with a target's name (``target.name == "vdla"``, ``"gpu" in names``)."""
    names = {"vdla", "host", "cpu", "gpu"}
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("vdla.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Constant) and o.value in names for o in operands):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "the CLI compares target names: " + ", ".join(bad)


def _comment_near(lines: list[str], lineno: int) -> str:
    """The comments on the import's line and the two lines before it."""
    return " ".join(line.split("#", 1)[1] for line in lines[max(0, lineno - 3):lineno]
                    if "#" in line)


def test_imports_inside_functions_are_for_heavy_dependencies_and_say_so():
    bad = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for lineno, targets, in_function in _imports(path):
            if in_function and "heavy" not in _comment_near(lines, lineno):
                bad.append(f"{path.relative_to(ROOT)}:{lineno}: {', '.join(targets)}")
    assert not bad, ("imports inside functions without a comment saying which heavy "
                     "dependency they keep out of start-up:\n" + "\n".join(bad))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_small_or_say_why_not(name):
    path = MODULES[name]
    source = path.read_text()
    if len(source.splitlines()) > MAX_LINES:
        doc = ast.get_docstring(ast.parse(source)) or ""
        assert LONG_REASON in doc, (f"{path.relative_to(ROOT)} has "
                                    f"{len(source.splitlines())} lines: split it along its "
                                    f"seams or say '{LONG_REASON}' in its docstring")


def test_no_function_of_the_compiler_is_too_long():
    long = []
    for name, path in MODULES.items():
        if not name.startswith("vdla.compiler"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                f"({lines} lines)")
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named "
                      "steps):\n" + "\n".join(long))


def test_the_light_parts_do_not_load_amaranth():
    """The register map, the simulators, the runtime, the compiler, the boards and the
    command line's parser import without Amaranth (a heavy import only hardware
    generation needs)."""
    code = ("import sys, vdla.isa.registers, vdla.sim.verilator, vdla.runtime, "
            "vdla.compiler.pipeline, vdla.compiler.targets.vdla, vdla.boards, vdla.cli; "
            "vdla.cli.build_parser(); print('amaranth' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
