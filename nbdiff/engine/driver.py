"""The one driver under every verb: it takes each step's comparison (live or recorded), keeps the
findings, warnings and the first divergence, and builds the :class:`DiffResult`.

A step diverges when one of its findings fails; known framework differences (paddle's biased
``running_var``) are findings that fail only with ``framework_differences="fail"``. The first
divergence is the earliest step's, then the lowest rank's; its step's findings are all kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nbdiff.align.optimizer_settings import OptimizerLog
from nbdiff.engine.comparer import StepComparison, WholeStep
from nbdiff.engine.explain import explain
from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence, EventDiff, require_compared
from nbdiff.judge.inherited import inherited_notes, inherited_warning
from nbdiff.result import DiffResult
from nbdiff.trace.events import Event

__all__ = ["Verdict"]


class Verdict:
    """What the steps compared so far amount to. ``keep_events``: whether every compared pair is kept
    here (``compare`` keeps a bounded number itself)."""

    def __init__(self, framework_fails: bool = False, keep_events: bool = True) -> None:
        self.framework_fails, self.keep_events = framework_fails, keep_events
        self.events: list[EventDiff] = []
        self.warnings: list[str] = []
        self.divergence: Divergence | None = None
        self.steps = 0
        self._at: tuple[int, int] | None = None
        self._framework: list[tuple[tuple[int, int], Divergence]] = []
        self._diverged: list[Divergence] = []

    def add(self, comparison: StepComparison) -> list[Divergence]:
        """One comparison's pairs and notes kept; its findings returned."""
        if self.keep_events:
            self.events += comparison.diffs
        self.warnings += comparison.notes
        return comparison.findings

    def take(self, step: int, whole: WholeStep, rank: int = 0, findings: Sequence[Divergence] | None = None) -> bool:
        """A step compared whole (:meth:`~nbdiff.engine.comparer.StepComparer.whole_step`): each part's
        pairs and notes kept, its findings (``findings``: those, as the caller placed them) judged;
        whether it diverged."""
        for part in whole.parts:
            self.add(part)
        return self.step_done(step, whole.findings if findings is None else findings, rank)

    def step_done(self, step: int, findings: Sequence[Divergence], rank: int = 0) -> bool:
        """Every finding of one step (of one rank); whether it diverged."""
        self.steps = max(self.steps, step + 1)
        at = (step, rank)
        failing = [f for f in findings if f.where != "framework" or self.framework_fails]
        if not self.framework_fails:
            self._framework += [(at, f) for f in findings if f.where == "framework"]
        if not failing:
            return False
        if self._at is None or at < self._at:
            self.divergence, self._at, self._diverged = failing[0], at, list(findings)
        return True

    @property
    def findings(self) -> list[Divergence]:
        """Framework differences up to the divergence, then every finding of the step that diverged."""
        last = self._at or (self.steps, 0)
        earlier = [f for at, f in self._framework if at < last]
        return earlier + self._diverged

    @property
    def at(self) -> tuple[int, int] | None:
        """The step and rank of the first divergence."""
        return self._at

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    def finish(
        self,
        names: tuple[str, str, str, str],
        unmatched: tuple[Sequence[Event], Sequence[Event]],
        options: dict[str, Any],
        events: Sequence[EventDiff] | None = None,
        explained_by: tuple[tuple[Framework, Framework], tuple[Any, Any], OptimizerLog] | None = None,
        notes: Sequence[str] = (),
        recorded_arguments: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {}),
        **more: Any,
    ) -> DiffResult:
        """The answer, as every verb gives it: ``names`` are base's and raw's frameworks then models; ``explained_by`` (live
        runs): what finds the arguments and optimizer settings that differ; ``recorded_arguments``
        (recorded runs): each side's layer arguments by path, as the dumps keep them. Nothing compared is an
        error, never agreement."""
        if events is None:  # else the caller kept (and checked) them
            events = self.events
            require_compared(events, names[2])
        warnings = list(dict.fromkeys(self.warnings))  # each said once (a step's plans are decided again)
        if self.divergence is None:
            warnings += inherited_warning(events)
            notes = [*inherited_notes(events), *notes]
        result = DiffResult(
            base_framework=names[0],
            raw_framework=names[1],
            base_model=names[2],
            raw_model=names[3],
            first_divergence=self.divergence,
            findings=tuple(self.findings),
            events=tuple(events),
            steps=self.steps,
            unmatched_base=tuple(unmatched[0]),
            unmatched_raw=tuple(unmatched[1]),
            warnings=tuple(warnings),
            notes=tuple(notes),
            options=options,
            **more,
        )
        if explained_by is not None:
            return explain(result, *explained_by)
        return explain(result, recorded=recorded_arguments)
