"""The target registry: names -> factories, so users pick a back half by name.

Built-in targets are one entry each in `BUILTIN` (``"module:Class"``, imported on first
use, so a target with a heavy optional dependency costs nothing until it is picked).
Other packages add theirs without touching vdla, either in code with
``register("mine", MyTarget)`` or, installed, through the ``vdla.targets`` entry-point
group (``mine = "mypackage.target:MyTarget"`` in their pyproject). `get(name, **options)`
makes one; the options are the target's own (the accelerator: ``config``, ``backend``).
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import Callable

from vdla.compiler.targets.base import Target

__all__ = ["BUILTIN", "factory", "get", "names", "register", "unregister"]

#: The targets vdla ships: name -> "module:Class".
BUILTIN = {
    "vdla": "vdla.compiler.targets.vdla.target:VdlaTarget",
    "host": "vdla.compiler.targets.host:HostTarget",
    "cpu": "vdla.compiler.targets.cpu.target:CpuTarget",
    "gpu": "vdla.compiler.targets.gpu.target:GpuTarget",
}

_REGISTERED: dict[str, Callable[..., Target]] = {}


def register(name: str, factory: Callable[..., Target], *, replace: bool = False) -> None:
    """Make `factory` (a `Target` subclass, or any callable returning a `Target`) the
    target called `name`. ValueError when the name is taken (unless `replace`)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a target name must be an identifier, not {name!r}")
    if not callable(factory):
        raise TypeError(f"target {name!r}: the factory must be callable, not {factory!r}")
    if not replace and name in names():
        raise ValueError(f"target {name!r} is registered already (pass replace=True to "
                         "replace it)")
    _REGISTERED[name] = factory


def unregister(name: str) -> None:
    """Forget a target `register` added (KeyError for any other name)."""
    if name not in _REGISTERED:
        raise KeyError(f"target {name!r} was not added with register()")
    del _REGISTERED[name]


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    """The installed ``vdla.targets`` entry points (read once per process: scanning the
    installed distributions takes tens of milliseconds, and every command asks)."""
    return {ep.name: ep.value for ep in entry_points(group="vdla.targets")}


def names() -> list[str]:
    """Every target name: the built-in ones first, then the registered and installed."""
    found = list(BUILTIN)
    for name in list(_REGISTERED) + sorted(_entry_points()):
        if name not in found:
            found.append(name)
    return found


def _load(spec: str) -> Callable[..., Target]:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def factory(name: str) -> Callable[..., Target]:
    """What makes target `name` (usually its `Target` subclass, whose class attributes
    describe it to the command line: `Target.cli_options`), without making one.
    ValueError naming the known targets for an unknown name."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in BUILTIN:
        return _load(BUILTIN[name])
    if name in _entry_points():
        return _load(_entry_points()[name])
    raise ValueError(f"unknown target {name!r}; available: {', '.join(names())}")


def get(name: str, **options) -> Target:
    """A new target `name` made with `options`. ValueError naming the known targets for
    an unknown name; TypeError for options the target does not take."""
    target = factory(name)(**options)
    if not isinstance(target, Target):
        raise TypeError(f"target {name!r}: its factory returned {type(target).__name__}, not "
                        "a vdla.compiler.targets.Target")
    return target
