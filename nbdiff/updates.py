"""Optimizer updates of one step: snapshots of trainable tensors, their tolerance, and the diffs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.compare.blame import Divergence, EventDiff
from nbdiff.compare.metrics import TensorDiff
from nbdiff.compare.tolerance import Tolerance
from nbdiff.frameworks import Framework
from nbdiff.replay import compare_param_grads
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = ["UPDATE_ATOL", "Snapshot", "snapshot", "update_tolerance", "update_diffs", "name_parameter"]

UPDATE_ATOL = 1e-3
"""Default tolerance of optimizer updates, relative to the largest update of the tensor."""
_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}

TolFn = Callable[[str, str], Tolerance]
Snapshot = dict[str, dict[str, np.ndarray]]


def snapshot(fw: Framework, layers: dict[str, Any], plans: dict[str, LayerWeights], side: str) -> Snapshot:
    """Copies of the trainable tensors of every planned layer of one side, by base path."""
    out = {}
    for plan in plans.values():
        layer = layers[plan.base_path if side == "base" else plan.raw_path]
        out[plan.base_path] = {
            n: fw.to_numpy(p).copy() for n, p in layer_tensors(fw, layer, plan.recursive).items() if fw.is_trainable(p)
        }
    return out


def update_tolerance(tol: TolFn, a: str, b: str, weight_scale: float) -> Tolerance:
    """Tolerance of an optimizer update of weights of magnitude ``weight_scale``."""
    # An update is a small difference of large numbers: allow a few roundings of the weight itself.
    floor = 4 * max(_EPS.get(a, _EPS["float32"]), _EPS.get(b, _EPS["float32"])) * weight_scale
    # Adam-like updates divide by |grad|: elements with tiny gradients change by a visible
    # fraction of the step for rounding-level gradient differences, so updates get at least
    # 0.1% of the largest update (a wrong learning rate is 10x beyond).
    user = tol(a, b)
    return replace(user, atol=max(user.atol, UPDATE_ATOL) if user.scaled else user.atol, floor=floor)


def update_diffs(
    step: int,
    plans: dict[str, LayerWeights],
    before: tuple[Snapshot, Snapshot],
    after: tuple[Snapshot, Snapshot],
    tol: TolFn,
    mode: str,
) -> list[EventDiff]:
    diffs = []
    for order, (key, plan) in enumerate(plans.items()):
        bd = {n: after[0][key][n] - before[0][key][n] for n in after[0][key]}
        rd = {n: after[1][key][n] - before[1][key][n] for n in after[1][key]}
        if not bd or not rd:
            continue

        weight_scale = max((float(np.abs(v).max()) for v in after[1][key].values() if v.size), default=0.0)

        def update_tol(a: str, b: str, _scale: float = weight_scale) -> Tolerance:
            return update_tolerance(tol, a, b, _scale)

        tensors = compare_param_grads(bd, rd, plan, update_tol, mode)
        diffs.append(param_pair(step, Phase.OPTIMIZER, order, plan, bd, rd, tensors))
    return diffs


def param_pair(
    step: int,
    phase: Phase,
    order: int,
    plan: LayerWeights,
    base: dict[str, np.ndarray],
    raw: dict[str, np.ndarray],
    tensors: Sequence[TensorDiff],
) -> EventDiff:
    """The compared pair for a planned layer's parameter-level arrays (updates, running statistics)."""

    def event(path: str, type_name: str, arrays: dict[str, np.ndarray]) -> Event:
        records = tuple(TensorRecord(n, v.shape, str(v.dtype), v) for n, v in arrays.items())
        return Event(step, phase, Kind.PARAM, order, path, type_name, 0, 0, None, True, (), records)

    return EventDiff(
        event(plan.base_path, plan.base_type, base), event(plan.raw_path, plan.raw_type, raw), tuple(tensors)
    )


def name_parameter(div: Divergence, plans: dict[str, LayerWeights]) -> Divergence:
    """Name the diverging parameter as the base model calls it."""
    name = div.metrics.name
    plan = plans.get(div.base_path)
    if plan is not None:
        try:
            back = plan.inverse({name: np.zeros((1, 1))})
            name = next(iter(back)) if len(back) == 1 else name
        except (KeyError, ValueError, StopIteration):
            pass
    prefix = f"{div.base_path}." if div.base_path else ""
    return replace(div, where="parameter", inherited=False, parameter=prefix + name)
