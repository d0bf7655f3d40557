"""Running statistics after a train-mode step: compared, known framework differences told apart.

Running statistics move in every train-mode forward, with or without an optimizer, so they
are compared after each such step; raw's are then set to base's, as weights are. A difference
a :mod:`nbdiff.judge.framework_differences` entry explains exactly (paddle's biased
``running_var``) is a finding of its own kind, ``framework``, not a divergence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedLayers
from nbdiff.engine.forward import received_differ, tensor_diffs
from nbdiff.engine.replay import magnitude
from nbdiff.engine.training.updates import name_parameter, param_events
from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence, EventDiff, blame_all, divergence_of
from nbdiff.judge.framework_differences import StateUpdate, explaining, momentum_of
from nbdiff.judge.metrics import compare_tensors
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.modes import save_state
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = ["state_of", "state_diffs", "recorded_state_diffs", "has_state", "StepStates"]

State = dict[int, np.ndarray]
"""``id`` of a non-trainable tensor -> a copy of its value."""


def _buffers(fw: Framework, layer: Any, recursive: bool) -> dict[str, Any]:
    return {n: t for n, t in layer_tensors(fw, layer, recursive).items() if not fw.is_trainable(t)}


def has_state(fw: Framework, layers: dict[str, Any], plans: dict[str, LayerWeights]) -> bool:
    """Whether any planned layer keeps running statistics (a float buffer) and is in train mode."""
    for plan in plans.values():
        layer = layers[plan.base_path]
        members = layer.members.values() if isinstance(layer, FusedLayers) else (layer,)
        if any(fw.is_training(m) for m in members) and any(
            fw.to_numpy(t).dtype.kind == "f" for t in _buffers(fw, layer, plan.recursive).values()
        ):
            return True
    return False


def state_of(fw: Framework, model: Any) -> State:
    """A model's running statistics now, by tensor (before a step: what a framework difference is verified from)."""
    return {id(t): v for t, v in save_state(fw, model)}


def state_diffs(
    fws: tuple[Framework, Framework],
    layers: tuple[dict[str, Any], dict[str, Any]],
    plans: dict[str, LayerWeights],
    tol: Any,
    mode: str,
    step: int,
    before: State | None = None,
    forward: tuple[Event, ...] | list[Event] = (),
    raw_forward: tuple[Event, ...] | list[Event] = (),
    kept: StepStates | None = None,
) -> tuple[list[Divergence], list[EventDiff]]:
    """Findings and compared pairs of every planned layer's running statistics after ``step``.

    ``before``: base's statistics when the step began (:func:`state_of`); ``forward``: base's
    forward events of the step (how many values each call normalised over). With both, a
    difference is checked against the known framework differences. With ``raw_forward`` too, a
    layer whose inputs already differed inherits its statistics' difference: not its own error.
    Live (``kept`` None), raw's statistics are then set to base's, as weights are; a watched run's
    are read from ``kept`` (each side's after the step, and raw's before it) and left as they are.
    """
    diffs, explained = [], []
    inherited: set[int] = set()  # orders of the layers whose inputs differed
    for order, plan in enumerate(plans.values()):
        compared = _layer_state(fws, layers, plan, tol, mode, before, forward, kept)
        if compared is None:
            continue
        mine, values, tensors, why = compared
        explained += [(order, n, sentence) for n, sentence in why]
        if tensors:
            diffs.append(EventDiff(*param_events(step, Phase.STATE, order, plan, mine, values), tuple(tensors)))
            if not all(t.passed for t in tensors) and _received_differently(plan, forward, raw_forward, tol, mode):
                inherited.add(order)
    return _findings(diffs, explained, plans, inherited), diffs


StepStates = tuple[State, State, State]
"""A watched step's statistics: base's after it, raw's after it, raw's before it."""


