"""What a disk memo (`vdla._memo`) is keyed on besides the inputs it is asked for: the
code that computes its answer, derived from the code itself rather than listed by hand.

    code_digest(quantize)                                   # a function's module, ...
    code_digest(("vdla.compiler.tuner.candidates", task, model))  # ... several
    code_digest((compile_model, Package("vdla.compiler")))  # ... or a whole package

`code` names what computes the answer: a module (or its name), a function or class
(their module), an object (its class's module), a `Package`, or a tuple of these. It
covers every file of those modules and of every project (``vdla``) module they import,
transitively: the imports are read from the source with `ast` (every ``import`` and
``from ... import`` statement, those inside functions too, since the code they reach runs
when the function does; not those under ``if TYPE_CHECKING:``, which never run). So an
edit to a module the answer's code imports makes a new digest, and an edit to one it
does not (the CLI's Verilog command, for a tuner's memo) leaves it. Code that a
computation reaches through an object rather than an import (a target's lowering,
called through the `Target` a compiled model is given) is covered by naming the
object (its class's module) or the package that holds every such class (`Package`).

Module names are resolved to files through the package-dir table of the pyproject.toml
beside the package in a source checkout (the top-level folders are ``vdla``'s
subpackages there: ``compiler/`` is ``vdla.compiler``), or, in an installed wheel,
where there is none, through the ``vdla`` folder's own layout (``vdla/compiler/...``).
Nothing is imported to find a file, so deriving a key never loads Amaranth or Triton.

Derived once per process for each `code` (`code_digest` runs on hot paths: the vdla
target's default chooser asks the memo tens of thousands of times per model; after the
first, a key is one dictionary look-up); a new process reads the edited files. Parsing
is most of the first derivation's cost (about a second for the whole compiler), so
each file's import statements are also kept across processes, by the SHA-256 of its
text, in ``cache_root()/imports`` (`IMPORTS_CACHE`): a warm process reads and hashes
the files, and parses only those edited since.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import sys
import tomllib
import types
from pathlib import Path
from typing import Any, Mapping

from vdla._buildcache import cache_root
from vdla._fileio import atomic_write

__all__ = ["IMPORTS_CACHE", "Package", "code_digest", "code_files", "code_roots",
           "file_digest", "forget", "package_dirs"]

#: The project's top-level package: only its modules are followed through imports.
PROJECT = "vdla"

#: Changes when what a digest covers changes (so every memo is recomputed once).
VERSION = 1


@dataclasses.dataclass(frozen=True, order=True)
class Package:
    """Every module of the package `name` (its subpackages' too) and what they import:
    for a computation that reaches code it does not import (a compiled model's target
    lowering its ops through modules chosen at run time)."""

    name: str


def code_roots(code: Any) -> tuple[str | Package, ...]:
    """`code` (see the module docstring) as sorted module names and `Package`s.
    TypeError for anything else, naming it."""
    found: set[str | Package] = set()

    def add(item: Any) -> None:
        if isinstance(item, (str, Package)):
            found.add(item)
        elif isinstance(item, types.ModuleType):
            found.add(item.__name__)
        elif isinstance(item, (tuple, list, set, frozenset)):
            for inner in item:
                add(inner)
        elif isinstance(item, functools.partial):
            add(item.func)
        elif isinstance(getattr(item, "__module__", None), str):
            # A function or class names its module; an object its class's.
            found.add(item.__module__)
        else:
            raise TypeError(f"a memo's code is a module, its name, a function, a class, an "
                            f"object, a Package or a tuple of these, not {item!r}")

    add(code)
    if not found:
        raise ValueError(f"a memo's code names no module: {code!r}")
    return tuple(sorted(found, key=lambda r: (isinstance(r, Package), str(r))))


@functools.cache
def package_dirs() -> dict[str, Path]:
    """package name -> its folder, for the ``vdla`` package this module belongs to: the
    package-dir table of the pyproject.toml beside it (a source checkout, editable
    install), else ``vdla`` alone (a wheel: every subpackage is a folder inside it)."""
    root = Path(__file__).resolve().parent
    pyproject = root.parent / "pyproject.toml"
    if pyproject.is_file():
        table = (tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {})
                 .get("package-dir", {}))
        # Only the project this package is the `vdla` of (not some other pyproject.toml
        # that happens to lie beside an installed package).
        if PROJECT in table and (root.parent / table[PROJECT]).resolve() == root:
            return {name: (root.parent / folder).resolve() for name, folder in table.items()}
    return {PROJECT: root}


def _module_file(name: str, dirs: Mapping[str, Path]) -> Path | None:
    """The file of project module `name` under `dirs` (a package's ``__init__.py``), or
    None if there is none."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):      # the longest mapped package first
        folder = dirs.get(".".join(parts[:cut]))
        if folder is None:
            continue
        base = folder.joinpath(*parts[cut:])
        if cut < len(parts) and base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        return None
    return None


def _root_file(name: str, dirs: Mapping[str, Path]) -> Path:
    """The file of a module named as (part of) a memo's code: a project module under
    `dirs`, or any other module loaded from a file (a test's); ValueError if none."""
    if name == PROJECT or name.startswith(PROJECT + "."):
        path = _module_file(name, dirs)
    else:
        path = getattr(sys.modules.get(name), "__file__", None)
        path = Path(path) if path and path.endswith(".py") else None
    if path is None:
        raise ValueError(f"a memo's code names module {name!r}, which has no source file "
                         f"(project packages: {', '.join(sorted(dirs))})")
    return path


def _package_modules(name: str, dirs: Mapping[str, Path]) -> list[str]:
    """The module names of every ``.py`` file in package `name`'s folder and below."""
    init = _module_file(name, dirs)
    if init is None or init.name != "__init__.py":
        raise ValueError(f"{name!r} is no package of the project (packages: "
                         f"{', '.join(sorted(dirs))})")
    folder = init.parent
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.append(".".join((name, *parts)))
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


#: Each source text's import statements, by the text's SHA-256: parsing is most of the
#: cost of deriving a digest (a second for the whole compiler), and a copy of the
#: sources, or a file edited back, needs none. Keyed by content, so never stale:
#: `forget` keeps it. Kept across processes too, in ``cache_root()/IMPORTS_CACHE``.
_PARSED: dict[str, tuple[tuple[int, str, tuple[str, ...]], ...]] = {}
#: The folder of `cache_root()` holding a JSON file of import statements per source
#: text (`_parsed`): a warm process reads them instead of parsing (tens of ms for the
#: whole compiler).
IMPORTS_CACHE = "imports"


def _statements(data: bytes, path: Path) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """(level, module, names) of every import statement in the source `data`, those
    under ``if TYPE_CHECKING:`` left out (never executed): ``import a.b`` is (-1, "",
    ("a.b",)), ``from .x import y`` is (1, "x", ("y",))."""
    found = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.append((-1, "", tuple(alias.name for alias in child.names)))
            elif isinstance(child, ast.ImportFrom):
                found.append((child.level, child.module or "",
                              tuple(alias.name for alias in child.names)))
            walk(child)

    walk(ast.parse(data, filename=str(path)))
    return tuple(found)


@functools.cache
def _scanned(path: Path) -> tuple[str, tuple[tuple[int, str, tuple[str, ...]], ...]]:
    """(SHA-256, import statements) of the file `path`, read once per process: the
    digest and the imports come from the same bytes."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _PARSED:
        _PARSED[digest] = _parsed(data, digest, path)
    return digest, _PARSED[digest]


def _parsed(data: bytes, digest: str,
            path: Path) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """`_statements` of `data` (SHA-256 `digest`), read from ``cache_root()/imports``
    when an earlier process stored them, else parsed and stored. An entry that cannot
    be read or fails its checksum is parsed again; a cache that cannot be written only
    costs the parsing."""
    entry = cache_root() / IMPORTS_CACHE / f"{digest}.json"

    def check(text: str) -> str:
        return hashlib.sha256(f"{VERSION}\0{digest}\0{text}".encode()).hexdigest()

    try:
        stored = json.loads(entry.read_bytes())
        text = json.dumps(stored["statements"])
        if stored["check"] == check(text):
            return tuple((int(level), str(module), tuple(str(n) for n in names))
                         for level, module, names in stored["statements"])
    except (OSError, ValueError, KeyError, TypeError):
        pass        # no entry, or one not to trust: parse the text
    found = _statements(data, path)
    text = json.dumps([list(s[:2]) + [list(s[2])] for s in found])
    try:
        atomic_write(entry, json.dumps({"statements": json.loads(text),
                                        "check": check(text)}).encode())
    except OSError:
        pass        # a cache that cannot be written: the statements are still right
    return found


def file_digest(path: Path) -> str:
    """SHA-256 of the bytes of `path`, read once per process."""
    return _scanned(path)[0]


def _imported(path: Path, name: str) -> list[tuple[str, ...]]:
    """What module `name` (in file `path`) imports: for each imported name, the module
    names it may be, the first that is a module meaning it (``from x import y``: ``x.y``
    if that is a submodule, else ``x``). Relative imports are resolved against the
    module's package. A package's ``__init__`` that Python runs on the way to a submodule
    is not followed (``import vdla.isa.encoding`` is ``vdla.isa.encoding``): it binds
    names, and the code that uses one imports it by name."""
    package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    found: list[tuple[str, ...]] = []
    for level, module, names in _scanned(path)[1]:
        if level < 0:
            found.extend((n,) for n in names)
            continue
        base = module
        if level:
            base = ".".join(p for p in (*package[:len(package) - level + 1], module) if p)
        # Each name is the submodule ``base.name`` when there is one, else a name of
        # ``base``'s own (defined or imported in its file).
        found.extend((f"{base}.{n}", base) for n in names)
    return found


def _closure(roots: tuple[str | Package, ...], dirs: Mapping[str, Path]) -> dict[str, Path]:
    """module name -> file, for `roots` and every project module they import, at any
    depth."""
    # Each name resolved once (a file, or None for an attribute): the same names are
    # imported by many modules, and each resolution asks the file system.
    resolved: dict[str, Path | None] = {}

    def resolve(name: str) -> Path | None:
        if name not in resolved:
            resolved[name] = _module_file(name, dirs)
        return resolved[name]

    pending: list[str] = []
    for root in roots:
        if isinstance(root, Package):
            pending += _package_modules(root.name, dirs)
        else:
            resolved[root] = _root_file(root, dirs)
            pending.append(root)
    found: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        path = resolve(name)
        if path is None or name in found:
            continue
        found[name] = path
        for choices in _imported(path, name):
            for target in choices:
                if not (target == PROJECT or target.startswith(PROJECT + ".")):
                    break                     # not the project's: not followed
                if resolve(target) is None:
                    continue                  # an attribute, not a module: the next
                if target not in found:
                    pending.append(target)
                break
    return found


def code_files(code: Any, dirs: Mapping[str, Path] | None = None) -> dict[str, Path]:
    """module name -> source file of everything `code` covers (module docstring).

    code : what computes the answer (a module or its name, a function, a class, an
        object, a `Package`, or a tuple of these)
    dirs : package name -> folder to resolve project modules in (default
        `package_dirs()`: the installed package); a test points it at a copy"""
    return _closure(code_roots(code), package_dirs() if dirs is None else dirs)


@functools.cache
def _roots_digest(roots: tuple[str | Package, ...],
                  dirs: tuple[tuple[str, Path], ...] | None) -> str:
    """`code_digest` of `roots` (`code_roots`) under `dirs` (None: `package_dirs()`,
    fixed in a process, so the hot path hashes no table)."""
    table = package_dirs() if dirs is None else dict(dirs)
    digest = hashlib.sha256(f"vdla code digest {VERSION}\0".encode())
    # Keyed by module name, not path: the same code installed elsewhere is the same key.
    for name, path in sorted(_closure(roots, table).items()):
        digest.update(f"{name}\0{file_digest(path)}\0".encode())
    return digest.hexdigest()


def code_digest(code: Any, dirs: Mapping[str, Path] | None = None) -> str:
    """SHA-256 of the names and contents of every module `code` covers (`code_files`):
    what a memo's folder is named by. Derived once per process for the same code and
    `dirs`. ValueError for a module that has no source file."""
    # The hot path (a chooser's function, asked tens of thousands of times a model):
    # one dictionary look-up.
    roots = (code.__module__,) if isinstance(code, types.FunctionType) else code_roots(code)
    return _roots_digest(roots, None if dirs is None else tuple(sorted(dirs.items())))


def forget() -> None:
    """Forget every digest derived in this process (what a new process would see): for
    tests that edit source files."""
    # `_PARSED` is keyed on the files' contents, so it is never stale: kept.
    for cached in (package_dirs, _scanned, _roots_digest):
        cached.cache_clear()
