"""Where a watched step begins: the only work ``watch`` does while the user's loop runs.

The root models' forward pre-hooks record and call :meth:`StepBoundary.begins`; everything else is
here, at the step boundary. As base begins a step, the steps both models finished are compared and
let go (:class:`~nbdiff.engine.live.watched.WatchedSteps`). As raw begins its first step, its calls
are paired with base's step 0 by a probe (a copy of raw on a copy of the arguments) and, with
``auto_init``, base's weights are copied into raw by that pairing where the structure copy could not;
with ``single_step``, each raw step is then fed base's values of the same step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.pairing import Pairing
from nbdiff.engine.gc_pause import gc_paused
from nbdiff.engine.live.comparer import LiveComparer
from nbdiff.engine.live.feed import feed_for
from nbdiff.engine.live.watched import WatchedSteps
from nbdiff.engine.types import StepRecord
from nbdiff.errors import InputError
from nbdiff.trace.modes import kept_rng
from nbdiff.trace.recorder import Feed
from nbdiff.trace.session import ModelSession
from nbdiff.trace.structure import forward_structure
from nbdiff.weights.assign import WeightMap, plan_pairing, write_weights

__all__ = ["StepBoundary"]


class StepBoundary:
    """What happens as each side of a watched run begins a step. ``copied``: the weight map base's
    weights were copied into raw by (``None``: not copied yet, or the structures did not match)."""

    def __init__(
        self,
        sides: tuple[ModelSession, ModelSession],
        models: tuple[Any, Any],
        cmp: LiveComparer,
        steps: WatchedSteps,
        options: dict[str, Any],
        copied: WeightMap | None,
    ) -> None:
        self.b, self.r = sides
        self.base, self.raw = models
        self.cmp, self.steps, self.copied = cmp, steps, copied
        self.auto_init, self.single_step = bool(options["auto_init"]), bool(options["single_step"])
        self.diff_phase = str(options["diff_phase"])
        self.warnings: list[str] = []
        self.deferred: Exception | None = None
        """What went wrong comparing while the code ran: raised when the block ends."""
        self.seen: Any = None
        """A counter of raw's steps, as the user's loop makes them."""
        self._pairing0: Pairing | None = None
        self._probing = False

    def begins(self, side: ModelSession, args: tuple, kwargs: dict) -> None:
        """``side``'s root model was called (before its forward): a step begins, unless nbdiff itself called it."""
        if self._probing:
            return
        if side is self.r and self.r.steps >= self.b.steps and self._needs_base_first():
            raise InputError(
                "With --single-step (or auto_init without a structure match) the base model must run "
                f"first in every step: raw was called for step {self.r.steps} before base. Call base, "
                "then raw, in the cell."
            )
        if side is self.b:
            self._compare_finished()
        side.begin_step()
        if side is self.r:
            self._raw_begins(args, kwargs)

    def _needs_base_first(self) -> bool:
        return self.single_step or (self.auto_init and self.copied is None)

    def _raw_begins(self, args: tuple, kwargs: dict) -> None:
        if self.seen is not None:
            self.seen.update(1)
        k = self.r.steps - 1
        if self._pairing0 is None and (self.auto_init or self.single_step):
            if self.b.steps == 0:
                return  # raw runs first and nothing needs base: recorded as is
            self._pairing0 = self._probe(args, kwargs)
            if self.auto_init:
                wmap = plan_pairing(self.b.fw, self.base, self.r.fw, self.raw, self._pairing0)
                if self.copied is None or not self.copied.covers(wmap):
                    self._write_base_start(wmap)
                    self.r.weights[-1] = self.r.weights_now()
                    self.copied = wmap
        if self.single_step and self._pairing0 is not None:
            self.r.recorder.feed = self._feed(k)

    def _probe(self, args: tuple, kwargs: dict) -> Pairing:
        """Pair raw's layer calls with base's step 0, from one no-grad forward of a copy of raw on a copy
        of the arguments, without its forward hooks: the user's model and hooks run only as often as the
        user's code calls it, and its state (a KV cache, a counter, a cache object passed in) stays the user's."""
        try:
            model, call = copy.deepcopy(self.raw), copy.deepcopy((args, kwargs))
            self.r.fw.drop_forward_hooks(model)  # the user's hooks (and nbdiff's, idle now) came along
        except Exception as exc:  # a model holding what cannot be copied (a lock, a process group)
            model, call = self.raw, (args, kwargs)
            self.warnings.append(
                f"raw could not be copied for the pairing probe ({type(exc).__name__}: {exc}); it was called once "
                "more before its first step, its Python-side state put back"
            )
        # A layer drawing random numbers in forward draws them from the user's generators.
        with kept_rng((self.b.fw, self.r.fw)), self.paused():
            raw_fwd = forward_structure(self.r.fw, model, call, "raw", train=True, root=False)
        base_fwd = self.b.recorder.step_events(0, self.b.grads)[0]
        root = [e for e in base_fwd if e.depth == 0][:1]
        probed = StepRecord(_with_root(root, raw_fwd, self.raw), [], [])
        return self.cmp.pair(StepRecord(base_fwd, [], []), probed, plan=False)[0]

    def _write_base_start(self, wmap: WeightMap) -> None:
        """Base's weights as its step 0 began into raw: base's optimizer may have stepped already. Base's
        own are put there and back only then: a graph of base still to be backpropagated (gradients
        accumulated over calls) refuses parameters written in place."""
        bfw, rfw = self.b.fw, self.r.fw
        now = self.b.weights_now(held=False)
        start = self.b.weights[0]
        if all(np.array_equal(now[i], start[i]) for i in start):
            write_weights(bfw, self.base, rfw, self.raw, wmap)
            return
        self.b.load(start)
        try:
            write_weights(bfw, self.base, rfw, self.raw, wmap)
        finally:
            self.b.load(now)

    def _feed(self, k: int) -> Feed:
        """Base inputs and output gradients of step ``k``, keyed by raw's running call numbers."""
        assert self._pairing0 is not None
        fwd, bwd, _ = self.b.recorder.step_events(k, self.b.grads)  # this step only, each step
        feed = feed_for(StepRecord(fwd, bwd, []), self._pairing0, self.diff_phase)
        # Calls of this step are numbered after those of earlier steps (the recorder's root
        # hook runs after this one, so the root's current call is not counted yet either).
        shift = self.r.recorder.call_counts()
        rekey = lambda d: {(path, call + shift.get(path, 0)): v for (path, call), v in d.items()}  # noqa: E731
        return Feed(rekey(feed.inputs), rekey(feed.grads))

    def _compare_finished(self) -> None:
        """Compare the steps both models finished while the code runs, as base begins a step (nothing
        of it has run), and let their recordings go: a long loop holds two steps, not all of them,
        and the step chart keeps each step's worst errors (:class:`KeptSteps`). Only once every step
        held is :meth:`~nbdiff.trace.recorder.Recorder.settled` on both sides: a replay writes the old
        weights into the user's parameters and back, which a graph still to be backpropagated would
        refuse. What goes wrong is raised when the block ends; the user's loop goes on untouched."""
        j = self.b.steps
        if self.deferred is not None or self.r.steps != j or j - self.steps.done < 2:
            return
        if not (self.b.recorder.settled() and self.r.recorder.settled()):
            return
        # One step's comparison is bounded work: the collector's passes over what it holds find nothing.
        pause = gc_paused()
        with kept_rng((self.b.fw, self.r.fw)), self.paused(), pause:
            try:
                bsteps = self.b.recorder.take_steps(self.b.grads, keep=1)
                rsteps = self.r.recorder.take_steps(self.r.grads, keep=1)
                for brec, rrec in zip(bsteps, rsteps):
                    self.steps.compare(StepRecord(*brec), StepRecord(*rrec))
            except Exception as exc:  # noqa: BLE001 - kept, raised when the block ends
                self.deferred = exc
            finally:
                self.steps.give_back_weights()
                pause.restore()  # here too: a Ctrl-C handled as its __exit__ began left the collector off

    @contextmanager
    def paused(self) -> Iterator[None]:
        """nbdiff's own replays are neither steps nor recorded calls nor the user's gradients."""
        self._probing = True
        self.b.recorder.paused = self.r.recorder.paused = True
        try:
            yield
        finally:
            self._probing = False
            self.b.recorder.paused = self.r.recorder.paused = False


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
