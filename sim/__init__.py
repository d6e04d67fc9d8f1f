"""Simulators of the accelerator: functional (numpy, the golden model) and, later,
cycle-accurate (Verilator). All raise the errors of `vdla.sim.errors`."""

from vdla.sim.errors import TOKEN_QUEUES, DeadlockError, ProgramError, SimError, Wait
from vdla.sim.functional import FunctionalSimulator

__all__ = ["FunctionalSimulator", "SimError", "ProgramError", "DeadlockError", "Wait",
           "TOKEN_QUEUES"]
