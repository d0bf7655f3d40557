"""What a comparison of many steps keeps: every step's worst errors, and the events of a few steps.

A long run compared step by step (``compare`` of two dumps, ``watch`` of a training loop) keeps
each step's worst errors for the step chart, and the events of the first steps, of the blamed step
and of the steps around it (the first step a bug touches is the one a user opens first, and the
ones just before and after it show how it began); the rest are summarised, so memory stays
bounded however many steps are compared.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from nbdiff.judge.blame import EventDiff
from nbdiff.result import StepRow, step_error_rows
from nbdiff.trace.events import Event, Kind, TensorRecord, changed

__all__ = ["KEEP_STEPS", "AROUND", "KeptSteps"]

KEEP_STEPS = 4
"""Default: the steps whose events are kept, besides the blamed one's and those around it."""
AROUND = 2
"""Steps kept before and after the blamed one (their statistics, as the first steps' are)."""


class KeptSteps:
    """What a comparison keeps of the steps it compared: every step's worst errors, the events of the
    first ``keep`` steps (statistics only once settled, unless ``values``) and all of the blamed
    step's. Memory is bounded by a few steps, however many were compared."""

    def __init__(self, keep: int, values: bool = False) -> None:
        self.keep = keep
        self.values = values
        """Keep the kept steps' tensors (a recording's spool holds them) rather than their statistics."""
        self.rows: dict[int, StepRow] = {}
        self.compared = 0
        """Events compared (pairs, inputs included)."""
        self.outputs = False
        """Whether any compared pair held a tensor other than an input (:func:`require_compared`)."""
        self._blamed: tuple[int, int, list[EventDiff]] | None = None
        self._settled: dict[tuple[int, int], list[EventDiff]] = {}
        self._dropped: set[int] = set()
        self._recent: deque[tuple[int, int, list[EventDiff]]] = deque(maxlen=AROUND)
        """The last steps past the first ``keep``, as compared: kept if the next one is blamed."""

    def add(self, k: int, rank: int, blamed: bool, diffs: list[EventDiff]) -> None:
        """``blamed``: this step holds the (new) first divergence."""
        self.compared += len(diffs)
        self.outputs = self.outputs or any(d.tensors for d in diffs if d.base.kind is not Kind.INPUT)
        step_error_rows(diffs, into=self.rows)
        if blamed:
            if self._blamed is not None:  # an earlier step (of a later rank) diverged too: it is the answer
                self._settle(*self._blamed)
            self._blamed = (k, rank, diffs)
            for before in self._recent:  # the steps just before it
                if before[0] < k:
                    self._settled[before[:2]] = [_settled(d) for d in before[2]]
                    self._dropped.discard(before[0])
            self._recent.clear()
        else:
            self._settle(k, rank, diffs)

    def _settle(self, k: int, rank: int, diffs: list[EventDiff]) -> None:
        if k < self.keep:
            self._settled[(k, rank)] = diffs if self.values else [_settled(d) for d in diffs]
        elif self._blamed is not None and self._blamed[0] < k <= self._blamed[0] + AROUND:
            self._settled[(k, rank)] = [_settled(d) for d in diffs]  # just after the blamed step
        else:
            self._dropped.add(k)
            if self._blamed is None:
                self._recent.append((k, rank, diffs))  # held as compared: settled only if kept

    def events(self) -> tuple[EventDiff, ...]:
        chunks = dict(self._settled)
        if self._blamed is not None:
            k, rank, diffs = self._blamed
            chunks[(k, rank)] = diffs
        return tuple(d for key in sorted(chunks) for d in chunks[key])

    def summarised(self) -> tuple[str, ...]:
        dropped = sorted(self._dropped - ({self._blamed[0]} if self._blamed else set()))
        if not dropped:
            return ()
        return (
            f"{len(dropped)} step(s) from step {dropped[0]} on are summarised by their worst errors "
            f"(result.step_errors(), the step chart: a click on one shows them), not kept event by event, so that "
            f"memory stays bounded; the first {self.keep}, the blamed one and {AROUND} on either side of it are kept. "
            f"Pass keep_steps={dropped[-1] + 1} (--keep-steps {dropped[-1] + 1}) to keep them all.",
        )


def _settled(d: EventDiff) -> EventDiff:
    """``d`` with every metric computed and its events' tensors reduced to statistics."""

    def records(ts: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
        return tuple(t if t.value is None else changed(t, value=None, stats=t.statistics()) for t in ts)

    def event(e: Event) -> Event:  # changed: a step's hundreds of events, each copied without __init__
        return changed(
            e, inputs=records(e.inputs), outputs=records(e.outputs), params=records(e.params), given=records(e.given)
        )

    metrics = lambda ts: None if ts is None else tuple(replace(t, detail=None) for t in ts)  # noqa: E731
    return replace(
        d, base=event(d.base), raw=event(d.raw), tensors=metrics(d.tensors), local=metrics(d.local),
        evidence=records(d.evidence),
    )  # fmt: skip
