"""One recorded step of one rank, compared whole: forward and backward, the updates, a parameter
written outside the optimizer, and the running statistics, into the verdict (``compare``'s loop)."""

from __future__ import annotations

from nbdiff.align.pairing import Pairing
from nbdiff.align.shards import Gathered
from nbdiff.engine.driver import Verdict
from nbdiff.engine.outside import recorded_writes
from nbdiff.engine.recorded.comparer import RecordedComparer
from nbdiff.engine.recorded.gathered import attributed
from nbdiff.judge.blame import EventDiff

__all__ = ["compare_recorded_step"]


def compare_recorded_step(
    cmp: RecordedComparer, k: int, rank: int, verdict: Verdict, gathered: Gathered | None = None
) -> tuple[bool, list[EventDiff], Pairing]:
    """Step ``k`` of one rank: forward and backward, then the updates (their gradients folded into
    the spread until the rank's first divergence), then the running statistics it moved."""
    brec, rrec = cmp.read_step(k, rank)
    pairing, notes = cmp.pair(brec, rrec)
    verdict.warnings += notes
    # Weights that drifted through updates that agreed explain what no layer makes on its own, as
    # live (nbdiff.engine.drift); after a divergence, later steps are for the chart.
    drift = cmp.drift_at(k) if cmp.spread is not None else None
    step = cmp.compare(pairing, brec, rrec, drift=drift)
    spread = cmp.spread
    grads = (lambda: cmp.gradient_spread(k)) if spread else None
    writes = recorded_writes(brec.optimizer, rrec.optimizer)  # parameters written outside the optimizer
    updates = cmp.compare_updates(cmp.updates(pairing, brec, rrec), grads, step, writes)
    state = cmp.compare_state(brec, rrec, k)
    findings = step.findings + updates.findings + state.findings
    if gathered is not None:
        findings = attributed(findings, gathered)
    verdict.warnings += step.notes + updates.notes + state.notes
    diverged = verdict.step_done(k, findings, rank)
    if diverged:
        cmp.spread = None  # after a divergence, later steps are for the chart
    return diverged and verdict.at == (k, rank), step.diffs + updates.diffs + state.diffs, pairing
