"""The workload that trains a profile-guided build of the Verilator model.

A profile-guided build (`vdla.sim.verilator.build`) first compiles the model with g++'s
profiler, runs this workload on it in a child process (the profiles are written when
the process exits), and compiles again with the counts. The profile tells g++ which
branches of the model's cycle function are taken, which it lays out and inlines for:
about 1.1-1.3x on the default config (``docs/simulation.md``).

The workload is the hand-written blocked GEMM of `vdla.runtime.kernels` with its
requantization (an ALU shift, a clamp), with one and with two virtual threads: every
module and queue, the GEMM core, the vector ALU, the DMA of instructions, micro-ops,
inputs, weights and outputs, and the token handshakes. Paths it leaves untouched (an
extension's datapath, padding) are optimised as if there were no profile
(``-fprofile-partial-training``), so they run no slower than in a build without one.

It is small (about 700,000 cycles on the default config, a few seconds instrumented):
the profile needs the proportions of a real program, not its length. Its source is part of the
build's cache key (`source_hash`), so a changed workload rebuilds the models.

The workload itself is `vdla.sim.verilator.training_workload`, run by module name in
the child process (it uses `vdla.runtime`, which builds models with this package: it
is never imported here). The child runs in the build's folder with the current folder
kept off its ``sys.path`` (`vdla._tools.python_module_argv`), so it imports the
installed vdla even when the user stands in a clone of the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

from vdla._tools import python_module_argv

__all__ = ["TrainingFailed", "source_hash", "train"]

#: Generous: the workload takes a few seconds on the instrumented model.
TIMEOUT_S = 600


class TrainingFailed(RuntimeError):
    """The training run failed; the message holds the end of its log."""


#: The module the child process runs, and its source file (hashed, never imported).
WORKLOAD_MODULE = "vdla.sim.verilator.training_workload"
_WORKLOAD_SOURCE = Path(__file__).resolve().parent / "training_workload.py"


@lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of the workload's source: what trains every profile."""
    return hashlib.sha256(_WORKLOAD_SOURCE.read_bytes()).hexdigest()


def train(library: Path, config, log_path: Path) -> None:
    """Run the workload on the instrumented `library` of `config` (a `HardwareConfig`)
    in a child process, whose exit writes the profiles next to the build's objects.
    Raises TrainingFailed with the end of the log (`log_path`) if it fails."""
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = "1"   # the reference's matrix product: one core is plenty
    command = python_module_argv(WORKLOAD_MODULE, str(Path(library).resolve()),
                                 json.dumps(config.to_dict()))
    with open(log_path, "w") as out:
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  cwd=Path(log_path).resolve().parent, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise TrainingFailed(f"the profile-guided build's training run took over "
                                 f"{TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = Path(log_path).read_text(errors="replace").splitlines()[-20:]
        raise TrainingFailed(f"the profile-guided build's training run failed (exit status "
                             f"{proc.returncode}); the end of its log:\n" + "\n".join(tail))