def _layer_state(
    fws: tuple[Framework, Framework],
    layers: tuple[dict[str, Any], dict[str, Any]],
    plan: LayerWeights,
    tol: Any,
    mode: str,
    before: State | None,
    forward: tuple[Event, ...] | list[Event],
    kept: StepStates | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Any], list[tuple[str, str]]] | None:
    """One planned layer's statistics compared: base's and raw's values, the comparisons, and the
    framework differences that explain a failing one (``(name, sentence)``)."""
    bfw, rfw = fws
    bl, rl = layers[0][plan.base_path], layers[1][plan.raw_path]
    own, theirs = _buffers(bfw, bl, plan.recursive), _buffers(rfw, rl, plan.recursive)
    mine = {n: _value(bfw, t, kept[0] if kept else None) for n, t in own.items()}
    if not mine or not theirs or any(v is None for v in mine.values()):
        return None
    try:
        converted = plan.convert(mine)
        known = before is not None and all(id(t) in before for t in own.values())
        start = plan.convert({n: before[id(t)] for n, t in own.items()}) if known and before else None
    except (KeyError, ValueError):
        return None
    values = {n: _value(rfw, t, kept[1] if kept else None) for n, t in theirs.items() if n in converted}
    values = {n: v for n, v in values.items() if v is not None}
    raw_start = {n: kept[2].get(id(theirs[n])) for n in values} if kept else {}
    # A running mean is a sum that cancels to ~0 behind a centred input: it rounds relative to
    # the values it was computed from, not to itself.
    paths = {plan.base_path}
    if isinstance(bl, FusedLayers):
        paths |= {_member_path(plan.base_path, bl, m) for m in bl.members.values()}
    hint = magnitude([t.value for e in forward if e.path in paths for t in e.inputs[:1] if t.value is not None])
    tensors, why = [], []
    for n, v in values.items():
        if np.asarray(converted[n]).dtype.kind != "f":
            continue
        t = tol(str(converted[n].dtype), str(v.dtype))
        tensors.append(compare_tensors(n, v, converted[n], t, mode, hint))
        if not tensors[-1].passed and start is not None and n in start:
            # A fused group (BatchNorm+ReLU) keeps its members' statistics under their names.
            layer = _member(bfw, bl, n.rpartition(".")[0])
            update = StateUpdate(
                bfw.name, rfw.name, type(layer).__name__, n.rpartition(".")[2], start[n], converted[n],
                momentum_of(bfw.name, layer), _count(forward, _member_path(plan.base_path, bl, layer), converted[n].size),
                raw_start.get(n),
            )  # fmt: skip
            entry = explaining(update, v, lambda a, b, t=t, n=n: compare_tensors(n, b, a, t, mode).passed)
            if entry is not None:
                why.append((n, entry.sentence.format(base=bfw.name, raw=rfw.name)))
    if kept is None:
        for n in values:
            rfw.set_value(theirs[n], converted[n])
    return mine, values, tensors, why


def _value(fw: Framework, t: Any, kept: State | None) -> np.ndarray | None:
    """A statistic's value: kept at a step's end, or live (a copy)."""
    if kept is not None:
        return kept.get(id(t))
    return fw.to_numpy(t).copy()


def recorded_state_diffs(
    frameworks: tuple[str, str],
    plans: dict[str, LayerWeights],
    brec: Any,
    rrec: Any,
    tol: Any,
    mode: str,
    step: int,
    momenta: dict[str, Any],
) -> tuple[list[Divergence], list[EventDiff]]:
    """:func:`state_diffs` of a recorded step: each side's statistics as its dump kept them (``brec.state``,
    ``rrec.state``: before and after, per layer). ``momenta``: base's BatchNorm momentum by path (torch's
    meaning), as the dump's layer arguments keep it, to verify a known framework difference."""
    by_path = [{e.path: e for e in rec.state} for rec in (brec, rrec)]
    diffs, explained = [], []
    inherited: set[int] = set()
    for order, plan in enumerate(plans.values()):
        b, r = by_path[0].get(plan.base_path), by_path[1].get(plan.raw_path)
        want = _as_raw(plan, b.outputs) if b is not None and r is not None else None
        if want is None:
            continue
        got = [t for t in r.outputs if t.name in want]  # type: ignore[union-attr]
        # As live: a running mean rounds relative to the inputs it was computed from, not to itself.
        hint = _input_scale(brec.forward, plan.base_path)
        tensors = tensor_diffs(got, [replace(want[t.name], name=t.name) for t in got], tol, mode, hint)
        if not tensors:
            continue
        start, raw_start = _as_raw(plan, b.inputs), {t.name: t.value for t in r.inputs}  # type: ignore[union-attr]
        for t, g in zip(tensors, got):
            if t.passed or start is None or start[g.name].value is None or g.value is None:
                continue  # statistics only: no value to verify a framework difference from
            update = StateUpdate(
                frameworks[0], frameworks[1], b.type_name, g.name, start[g.name].value, want[g.name].value,  # type: ignore[union-attr]
                momenta.get(plan.base_path), _count(brec.forward, plan.base_path, g.value.size), raw_start.get(g.name),
            )  # fmt: skip
            entry = explaining(
                update, g.value, lambda a, v, t=t, n=g.name: compare_tensors(n, v, a, t.tolerance, mode).passed
            )
            if entry is not None:
                explained.append((order, g.name, entry.sentence.format(base=frameworks[0], raw=frameworks[1])))
        mine, theirs = {t.name: t.value for t in b.outputs}, {t.name: t.value for t in got}  # type: ignore[union-attr]
        diffs.append(EventDiff(*param_events(step, Phase.STATE, order, plan, mine, theirs), tuple(tensors)))
        if not all(t.passed for t in tensors) and _received_differently(plan, brec.forward, rrec.forward, tol, mode):
            inherited.add(order)
    return _findings(diffs, explained, plans, inherited), diffs


