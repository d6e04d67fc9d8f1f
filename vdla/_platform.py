"""Facts about the machine vdla runs on, named once: the CPU's name, for reports and for
the tuner's records (a record taken on one CPU is never used for another)."""

from __future__ import annotations

import functools
import platform

__all__ = ["cpu_name"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string.

    Read once, by `_read_cpu_name`, looked up on every call: modules import this
    function by name, so a test that stands in for another machine replaces that one
    (tests/platform_testing.py) and every caller sees it, whenever it was imported."""
    return _read_cpu_name()


@functools.lru_cache(maxsize=None)
def _read_cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
