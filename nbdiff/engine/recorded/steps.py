"""One recorded step of one rank, compared whole: forward and backward, the updates, a parameter
written outside the optimizer, and the running statistics, into the verdict (``compare``'s loop)."""

from __future__ import annotations

from nbdiff.align.pairing import Pairing
from nbdiff.align.shards import Gathered
from nbdiff.engine.comparer import BeforeCompare, StepComparison
from nbdiff.engine.driver import Verdict
from nbdiff.engine.outside import recorded_writes
from nbdiff.engine.recorded.comparer import RecordedComparer
from nbdiff.engine.recorded.gathered import attributed
from nbdiff.engine.types import StepRecord
from nbdiff.judge.blame import EventDiff

__all__ = ["compare_recorded_step"]


class _Recorded:
    """What the dumps give a recorded step beyond its records (:class:`~nbdiff.engine.comparer.StepSource`)."""

    def __init__(self, cmp: RecordedComparer) -> None:
        self.cmp = cmp

    def before_compare(self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> BeforeCompare:
        # Weights that drifted through updates that agreed explain what no layer makes on its own, as
        # live (nbdiff.engine.drift); after a divergence, later steps are for the chart.
        return BeforeCompare(drift=self.cmp.drift_at(k) if self.cmp.spread is not None else None)

    def updates(
        self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord, step: StepComparison
    ) -> StepComparison:
        cmp = self.cmp
        grads = (lambda: cmp.gradient_spread(k)) if cmp.spread else None
        writes = recorded_writes(brec.optimizer, rrec.optimizer)  # parameters written outside the optimizer
        return cmp.compare_updates(cmp.updates(pairing, brec, rrec), grads, step, writes)

    def state(self, k: int, brec: StepRecord, rrec: StepRecord) -> StepComparison:
        return self.cmp.compare_state(brec, rrec, k)


def compare_recorded_step(
    cmp: RecordedComparer, k: int, rank: int, verdict: Verdict, gathered: Gathered | None = None
) -> tuple[bool, list[EventDiff], Pairing]:
    """Step ``k`` of one rank: forward and backward, then the updates (their gradients folded into
    the spread until the rank's first divergence), then the running statistics it moved."""
    brec, rrec = cmp.read_step(k, rank)
    whole = cmp.whole_step(k, brec, rrec, _Recorded(cmp))
    findings = attributed(whole.findings, gathered) if gathered is not None else None
    diverged = verdict.take(k, whole, rank, findings)
    if diverged:
        cmp.spread = None  # after a divergence, later steps are for the chart
    return diverged and verdict.at == (k, rank), whole.diffs, whole.pairing
