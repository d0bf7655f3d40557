"""The types every stage of the engine passes: a recorded step, a tolerance by dtypes, the weight
plans, a snapshot of weights by plan. One place, so that a stage reads another's values without
importing that stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nbdiff.judge.tolerance import Tolerance
from nbdiff.trace.events import Event, Kind
from nbdiff.weights.plan import LayerWeights

__all__ = ["StepRecord", "TolFn", "Plans", "Snapshot"]

TolFn = Callable[[str, str], Tolerance]
"""The tolerance for a base and a raw dtype name."""
Plans = dict[str, LayerWeights]
"""Weight plans by base path: how each paired layer's tensors map onto raw's (decided at the first step)."""
Snapshot = dict[str, dict[str, np.ndarray]]
"""Arrays (weights, updates, gradients) by plan key, then by parameter name."""


@dataclass(frozen=True)
class StepRecord:
    forward: list[Event]
    backward: list[Event]
    warnings: list[str]
    param_grads: dict[int, np.ndarray] = field(default_factory=dict)
    """``id`` of a parameter -> its gradient in this step, the copy the backward events hold."""
    optimizer: list[Event] = field(default_factory=list)
    """The optimizer's updates, as a dump records them (live steps compare weights instead)."""
    state: list[Event] = field(default_factory=list)
    """The running statistics the step moved, before (inputs) and after (outputs), as a dump records
    them (live steps read the models instead)."""

    _calls: dict[tuple[str, int], Event] | None = field(default=None, repr=False, compare=False)

    def forward_of(self, bwd: Event) -> Event | None:
        """The forward layer call whose backward ``bwd`` is (a fused group's has none of its own).
        Indexed on first use: after a bug upstream, every backward event asks."""
        if self._calls is None:  # the first call of a (path, call) wins, as a search would find it
            calls = {(e.path, e.call): e for e in reversed(self.forward) if e.kind is Kind.LAYER}
            object.__setattr__(self, "_calls", calls)  # a cache: the record itself does not change
        return self._calls.get((bwd.path, bwd.call))  # type: ignore[union-attr]
