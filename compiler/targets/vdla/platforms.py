"""The accelerator's platforms for training sets (`vdla.compiler.tuner.dataset`): hardware
configs drawn from a space of them (`VdlaTarget.platforms`)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from vdla.config import HardwareConfig

__all__ = ["CONFIG_SPACE", "sample_configs"]

#: The accelerator configs a training set samples from: `HardwareConfig` fields -> the
#: values drawn (the default config's other fields). Cores from 8x8 to 32x32, buffers
#: from half to twice the default's, and the ALU's src hold. Only fields that
#: `HardwareConfig.name` names: records key a measurement on that name, so a field it
#: leaves out (the DRAM's bandwidth, the clock) would mix two platforms' cycles.
CONFIG_SPACE: dict[str, tuple] = {
    "block_in": (8, 16, 32),
    "block_out": (8, 16, 32),
    "inp_buff_size": (16 << 10, 32 << 10, 64 << 10),
    "wgt_buff_size": (128 << 10, 256 << 10, 512 << 10),
    "acc_buff_size": (64 << 10, 128 << 10, 256 << 10),
    "uop_buff_size": (16 << 10, 32 << 10),
    "alu_hold": (False, True),
}


def sample_configs(count: int, *, seed: int = 0, space: dict[str, Sequence] | None = None,
                   base: HardwareConfig | None = None) -> list[HardwareConfig]:
    """`count` distinct valid configs drawn from `space` (default `CONFIG_SPACE`) over
    `base` (default: the default config), in a seeded order. ValueError when the space
    holds fewer valid configs than `count`, or names a field HardwareConfig lacks."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, not {count!r}")
    space = dict(CONFIG_SPACE if space is None else space)
    base = HardwareConfig() if base is None else base
    fields = {f.name for f in dataclasses.fields(HardwareConfig)}
    unknown = sorted(set(space) - fields)
    if unknown:
        raise ValueError(f"config space: {unknown} are not HardwareConfig fields")
    names = list(space)
    points = list(itertools.product(*(space[n] for n in names)))
    order = np.random.default_rng(seed).permutation(len(points))
    configs, seen = [], set()
    for i in order:
        try:
            config = dataclasses.replace(base, **dict(zip(names, points[int(i)])))
        except (TypeError, ValueError):
            continue   # a combination the config refuses
        if config.name not in seen:
            seen.add(config.name)
            configs.append(config)
            if len(configs) == count:
                return configs
    raise ValueError(f"the config space holds {len(configs)} valid configs, fewer than "
                     f"the {count} asked for")
