"""Conditioning: how far base moves on its own when its inputs change by one rounding unit.

Some computations amplify rounding a lot: a train-mode BatchNorm over two values per
channel divides by their tiny spread. There, the rounding differences between two
frameworks grow past any fixed tolerance although both compute the same thing. A copy
of base, run once more on its inputs moved by one unit in the last place, shows how
much each event's results move from rounding alone; a difference of no more than
:data:`MARGIN` times that is the model's conditioning, not a port difference.

Measured lazily, only when blame would otherwise report a divergence, so a step that
agrees costs nothing more.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.engine.stepping import run_step
from nbdiff.engine.types import StepRecord
from nbdiff.frameworks import Framework
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.inputs import CallArgs
from nbdiff.trace.nest import flatten, unflatten

__all__ = ["Floor", "MARGIN", "measure_floor", "Noise"]

MARGIN = 4.0
"""Rounding differs at every layer between frameworks, while the probe moves the inputs once."""

Key = tuple[str, str, str, int]
Floor = dict[Key, float]
"""``(phase, kind, path, call)`` -> the largest change of that event's results."""


def _key(e: Event) -> Key:
    return (e.phase.value, e.kind.value, e.path, e.call)


def _nudged(fw: Framework, call: CallArgs, seed: int) -> CallArgs | None:
    """``call`` with every floating input tensor times ``1 + eps * u``, ``u`` uniform in [-1, 1]."""
    leaves, template = flatten(call, fw.is_tensor)
    rng = np.random.RandomState(seed)
    values, moved = [], False
    for _, t in leaves:
        a = fw.to_numpy(t) if fw.is_floating(t) else None
        if a is None or a.dtype.name != fw.dtype_name(t):  # integers, and bfloat16 read as float32
            values.append(t)
            continue
        u = rng.uniform(-1.0, 1.0, a.shape).astype(a.dtype)
        values.append(fw.from_numpy(a * (1 + np.finfo(a.dtype).eps * u), device=fw.device_of(t)))
        moved = True
    return unflatten(template, values) if moved else None


def measure_floor(
    fw: Framework,
    model: Any,
    call: CallArgs,
    loss_fn: Callable[[Any], Any] | None,
    brec: StepRecord,
    param_grads: Callable[[Any, str], dict[str, np.ndarray]] | None,
) -> Floor | None:
    """Each event's largest change when a copy of base runs on nudged inputs; ``None`` when no input
    can be nudged (token ids only). ``param_grads(model, path)`` reads a layer's parameter gradients."""
    nudged = _nudged(fw, call, seed=0)
    if nudged is None:
        return None
    backward = param_grads is not None and bool(brec.backward)
    try:
        twin = copy.deepcopy(model)  # its own gradients and running statistics: base is left as it is
        rec = run_step(fw, twin, nudged, loss_fn, side="base", step=brec.forward[0].step, backward=backward)
    except Exception:  # a model that cannot be copied or run twice: nothing measured, nothing dismissed
        return None
    floor: Floor = {}
    for mine, theirs, field in ((rec.forward, brec.forward, "outputs"), (rec.backward, brec.backward, "inputs")):
        at = {_key(e): e for e in theirs}
        for e in mine:
            b = at.get(_key(e))
            if b is not None:
                floor[_key(e)] = _change(getattr(e, field), getattr(b, field))
    if backward and param_grads is not None:
        twins = dict(fw.named_layers(twin))
        for e in brec.backward:
            if e.path in twins:
                mine_g, base_g = param_grads(twins[e.path], e.path), param_grads(None, e.path)
                moved = [_max_change(mine_g[n], base_g[n]) for n in mine_g if n in base_g]
                floor[_key(e)] = max([floor.get(_key(e), 0.0), *moved])
    return floor


def _change(a: tuple[TensorRecord, ...], b: tuple[TensorRecord, ...]) -> float:
    return max(
        (_max_change(x.value, y.value) for x, y in zip(a, b) if x.value is not None and y.value is not None),
        default=0.0,
    )


def _max_change(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not a.size or a.dtype.kind != "f":
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


class Noise:
    """What blame asks of the floor: is an event's error within the model's own rounding sensitivity?"""

    def __init__(self, measure: Callable[[], Floor | None]) -> None:
        self._measure = measure
        self._floor: Floor | None = None
        self._done = False
        self.dismissed: list[tuple[Event, float, float]] = []
        """``(event, its error, base's own move)`` of each difference put down to conditioning."""

    def __call__(self, event: Event, tensors: tuple[TensorDiff, ...]) -> bool:
        if not self._done:
            self._floor, self._done = self._measure(), True
        limit = self._floor.get(_key(event)) if self._floor is not None else None
        err = max((t.max_abs for t in tensors if not t.passed), default=0.0)
        if limit is None or limit <= 0 or not np.isfinite(err) or err > MARGIN * limit:
            return False
        self.dismissed.append((event, err, limit))
        return True