def _input_scale(forward: Sequence[Event], path: str) -> float:
    """The largest magnitude of a layer's first inputs in a recorded step (values, else statistics)."""
    out = 0.0
    for e in forward:
        if e.path == path and e.inputs:
            t = e.inputs[0]
            if t.value is not None:
                out = max(out, magnitude([t.value]))
            elif t.stats is not None:
                out = max(out, abs(t.stats.min), abs(t.stats.max))
    return out


def _as_raw(plan: LayerWeights, records: tuple[TensorRecord, ...]) -> dict[str, TensorRecord] | None:
    """Base's records under raw's names (their values converted by the plan where the dump kept them):
    which raw tensor each base one becomes is read from the plan's conversion of numbered stand-ins."""
    try:
        marked = plan.convert({t.name: np.full(t.shape, i + 1.0) for i, t in enumerate(records)})
        values = plan.convert({t.name: t.value for t in records}) if all(t.value is not None for t in records) else {}
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    out = {}
    for name, a in marked.items():
        i = int(round(float(np.asarray(a).flat[0]))) - 1 if np.asarray(a).size else -1
        if 0 <= i < len(records):
            src = records[i]
            v = values.get(name)
            out[name] = (
                replace(src, name=name, value=v, shape=tuple(v.shape)) if v is not None else replace(src, name=name)
            )
    return out


def _received_differently(
    plan: LayerWeights, forward: Sequence[Event], raw_forward: Sequence[Event], tol: Any, mode: str
) -> bool:
    """Whether the layer's first call of the step received other inputs on raw's side."""
    b = next((e for e in forward if e.kind is Kind.LAYER and e.path == plan.base_path), None)
    r = next((e for e in raw_forward if e.kind is Kind.LAYER and e.path == plan.raw_path), None)
    return b is not None and r is not None and received_differ(r.inputs, b.inputs, tol, mode)


def _findings(
    diffs: list[EventDiff], explained: list[tuple[int, str, str]], plans: dict[str, LayerWeights], inherited: set[int]
) -> list[Divergence]:
    """State divergences (blame over what no entry explains, of layers whose inputs agreed), then the
    framework differences."""
    why = {(o, n): s for o, n, s in explained}
    unexplained = [
        replace(d, tensors=tuple(t for t in d.tensors if (d.base.order, t.name) not in why))
        for d in diffs
        if d.base.order not in inherited
    ]
    found, _ = blame_all([d for d in unexplained if d.tensors], lambda d: d.tensors)
    out = [replace(name_parameter(f, plans), where="state") for f in found]
    for d in diffs:
        for t in d.tensors:
            if (d.base.order, t.name) in why:
                f = name_parameter(replace(divergence_of(d, "framework"), metrics=t, tolerance=t.tolerance), plans)
                out.append(replace(f, where="framework", explanation=why[(d.base.order, t.name)]))
    return out


def _member(fw: Framework, layer: Any, name: str) -> Any:
    """The layer a statistic belongs to: in a fused group (BatchNorm+ReLU), the member keeping it."""
    if not isinstance(layer, FusedLayers):
        return layer
    if name in layer.members:
        return layer.members[name]
    return next((m for m in layer.members.values() if _buffers(fw, m, False)), layer)


def _member_path(group: str, layer: Any, member: Any) -> str:
    """The dotted path of a fused group's member (``blocks.0.bn+relu`` -> ``blocks.0.bn``)."""
    if not isinstance(layer, FusedLayers):
        return group
    name = next((n for n, m in layer.members.items() if m is member), "")
    parent = group.rpartition(".")[0]
    return f"{parent}.{name}" if parent else name


def _count(forward: tuple[Event, ...] | list[Event], path: str, channels: int) -> int | None:
    """Values per channel the layer's one call of the step normalised over; ``None`` unless called once."""
    calls = [e for e in forward if e.kind is Kind.LAYER and e.path == path]
    if len(calls) != 1 or not calls[0].inputs or not channels:
        return None
    n = math.prod(calls[0].inputs[0].shape) // channels
    return n if n * channels == math.prod(calls[0].inputs[0].shape) else None
