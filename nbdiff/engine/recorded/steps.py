"""One recorded step of one rank, compared whole: forward and backward, the updates, a parameter
written outside the optimizer, and the running statistics, into the verdict (``compare``'s loop)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nbdiff.align.pairing import Pairing
from nbdiff.engine.comparer import BeforeCompare, StepComparison, WholeStep
from nbdiff.engine.driver import Verdict
from nbdiff.engine.kept import KeptSteps
from nbdiff.engine.recorded.comparer import RecordedComparer
from nbdiff.engine.recorded.gathered import attributed
from nbdiff.engine.training.outside import recorded_writes
from nbdiff.engine.types import StepRecord, TolFn
from nbdiff.gather.shards import Gathered
from nbdiff.judge.blame import EventDiff
from nbdiff.trace.dump.store import RankDump
from nbdiff.trace.events import Event, Phase

__all__ = ["compare_recorded_step", "compare_ranks", "Unmatched"]


class _Recorded:
    """What the dumps give a recorded step beyond its records (:class:`~nbdiff.engine.comparer.StepSource`)."""

    def __init__(self, cmp: RecordedComparer) -> None:
        self.cmp = cmp

    def before_compare(self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> BeforeCompare:
        # Weights that drifted through updates that agreed explain what no layer makes on its own, as
        # live (nbdiff.engine.training.drift); after a divergence, later steps are for the chart.
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
    if diverged and verdict.at == (k, rank):  # said of the step the answer is about
        verdict.warnings += untold(whole, k, rank)
    if diverged:
        cmp.spread = None  # after a divergence, later steps are for the chart
    return diverged and verdict.at == (k, rank), whole.diffs, whole.pairing


def untold(whole: WholeStep, k: int, rank: int) -> list[str]:
    """What a statistics dump cannot tell after a forward divergence, said: the backward and update
    events that differ there may only inherit it, or add errors of their own (a custom layer's wrong
    gradient, a learning rate), which only values could tell apart (a tensor dump rebuilds each layer
    and runs it on base's inputs; a statistics dump has no inputs to run it on)."""
    if not any(f.phase is Phase.FORWARD for f in whole.findings):
        return []
    found = {(f.phase, f.raw_path) for f in whole.findings}
    unjudged = [
        d
        for d in whole.diffs
        if d.base.phase in (Phase.BACKWARD, Phase.OPTIMIZER)
        and not d.passed
        and (d.base.phase, d.raw.path) not in found
        and any(t.value is None for t in (*d.raw.outputs, *d.raw.inputs))
    ]
    if not unjudged:
        return []
    backward = sum(d.base.phase is Phase.BACKWARD for d in unjudged)
    return [
        f"rank {rank}, step {k}: after the forward divergence, {backward} backward and {len(unjudged) - backward} "
        "optimizer event(s) differ too; a statistics dump cannot tell whether any of them adds an error of its own "
        "to what it inherits (a custom layer's wrong gradient, a learning rate). To check, record this step again "
        f"with dump_type='tensor' (steps=[{k}]) and compare."
    ]


def compare_ranks(
    ranks: Iterable[tuple[int, RankDump, RankDump, Gathered | None]],
    tol: TolFn,
    mode: str,
    verdict: Verdict,
    kept: KeptSteps,
    checked: Callable[[RankDump, RankDump, int], list[str]],
) -> tuple[tuple[RankDump, RankDump] | None, Unmatched]:
    """Every step of every rank pair, in order, into ``verdict`` and ``kept``; ``checked`` says what is
    wrong with a rank pair's dumps (warnings; raising where it may not be compared). The first rank
    pair (``None``: no rank in common), and the calls left unpaired."""
    first: tuple[RankDump, RankDump] | None = None
    unmatched = Unmatched()
    for rank, a, b, gathered in ranks:
        first = first or (a, b)
        verdict.warnings += checked(a, b, rank)
        cmp = RecordedComparer(a, b, tol, mode)
        for k in range(min(len(a.steps), len(b.steps))):
            cut = [str(d.path) for d in (a, b) if k in d.incomplete]
            if cut:
                verdict.warnings.append(
                    f"rank {rank}, step {k}: cut short by an exception in {', '.join(cut)}; not compared."
                )
                continue
            diverged, diffs, pairing = compare_recorded_step(cmp, k, rank, verdict, gathered)
            kept.add(k, rank, diverged, diffs)
            unmatched.add(pairing)
        if gathered is not None:
            verdict.warnings += gathered.notes
    return first, unmatched


class Unmatched:
    """Events left unpaired, each layer call once, however many steps it went unpaired in."""

    def __init__(self) -> None:
        self.base: dict[tuple[int, str, str, int], Event] = {}
        self.raw: dict[tuple[int, str, str, int], Event] = {}

    def add(self, pairing: Pairing) -> None:
        for into, events in ((self.base, pairing.unmatched_base), (self.raw, pairing.unmatched_raw)):
            for e in events:
                into.setdefault((e.rank, e.phase.value, e.path, e.call), e)
