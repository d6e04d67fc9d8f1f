"""vdla: hardware-software co-design toolkit for a VTA-style deep-learning accelerator.

``vdla.HardwareConfig`` holds the accelerator's parameters; the subpackages are imported
on first use (``vdla.isa``, ``vdla.sim``, ``vdla.runtime``, ...), so ``import vdla``
stays cheap.
"""

import importlib

from vdla.config import AluOp, HardwareConfig

__all__ = ["HardwareConfig", "AluOp", "isa", "sim", "runtime", "hw", "compiler", "boards"]
__version__ = "0.1.0.dev0"

_SUBPACKAGES = {"isa", "sim", "runtime", "hw", "compiler", "boards"}


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"vdla.{name}")
    raise AttributeError(f"module 'vdla' has no attribute {name!r}")
