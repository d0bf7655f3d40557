"""The events of a recorded step, built from its layer calls once the step has run."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.frameworks import Framework
from nbdiff.trace.calls import Call, link_backward_parents
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, changed

__all__ = ["build_events", "step_groups", "renumbered"]


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


def renumbered(group: list[Call]) -> list[Call]:
    """One step's calls numbered from 0 (orders, parents, and each path's calls), however many steps
    the recording held before it."""
    first_call: dict[str, int] = {}
    out = []
    for i, rec in enumerate(group):
        base_call = first_call.setdefault(rec.path, rec.call)
        out.append(changed(rec, order=i, call=rec.call - base_call, parent=None))
    new_order = {rec.order: i for i, rec in enumerate(group)}
    for new, old in zip(out, group):
        new.parent = new_order.get(old.parent) if old.parent is not None else None
    return out


def build_events(
    fw: Framework,
    calls: list[Call],
    step: int,
    loss: Any | None,
    grad_of: Callable[[Any], np.ndarray | None],
    backward: bool,
    params_of: Callable[[Any], list[tuple[str, Any]]] | None = None,
) -> tuple[list[Event], list[Event], list[str]]:
    """Forward and backward events of ``calls`` (one step), plus warnings.

    Backward events come in backward order: the reverse of the forward call starts, which
    puts every layer after its sublayers, as autograd runs them. ``grad_of(param)`` gives a
    parameter's gradient for the step; ``params_of(layer)`` its own parameters as ``grad_of`` knows
    them (default: as the layer holds them now).
    """
    forward = _forward_events(fw, calls, step)
    if loss is not None:
        record = TensorRecord(
            "loss", fw.shape_of(loss), fw.dtype_name(loss), fw.to_numpy(loss), None, fw.layout_of(loss)
        )
        forward.append(
            Event(step, Phase.FORWARD, Kind.LOSS, len(forward), "<loss>", "Loss", 0, 0, None, False, (), (record,))
        )
    grads = _backward_events(fw, calls, step, forward, grad_of, params_of or fw.direct_params) if backward else []
    return forward, link_backward_parents(grads), []


def _forward_events(fw: Framework, calls: list[Call], step: int) -> list[Event]:
    forward: list[Event] = []
    renumber: dict[int, int] = {}  # call order -> event order; a parent's call starts before its children's
    for rec in calls:
        if not rec.done:
            continue
        ev = Event(
            step=step,
            phase=Phase.FORWARD,
            kind=Kind.API if rec.api else Kind.LAYER,
            order=len(forward),
            path=rec.path,
            type_name=rec.api or type(rec.layer).__name__,
            call=rec.call,
            depth=rec.depth,
            parent=renumber.get(rec.parent) if rec.parent is not None else None,
            library=False if rec.api else fw.is_library_layer(rec.layer),
            inputs=tuple(rec.inputs),
            outputs=tuple(rec.outputs),
            given=tuple(rec.given),
            args=rec.args,
            stack=rec.stack,
            template=rec.template,
            layer=rec.layer,
            bases=() if rec.api else _bases(fw, rec.layer),
            weights=() if rec.api else _weight_shapes(fw, rec.layer),
        )
        renumber[rec.order] = ev.order
        forward.append(ev)
    return forward


def _backward_events(
    fw: Framework,
    calls: list[Call],
    step: int,
    forward: list[Event],
    grad_of: Callable[[Any], np.ndarray | None],
    params_of: Callable[[Any], list[tuple[str, Any]]],
) -> list[Event]:
    """Each layer call's gradients, in backward order; a parameter's gradient goes with the last call of
    its layer (the first met going backward)."""
    grads: list[Event] = []
    seen_params: set[int] = set()
    fwd_by_key = {(e.path, e.call): e for e in forward if e.kind is Kind.LAYER}
    for rec in reversed(calls):
        f = fwd_by_key.get((rec.path, rec.call))
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
            grads.append(
                Event(
                    step, Phase.BACKWARD, Kind.LAYER, len(grads), rec.path, f.type_name, rec.call, rec.depth,
                    f.parent, f.library, grad_in, grad_out, tuple(params), (), rec.backward_stack or rec.stack,
                )
            )  # fmt: skip
    return grads


_GENERIC = {"Module", "Layer", "object"}


def _bases(fw: Framework, layer: Any) -> tuple[str, ...]:
    return tuple(n for n in fw.class_names(layer) if n not in _GENERIC)


def _weight_shapes(fw: Framework, layer: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(fw.shape_of(p))) for _, p in fw.direct_params(layer)))
