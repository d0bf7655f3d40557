"""A learning rate that differs where the gradients differ too: each side's update over its own gradient.

Where a parameter's gradient already differed in the step (an upstream bug), comparing the two
updates cannot tell the optimizers apart, so such an update inherits the step's finding. Plain SGD,
and any SGD's first step with momentum, moves a parameter by ``-lr * grad``: one number per side,
read from the update and the gradient the dump (or the step) kept. Two numbers that differ are the
optimizers' own difference (a learning rate, a parameter group's), whatever the gradients were. An
update that is not one number times its gradient (Adam, momentum later on, weight decay) says nothing
here and is left as it was.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from nbdiff.engine.layouts import converted_records
from nbdiff.engine.training.updates import Updates
from nbdiff.judge.blame import EventDiff
from nbdiff.trace.events import Phase, TensorRecord
from nbdiff.weights.plan import LayerWeights

__all__ = ["step_size", "step_sizes_apart", "noted"]

STEP_RTOL = 1e-2
"""How far apart two step sizes may be, relative to the larger: each is read from an update that fits
its gradient to :data:`_FIT` of its largest element, which leaves the number itself that uncertain on a
few elements (a bias of four); a learning rate 3% off, or a group's 3x, is beyond."""
_FIT = 1e-3
"""How closely an update must be one number times its gradient, relative to its largest element."""


def step_size(update: np.ndarray, grad: np.ndarray, floor: float = 0.0) -> float | None:
    """``a`` with ``update == a * grad`` to within :data:`_FIT` of the update (or ``floor``, the rounding
    of the weights it is the difference of); ``None`` where no one number does."""
    if np.shape(update) != np.shape(grad):
        return None
    u, g = np.asarray(update, np.float64).ravel(), np.asarray(grad, np.float64).ravel()
    if not (np.isfinite(u).all() and np.isfinite(g).all()):
        return None
    gg, largest = float(g @ g), float(np.abs(u).max(initial=0.0))
    if gg == 0.0 or largest == 0.0 or largest <= floor:
        return None
    a = float(u @ g) / gg
    return a if float(np.abs(u - a * g).max()) <= max(_FIT * largest, floor) else None


def step_sizes_apart(
    plans: dict[str, LayerWeights], updates: dict[str, Updates], step: list[EventDiff]
) -> dict[tuple[str, str], str]:
    """``(raw path, parameter name)`` of each update whose side moved its own gradient by another step
    size than the other side, with what was read; ``step``: the step's pairs (their gradients)."""
    grads = _gradients(step)
    out = {}
    for key, u in updates.items():
        plan = plans.get(key)
        if plan is None or plan.recursive or not u.base.outputs or not u.raw.outputs:
            continue
        bg, rg = grads[0].get(plan.base_path), grads[1].get(plan.raw_path)
        if not bg or not rg:
            continue
        base_u, base_g = _values(converted_records(plan, u.base.outputs)), _values(converted_records(plan, bg))
        raw_u, raw_g = _values(u.raw.outputs), _values(rg)
        for name in raw_u.keys() & base_u.keys() & raw_g.keys() & base_g.keys():
            a = step_size(base_u[name], base_g[name])
            b = step_size(raw_u[name], raw_g[name])
            if a is not None and b is not None and abs(a - b) > STEP_RTOL * max(abs(a), abs(b)):
                out[(plan.raw_path, name)] = (
                    f"each side's update is its own gradient times one number: base {a:.4g}, raw {b:.4g} "
                    f"(x{b / a:.4g}; -lr for plain SGD): the optimizers differ, whatever the gradients did"
                )
    return out


def noted(diffs: list[EventDiff], notes: dict[tuple[str, str], str]) -> list[EventDiff]:
    """``diffs`` with each tensor in ``notes`` carrying its note."""
    if not notes:
        return diffs
    out = []
    for d in diffs:
        tensors = tuple(
            replace(t, note=notes[(d.raw.path, t.name)]) if (d.raw.path, t.name) in notes else t for t in d.tensors
        )
        out.append(replace(d, tensors=tensors) if tensors != d.tensors else d)
    return out


def _gradients(
    step: list[EventDiff],
) -> tuple[dict[str, tuple[TensorRecord, ...]], dict[str, tuple[TensorRecord, ...]]]:
    """Each side's parameter gradients by layer path, from the step's backward pairs (kept values only)."""
    out: tuple[dict[str, tuple[TensorRecord, ...]], dict[str, tuple[TensorRecord, ...]]] = ({}, {})
    for d in step:
        if d.base.phase is not Phase.BACKWARD:
            continue
        for side, e in zip(out, (d.base, d.raw)):
            kept = tuple(t for t in e.params if t.value is not None)
            if kept and e.path not in side:  # a layer called twice: its first call's event holds the sum
                side[e.path] = kept
    return out


def _values(records: tuple[TensorRecord, ...]) -> dict[str, np.ndarray]:
    return {t.name: t.value for t in records if t.value is not None}
