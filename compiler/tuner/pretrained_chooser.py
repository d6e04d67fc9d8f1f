"""The pretrained chooser: each tunable op compiled with the schedule the target's
pretrained cost model ranks first, measuring nothing (``vdla run --chooser pretrained``;
``learned`` is its old name).

    pretrained_schedules(graph, target)     # node name -> schedule, zero-shot
    pretrained_choice(task)                 # one task's pick (None: no model)

The model is the one ``vdla tune --tuner pretrained`` starts from (`TuneTask.pretrained`,
a `vdla.compiler.tuner.cost_model.CostModel` trained on training sets); here it is used
as it ships, with no measurement to correct it. `pretrained_choice` is remembered on
disk (``cache_root()/schedules``) keyed on the task, the model's digest and the code
of this module, `candidates`, the task's class and the model's class (`memo_code`), since
ranking a space of thousands takes a second
(`vdla.compiler.tuner.candidates`: a larger space is sampled and searched around the
model's best).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vdla._memo import remembered
from vdla.compiler.tuner.candidates import (POOL, Candidates, memo_code, memo_key,
                                            remembered_space)

__all__ = ["MARGIN", "pretrained_choice", "pretrained_schedules"]


#: The pretrained chooser keeps the task's default schedule unless the model predicts its
#: own pick faster by more than this share. The model's error on one schedule of a
#: config it never saw is under 2.2% for 95% of schedules (leaving each training config
#: out in turn, centred per task: `bench/tuner_transfer.py`), and its first pick, the
#: one of thousands it flatters most, is predicted 2.3% too fast or more on 5% of tasks;
#: below about 5% a predicted gain is as likely that error as a gain, and following it
#: loses as often as it wins (docs/tuner.md).
MARGIN = 0.05


def pretrained_choice(task, *, margin: float = MARGIN, pool: int = POOL) -> Any:
    """The schedule of `task`'s space that its pretrained model predicts fastest, unless
    it predicts the default schedule within `margin` of it, or the target's own estimate
    has the default faster and overrules the model (`FeatureSet.baseline_vetoes`) (then
    the default); None when the task has no model (`TuneTask.pretrained`). A space
    larger than `pool` is ranked on a sample widened around the model's best
    (`Candidates`).

    Why the second condition: the correction is learned across tasks, and where it turns
    the target's own order of two schedules of one task around it extrapolates. On the
    five configs no training set measured, every pick that paid off had both estimates
    agree (by 7% to 2.1x), and the one that lost did not: MobileNet-v1's
    ``features.2.dw`` on the default config, corrected 9.8% faster, timing model 1.2%
    slower, measured 1.1% slower (docs/tuner.md). Zero-shot promises no more cycles than
    the default chooser, so a pick must convince both. The CPU's own estimate ranks
    schedules at pairwise 0.6-0.7 and vetoes nothing."""
    model = task.pretrained()
    if model is None:
        return None

    def choose():
        space = remembered_space(task)
        found = Candidates(task, model, space, pool=pool)
        found.climb(found.prior)
        default = task.default_schedule()
        pick = int(np.argmin(found.prior))
        fallback = found.add([space.index(default)])[0] if default in space else pick
        better = found.prior[fallback] - found.prior[pick] > math.log2(1 + margin)
        if better and model.feature_set.baseline_vetoes:
            own = model.feature_set.baseline_of(found.features[[pick, fallback]])
            better = own[0] <= own[1]
        return space[int(found.index[pick if better else fallback])]

    if not task.remembered_on_disk:
        return choose()
    key = memo_key(task, model=model.digest, margin=margin, pool=pool)
    # This module's rule decides the choice too, and the model's `predict` and its
    # feature set's `baseline_of` (reached through the objects): a change to any of
    # them forgets the old choices.
    return remembered("schedules", "learned", key, choose, to_json=task.schedule_to_dict,
                      from_json=task.schedule_from_dict,
                      code=memo_code(task, __name__, model, model.feature_set))


def pretrained_schedules(graph, target) -> dict[str, Any]:
    """node name -> `pretrained_choice` for each tunable node of `graph` on `target` whose
    task has a pretrained model (the others keep the target's default)."""
    found = {}
    for task in target.tasks(graph):
        choice = pretrained_choice(task)
        if choice is not None:
            found.update(dict.fromkeys(task.nodes, choice))
    return found
