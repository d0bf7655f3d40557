"""``auto_diff``'s step loop: both models run, paired, compared, trained and checked, one step at a time.

Each step runs both models on the same inputs (raw fed base's with ``single_step``), pairs and
compares the step (:class:`~nbdiff.engine.live.comparer.LiveComparer`), then the optimizers'
updates and the running statistics; the verdict keeps what each step found.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from nbdiff.align.optimizer_settings import OptimizerLog
from nbdiff.align.pairing import Pairing
from nbdiff.engine.comparer import BeforeCompare, StepComparison, WholeStep
from nbdiff.engine.conditioning import Floor, measure_floor
from nbdiff.engine.driver import Verdict
from nbdiff.engine.live.comparer import LiveComparer, live_param_grads
from nbdiff.engine.live.feed import feed_for, guessed_feed, same_feed
from nbdiff.engine.progress import progress
from nbdiff.engine.stepping import run_optimizer, run_step
from nbdiff.engine.training.state import state_of
from nbdiff.engine.types import StepRecord
from nbdiff.frameworks import Framework
from nbdiff.result import DiffResult
from nbdiff.trace.calls import Feed
from nbdiff.trace.modes import kept_rng, no_dropout, restore_state, save_state, training_flags
from nbdiff.trace.spool import Spool
from nbdiff.weights.assign import WeightMap, write_weights

__all__ = ["LiveSteps"]


class LiveSteps:
    """``auto_diff``'s steps: both models run, paired, compared, trained and checked, one step at a time."""

    def __init__(
        self,
        bfw: Framework, base: Any, rfw: Framework, raw: Any, calls: tuple[Any, Any], losses: list[Any],
        opts: list[Any] | None, cmp: LiveComparer, spool: Spool, copied: WeightMap | None, single_step: bool,
        diff_phase: str, api_level: bool | str, verdict: Verdict,
    ) -> None:  # fmt: skip
        self.bfw, self.base, self.rfw, self.raw, self.calls, self.losses = bfw, base, rfw, raw, calls, losses
        self.opts, self.cmp, self.spool, self.copied, self.verdict = opts, cmp, spool, copied, verdict
        self.single_step, self.diff_phase, self.api_level = single_step, diff_phase, api_level
        self.backward = diff_phase != "forward"
        self.training = opts is not None and self.backward
        self.pairing: Pairing | None = None
        self.wmap: WeightMap | None = None
        self.initial: list[Any] = []
        self._state_before: Any = None  # base's running statistics as the step being compared began
        self.log = OptimizerLog()  # the optimizers that step, and their learning rates, to say why an update differs

    def hold(self, stack: ExitStack) -> None:
        """Modes, dropout, random generators and gradients as the user had them, once the steps are done."""
        bfw, base, rfw, raw = self.bfw, self.base, self.rfw, self.raw
        stack.callback(self.spool.close)
        stack.enter_context(kept_rng((bfw, rfw)))
        self.log.listen(stack, (bfw, rfw))
        for fw, model in ((bfw, base), (rfw, raw)):
            stack.enter_context(training_flags(fw, model))
            stack.enter_context(no_dropout(fw, model))
            stack.callback(fw.zero_grad, model, None)
        self.initial = [save_state(bfw, base), save_state(rfw, raw)]
        if self.opts is None:
            # Not training: running statistics end as they were (raw's as copied from base).
            stack.callback(restore_state, bfw, self.initial[0])
            stack.callback(lambda: restore_state(rfw, self.initial[1]))  # initial[1] may be replaced

    def all_steps(self, steps: int) -> None:
        """Every step asked for, compared: the first divergence is the earliest step's, and the steps
        after it show how the error goes on (the step chart). Each step starts where base's does."""
        with ExitStack() as stack:
            self.hold(stack)
            for step in progress(range(steps), "nbdiff: steps", total=steps):
                self.verdict.take(step, self.step(step))

    def step(self, step: int) -> WholeStep:
        """Run both models' step, then compare, train and check it whole."""
        cmp, verdict = self.cmp, self.verdict
        if step and self.training:
            # Each step starts where base's does: the last update's own error was compared, and
            # weights drifted by it (Adam: lr-sized) would flip ReLU masks and fail the next step.
            cmp.feed_optimizer(grads=None)
        self._state_before = state_of(self.bfw, self.base)
        brec, rrec = self._run_pair(step)
        if self.wmap is None:
            brec, rrec = self._copy_by_plan(step, brec, rrec)
        assert self.pairing is not None
        verdict.warnings += [f"base: {w}" for w in brec.warnings] + [f"raw: {w}" for w in rrec.warnings]
        return cmp.whole_step(step, brec, rrec, self, self.pairing)

    # -- what a live step gives its comparison (a StepSource) ------------------------
    def before_compare(self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> BeforeCompare:
        if self.single_step:  # raw ran on base's values: no rounding of base's to measure
            return BeforeCompare()
        return BeforeCompare(
            floor=_floor_of(self.bfw, self.base, self.calls[0], self.losses[0], brec, self.cmp, self.backward)
        )

    def updates(
        self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord, step: StepComparison
    ) -> StepComparison:
        return self._train(k) if self.training else StepComparison()

    def state(self, k: int, brec: StepRecord, rrec: StepRecord) -> StepComparison:
        if not self.cmp.keeps_state():
            return StepComparison()
        # Running statistics move in any train-mode forward, with or without optimizers.
        return self.cmp.compare_state(k, self._state_before, brec, rrec)

    def _copy_by_plan(self, step: int, brec: StepRecord, rrec: StepRecord) -> tuple[StepRecord, StepRecord]:
        """Weights pair by execution order: step 0's plan (the comparer's) decides. A structure copy that
        paired any layer differently is redone from it, and the step run again."""
        bfw, base, rfw, raw, copied = self.bfw, self.base, self.rfw, self.raw, self.copied
        wmap = self.cmp.wmap
        assert wmap is not None
        if copied is not None and not copied.covers(wmap):
            restore_state(bfw, self.initial[0])
            restore_state(rfw, self.initial[1])
            tied = write_weights(bfw, base, rfw, raw, wmap, restore_on_failure=False)
            wmap = replace(wmap, warnings=wmap.warnings + tuple(tied))
            self.verdict.warnings += tied
            self.initial[1] = save_state(rfw, raw)
            brec, rrec = self._run_pair(step)
        elif copied is not None:
            tied = tuple(w for w in copied.warnings if "tied" in w)
            wmap = replace(wmap, warnings=wmap.warnings + tied)
            self.verdict.warnings += tied
        self.wmap = wmap
        return brec, rrec

    def _train(self, step: int) -> StepComparison:
        """Both optimizers step from base's weights and gradients; their updates compared."""
        cmp, opts, log = self.cmp, self.opts, self.log
        assert opts is not None
        cmp.feed_optimizer()
        before = cmp.snapshot()
        run_optimizer(self.bfw, opts[0], "base")
        run_optimizer(self.rfw, opts[1], "raw")
        stacks = (log.stack_at(self.bfw.name, step), log.stack_at(self.rfw.name, step))
        # The weights as they are now, read at once, and the updates written over ``before``'s copies.
        after = cmp.snapshot(copy=False)
        return cmp.compare_snapshots(step, before, after, stacks, into_before=True)

    def _fresh(self, side: int, step: int) -> None:
        fw, model = ((self.bfw, self.base), (self.rfw, self.raw))[side]
        fw.zero_grad(model, self.opts[side] if self.opts else None)
        fw.seed(step)

    def _run_pair(self, step: int) -> tuple[StepRecord, StepRecord]:
        """Base's step, then raw's (fed base's inputs with ``single_step``); ``self.pairing`` follows."""
        for side in (0, 1):
            self._fresh(side, step)
        brec = run_step(
            self.bfw, self.base, self.calls[0], self.losses[0], side="base", step=step, backward=self.backward,
            api_level=self.api_level, spool=self.spool,
        )  # fmt: skip
        if not self.single_step:
            return brec, self._run_raw(brec, step, None)
        if self.pairing is not None:
            return brec, self._run_raw(brec, step, feed_for(brec, self.pairing, self.diff_phase))
        # Raw's calls are paired only once it has run: feed it by a guess (same paths, or the weight
        # copy's), then check the guess against the pairing; run raw again only where it was wrong.
        copied = self.copied
        guess = guessed_feed(brec, self.diff_phase, copied.pairs() if copied else (), copied.fused if copied else ())
        rrec = self._run_raw(brec, step, guess, plan=False)
        assert self.pairing is not None
        right = feed_for(brec, self.pairing, self.diff_phase)
        if same_feed(guess, right, rrec):
            self.verdict.warnings += self.cmp.plan_from(self.pairing)
            return brec, rrec
        restore_state(self.rfw, self.initial[1])
        self._fresh(1, step)
        return brec, self._run_raw(brec, step, right)

    def _run_raw(self, brec: StepRecord, step: int, feed: Feed | None, plan: bool = True) -> StepRecord:
        rrec = run_step(
            self.rfw, self.raw, self.calls[1], self.losses[1], side="raw", step=step, backward=self.backward,
            feed=feed, api_level=self.api_level, spool=self.spool,
        )  # fmt: skip
        self.pairing, notes = self.cmp.pair(brec, rrec, plan)
        self.verdict.warnings += notes
        return rrec

    def result(self, options: dict) -> DiffResult:
        """The answer, explained: arguments and optimizer settings that differ, warnings, notes."""
        if self.spool.failure:
            self.verdict.warnings.append(f"{self.spool.failure}: the rest of the recording was held in memory")
        pairing = self.pairing
        return self.verdict.finish(
            (self.bfw.name, self.rfw.name, type(self.base).__name__, type(self.raw).__name__),
            (pairing.unmatched_base, pairing.unmatched_raw) if pairing else ((), ()),
            options,
            explained_by=((self.bfw, self.rfw), (self.base, self.raw), self.log),
        )


def _floor_of(
    bfw: Framework, base: Any, call: Any, loss_fn: Any, brec: StepRecord, cmp: LiveComparer, backward: bool
) -> Callable[[], Floor | None]:
    """Base's sensitivity to rounding in this step, measured only if blame asks (:mod:`nbdiff.engine.conditioning`)."""

    def param_grads(layer: Any, path: str) -> dict[str, Any]:
        return live_param_grads(bfw, layer if layer is not None else cmp.blayers[path], False)

    return lambda: measure_floor(bfw, base, call, loss_fn, brec, param_grads if backward else None)
