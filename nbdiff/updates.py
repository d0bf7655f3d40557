"""Optimizer updates of one step: snapshots of trainable tensors, their tolerance, and the diffs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.compare.blame import Divergence, EventDiff
from nbdiff.compare.metrics import TensorDiff, compare_tensors
from nbdiff.compare.tolerance import Tolerance
from nbdiff.frameworks import Framework
from nbdiff.replay import compare_param_grads
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = [
    "UPDATE_ATOL", "GRADIENT_SENSITIVITY", "Snapshot", "snapshot", "update_tolerance", "update_diffs",
    "discount_updates", "discount_gradients", "name_parameter",
]  # fmt: skip

UPDATE_ATOL = 1e-3
"""Default tolerance of optimizer updates, relative to the largest update of the tensor."""
_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}

GRADIENT_SENSITIVITY = 2.0
"""How far apart two optimizers given gradients that differ may move an element, as a multiple of
``r`` (the element's largest gradient difference so far over its largest gradient) times the
tensor's largest update. SGD moves it by ``lr * dg`` (at most ``r`` of that); Adam divides by a
running ``|g|``, so its update moves by about ``lr * r``, and momentum carries earlier steps' ``r``."""
TolFn = Callable[[str, str], Tolerance]
Snapshot = dict[str, dict[str, np.ndarray]]
GradientSteps = Callable[[], list[tuple[Snapshot, Snapshot]]]
"""Both sides' parameter gradients of each step so far, the current one last (read only when needed)."""


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
    grads: GradientSteps | None = None,
) -> list[EventDiff]:
    """``grads``: the gradients each optimizer was given, when they were not the same (``watch``)."""
    diffs = []
    given: list[tuple[Snapshot, Snapshot]] | None = None
    for order, (key, plan) in enumerate(plans.items()):
        bd = {n: after[0][key][n] - before[0][key][n] for n in after[0][key]}
        rd = {n: after[1][key][n] - before[1][key][n] for n in after[1][key]}
        if not bd or not rd:
            continue

        weight_scale = max((float(np.abs(v).max()) for v in after[1][key].values() if v.size), default=0.0)

        def update_tol(a: str, b: str, _scale: float = weight_scale) -> Tolerance:
            return update_tolerance(tol, a, b, _scale)

        tensors = compare_param_grads(bd, rd, plan, update_tol, mode)
        if grads is not None and not all(t.passed for t in tensors):
            given = given if given is not None else grads()  # once per call, only when something fails
            steps = [(b.get(key, {}), r.get(key, {})) for b, r in given]
            tensors = _discounted(tensors, plan, (bd, rd), steps, mode)
        diffs.append(param_pair(step, Phase.OPTIMIZER, order, plan, bd, rd, tensors))
    return diffs


def _discounted(
    tensors: list[TensorDiff],
    plan: LayerWeights,
    updates: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    grads: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    mode: str,
) -> list[TensorDiff]:
    try:
        bu = plan.convert(dict(updates[0]))
        steps = [(plan.convert(dict(b)), r) for b, r in grads if b and r]
    except (KeyError, ValueError):
        return tensors
    return discount_updates(tensors, bu, updates[1], steps, mode)


def discount_updates(
    tensors: list[TensorDiff],
    base: dict[str, np.ndarray],
    raw: dict[str, np.ndarray],
    grads: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    mode: str,
) -> list[TensorDiff]:
    """The failing update comparisons redone by :func:`discount_gradients`; every array in raw's
    layout (``grads``: base's and raw's per step so far, by parameter name)."""
    out = []
    for t in tensors:
        pairs = [(bg[t.name], rg[t.name]) for bg, rg in grads if t.name in bg and t.name in rg]
        known = not t.passed and t.name in base and t.name in raw and pairs
        out.append(discount_gradients(t, base[t.name], raw[t.name], pairs, mode) if known else t)
    return out


def discount_gradients(
    t: TensorDiff, bu: np.ndarray, ru: np.ndarray, grads: list[tuple[np.ndarray, np.ndarray]], mode: str
) -> TensorDiff:
    """``t`` (raw's update ``ru`` against base's ``bu``) compared again, after taking out of each
    element what the gradients the two optimizers were handed (``grads``: base's and raw's, per step
    so far) explain; ``t`` itself when it still fails.

    Rounding decides a gradient near zero (it may even flip sign), and Adam divides by ``|g|``: such
    an element moves by ``±lr`` on one side and not the other, a false alarm without this. An element
    ``r`` apart (largest gradient difference over largest gradient, over the steps so far) may differ
    by ``GRADIENT_SENSITIVITY * r`` of the largest update. A wrong learning rate, decay, beta or
    epsilon shows where the gradients agree, and stays."""
    if len({np.shape(x) for pair in grads for x in pair} | {np.shape(bu), np.shape(ru)}) != 1:
        return t
    gap = size = np.zeros(np.shape(bu))
    for bg, rg in grads:
        bg, rg = np.asarray(bg, np.float64), np.asarray(rg, np.float64)
        gap, size = np.maximum(gap, np.abs(bg - rg)), np.maximum(size, np.maximum(np.abs(bg), np.abs(rg)))
    rel = np.divide(gap, size, out=np.zeros_like(size), where=size > 0)
    bu, ru = np.asarray(bu, np.float64), np.asarray(ru, np.float64)
    largest = max(float(np.abs(bu).max(initial=0.0)), float(np.abs(ru).max(initial=0.0)))
    d = ru - bu
    left = np.sign(d) * np.maximum(np.abs(d) - np.minimum(GRADIENT_SENSITIVITY * rel, 2.0) * largest, 0.0)
    redone = compare_tensors(t.name, bu + left, bu, t.tolerance, mode)  # t.tolerance: already the dtypes'
    if not redone.passed:
        return t
    explained = np.abs(left) < np.abs(d)
    n, worst = int(np.count_nonzero(explained & (rel > 1e-3))), float(rel[explained].max(initial=0.0))
    return replace(
        redone,
        note=f"{n} element(s) differ by what the gradients each optimizer was given explain (up to {worst:.1%} "
        "apart there: near zero, rounding decides a gradient, and an optimizer that divides by |grad|, as Adam "
        "does, makes that a visible part of the update)",
    )


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
