"""``watch``: record two models while the user's own code runs them, then compare step by step.

This is what ``%%modeldiff`` runs around a cell. Each call of a root model starts a
step; the code must call base before raw in every step (base then raw forward,
loss, backward and optimizer steps, in any arrangement after that).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.optimizer_settings import OptimizerLog, optimizer_params
from nbdiff.align.pairing import Pairing
from nbdiff.engine.gc_pause import gc_paused
from nbdiff.engine.kept import KEEP_STEPS
from nbdiff.engine.live.comparer import LiveComparer
from nbdiff.engine.live.feed import feed_for
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
from nbdiff.judge.blame import require_compared
from nbdiff.judge.tolerance import Tolerance
from nbdiff.result import DiffResult
from nbdiff.trace.interrupts import is_interrupt
from nbdiff.trace.modes import kept_rng
from nbdiff.trace.recorder import Feed
from nbdiff.trace.session import ModelSession
from nbdiff.trace.spool import MEMORY_MIB, Spool, give_back_heap
from nbdiff.trace.structure import forward_structure
from nbdiff.weights.assign import WeightMap, plan_pairing, plan_weights, write_weights

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
        self._cmp = LiveComparer(
            self.bfw, base, self.rfw, raw, self._tol, compare_mode, diff_phase, layer_map, self._spool, bool(auto_init)
        )
        self._stack = ExitStack()
        self._optimizers = OptimizerLog()
        self._copied: WeightMap | None = None
        self._pairing0: Pairing | None = None
        self._probing = False
        self._warnings: list[str] = []
        self._seen: Any = None
        self._steps = WatchedSteps(
            self._b, self._r, self._cmp, self._optimizers, self._tol, keep_steps, framework_differences == "fail"
        )
        self._deferred: Exception | None = None  # what went wrong comparing while the code ran

    def _tol(self, a: str, b: str) -> Tolerance:
        return self.spec.tol(a, b)

    # -- recording -------------------------------------------------------------
    def __enter__(self) -> watch:
        stack = self._stack
        try:
            if self.options["auto_init"]:
                self._copy_by_structure()
            for side in (self._b, self._r):
                side.install(stack, self._on_root(side))
            # The optimizers the cell steps, to name their settings when an update is blamed.
            # ... and what each step left: a parameter written after it is not the optimizer's doing.
            self._optimizers.listen(stack, (self.bfw, self.rfw), self._stepped)
            seen = counter("nbdiff: steps seen")  # raw's calls, as the user's loop makes them
            self._seen = seen
            stack.callback(seen.close)
        except BaseException:
            stack.close()
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
        try:
            for side in (self._b, self._r):
                side.end()
        finally:
            self._stack.close()
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

    def _stepped(self, optimizer: Any) -> None:
        held = {id(p) for p in optimizer_params(optimizer)}
        for side in (self._b, self._r):
            side.stepped(held)

    def _copy_by_structure(self) -> None:
        try:
            wmap = plan_weights(self.base, self.raw, self.layer_map)[2]
            write_weights(self.bfw, self.base, self.rfw, self.raw, wmap)
            self._copied = wmap
        except WeightTransferError:
            self._copied = None  # paired by execution when raw first runs

    def _on_root(self, side: ModelSession) -> Any:
        def pre(layer: Any, args: tuple, kwargs: dict) -> None:
            if self._probing:
                return
            if side is self._r and self._r.steps >= self._b.steps and self._needs_base_first():
                raise InputError(
                    "With --single-step (or auto_init without a structure match) the base model must run "
                    f"first in every step: raw was called for step {self._r.steps} before base. Call base, "
                    "then raw, in the cell."
                )
            if side is self._b:
                self._compare_finished()
            side.begin_step()
            if side is self._r:
                self._before_raw_step(args, kwargs)

        return pre

    def _needs_base_first(self) -> bool:
        return bool(self.options["single_step"]) or (bool(self.options["auto_init"]) and self._copied is None)

    def _before_raw_step(self, args: tuple, kwargs: dict) -> None:
        if self._seen is not None:
            self._seen.update(1)
        k = self._r.steps - 1
        if self._pairing0 is None and (self.options["auto_init"] or self.options["single_step"]):
            if self._b.steps == 0:
                return  # raw runs first and nothing needs base: recorded as is
            self._pairing0 = self._probe(args, kwargs)
            if self.options["auto_init"]:
                wmap = plan_pairing(self.bfw, self.base, self.rfw, self.raw, self._pairing0)
                if self._copied is None or not self._copied.covers(wmap):
                    self._write_base_start(wmap)
                    self._r.weights[-1] = self._r.weights_now()
                    self._copied = wmap
        if self.options["single_step"] and self._pairing0 is not None:
            self._r.recorder.feed = self._feed(k)

    def _probe(self, args: tuple, kwargs: dict) -> Pairing:
        """Pair raw's layer calls with base's step 0, from one no-grad forward of a copy of raw on a copy
        of the arguments: the user's model runs only as often as the user's code calls it, and its state
        (a KV cache, a counter, a cache object passed in) stays the user's."""
        try:
            model, call = copy.deepcopy(self.raw), copy.deepcopy((args, kwargs))
        except Exception as exc:  # a model holding what cannot be copied (a lock, a process group)
            model, call = self.raw, (args, kwargs)
            self._warnings.append(
                f"raw could not be copied for the pairing probe ({type(exc).__name__}: {exc}); it was called once "
                "more before its first step, its Python-side state put back"
            )
        # A layer drawing random numbers in forward draws them from the user's generators.
        with kept_rng((self.bfw, self.rfw)), self._paused():
            raw_fwd = forward_structure(self.rfw, model, call, "raw", train=True, root=False)
        base_fwd = self._b.recorder.step_events(0, self._b.grads)[0]
        root = [e for e in base_fwd if e.depth == 0][:1]
        probed = StepRecord(_with_root(root, raw_fwd, self.raw), [], [])
        return self._cmp.pair(StepRecord(base_fwd, [], []), probed, plan=False)[0]

    def _write_base_start(self, wmap: WeightMap) -> None:
        """Base's weights as its step 0 began into raw: base's optimizer may have stepped already. Base's
        own are put there and back only then: a graph of base still to be backpropagated (gradients
        accumulated over calls) refuses parameters written in place."""
        now = self._b.weights_now(held=False)
        start = self._b.weights[0]
        if all(np.array_equal(now[i], start[i]) for i in start):
            write_weights(self.bfw, self.base, self.rfw, self.raw, wmap)
            return
        self._b.load(start)
        try:
            write_weights(self.bfw, self.base, self.rfw, self.raw, wmap)
        finally:
            self._b.load(now)

    def _feed(self, k: int) -> Feed:
        """Base inputs and output gradients of step ``k``, keyed by raw's running call numbers."""
        assert self._pairing0 is not None
        fwd, bwd, _ = self._b.recorder.step_events(k, self._b.grads)  # this step only, each step
        feed = feed_for(StepRecord(fwd, bwd, []), self._pairing0, str(self.options["diff_phase"]))
        # Calls of this step are numbered after those of earlier steps (the recorder's root
        # hook runs after this one, so the root's current call is not counted yet either).
        shift = self._r.recorder.call_counts()
        rekey = lambda d: {(path, call + shift.get(path, 0)): v for (path, call), v in d.items()}  # noqa: E731
        return Feed(rekey(feed.inputs), rekey(feed.grads))

    # -- comparing -------------------------------------------------------------
    def _compare_finished(self) -> None:
        """Compare the steps both models finished while the code runs, as base begins a step (nothing
        of it has run), and let their recordings go: a long loop holds two steps, not all of them,
        and the step chart keeps each step's worst errors (:class:`KeptSteps`). Only once every step
        held is :meth:`~nbdiff.trace.recorder.Recorder.settled` on both sides: a replay writes the old
        weights into the user's parameters and back, which a graph still to be backpropagated would
        refuse. What goes wrong is raised when the block ends; the user's loop goes on untouched."""
        j = self._b.steps
        if self._deferred is not None or self._r.steps != j or j - self._steps.done < 2:
            return
        if not (self._b.recorder.settled() and self._r.recorder.settled()):
            return
        now = (self._b.weights_now(held=False), self._r.weights_now(held=False))
        # One step's comparison is bounded work: the collector's passes over what it holds find nothing.
        with kept_rng((self.bfw, self.rfw)), self._paused(), gc_paused():
            try:
                bsteps = self._b.recorder.take_steps(self._b.grads, keep=1)
                rsteps = self._r.recorder.take_steps(self._r.grads, keep=1)
                for brec, rrec in zip(bsteps, rsteps):
                    self._steps.compare(StepRecord(*brec), StepRecord(*rrec))
            except Exception as exc:  # noqa: BLE001 - kept, raised when the block ends
                self._deferred = exc
            finally:
                self._b.load(now[0])
                self._r.load(now[1])

    @contextmanager
    def _paused(self) -> Iterator[None]:
        """nbdiff's own replays are neither steps nor recorded calls nor the user's gradients."""
        self._probing = True
        self._b.recorder.paused = self._r.recorder.paused = True
        try:
            yield
        finally:
            self._probing = False
            self._b.recorder.paused = self._r.recorder.paused = False

    def _compare(self, interrupted: bool = False) -> DiffResult | None:
        if self._deferred is not None:
            raise self._deferred
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
        intro = self._warnings + self._dropout_warning()
        if interrupted:
            intro.append(
                f"interrupted in step {n}: the {n} step(s) both models completed are compared, the one in progress is not."
            )
        elif nb != nr:
            intro.append(f"base ran {nb} step(s), raw {nr}: compared the first {n}.")
        verdict.warnings[:0] = intro
        final = (self._b.weights_now(), self._r.weights_now())
        try:
            for k in progress(range(done, n), "nbdiff: comparing steps", total=n - done):
                self._steps.compare(StepRecord(*bsteps[k - done]), StepRecord(*rsteps[k - done]))
        finally:
            self._b.load(final[0])
            self._r.load(final[1])
        if self._spool.failure:
            verdict.warnings.append(f"{self._spool.failure}: the rest of the recording was held in memory")
        if not kept.outputs:
            require_compared((), type(self.base).__name__)
        pairing = self._steps.pairing
        result = verdict.finish(
            (self.bfw.name, self.rfw.name, type(self.base).__name__, type(self.raw).__name__),
            (pairing.unmatched_base, pairing.unmatched_raw) if pairing else ((), ()),
            dict(self.options, weight_map=self._copied),
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


def _with_root(root: list[Any], raw_fwd: list[Any], raw: Any) -> list[Any]:
    """The probe skips raw's root (its hooks are running); add a root event shaped like base's."""
    if not root:
        return raw_fwd
    r = replace(root[0], path="", type_name=type(raw).__name__, layer=raw, inputs=(), stack=())
    shifted = (
        replace(e, order=e.order + 1, depth=e.depth + 1, parent=(e.parent + 1) if e.parent is not None else 0)
        for e in raw_fwd
    )
    return [r, *shifted]
