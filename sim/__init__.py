"""Simulators of the accelerator: functional (numpy, the golden model) and cycle-accurate
(`vdla.sim.verilator`). All raise the errors of `vdla.sim.errors`."""

from vdla.sim.errors import (TOKEN_QUEUES, DeadlockError, ProgramError, SimError, Wait,
                             WatchdogError)
from vdla.sim.functional import FunctionalSimulator
from vdla.sim.validate import BudgetError, ProgramValidator

__all__ = ["FunctionalSimulator", "ProgramValidator", "SimError", "ProgramError", "BudgetError",
           "DeadlockError", "WatchdogError", "Wait", "TOKEN_QUEUES"]
