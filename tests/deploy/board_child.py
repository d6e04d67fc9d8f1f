"""A board's process, for tests: runs a bundle's own ``run.py`` with the board's layers
(`vdla.deploy.board.hardware.open_layers`, the one function that reaches the hardware)
replaced by layers that forward every register access and every cache flush and
invalidate over a pipe to the parent, which applies them to the Verilator model
(`board_shim.serve_layers`). Everything else (run.py, the runner, the player, the
accelerator's protocol, the manifest check) is the bundle's carried code, unchanged.

    python board_child.py BUNDLE FD_IN FD_OUT REPORT [--block] -- RUN.PY ARGS...

It imports the standard library only, so it runs in a bare virtual environment with
numpy alone. ``--block`` first installs a `sys.meta_path` finder that refuses every
module but the standard library's, numpy's and the bundle's carried vdla modules. At
exit REPORT holds {"exit": status, "modules": {vdla module: file}, "refused": [names],
"loaded": [every module imported after start-up]}.
"""

import importlib.abc
import json
import os
import runpy
import struct
import sys
import traceback
from pathlib import Path

#: A request: op (r: read a register, w: write one, f: flush bytes to the model, i:
#: invalidate, read them back), then two numbers (offset and value, or offset and size).
HEADER = struct.Struct("<cQQ")


class Blocker(importlib.abc.MetaPathFinder):
    """Refuses every module but the standard library's, numpy's and the `carried` vdla
    modules (the bundle's), and records what it refused."""

    def __init__(self, carried: set[str]):
        self.carried, self.refused = carried, []

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top == "numpy" or name in self.carried:
            return None
        self.refused.append(name)
        raise ImportError(f"{name} is refused on the board (not the standard library, "
                          "numpy or the bundle's carried code)")


def _carried(lib: Path) -> set[str]:
    names = set()
    for path in lib.rglob("*.py"):
        parts = path.relative_to(lib).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def main() -> int:
    bundle, fd_in, fd_out, report = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
        Path(sys.argv[4])
    rest = sys.argv[5:]
    before = set(sys.modules)
    block = rest[:1] == ["--block"]
    rest = rest[rest.index("--") + 1:]
    lib = bundle / "lib"
    blocker = None
    if block:
        blocker = Blocker(_carried(lib))
        sys.meta_path.insert(0, blocker)
    sys.path.insert(0, str(lib))       # as run.py does, so that the layers patch its code
    sys.dont_write_bytecode = True
    import numpy as np
    import vdla.deploy.board.hardware as hardware
    rx, tx = os.fdopen(fd_in, "rb", buffering=0), os.fdopen(fd_out, "wb", buffering=0)

    def receive(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = rx.read(n - len(data))
            if not chunk:
                raise EOFError("the parent closed the pipe")
            data += chunk
        return data

    class PipeMmio(hardware.Mmio):
        def read(self, offset):
            tx.write(HEADER.pack(b"r", offset, 0))
            return struct.unpack("<I", receive(4))[0]

        def write(self, offset, value):
            tx.write(HEADER.pack(b"w", offset, value & 0xFFFFFFFF))

    class PipeMemory(hardware.DmaMemory):
        """The DMA region as this process's own array; a flush sends its bytes to the
        model's DRAM, an invalidate reads them back, as a CPU's caches do: a missing or
        misplaced flush or invalidate gives wrong outputs."""

        def __init__(self, size, base):
            self.physical_address, self.array = base, np.zeros(size, np.uint8)

        def flush(self, offset, nbytes):
            tx.write(HEADER.pack(b"f", offset, nbytes))
            tx.write(self.array[offset:offset + nbytes].tobytes())

        def invalidate(self, offset, nbytes):
            tx.write(HEADER.pack(b"i", offset, nbytes))
            self.array[offset:offset + nbytes] = np.frombuffer(receive(nbytes), np.uint8)

    base = int(os.environ.get("VDLA_TEST_REGION_BASE", 1 << 20))
    hardware.open_layers = lambda register_base, size: (PipeMmio(), PipeMemory(size, base),
                                                        None)
    sys.argv = [str(bundle / "run.py"), *rest]
    try:
        runpy.run_path(str(bundle / "run.py"), run_name="__main__")
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception:       # (an import refused, say: reported, not lost)
        traceback.print_exc()
        status = 1
    modules = {name: getattr(module, "__file__", None) for name, module in
               sorted(sys.modules.items()) if name == "vdla" or name.startswith("vdla.")}
    report.write_text(json.dumps({"exit": status, "modules": modules,
                                  "refused": blocker.refused if blocker else [],
                                  "loaded": sorted(set(sys.modules) - before)}))
    return status


if __name__ == "__main__":
    sys.exit(main())
