"""Live steps: both models are here (``auto_diff``, ``watch``). Local errors are measured by replay,
parameter gradients read from the layers or the recorded copies, weights and running statistics
compared and set between steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pair, Pairing
from nbdiff.engine.backward import GradsOf
from nbdiff.engine.comparer import StepComparer, StepComparison
from nbdiff.engine.conditioning import MARGIN
from nbdiff.engine.constants import constant_differences
from nbdiff.engine.forward import api_local
from nbdiff.engine.layouts import records_of
from nbdiff.engine.replay import Replayer, paired_param_grads
from nbdiff.engine.ties import tie_differences
from nbdiff.engine.training.outside import Writes
from nbdiff.engine.training.state import State, StepStates, has_state, state_diffs
from nbdiff.engine.training.updates import GradientSpread, snapshot, snapshot_updates
from nbdiff.engine.types import Plans, Snapshot, StepRecord, TolFn
from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.origin.stack import Frame
from nbdiff.trace.spool import Spool
from nbdiff.weights.assign import WeightMap, execution_pairs, plan_pairing
from nbdiff.weights.fused import fused_layers
from nbdiff.weights.plan import layer_tensors

__all__ = ["LiveComparer", "ParamGrads", "live_param_grads", "held_param_grads"]


ParamGrads = Callable[[Framework, Any, bool], dict[str, np.ndarray]]
"""``(framework, layer, recursive) -> {name: gradient}`` of a layer's parameters."""


KEEPS_STATE = "it keeps state between calls (a counter, a cache): running it again is not the call the step made"


def live_param_grads(fw: Framework, layer: Any, recursive: bool) -> dict[str, np.ndarray]:
    """The gradients the parameters hold now (views: paddle zeroes them in place later)."""
    return {n: g for n, p in layer_tensors(fw, layer, recursive).items() if (g := _live_grad(fw, p)) is not None}


def held_param_grads(held: dict[int, np.ndarray], live: bool = True) -> ParamGrads:
    """Gradients from recorded copies (``id`` of a parameter -> gradient); with ``live``, those not
    recorded are copied from the parameters. Copies, as comparisons want them: read again later
    (lazy metrics), they must not change meanwhile."""

    def of(fw: Framework, layer: Any, recursive: bool) -> dict[str, np.ndarray]:
        out = {}
        for n, p in layer_tensors(fw, layer, recursive).items():
            g = held.get(id(p))
            if g is None and live and (g := _live_grad(fw, p)) is not None:
                g = g.copy()
            if g is not None:
                out[n] = g
        return out

    return of


def _live_grad(fw: Framework, p: Any) -> np.ndarray | None:
    g = fw.grad_of(p) if fw.is_trainable(p) else None
    return None if g is None else fw.to_numpy(g)


