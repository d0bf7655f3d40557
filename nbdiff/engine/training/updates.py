"""Optimizer updates of one step: snapshots of trainable tensors, their tolerance, and the diffs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedLayers
from nbdiff.engine.forward import add_tensor_diffs
from nbdiff.engine.layouts import converted_records, records_of
from nbdiff.engine.replay import array_magnitude, read_magnitudes
from nbdiff.engine.training.spread import Spread, widened, widened_together
from nbdiff.engine.types import Snapshot, TolFn
from nbdiff.errors import WeightTransferError
from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.bulk import Comparisons
from nbdiff.judge.metrics import TensorDiff, compare_tensors
from nbdiff.judge.tolerance import Tolerance
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.origin.stack import Frame
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = [
    "UPDATE_ATOL", "GRADIENT_SENSITIVITY", "Updates", "snapshot", "snapshot_updates", "update_tolerance",
    "update_diffs", "param_events",
    "GradientSpread", "in_raw_layout", "discount_updates", "name_parameter",
]  # fmt: skip

UPDATE_ATOL = 1e-3
"""Default tolerance of optimizer updates, relative to the largest update of the tensor."""
_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}

GRADIENT_SENSITIVITY = 2.0
"""How far apart two optimizers given gradients that differ may move an element, as a multiple of
``r`` (the element's largest gradient difference so far over its largest gradient) times the
tensor's largest update. SGD moves it by ``lr * dg`` (at most ``r`` of that); Adam divides by a
running ``|g|``, so its update moves by about ``lr * r``, and momentum carries earlier steps' ``r``."""
MOMENTUM_CARRY = 10.0
"""How many steps' gradient differences an SGD update may carry (momentum 0.9: ten)."""
NOISE_GAP = 0.1
"""An element whose gradients so far were this far apart, relative to their size, was given other
inputs on each side: Adam (momentum, and a division by a running size) can move it anywhere up to
its step either way, so no update there is the optimizer's own difference. A long Adam run of
equivalent CNNs false-alarmed on a convolution bias whose gradients were 1e-9 and 78% apart, and on
a weight element 24% apart whose updates had opposite signs. Wrong settings show where gradients
agree (rounding leaves them 1e-6 apart)."""


class GradientSpread:
    """How far apart the gradients the two optimizers were given have been, per parameter, over the
    steps so far (:data:`Spread`, in raw's layout). That is all discounting reads, so each step is
    folded in once: reading every earlier step again at each later one made a long run's comparison
    quadratic in its length, and held all those steps' gradients at once."""

    def __init__(self) -> None:
        self.steps = 0
        """Steps folded in so far."""
        self._by_key: dict[str, dict[str, Spread | None]] = {}  # None: the shapes changed between steps

    def fold(self, grads: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> None:
        """The next step: per layer key, base's gradients in raw's layout and raw's, by name."""
        together: list[tuple[dict[str, Spread | None], str, np.ndarray, np.ndarray, Spread | None]] = []
        for key, (base, raw) in grads.items():
            held = self._by_key.setdefault(key, {})
            for name, bg in base.items():
                rg = raw.get(name)
                if rg is not None and (name not in held or held[name] is not None):
                    spread = held.get(name)
                    if widened_together(spread, bg, rg):
                        together.append((held, name, bg, rg, spread))
                    else:
                        held[name] = _widened(spread, bg, rg)
        for (held, name, *_), spread in zip(together, widened([t[2:] for t in together])):
            held[name] = spread
        self.steps += 1

    def catch_up(
        self, k: int, step: Callable[[int], dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]]
    ) -> GradientSpread:
        """Fold in every step up to ``k`` not folded yet, each read by ``step(s)`` as :meth:`fold` takes it."""
        for s in range(self.steps, k + 1):
            self.fold(step(s))
        return self

    def of(self, key: str) -> dict[str, Spread | None]:
        return self._by_key.get(key, {})


def _widened(spread: Spread | None, bg: np.ndarray, rg: np.ndarray) -> Spread | None:
    """``spread`` (None: the first step) widened by one step's gradients; None once the shapes differ."""
    if np.shape(bg) != np.shape(rg) or (spread is not None and spread[0].shape != np.shape(bg)):
        return None
    # The gradients' own float type (float32 stays float32: two arrays per parameter are held).
    bg, rg = np.asarray(bg, np.result_type(bg, np.float32)), np.asarray(rg, np.result_type(rg, np.float32))
    gap, size = np.abs(bg - rg), np.maximum(np.abs(bg), np.abs(rg))
    last = float(size.max(initial=0.0))
    return (gap, size, last) if spread is None else (np.maximum(spread[0], gap), np.maximum(spread[1], size), last)


def in_raw_layout(
    plans: dict[str, LayerWeights], base: Snapshot, raw: Snapshot
) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Per plan, base's arrays converted to raw's layout and raw's (a plan that cannot convert them is left out)."""
    out = {}
    for key, plan in plans.items():
        b, r = base.get(key, {}), raw.get(key, {})
        if b and r:
            try:
                out[key] = (plan.convert(dict(b)), r)
            except (KeyError, ValueError):
                continue
    return out


def snapshot(
    fw: Framework, layers: dict[str, Any], plans: dict[str, LayerWeights], side: str, copy: bool = True
) -> Snapshot:
    """Copies of the parameters of every planned layer of one side, by base path: frozen ones too, so a
    parameter frozen on one side only shows as an update that differs (not a later forward).
    ``copy=False``: the values as the framework hands them (on the host, its own memory), for a
    snapshot read at once."""
    out = {}
    for plan in plans.values():
        layer = layers[plan.base_path if side == "base" else plan.raw_path]
        members = layer.members.values() if isinstance(layer, FusedLayers) else (layer,)
        params = {id(p) for m in members for _, sub in fw.named_layers(m) for _, p in fw.direct_params(sub)}
        out[plan.base_path] = {
            n: fw.to_numpy(p).copy() if copy else fw.to_numpy(p)
            for n, p in layer_tensors(fw, layer, plan.recursive).items()
            if fw.is_trainable(p) or id(p) in params
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


@dataclass(frozen=True)
class Updates:
    """One planned layer's optimizer updates, both sides: events whose outputs are the updates
    (base's in base's layout), and the magnitude of raw's weights (0 when not known)."""

    base: Event
    raw: Event
    weight_scale: float = 0.0


def _difference(after: np.ndarray, before: np.ndarray, into_before: bool) -> np.ndarray:
    """``after - before``; into ``before``'s own memory where the caller lets it go (a weight-sized
    array fewer to fault in: the update check of 8 x Linear(1024, 2048) spent a third of its time there)."""
    if into_before and before.flags.writeable and before.shape == after.shape and before.dtype == after.dtype:
        return np.subtract(after, before, out=before)
    return after - before


def snapshot_updates(
    step: int,
    plans: dict[str, LayerWeights],
    before: tuple[Snapshot, Snapshot],
    after: tuple[Snapshot, Snapshot],
    into_before: bool = False,
    stacks: tuple[tuple[Frame, ...], tuple[Frame, ...]] = ((), ()),
) -> dict[str, Updates]:
    """What each side's optimizer changed (after minus before), per plan; ``into_before``: written over
    ``before``'s arrays, which the caller no longer reads; ``stacks``: where each side's optimizer stepped."""
    out = {}
    magnitudes: dict[int, tuple[np.ndarray, float]] = {}
    read_magnitudes((a for key in plans for a in after[1].get(key, {}).values()), magnitudes)
    for order, (key, plan) in enumerate(plans.items()):
        bd = {n: _difference(after[0][key][n], before[0][key][n], into_before) for n in after[0][key]}
        rd = {n: _difference(after[1][key][n], before[1][key][n], into_before) for n in after[1][key]}
        if bd and rd:
            scale = max((array_magnitude(v, magnitudes) for v in after[1][key].values()), default=0.0)
            base, raw = param_events(step, Phase.OPTIMIZER, order, plan, bd, rd, stacks)
            out[key] = Updates(base, raw, scale)
    return out


def update_diffs(
    plans: dict[str, LayerWeights],
    updates: dict[str, Updates],
    tol: TolFn,
    mode: str,
    grads: Callable[[], GradientSpread] | None = None,
) -> list[EventDiff]:
    """Each planned layer's updates compared in raw's layout. ``grads``: how far apart the gradients
    each optimizer was given were, when they were not the same (``watch``, ``compare``); asked for
    only when an update fails."""
    batch, diffs = Comparisons(mode), []
    spread: list[GradientSpread] = []  # asked for once, only when something fails

    def finish(key: str, u: Updates, base: tuple[TensorRecord, ...], start: int, end: int) -> None:
        tensors = batch.decided(start, end)
        if grads is not None and not all(t.passed for t in tensors):
            if not spread:
                spread.append(grads())
            tensors = discount_updates(tensors, _values(base), _values(u.raw.outputs), spread[0].of(key), mode)
        diffs.append(EventDiff(u.base, u.raw, tuple(tensors)))

    for key, plan in plans.items():
        u = updates.get(key)
        if u is None or not u.base.outputs or not u.raw.outputs:
            continue

        def update_tol(a: str, b: str, _scale: float = u.weight_scale) -> Tolerance:
            return update_tolerance(tol, a, b, _scale)

        base = converted_records(plan, u.base.outputs)  # weight-sized: held only until compared
        start = len(batch)
        add_tensor_diffs(batch, u.raw.outputs, base, update_tol)
        batch.when_decided(partial(finish, key, u, base, start, len(batch)))
    batch.made()
    return diffs


def _values(records: tuple[TensorRecord, ...]) -> dict[str, np.ndarray]:
    return {t.name: t.value for t in records if t.value is not None}


def discount_updates(
    tensors: list[TensorDiff],
    base: dict[str, np.ndarray],
    raw: dict[str, np.ndarray],
    spreads: dict[str, Spread | None],
    mode: str,
) -> list[TensorDiff]:
    """The failing update comparisons redone by what the gradients explain; every array in raw's
    layout (``spreads``: :meth:`GradientSpread.of` the layer, by parameter name)."""
    out = []
    for t in tensors:
        spread = spreads.get(t.name)
        if spread is None or t.passed or t.name not in base or t.name not in raw:
            out.append(t)
        else:
            out.append(_discounted(t, base[t.name], raw[t.name], spread, mode))
    return out


def _discounted(t: TensorDiff, bu: np.ndarray, ru: np.ndarray, spread: Spread, mode: str) -> TensorDiff:
    """``t`` (raw's update ``ru`` against base's ``bu``) compared again, after taking out of each
    element what the gradients the two optimizers were handed explain (``spread``); ``t`` itself
    when it still fails.

    Rounding decides a gradient near zero (it may even flip sign), and Adam divides by ``|g|``: such
    an element moves by ``±lr`` on one side and not the other, a false alarm without this. An element
    ``r`` apart (largest gradient difference over largest gradient, over the steps so far) may differ
    by ``GRADIENT_SENSITIVITY * r`` of the largest update (anything where ``r >= NOISE_GAP``), and
    by ``MOMENTUM_CARRY`` times its own gradient difference at SGD's gain (the largest update over the
    step's largest gradient). A wrong learning rate, decay, beta or epsilon shows where the gradients
    agree, and stays."""
    gap, size, last = spread
    if not np.shape(bu) == np.shape(ru) == gap.shape:
        return t
    rel = np.divide(gap, size, out=np.zeros(size.shape), where=size > 0)
    bu, ru = np.asarray(bu, np.float64), np.asarray(ru, np.float64)
    largest = max(float(np.abs(bu).max(initial=0.0)), float(np.abs(ru).max(initial=0.0)))
    d = given = ru - bu
    # SGD (with momentum) moves an element by lr times its gradients: about ``largest / last`` per
    # unit of gradient. Relative to the element's largest gradient so far (``rel``), a long run whose
    # gradients shrank was allowed far less than its own gradient difference made (offline, 256 SGD
    # steps of equivalent MLPs false-alarmed at step 199 to 241).
    if last > 0:
        d = np.sign(d) * np.maximum(np.abs(d) - MOMENTUM_CARRY * gap * (largest / last), 0.0)
    # Gradients that were NOISE_GAP apart or more (a bias before a BatchNorm gets only rounding; a
    # long run's weights drift) leave Adam free to move the element anywhere up to its step: both
    # updates, whatever they are, are explained there.
    allowed = np.where(rel >= NOISE_GAP, 2.0, np.minimum(GRADIENT_SENSITIVITY * rel, 2.0))
    left = np.sign(d) * np.maximum(np.abs(d) - allowed * largest, 0.0)
    redone = compare_tensors(t.name, bu + left, bu, t.tolerance, mode)  # t.tolerance: already the dtypes'
    if not redone.passed:
        return t
    explained = (np.abs(left) < np.abs(given)) & (np.abs(given) > 1e-3 * largest)  # visibly, not by rounding
    n, worst = int(np.count_nonzero(explained)), float(rel[explained].max(initial=0.0))
    return replace(
        redone,
        note=f"{n} element(s) differ by what the gradients each optimizer was given explain (up to {worst:.1%} "
        "apart there: near zero, rounding decides a gradient, and an optimizer that divides by |grad|, as Adam "
        "does, makes that a visible part of the update)",
    )


def param_events(
    step: int,
    phase: Phase,
    order: int,
    plan: LayerWeights,
    base: dict[str, np.ndarray],
    raw: dict[str, np.ndarray],
    stacks: tuple[tuple[Frame, ...], tuple[Frame, ...]] = ((), ()),
) -> tuple[Event, Event]:
    """A planned layer's parameter-level arrays (updates, running statistics) as a pair of events;
    ``stacks``: each side's frames (where its optimizer stepped)."""

    def event(path: str, type_name: str, arrays: dict[str, np.ndarray], stack: tuple[Frame, ...]) -> Event:
        return Event(
            step, phase, Kind.PARAM, order, path, type_name, 0, 0, None, True, (), records_of(arrays), stack=stack
        )

    return event(plan.base_path, plan.base_type, base, stacks[0]), event(plan.raw_path, plan.raw_type, raw, stacks[1])


def name_parameter(div: Divergence, plans: dict[str, LayerWeights]) -> Divergence:
    """Name the diverging parameter as the base model calls it."""
    name = div.metrics.name
    plan = plans.get(div.base_path)
    if plan is not None:
        try:
            # An array of the raw tensor's shape: a fused layer's plan splits it along its features (one
            # of 1 x 1 raised IndexError, and a port with fused projections and an optimizer bug crashed).
            back = plan.inverse({name: np.zeros(div.metrics.raw_shape or (1, 1))})
            name = next(iter(back)) if len(back) == 1 else name
        except (KeyError, ValueError, IndexError, StopIteration, WeightTransferError):
            pass  # named as raw names it
    prefix = f"{div.base_path}." if div.base_path else ""
    return replace(div, where="parameter", inherited=False, parameter=prefix + name)
