"""``watch``: record two models while the user's own code runs them, then compare step by step.

This is what ``%%modeldiff`` runs around a cell. Each call of a root model starts a
step; the code must call base before raw in every step (base then raw forward,
loss, backward and optimizer steps, in any arrangement after that).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.optimizer_settings import OptimizerLog, optimizer_params
from nbdiff.engine.gc_pause import gc_frozen
from nbdiff.engine.kept import KEEP_STEPS
from nbdiff.engine.live.boundary import StepBoundary
from nbdiff.engine.live.comparer import LiveComparer
from nbdiff.engine.live.watched import WatchedSteps
from nbdiff.engine.options import (
    check_mib,
    check_models,
    check_recordable,
)
from nbdiff.engine.progress import counter, progress
from nbdiff.engine.spec import Comparison
from nbdiff.engine.spill import SPILL_ABOVE_MIB, spilled
from nbdiff.engine.types import StepRecord
from nbdiff.errors import InputError, NbdiffError, WeightTransferError
from nbdiff.frameworks import framework_of
from nbdiff.frameworks.interrupts import is_interrupt, undone_whole
from nbdiff.judge.blame import require_compared
from nbdiff.result import DiffResult
from nbdiff.trace.session import ModelSession
from nbdiff.trace.spool import MEMORY_MIB, Spool, give_back_heap
from nbdiff.weights.assign import plan_weights, write_weights

__all__ = ["watch"]


class watch:
    """Context manager: ``with nbdiff.watch(base, raw) as w: <your training code>``, then ``w.result``.

    Inside, every call of ``base`` or ``raw`` (the root models) is one step of that
    model. Base weights are copied into raw first (``auto_init``), paired by execution
    order when raw first runs. With ``single_step`` every raw layer gets the base
    layer's inputs and output gradients of the same step. Hooks are removed and
    modes restored when the block ends, also on error. Steps are compared while the
    code runs, once both models finished them (and let go); the rest when the block
    completes. The result keeps every step's worst errors and the events of the first
    ``keep_steps`` steps and of the blamed one; past ``spill_above_mib`` MiB its tensors
    wait in a file (``%%modeldiff``: always, since a notebook keeps what it showed).
    Running statistics a train-mode step moved are compared after it; a difference a known
    framework difference explains is a finding that fails only with ``framework_differences="fail"``.
    """

    def __init__(
        self,
        base: Any,
        raw: Any,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        compare_mode: str = "strict",
        auto_init: bool = True,
        diff_phase: str = "both",
        single_step: bool = False,
        layer_map: LayerMap | None = None,
        api_level: bool | str = False,
        memory_mib: float | None = MEMORY_MIB,
        keep_steps: int = KEEP_STEPS,
        spill_above_mib: float | None = SPILL_ABOVE_MIB,
        framework_differences: str = "report",
    ) -> None:
        check_models(base, raw, layer_map)
        self.spec = Comparison(atol, rtol, compare_mode, diff_phase, framework_differences, keep_steps)
        check_mib(memory_mib=memory_mib, spill_above_mib=spill_above_mib)
        self.bfw, self.rfw = framework_of(base, "base"), framework_of(raw, "raw")
        check_recordable((self.bfw, self.rfw), (base, raw))
        self.base, self.raw = base, raw
        self.options = dict(
            atol=atol, rtol=rtol, compare_mode=compare_mode, auto_init=auto_init, diff_phase=diff_phase,
            single_step=single_step, api_level=api_level, keep_steps=keep_steps,
            framework_differences=framework_differences,
        )  # fmt: skip
        self.layer_map = layer_map
        self._spill_above = spill_above_mib
        self.result: DiffResult | None = None
        backward = diff_phase != "forward"
        # Both models' recordings share one limit: beyond it, what the cell's steps record goes to a file.
        self._spool = Spool(None if memory_mib is None else int(memory_mib * 2**20))
        self._b = ModelSession(self.bfw, base, "base", backward, api_level=api_level, spool=self._spool)
        self._r = ModelSession(self.rfw, raw, "raw", backward, api_level=api_level, spool=self._spool)
        tol = self.spec.tol  # the spec's, not a method of this watch: the comparer would hold the watch in a cycle
        self._cmp = LiveComparer(
            self.bfw, base, self.rfw, raw, tol, compare_mode, diff_phase, layer_map, self._spool, bool(auto_init)
        )
        self._stack = ExitStack()
        self._optimizers = OptimizerLog()
        self._steps = WatchedSteps(
            self._b, self._r, self._cmp, self._optimizers, tol, keep_steps, framework_differences == "fail"
        )
        # The root models' hooks record and call this as a step begins; it does the rest (engine/live/boundary).
        self._boundary = StepBoundary((self._b, self._r), (base, raw), self._cmp, self._steps, self.options, None)

    # -- recording -------------------------------------------------------------
    def __enter__(self) -> watch:
        stack = self._stack
        try:
            if self.options["auto_init"]:
                self._copy_by_structure()
            for side in (self._b, self._r):
                side.install(stack, _begins(self._boundary, side))
            # The optimizers the cell steps, to name their settings when an update is blamed.
            # ... and what each step left: a parameter written after it is not the optimizer's doing.
            self._optimizers.listen(stack, (self.bfw, self.rfw), self._stepped)
            seen = counter("nbdiff: steps seen")  # raw's calls, as the user's loop makes them
            self._boundary.seen = seen
            stack.callback(seen.close)
            # What lives now is out of the collector's passes while the loop runs (engine/gc_pause).
            stack.enter_context(gc_frozen())
        except BaseException:
            undone_whole(stack.close)  # a second Ctrl-C is raised after
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.end_after(exc)

    def end_after(self, error: BaseException | None) -> DiffResult | None:
        """Finish after the user's code ended with ``error`` (``None``: it completed). A Ctrl-C: the
        steps both models completed are compared (``result``), and the interrupt stays the news (a
        comparison that cannot be made then leaves ``result`` None); any other error: nothing is."""
        stopped = error is not None and is_interrupt(error)  # paddle raises a Ctrl-C in its backward as OSError
        try:
            return self.finish(compare=error is None or stopped, interrupted=stopped)
        except NbdiffError:
            if not stopped:
                raise
            return None

    def finish(self, compare: bool = True, interrupted: bool = False) -> DiffResult | None:
        """Remove every hook and restore modes; then, with ``compare``, compare and keep ``result``.
        ``interrupted``: the code stopped mid-step (Ctrl-C); the steps both models completed are
        compared, the one in progress is left out (``None`` when there is none)."""
        # Hooks off and modes back whole, even under Ctrl-C (raised after, as record's exit does).
        undone_whole(self._unhook)
        try:
            if compare:
                self.result = self._compare(interrupted)
        finally:
            self._spool.close()
            self._b.recorder.calls.clear()
            self._r.recorder.calls.clear()
            # What the steps recorded is freed: glibc keeps it in its heap, where a kernel looked
            # +1.5 GiB larger after three interrupted 300-step loops, unless it is handed back.
            give_back_heap()
        return self.result

    def _unhook(self) -> None:
        try:
            for side in (self._b, self._r):
                side.end()
        finally:
            self._stack.close()

    def _stepped(self, optimizer: Any) -> None:
        held = {id(p) for p in optimizer_params(optimizer)}
        for side in (self._b, self._r):
            side.stepped(held)

    def _copy_by_structure(self) -> None:
        try:
            wmap = plan_weights(self.base, self.raw, self.layer_map)[2]
            write_weights(self.bfw, self.base, self.rfw, self.raw, wmap)
            self._boundary.copied = wmap
        except WeightTransferError:
            self._boundary.copied = None  # paired by execution when raw first runs

    # -- comparing -------------------------------------------------------------
    def _compare(self, interrupted: bool = False) -> DiffResult | None:
        if self._boundary.deferred is not None:
            raise self._boundary.deferred
        bsteps = self._b.recorder.events_by_root_call(self._b.grads)
        rsteps = self._r.recorder.events_by_root_call(self._r.grads)
        done = self._steps.done
        nb, nr = done + len(bsteps), done + len(rsteps)
        n = min(nb, nr)
        if interrupted:
            # The step both began last may be cut short; one side's step before the other's next is whole.
            n -= nb == nr
            if n <= 0:
                return None
        if n == 0:
            raise InputError(
                f"The code called base {nb} time(s) and raw {nr} time(s): nothing to compare. "
                "Call both models (base first) in the cell."
            )
        verdict, kept = self._steps.verdict, self._steps.kept
        intro = self._boundary.warnings + self._dropout_warning()
        if interrupted:
            intro.append(
                f"interrupted in step {n}: the {n} step(s) both models completed are compared, the one in progress is not."
            )
        elif nb != nr:
            intro.append(f"base ran {nb} step(s), raw {nr}: compared the first {n}.")
        verdict.warnings[:0] = intro
        try:
            for k in progress(range(done, n), "nbdiff: comparing steps", total=n - done):
                self._steps.compare(StepRecord(*bsteps[k - done]), StepRecord(*rsteps[k - done]))
        finally:
            self._steps.give_back_weights()
        if self._spool.failure:
            verdict.warnings.append(f"{self._spool.failure}: the rest of the recording was held in memory")
        if not kept.outputs:
            require_compared((), type(self.base).__name__)
        pairing = self._steps.pairing
        result = verdict.finish(
            (self.bfw.name, self.rfw.name, type(self.base).__name__, type(self.raw).__name__),
            (pairing.unmatched_base, pairing.unmatched_raw) if pairing else ((), ()),
            dict(self.options, weight_map=self._boundary.copied),
            events=kept.events(),
            explained_by=((self.bfw, self.rfw), (self.base, self.raw), self._optimizers),
            notes=kept.summarised(),
            step_summary=tuple(kept.rows[k] for k in sorted(kept.rows)),
        )
        return spilled(result, self._spill_above)

    def _dropout_warning(self) -> list[str]:
        """What watching changed in the user's own run: dropout, turned off so both sides agree."""
        off = [f"base {x}" for x in self._b.dropout_off] + [f"raw {x}" for x in self._r.dropout_off]
        if not off:
            return []
        more = f" and {len(off) - 6} more" if len(off) > 6 else ""
        return [
            f"dropout was off while watching ({', '.join(off[:6])}{more}): both models must compute the same "
            "thing, so the steps you watched are not the ones your loop makes without nbdiff; the rates are back "
            "as they were. Dropout that a layer's code applies at a fixed rate (F.dropout(x, 0.1)) cannot be "
            "turned off: if the outputs differ from such a layer on, compare in eval mode."
        ]


def _begins(boundary: StepBoundary, side: ModelSession) -> Callable[[Any, tuple, dict], None]:
    """A root model's forward pre-hook: a step of ``side`` begins. A function, not a ``partial``: the
    pairing probe deep-copies raw with its hooks, and copy takes a function as it is but copies a
    partial's arguments (the whole watch, which cannot be copied: raw itself was probed)."""

    def pre(layer: Any, args: tuple, kwargs: dict) -> None:
        boundary.begins(side, args, kwargs)

    return pre
