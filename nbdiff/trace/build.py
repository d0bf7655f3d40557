"""The events of a recorded step, built from its layer calls once the step has run."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.frameworks import Framework
from nbdiff.trace.calls import Call
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, new_event

__all__ = ["build_events", "step_groups", "first_calls"]


def step_groups(calls: list[Call], roots_per_step: int = 1) -> list[list[Call]]:
    """The recorded calls cut into steps: a step begins every ``roots_per_step`` root calls (its
    micro-batches); calls before the first root belong to none."""
    groups: list[list[Call]] = []
    roots = itertools.count()
    for rec in calls:
        if rec.depth == 0 and next(roots) % roots_per_step == 0:
            groups.append([])
        if groups:
            groups[-1].append(rec)
    return groups


def first_calls(group: list[Call]) -> dict[str, int]:
    """Each path's first call number in ``group`` (one step of a recording that held steps before it):
    what :func:`build_events` numbers the step's calls of that path from."""
    first: dict[str, int] = {}
    for rec in group:
        first.setdefault(rec.path, rec.call)
    return first


def build_events(
    fw: Framework,
    calls: list[Call],
    step: int,
    loss: Any | None,
    grad_of: Callable[[Any], np.ndarray | None],
    backward: bool,
    params_of: Callable[[Any], list[tuple[str, Any]]] | None = None,
    first_call: dict[str, int] | None = None,
) -> tuple[list[Event], list[Event], list[str]]:
    """Forward and backward events of ``calls`` (one step), plus warnings.

    Events are numbered from 0 within the step, each path's calls from ``first_call`` (default: as
    recorded). Backward events come in backward order: the reverse of the forward call starts, which
    puts every layer after its sublayers, as autograd runs them. ``grad_of(param)`` gives a
    parameter's gradient for the step; ``params_of(layer)`` its own parameters as ``grad_of`` knows
    them (default: as the layer holds them now).
    """
    first = first_call or {}
    forward = _forward_events(fw, calls, step, first)
    if loss is not None:
        record = TensorRecord(
            "loss", fw.shape_of(loss), fw.dtype_name(loss), fw.to_numpy(loss), None, fw.layout_of(loss)
        )
        forward.append(
            Event(step, Phase.FORWARD, Kind.LOSS, len(forward), "<loss>", "Loss", 0, 0, None, False, (), (record,))
        )
    grads = (
        _backward_events(fw, calls, step, forward, grad_of, params_of or fw.direct_params, first) if backward else []
    )
    return forward, grads, []


def _forward_events(fw: Framework, calls: list[Call], step: int, first: dict[str, int]) -> list[Event]:
    forward: list[Event] = []
    renumber: dict[int, int] = {}  # call order -> event order; a parent's call starts before its children's
    layer_facts = _LayerFacts(fw)
    for rec in calls:
        if not rec.done:
            continue
        library, bases, weights = (False, (), ()) if rec.api else layer_facts.of(rec.layer)
        order = renumber[rec.order] = len(forward)
        forward.append(
            new_event(
                step=step, phase=Phase.FORWARD, kind=Kind.API if rec.api else Kind.LAYER, order=order,
                path=rec.path, type_name=rec.api or type(rec.layer).__name__, call=rec.call - first.get(rec.path, 0),
                depth=rec.depth, parent=renumber.get(rec.parent) if rec.parent is not None else None,
                library=library, inputs=tuple(rec.inputs), outputs=tuple(rec.outputs), given=tuple(rec.given),
                args=rec.args, stack=rec.stack, template=rec.template, layer=rec.layer, bases=bases, weights=weights,
            )
        )  # fmt: skip
    return forward


def _backward_events(
    fw: Framework,
    calls: list[Call],
    step: int,
    forward: list[Event],
    grad_of: Callable[[Any], np.ndarray | None],
    params_of: Callable[[Any], list[tuple[str, Any]]],
    first: dict[str, int],
) -> list[Event]:
    """Each layer call's gradients, in backward order, each pointing at its enclosing layer's backward
    event; a parameter's gradient goes with the last call of its layer (the first met going backward)."""
    found: list[tuple[Call, Event, tuple[TensorRecord, ...], tuple[TensorRecord, ...], tuple[TensorRecord, ...]]] = []
    seen_params: set[int] = set()
    fwd_by_key = {(e.path, e.call): e for e in forward if e.kind is Kind.LAYER}
    for rec in reversed(calls):
        f = fwd_by_key.get((rec.path, rec.call - first.get(rec.path, 0)))
        if f is None or rec.api:
            continue
        params = []
        for pname, p in params_of(rec.layer):
            if id(p) in seen_params or not fw.is_trainable(p):
                continue
            g = grad_of(p)
            if g is not None:
                seen_params.add(id(p))
                params.append(TensorRecord(pname, fw.shape_of(p), fw.dtype_name(p), g, None, fw.layout_of(p)))
        grad_in, grad_out = tuple(rec.grad_in.values()), tuple(rec.grad_out.values())
        if grad_in or grad_out or params:
            found.append((rec, f, grad_in, grad_out, tuple(params)))
    parents = _backward_parents([rec.depth for rec, *_ in found])
    return [
        new_event(
            step=step, phase=Phase.BACKWARD, kind=Kind.LAYER, order=i, path=rec.path, type_name=f.type_name,
            call=f.call, depth=rec.depth, parent=parents[i], library=f.library, inputs=grad_in, outputs=grad_out,
            params=params, stack=rec.backward_stack or rec.stack,
        )
        for i, (rec, f, grad_in, grad_out, params) in enumerate(found)
    ]  # fmt: skip


def _backward_parents(depths: list[int]) -> list[int | None]:
    """The order of each backward event's enclosing layer's event, read from the events' depths before they
    are made (no event made twice). Backward order is reversed pre-order, so walking it from the end is
    pre-order: the enclosing layer is the nearest event met before of smaller depth."""
    parents: list[int | None] = [None] * len(depths)
    ancestors: list[int] = []
    for i in range(len(depths) - 1, -1, -1):  # backward order reversed is pre-order
        while ancestors and depths[ancestors[-1]] >= depths[i]:
            ancestors.pop()
        parents[i] = ancestors[-1] if ancestors else None
        ancestors.append(i)
    return parents


class _LayerFacts:
    """What pairing reads of a layer object, read once per step: whether the framework's own, the framework
    classes it stands for, its weights' shapes."""

    def __init__(self, fw: Framework) -> None:
        self.fw = fw
        self._known: dict[int, tuple[bool, tuple[str, ...], tuple[tuple[int, ...], ...]]] = {}

    def of(self, layer: Any) -> tuple[bool, tuple[str, ...], tuple[tuple[int, ...], ...]]:
        found = self._known.get(id(layer))
        if found is None:
            fw = self.fw
            found = self._known[id(layer)] = (fw.is_library_layer(layer), _bases(fw, layer), _weight_shapes(fw, layer))
        return found


_GENERIC = {"Module", "Layer", "object"}


def _bases(fw: Framework, layer: Any) -> tuple[str, ...]:
    return tuple(n for n in fw.class_names(layer) if n not in _GENERIC)


def _weight_shapes(fw: Framework, layer: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(fw.shape_of(p))) for _, p in fw.direct_params(layer)))
