"""Events of a recorded step's parameters: the optimizer's updates, running statistics moved,
the weights as the step began, and gradients of parameters whose layer was never called."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.frameworks import Framework
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, changed
from nbdiff.trace.layer_paths import relative
from nbdiff.trace.session import Weights

__all__ = ["updates", "states", "weights_at_start", "with_uncalled_grads"]


def updates(
    fw: Framework,
    layers: dict[str, Any],
    params: dict[str, dict[str, Any]],
    step: int,
    weights: tuple[Weights, Weights],
    written: dict[int, float],
) -> list[Event]:
    """One optimizer event per layer whose own parameters changed during the step (``weights``: as it
    began and as the next began); ``written``: the parameters written after the optimizer stepped, by
    ``id``, with their norm ratio (the event's ``params``)."""
    before, after = weights
    out: list[Event] = []
    for path, layer in layers.items():
        records, writes = [], []
        for name, p in params[path].items():
            if id(p) in before and id(p) in after and not np.array_equal(before[id(p)], after[id(p)]):
                delta = after[id(p)] - before[id(p)]
                records.append(TensorRecord(name, tuple(delta.shape), fw.dtype_name(p), delta, None, fw.layout_of(p)))
                if id(p) in written:
                    writes.append(TensorRecord(name, (), "float64", np.array(written[id(p)], np.float64)))
        if records:
            e = param_event(fw, Phase.OPTIMIZER, step, len(out), path, layer, records)
            out.append(changed(e, params=tuple(writes)) if writes else e)
    return out


def states(fw: Framework, layers: dict[str, Any], step: int, before: Weights, after: Weights) -> list[Event]:
    """One event per layer whose running statistics the step moved: before it (inputs), after it (outputs)."""
    out: list[Event] = []
    for path, layer in layers.items():
        moved = [
            (name, before[id(t)], after[id(t)])
            for name, t in fw.direct_buffers(layer) + fw.direct_params(layer)
            if not fw.is_trainable(t) and id(t) in before and id(t) in after and fw.is_floating(t)
            and not np.array_equal(before[id(t)], after[id(t)])
        ]  # fmt: skip
        if moved:
            ins = tuple(TensorRecord(n, tuple(a.shape), str(a.dtype), a) for n, a, _ in moved)
            outs = tuple(TensorRecord(n, tuple(a.shape), str(a.dtype), a) for n, _, a in moved)
            e = param_event(fw, Phase.STATE, step, len(out), path, layer, list(outs))
            out.append(changed(e, inputs=ins))
    return out


def param_event(
    fw: Framework, phase: Phase, step: int, order: int, path: str, layer: Any, records: list[TensorRecord]
) -> Event:
    """One layer's parameters (an update, or the weights as a step began) as an event."""
    return Event(step, phase, Kind.PARAM, order, path, type(layer).__name__, 0,
                 path.count(".") + 1 if path else 0, None, fw.is_library_layer(layer), (), tuple(records))  # fmt: skip


def weights_at_start(
    fw: Framework, layers: dict[str, Any], params: dict[str, dict[str, Any]], step: int, at_start: Weights
) -> list[Event]:
    """One event per layer with its floating parameters as step ``step`` began (trainable ones from
    ``at_start``; the rest do not change) and its floating buffers as they are now."""
    out: list[Event] = []
    for path, layer in layers.items():
        records = []
        for name, p in [*params[path].items(), *fw.direct_buffers(layer)]:
            if not fw.is_floating(p):
                continue
            value = at_start.get(id(p))
            value = fw.to_numpy(p) if value is None else value
            records.append(TensorRecord(name, tuple(value.shape), fw.dtype_name(p), value, None, fw.layout_of(p)))
        if records:
            out.append(param_event(fw, Phase.WEIGHTS, step, len(out), path, layer, records))
    return out


def with_uncalled_grads(
    fw: Framework,
    params: dict[str, dict[str, Any]],
    forward: list[Event],
    backward: list[Event],
    grads: dict[int, np.ndarray],
) -> list[Event]:
    """Parameter gradients of layers the step never called, in the backward event of their nearest
    called ancestor, under dotted names (``out_proj.weight``): torch's ``MultiheadAttention`` uses
    its ``out_proj`` weights without calling it, and a dump without them compared nothing there."""
    if not backward:
        return backward
    called = {e.path for e in forward if e.kind is Kind.LAYER}
    by_path = {e.path: i for i, e in reversed(list(enumerate(backward)))}  # a path's first backward event
    placed: set[int] = set()
    for e in backward:
        own = params.get(e.path, {})
        placed.update(id(own[t.name]) for t in e.params if t.name in own)
    extra: dict[int, list[TensorRecord]] = {}
    for path, own in params.items():
        if path in called:
            continue
        owner = _ancestor(path, by_path)
        for name, p in own.items():
            g = grads.get(id(p))
            if owner is None or g is None or id(p) in placed or not fw.is_trainable(p):
                continue
            placed.add(id(p))
            rel = relative(path, backward[owner].path)
            extra.setdefault(owner, []).append(
                TensorRecord(f"{rel}.{name}", fw.shape_of(p), fw.dtype_name(p), g, None, fw.layout_of(p))
            )
    if not extra:
        return backward
    return [changed(e, params=e.params + tuple(extra[i])) if i in extra else e for i, e in enumerate(backward)]


def _ancestor(path: str, by_path: dict[str, int]) -> int | None:
    while path:
        path = path.rpartition(".")[0]
        if path in by_path:
            return by_path[path]
    return None
