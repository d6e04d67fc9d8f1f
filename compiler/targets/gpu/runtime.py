"""Where the GPU target's kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Triton and PyTorch (device memory, CUDA events) are the ``gpu`` extra
(``pip install 'vdla[gpu]'``); nothing here imports them until a target needs them, so
vdla runs without them and `require` says how to install them.

Triton decides whether kernels are compiled for the GPU or run by its interpreter when
it and they are first imported (``TRITON_INTERPRET``; its own library's functions are
decorated then too), so a process runs the GPU target in one mode: the first target to
need its kernels fixes it (`resolve`), and a target that asks for the other mode later
gets an error saying to use a new process.

    mode = runtime.resolve("auto")     # "cuda" when a CUDA GPU is there, else "interpreter"
    k = runtime.kernels()              # the module `vdla.compiler.targets.gpu.kernels`
    fn = runtime.kernel("nd_map")      # a kernel of `kernels` or `sequence_kernels`
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

from vdla._platform import cpu_name

__all__ = ["DEVICES", "INSTALL", "MODES", "available", "cuda_available", "device_name",
           "kernel", "kernels", "require", "resolve", "torch_device"]

#: How to install what the GPU target needs.
INSTALL = "pip install 'vdla[gpu]'  (Triton and PyTorch)"
#: Where kernels run.
MODES = ("cuda", "interpreter")
#: What a user may ask for: a mode, or "auto" (a CUDA GPU when one is present).
DEVICES = ("auto",) + MODES


def available() -> bool:
    """Whether Triton and PyTorch can be imported (without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("triton", "torch"))


def require() -> None:
    """ValueError saying how to install the gpu extra when Triton or PyTorch is missing."""
    missing = [name for name in ("triton", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"the gpu target needs {' and '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL}")


@functools.lru_cache(maxsize=None)
def cuda_available() -> bool:
    """Whether PyTorch sees a CUDA GPU (asked once per process)."""
    require()
    import torch  # heavy (the gpu extra): imported only when the target is used

    return bool(torch.cuda.is_available())


_ON = ("1", "true", "on", "yes")
#: This process's mode, once the first target has resolved it.
_mode: str | None = None


def auto_mode() -> str:
    """The mode ``auto`` runs in here (this process's mode, once one is fixed), without
    fixing it: ``cuda`` or ``interpreter``. Requires the gpu extra."""
    if _mode is not None:
        return _mode
    return "interpreter" if _interpreter_forced() or not cuda_available() else "cuda"


def _interpreter_forced() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _ON


def resolve(device: str) -> str:
    """The mode a target asked for `device` runs in: ``auto`` is ``cuda`` when a CUDA GPU
    is present and ``TRITON_INTERPRET`` is not set, else ``interpreter``. The first call
    fixes the process's mode (see the module docstring). ValueError for an unknown
    device, a missing extra, ``cuda`` without a GPU, or a mode other than the process's."""
    global _mode
    if device not in DEVICES:
        raise ValueError(f"gpu target: device must be one of {', '.join(DEVICES)}, not "
                         f"{device!r}")
    require()
    forced = _interpreter_forced()
    if _mode is None:
        if device == "cuda" and forced:
            raise ValueError("gpu target: device 'cuda' asked for, but TRITON_INTERPRET is "
                             "set: unset it to run on the GPU")
        if device == "cuda" and not cuda_available():
            raise ValueError("gpu target: device 'cuda' asked for, but PyTorch sees no CUDA "
                             "GPU (torch.cuda.is_available() is False); use device "
                             "'interpreter' (Triton's interpreter on the CPU) or 'auto'")
        if device == "interpreter" or forced or (device == "auto" and not cuda_available()):
            mode = "interpreter"
        else:
            mode = "cuda"
        if "triton" in sys.modules and (mode == "interpreter") != forced:
            raise ValueError(f"gpu target: Triton was imported already with "
                             f"TRITON_INTERPRET={'1' if forced else 'unset'}, so this process "
                             f"cannot run its kernels on {mode}; start a new one")
        if mode == "interpreter":
            os.environ["TRITON_INTERPRET"] = "1"   # for Triton's lazily imported modules too
        _mode = mode
    elif device not in ("auto", _mode):
        raise ValueError(f"gpu target: this process runs the gpu target's kernels on "
                         f"{_mode} (Triton fixes that when it is first imported); run "
                         f"device {device!r} in a new process")
    return _mode


def kernels():
    """The kernel module, compiled for the GPU or run by the interpreter (the process's
    mode, `resolve`)."""
    if _mode is None:
        raise ValueError("kernels: resolve() a device first")
    # heavy: imports Triton, which must see TRITON_INTERPRET as `resolve` set it
    from vdla.compiler.targets.gpu import kernels as module

    return module


def kernel(name: str):
    """The Triton kernel `name` of `kernels` or `sequence_kernels` (a `Launch`'s kernel),
    in the process's mode (`kernels`)."""
    module = kernels()
    # heavy: Triton, as above (the sequence kernels build on `kernels`' helpers)
    from vdla.compiler.targets.gpu import sequence_kernels

    for source in (module, sequence_kernels):
        if name in source.__all__:
            return getattr(source, name)
    raise ValueError(f"the gpu target has no kernel {name!r}")


def torch_device(mode: str):
    """The `torch.device` tensors of `mode` live on (the interpreter reads host memory)."""
    import torch  # heavy (the gpu extra), as above

    return torch.device("cuda" if mode == "cuda" else "cpu")


@functools.lru_cache(maxsize=None)
def device_name(mode: str) -> str:
    """What runs the kernels, for reports: the GPU's name, or the interpreter and CPU."""
    if mode == "cuda":
        import torch  # heavy (the gpu extra), as above

        return torch.cuda.get_device_name()
    return f"Triton interpreter on {cpu_name()}"