class LiveComparer(StepComparer):
    """Steps of two models held here. ``strict``: the first step's weight plan must cover every
    paired layer (``auto_init``); ``spool``: where the recordings are held, told what each
    comparison read so their pages can go."""

    def __init__(
        self,
        bfw: Framework, base: Any, rfw: Framework, raw: Any, tol: TolFn, mode: str, diff_phase: str = "both",
        layer_map: LayerMap | None = None, spool: Spool | None = None, strict: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(tol, mode, diff_phase, layer_map)
        self.bfw, self.base, self.rfw, self.raw, self.spool, self.strict = bfw, base, rfw, raw, spool, strict
        self.blayers = dict(bfw.named_layers(base))
        self.rlayers = dict(rfw.named_layers(raw))
        self.wmap: WeightMap | None = None
        """The first step's weight plan, as a map (``result.options["weight_map"]``)."""
        self.replayer: Replayer | None = None
        self._evidence: dict[int, tuple[TensorRecord, ...]] = {}
        """By raw event (its id, within one step's comparison): the replay's failing sublayer inputs."""
        self._received: set[int] = set()
        """Base events (their ids, within one step's comparison) judged from what they received."""
        self._sequences: dict[str, list[Any]] = {}
        """Raw groups run in turn (a norm then its activation module), by group path, for their replay."""

    def layers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.blayers, self.rlayers

    def paired(self, pairing: Pairing) -> None:
        # A fused group stands for its members wherever a base layer is looked up by path.
        self.blayers.update(fused_layers(self.blayers, pairing.fused))
        self.rlayers.update(fused_layers(self.rlayers, pairing.fused, "raw"))
        # Raw's norm then activation, where base's layer applies its activation itself: run again in turn.
        self._sequences = {
            g.path: [self.rlayers[m] for m in g.members]
            for g in pairing.fused
            if g.side == "raw" and g.layout is None and not g.applied
        }

    def decide_plans(self, pairing: Pairing) -> tuple[Plans, list[str]]:
        wmap = plan_pairing(self.bfw, self.base, self.rfw, self.raw, pairing, strict=self.strict)
        plans = wmap.by_base_path()
        self.wmap, self.replayer = wmap, Replayer(self.bfw, self.rfw, plans, self.tol, self.mode)
        pairs = execution_pairs(pairing)
        return plans, [
            *wmap.warnings,
            *constant_differences(self.bfw, self.blayers, self.rfw, self.rlayers, pairs, self.tol),
            *tie_differences(self.bfw, self.blayers, self.rfw, self.rlayers, pairs),
        ]

    def grads_of(self, brec: StepRecord, rrec: StepRecord, grads: ParamGrads | None) -> GradsOf:
        """By default, the copies the records hold, else the live gradients."""
        if grads is None:
            grads = held_param_grads({**brec.param_grads, **rrec.param_grads})
        plans, bfw, rfw = self.plans, self.bfw, self.rfw

        def of(p: Pair, b: Event, r: Event) -> tuple[tuple[TensorRecord, ...], dict[str, TensorRecord]]:
            plan = plans.get(p.base.path)
            if plan is None or p.base.call != 0 or plan.raw_path != p.raw.path:
                return (), {}
            bg = grads(bfw, self.blayers[p.base.path], plan.recursive)
            rg = grads(rfw, self.rlayers[p.raw.path], plan.recursive)
            paired = paired_param_grads(bg, rg, plan)
            return records_of({n: v for n, v, _ in paired}), {
                t.name: t for t in records_of({n: v for n, _, v in paired})
            }

        return of

    def local_layer(self, d: EventDiff, kids: list[tuple[Event, Event]]) -> tuple[TensorDiff, ...] | None:
        assert self.replayer is not None
        raw = d.raw
        if raw.layer is None and raw.path in self._sequences:
            raw = replace(raw, layer=self.rfw.sequence(self._sequences[raw.path]))
        self.replay_ready()
        local = self.replayer.forward(d.base, raw, kids)
        if self.replayer.evidence:
            self._evidence[id(d.raw)] = self.replayer.evidence
        return local

    def judged_from_received(self, d: EventDiff) -> tuple[TensorDiff, ...] | None:
        """A layer that keeps state between calls (a counter, a cache) is not run again: what it made of
        inputs that agree, every sublayer call inside it agreeing, is its own code's (after or around
        those sublayers); where its inputs differ, it stays not measured."""
        if self.replayer is None or not self.replayer.kept_state:
            return None
        own = api_local(d, self.tol, self.mode, "inputs", MARGIN) or None
        if own:
            self._received.add(id(d.base))
        return own

    def how_local(self, f: Divergence) -> Divergence:
        if f.event is not None and id(f.event.base) in self._received:
            return replace(f, local_by="received", unmeasured=KEEPS_STATE)
        return f

    def with_evidence(
        self, diffs: list[EventDiff], found: list[Divergence]
    ) -> tuple[list[EventDiff], list[Divergence]]:
        kept, self._evidence = self._evidence, {}
        if not kept:  # nothing failed inside a layer's own code: nothing to attach
            return diffs, found
        diffs = [replace(d, evidence=kept[id(d.raw)]) if id(d.raw) in kept else d for d in diffs]
        now = {id(d.raw): d for d in diffs if id(d.raw) in kept}
        return diffs, [
            replace(f, event=now[id(f.event.raw)]) if f.event and id(f.event.raw) in now else f for f in found
        ]

    def local_backward(
        self, brec: StepRecord, rrec: StepRecord, d: EventDiff, kids: list[tuple[Event, Event]]
    ) -> tuple[TensorDiff, ...] | None:
        bf, rf = brec.forward_of(d.base), rrec.forward_of(d.raw)
        if bf is None or rf is None or self.replayer is None:
            return None
        self.replay_ready()
        return self.replayer.backward(bf, rf, d.base)

    def rounding_gated(self, brec: StepRecord, rrec: StepRecord, found: Divergence) -> str | None:
        d = found.event
        if d is None or self.replayer is None:
            return None
        bf, rf = brec.forward_of(d.base), rrec.forward_of(d.raw)
        if bf is None or rf is None or not bf.inputs or len(bf.inputs) != len(rf.inputs):
            return None
        self.replay_ready()
        swapped = self.replayer.backward_on_raw_inputs(bf, rf, d.base, d.raw)
        if not swapped or not all(t.passed for t in swapped):
            return None
        return (
            f"step {d.base.step}, backward: `{d.base.path or '<root>'}` ({d.base.type_name}) hands back gradients "
            f"{d.ratio:.3g}x their tolerance apart, from forward inputs the forward comparison accepted: base's own "
            "layer, run on raw's inputs, hands back raw's gradients (a gate, such as a ReLU's mask, that rounding "
            "flipped for a few values; a weight gradient summed from inputs that differ by rounding), so it is not "
            "reported as a divergence"
        )

    def read(self, b: Event, r: Event) -> None:
        if self.spool is not None and self.spool.written:  # nothing in the file: no pages to count
            self.spool.read(*(t.value for e in (b, r) for t in (*e.inputs, *e.outputs, *e.params, *e.given)))

    def done_reading(self) -> None:
        self._received = set()
        if self.spool is not None:
            self.spool.trim()

    # -- between steps ---------------------------------------------------------
    def snapshot(self, copy: bool = True) -> tuple[Snapshot, Snapshot]:
        """Trainable tensors of every planned layer, both sides, as copies (``copy=False``: as the
        frameworks hand them, for reading at once)."""
        plans = self.plans
        return (
            snapshot(self.bfw, self.blayers, plans, "base", copy),
            snapshot(self.rfw, self.rlayers, plans, "raw", copy),
        )

    def feed_optimizer(self, grads: ParamGrads | None = live_param_grads) -> None:
        """Give raw base's weights and gradients (converted), so both optimizers step from the same
        point: their updates then differ only by the optimizers' own error. Without this, Adam turns
        rounding-level gradients (a key bias whose true gradient is 0) into lr-sized differences.
        ``grads=None``: the weights only (before a step, so it starts where base's does)."""
        bfw, rfw = self.bfw, self.rfw
        for plan in self.plans.values():
            bl, rl = self.blayers[plan.base_path], self.rlayers[plan.raw_path]
            weights = {n: bfw.to_numpy(t) for n, t in layer_tensors(bfw, bl, plan.recursive).items()}
            theirs = layer_tensors(rfw, rl, plan.recursive)
            try:
                w = plan.convert(weights)
                g = plan.convert(grads(bfw, bl, plan.recursive)) if grads is not None else {}
            except (KeyError, ValueError):
                continue
            for n, t in theirs.items():
                if n in w and rfw.is_trainable(t) and tuple(w[n].shape) == rfw.shape_of(t):
                    rfw.set_value(t, w[n])
                held = rfw.grad_of(t) if n in g and rfw.is_trainable(t) else None
                if held is not None and tuple(g[n].shape) == rfw.shape_of(held):
                    rfw.set_value(held, g[n])

    def compare_state(
        self,
        step: int,
        before: State | None = None,
        brec: StepRecord | None = None,
        rrec: StepRecord | None = None,
        kept: StepStates | None = None,
    ) -> StepComparison:
        """Running statistics after a train-mode step, then raw's set to base's (as weights are);
        ``before`` and the step's records let known framework differences be verified, and tell a layer
        that received other inputs (its statistics inherit that) (:mod:`nbdiff.engine.training.state`). A watched
        step's are read from ``kept`` and raw's left as the user's code made them."""
        forward = (brec.forward if brec else [], rrec.forward if rrec else [])
        found, diffs = state_diffs(
            (self.bfw, self.rfw), (self.blayers, self.rlayers), self.plans, self.tol, self.mode, step, before,
            *forward, kept=kept,
        )  # fmt: skip
        return StepComparison(found, diffs)

    def keeps_state(self) -> bool:
        """Whether a planned base layer in train mode keeps running statistics (compare them after each step)."""
        return has_state(self.bfw, self.blayers, self.plans)

    def compare_snapshots(
        self,
        step: int,
        before: tuple[Snapshot, Snapshot],
        after: tuple[Snapshot, Snapshot],
        stacks: tuple[tuple[Frame, ...], tuple[Frame, ...]] = ((), ()),
        grads: Callable[[], GradientSpread] | None = None,
        writes: Writes | None = None,
        into_before: bool = False,
        compared: StepComparison | None = None,
    ) -> StepComparison:
        """The optimizers' updates (after minus before) compared; ``stacks``: where each side's
        optimizer was stepped, shown for its updates; ``writes``: what was written outside them;
        ``into_before``: the updates may be written over ``before``'s arrays; ``compared``: the step's
        forward and backward comparison (see :meth:`compare_updates`)."""
        updates = snapshot_updates(step, self.plans, before, after, into_before, stacks)
        return self.compare_updates(updates, grads, compared, writes)
