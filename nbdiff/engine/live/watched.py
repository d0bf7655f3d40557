"""The steps of a watched run (:func:`nbdiff.watch`), compared one by one as the user's code ran them.

Each step replays on the weights it ran with (raw's, after step 0, on those base's updates would
have given: :mod:`nbdiff.engine.training.drift`), then compares what the optimizers changed. What the
result keeps is bounded (:class:`~nbdiff.engine.kept.KeptSteps`), and each step's weights and
gradients are let go once compared, so a step can be compared while the loop still runs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbdiff.align.optimizer_settings import OptimizerLog
from nbdiff.align.pairing import Pairing
from nbdiff.engine.comparer import BeforeCompare, StepComparison
from nbdiff.engine.driver import Verdict
from nbdiff.engine.kept import KeptSteps
from nbdiff.engine.live.comparer import LiveComparer, ParamGrads, held_param_grads
from nbdiff.engine.training.drift import drift_note, followed
from nbdiff.engine.training.outside import outside_writes
from nbdiff.engine.training.updates import GradientSpread, in_raw_layout
from nbdiff.engine.types import Snapshot, StepRecord, TolFn
from nbdiff.trace.session import ModelSession, Weights
from nbdiff.weights.plan import layer_tensors

__all__ = ["WatchedSteps"]


class WatchedSteps:
    """Both models' recorded steps compared in order (``compare``), into ``verdict`` and ``kept``."""

    def __init__(
        self,
        b: ModelSession,
        r: ModelSession,
        cmp: LiveComparer,
        optimizers: OptimizerLog,
        tol: TolFn,
        keep_steps: int,
        framework_fails: bool = False,
    ) -> None:
        self.b, self.r, self.cmp, self.optimizers, self.tol = b, r, cmp, optimizers, tol
        self.verdict = Verdict(framework_fails, keep_events=False)
        self.kept = KeptSteps(keep_steps, values=True)
        self.done = 0
        """Steps compared so far."""
        self.pairing: Pairing | None = None
        """The last compared step's."""
        self._start: tuple[Snapshot, Snapshot] | None = None  # the weights the first step began with
        self._now: tuple[Snapshot, Snapshot] = ({}, {})  # those the step being compared began with
        self._spread = GradientSpread()  # the gradients each optimizer was given, until the first divergence
        self._user_weights: tuple[Weights, Weights] | None = None  # see _keep_user_weights

    def compare(self, brec: StepRecord, rrec: StepRecord) -> None:
        """The next step as the user ran it: replays on the weights it ran with, then its updates.
        Every step is compared, so the error's growth can be seen (``result.plot()``); after the first
        divergence only for the chart. Its weights and gradients are let go after."""
        k, verdict = self.done, self.verdict
        whole = self.cmp.whole_step(k, brec, rrec, self)
        diverged = verdict.take(k, whole)
        self.kept.add(k, 0, diverged and verdict.at == (k, 0), whole.diffs)
        self.pairing = whole.pairing
        for side in (self.b, self.r):
            side.let_go(k)
        self.done += 1

    # -- what a watched step gives its comparison (a StepSource) ---------------------
    def before_compare(self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> BeforeCompare:
        """What step ``k``'s comparison needs, made only when asked: both models loaded with the weights the
        step ran with (raw's, after step 0, with those its updates would have given had they been base's:
        :mod:`nbdiff.engine.training.drift`) before its first replay, and how far those drifted once an error no layer
        makes on its own is found. A step within tolerance replays nothing and loads nothing."""
        self._now = now = self._plan_snapshot(k)  # both sides' weights as step k began: where k - 1 ended
        start = self._start = self._start or now
        follow: list[Snapshot] = []  # made once, by the first that asks

        def followed_k() -> Snapshot:
            if not follow:
                follow.append(followed(self.cmp.plans, start[0], now[0], start[1]))
            return follow[0]

        def ready() -> None:
            self._keep_user_weights()
            self.b.load(self.b.weights[k])
            self.r.load({**self.r.weights[k], **self._raw_weights(followed_k())} if k > 0 else self.r.weights[k])

        # Only updates that agreed make drift; after a divergence its steps are for the chart.
        drift = None
        if k > 0 and not self.verdict.diverged:
            drift = lambda: drift_note(k, followed_k(), now[1], self.tol)  # noqa: E731
        return BeforeCompare(self._grads_of(k), drift=drift, every=not self.verdict.diverged, ready=ready)

    def _keep_user_weights(self) -> None:
        """Before a replay loads a step's weights: the weights the user's loop holds now, put back by
        :meth:`give_back_weights`."""
        if self._user_weights is None:
            self._user_weights = (self.b.weights_now(held=False), self.r.weights_now(held=False))

    def give_back_weights(self) -> None:
        """The weights the user's loop held before the comparisons' replays, back in both models (nothing
        to do where none replayed)."""
        held, self._user_weights = self._user_weights, None
        if held is not None:
            self.b.load(held[0])
            self.r.load(held[1])

    def updates(
        self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord, step: StepComparison
    ) -> StepComparison:
        first, cmp = not self.verdict.diverged, self.cmp
        if first:  # folded now: this step's gradients are let go once it is compared
            self._spread.catch_up(
                k, lambda s: in_raw_layout(cmp.plans, *self._plan_snapshot(s, lambda side: side.grads[s]))
            )
        return self._updates(k, self._now, self._plan_snapshot(k + 1), self._spread if first else None, step)

    def state(self, k: int, brec: StepRecord, rrec: StepRecord) -> StepComparison:
        """The running statistics step ``k`` moved on base's side, against raw's as the user's code left
        them (raw's own before the step, for a framework difference to be verified)."""
        b, r = self.b.states, self.r.states
        if not any(not np.array_equal(v, b[k + 1].get(i, v)) for i, v in b[k].items()):
            return StepComparison()  # eval mode, or no statistics
        return self.cmp.compare_state(k, b[k], brec, rrec, kept=(b[k + 1], r[k + 1], r[k]))

    def _grads_of(self, k: int) -> ParamGrads:
        # Recorded copies only: the live gradients are a later step's.
        return held_param_grads({**self.b.grads[k], **self.r.grads[k]}, live=False)

    def _updates(
        self,
        k: int,
        before: tuple[Snapshot, Snapshot],
        after: tuple[Snapshot, Snapshot],
        spread: GradientSpread | None,
        step: StepComparison | None = None,
    ) -> StepComparison:
        """What the optimizers changed during step ``k`` (``before``, ``after``: the weights it began
        and ended with); nothing when no optimizer ran. ``spread``: the gradients each optimizer was
        given so far, to take out what they explain (until the first divergence; after it, only the
        chart reads)."""
        changed = any(
            not np.array_equal(side.weights[k][i], side.weights[k + 1][i])
            for side in (self.b, self.r)
            for i in side.weights[k]
        )
        if not changed:
            return StepComparison()
        log, fws = self.optimizers, (self.b.fw, self.r.fw)
        stacks = (log.stack_at(fws[0].name, k), log.stack_at(fws[1].name, k))
        # Each optimizer stepped from its own model's gradients: the updates may differ by what those did.
        grads = (lambda: spread) if spread is not None else None
        # A parameter written after the optimizer stepped (read where step k + 1 began) is that write's doing.
        cmp = self.cmp
        written = (self.b.outside[k + 1], self.r.outside[k + 1])
        writes = outside_writes((self.b.fw, self.r.fw), (cmp.blayers, cmp.rlayers), cmp.plans, written)
        return cmp.compare_snapshots(k, before, after, stacks, grads, writes, compared=step)

    def _raw_weights(self, snapshot: Snapshot) -> Weights:
        """Raw's parameters by ``id``, from arrays by plan and raw's names."""
        out: Weights = {}
        for plan in self.cmp.plans.values():
            arrays = snapshot.get(plan.base_path, {})
            for n, p in layer_tensors(self.r.fw, self.cmp.rlayers[plan.raw_path], plan.recursive).items():
                if n in arrays:
                    out[id(p)] = arrays[n]
        return out

    def _plan_snapshot(
        self, k: int, source: Callable[[ModelSession], Weights] | None = None
    ) -> tuple[Snapshot, Snapshot]:
        """Both sides' weights at the start of step ``k`` (or what ``source`` gives), by plan and name."""
        out: tuple[Snapshot, Snapshot] = ({}, {})
        for plan in self.cmp.plans.values():
            for i, (side, layers, path) in enumerate(
                ((self.b, self.cmp.blayers, plan.base_path), (self.r, self.cmp.rlayers, plan.raw_path))
            ):
                held = side.weights[k] if source is None else source(side)
                tensors = layer_tensors(side.fw, layers[path], plan.recursive)
                out[i][plan.base_path] = {n: held[id(p)] for n, p in tensors.items() if id(p) in held}
        return out
