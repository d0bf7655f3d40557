"""A step of ``M`` micro-batches (``record(..., micro_batches=M)``: gradient accumulation, a
pipeline schedule) as one step on the whole batch, so that it compares with a run that takes the
batch at once.

A layer called ``K`` times per micro-batch was called ``M * K`` times in the step, micro-batch
by micro-batch; its call ``j`` of every micro-batch joins into call ``j``, as a data-parallel
run's groups join (:mod:`nbdiff.gather.data_parallel`): inputs, outputs and their gradients along
the batch, the gradients scaled by ``1/M`` under a mean (each micro-batch's loss a mean over its
slice). The parameter gradients the hooks summed over the micro-batches are scaled alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.gather.data_parallel import joined_groups, scaled_stats
from nbdiff.gather.gathering import Gathering, event_key
from nbdiff.trace.events import Event, Phase, TensorRecord, changed
from nbdiff.trace.mesh import Mesh

__all__ = ["folded"]

_SPLIT = (Phase.FORWARD, Phase.BACKWARD)


def folded(
    events: list[Event],
    m: int,
    other: list[Event] | None,
    reduce: str,
    ranks: list[int],
    parts: dict[int, Gathering],
    into: dict[int, Gathering],
    note: Callable[[str], None],
    where: Any,
) -> list[Event]:
    """``events`` (a step of ``m`` micro-batches, gathered from ``ranks``: ``parts`` tells how each
    of its tensors was) as one step: forward and backward events joined over the micro-batches, the
    rest as they are; ``into`` learns how each joined tensor was."""
    if m == 1:
        return events
    k = events[0].step if events else 0
    per: list[list[Event]] = [[] for _ in range(m)]
    summed: dict[tuple, tuple[TensorRecord, ...]] = {}
    for phase in _SPLIT:
        for mb, evs in enumerate(_by_micro_batch([e for e in events if e.phase is phase], m, where, k)):
            for e in evs:
                if e.params and phase is Phase.BACKWARD:  # summed over the micro-batches already
                    summed[event_key(e)] = e.params
                    e = changed(e, params=())
                per[mb].append(e)
    mesh = Mesh((m,), ("micro_batch",), (0,), ("micro_batch",), reduce)
    own: dict[int, Gathering] = {}
    groups = [({"micro_batch": i}, list(ranks)) for i in range(m)]
    joined = joined_groups(per, other, mesh, groups, parts, own, note, k, placed=False)
    for key, how in own.items():
        how.unit, how.ranks = "micro-batch", list(ranks)  # each micro-batch's: the step's ranks
        into[key] = how
    scale = 1.0 / m if reduce == "mean" else 1.0
    out = [changed(e, params=_scaled(summed[event_key(e)], scale)) if event_key(e) in summed else e for e in joined]
    return out + [e for e in events if e.phase not in _SPLIT]


def _by_micro_batch(events: list[Event], m: int, where: Any, k: int) -> list[list[Event]]:
    """One phase's events by micro-batch, each numbered as a step of its own (calls, order, parents)."""
    calls: dict[tuple, int] = {}
    for e in events:
        calls[(e.kind, e.path)] = calls.get((e.kind, e.path), 0) + 1
    per: list[list[Event]] = [[] for _ in range(m)]
    renumbered: list[dict[int, int]] = [{} for _ in range(m)]
    for e in events:
        n = calls[(e.kind, e.path)]
        if n % m:
            raise DumpError(f"{where}: step {k} calls `{e.path or '<root>'}` {n} times, not a multiple of its "
                            f"{m} micro-batches; record with the micro_batches the loop runs per step.")  # fmt: skip
        each = n // m
        mb = e.call // each
        renumbered[mb][e.order] = len(per[mb])
        per[mb].append(e)
    return [
        [
            changed(e, order=i, call=e.call % (calls[(e.kind, e.path)] // m), parent=renumbered[mb].get(e.parent))  # type: ignore[arg-type]
            for i, e in enumerate(evs)
        ]
        for mb, evs in enumerate(per)
    ]


def _scaled(records: tuple[TensorRecord, ...], scale: float) -> tuple[TensorRecord, ...]:
    if scale == 1.0:
        return records
    return tuple(
        changed(t, value=(t.value * scale).astype(t.value.dtype))
        if isinstance(t.value, np.ndarray)
        else changed(t, stats=scaled_stats(t.stats, scale))
        if t.stats is not None
        else t
        for t in records
    )
