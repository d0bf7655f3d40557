"""A pipeline run's stages joined into one model's step (a mesh dimension named like ``pp``).

Each stage's rank recorded its own part of the model, under the full model's layer paths (as
torchtitan splits a model, deleting the other stages' layers), each step already one call per
layer (:mod:`nbdiff.gather.micro_batches`). The forward runs stage after stage, the backward the
other way; each stage's root call is the model's, cut: one root stands for them, taking its
inputs (and their gradients) from the first stage and its outputs from the last.
"""

from __future__ import annotations

from typing import Any

from nbdiff.errors import DumpError
from nbdiff.trace.events import Event, Kind, Phase, changed

__all__ = ["joined_stages"]


def joined_stages(stages: list[list[Event]], where: Any) -> list[Event]:
    """One step from each stage's (in stage order)."""
    out = []
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        parts = [[e for e in events if e.phase is phase] for events in stages]
        roots = [next((e for e in p if _is_root(e)), None) for p in parts]
        if any(p for p in parts) and any(r is None for r, p in zip(roots, parts) if p):
            raise DumpError(f"{where}: a stage's {phase.value} has no call of the model itself; record each stage's "
                            "module, the model as the stage holds it.")  # fmt: skip
        order = parts if phase is Phase.FORWARD else parts[::-1]  # backward: the last stage's first
        out += _joined(order, roots[0], roots[-1], phase)
    for phase in (Phase.OPTIMIZER, Phase.STATE):
        events = [e for s in stages for e in s if e.phase is phase]
        out += [changed(e, order=i) for i, e in enumerate(events)]
    return out


def _is_root(e: Event) -> bool:
    return e.kind is Kind.LAYER and e.depth == 0


def _joined(parts: list[list[Event]], first: Event | None, last: Event | None, phase: Phase) -> list[Event]:
    if first is None or last is None:
        return []
    forward = phase is Phase.FORWARD
    roots = [e for p in parts for e in p if _is_root(e)]
    params = tuple(t for r in roots for t in r.params)  # a stage's own parameters, if its root holds any
    root = (
        changed(first, outputs=last.outputs, params=params)
        if forward
        else changed(last, inputs=first.inputs, params=params)
    )
    # The forward's root comes first, the backward's last (backward order is the calls' reversed).
    body: list[tuple[int, Event]] = [(s, e) for s, p in enumerate(parts) for e in p if not _is_root(e)]
    n = len(body)
    at = 0 if forward else n
    renumbered: dict[tuple[int, int], int] = {}
    for i, (s, e) in enumerate(body):
        renumbered[(s, e.order)] = i + 1 if forward else i
    for s, p in enumerate(parts):
        for e in p:
            if _is_root(e):
                renumbered[(s, e.order)] = at
    events = [
        changed(e, order=renumbered[(s, e.order)], parent=None if e.parent is None else renumbered.get((s, e.parent)))
        for s, e in body
    ]
    root = changed(root, order=at, parent=None)
    return [root, *events] if forward else [*events, root]
