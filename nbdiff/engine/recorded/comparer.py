"""Recorded steps: two dumps written by :func:`nbdiff.record`, without the models (``compare``).

Without the models there is no replay, so the local error of an event is judged from what the
dump holds: an event whose own inputs agree (forward: the tensors passed in; backward: the
gradients arriving at its outputs) but whose results do not is where the error arises; one whose
inputs already differ inherited it. Parameter gradients and updates are converted between layouts
with the same weight rules as ``assign_weight``, found by the layer classes the dump recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedGroup, member_name, stand_ins
from nbdiff.align.pairing import Pair, Pairing
from nbdiff.align.received import received_pairs
from nbdiff.engine.backward import GradsOf
from nbdiff.engine.comparer import StepComparer, StepComparison
from nbdiff.engine.conditioning import MARGIN
from nbdiff.engine.forward import api_local, by_statistics, received_differ, received_ratio, tensor_diffs
from nbdiff.engine.layouts import converted, converted_records
from nbdiff.engine.recorded.dump_steps import (
    layer_args,
    recorded_step,
    step_param_grads,
    subtree_params,
    updates_by_path,
)
from nbdiff.engine.recorded.rebuilt import (
    RebuiltSide,
    mirrored,
    plan_snapshot,
    rebuilt_local,
    rebuilt_local_backward,
    weightless,
)
from nbdiff.engine.recorded.recomputed import BatchNormCall, read_off, recorded_batch_norm, rounding_move
from nbdiff.engine.replay import compare_param_grads
from nbdiff.engine.training.drift import Explanation, drift_note, followed
from nbdiff.engine.training.state import recorded_state_diffs
from nbdiff.engine.training.updates import GradientSpread, Updates
from nbdiff.engine.types import Plans, Snapshot, StepRecord, TolFn
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.capture import BATCH_NORMS
from nbdiff.trace.dump.store import RankDump
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.weights.fused import fused_plan, unfused_plan
from nbdiff.weights.plan import LayerWeights, plan_by_classes

__all__ = ["RecordedComparer"]


_NOT_REBUILT = {
    "between": "a layer with sublayers is not rebuilt offline",
    "api": "an API call is not run again offline",
}


JUMP = 100.0
"""How many times what a sublayer made a layer's own code must hand the next one before that code, not the
sublayer, is where a difference came from: rounding grows through code, not by orders of magnitude."""


def _value(records: tuple[TensorRecord, ...]) -> np.ndarray | None:
    return records[0].value if records else None


class RecordedComparer(StepComparer):
    """Steps of one rank of two dumps (``a``: base, ``b``: raw)."""

    require_pairs = False

    def __init__(self, a: RankDump, b: RankDump, tol: TolFn, mode: str) -> None:
        super().__init__(tol, mode)
        self.a, self.b = a, b
        self._layers: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._groups: tuple[FusedGroup, ...] = ()
        self.arguments = (layer_args(a), layer_args(b))
        """Each side's layer arguments by path, as the dumps keep them."""
        self._amplified: list[tuple[str, float]] = []
        """This step's layers that amplified differences within tolerance past it: (path, ratio)."""
        self._recomputed_events: set[int] = set()
        """``id`` of this step's base events whose own error a recomputed layer measured."""
        self.sides = (RebuiltSide(a), RebuiltSide(b))
        """Each side's recorded weights by step; raw's layers rebuilt from its dump to measure a local
        error on base's inputs (tensor dumps)."""
        self.follow: Snapshot = {}
        """Raw's weights at the step compared as base's updates would have moved them (:mod:`nbdiff.engine.training.drift`)."""
        self.position = 0
        """The step compared: its place in the dumps (not its training number)."""
        self._rebuilt_events: set[int] = set()
        """``id`` of this step's base events whose local error a rebuild measured."""
        self.not_measured: dict[int, str] = {}
        """``id`` of this step's base events judged from the dump: why no rebuild measured them."""
        self.spread: GradientSpread | None = GradientSpread()
        """The gradients each optimizer was given, folded in up to the step compared (until a divergence)."""

    def layers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Stand-ins for the recorded layers, with the facts pairing reads (fused layouts)."""
        if self._layers is None:
            a, b = self.a, self.b
            self._layers = (
                stand_ins(a.layers, a.meta.get("layer_facts", {})),
                stand_ins(b.layers, b.meta.get("layer_facts", {})),
            )
        return self._layers

    def decide_plans(self, pairing: Pairing) -> tuple[Plans, list[str]]:
        a, b = self.a, self.b
        plans: Plans = {}
        base_groups = {g.path: g for g in pairing.fused if g.side == "base"}
        raw_groups = {g.path: g for g in pairing.fused if g.side == "raw"}
        self._groups = pairing.fused
        for p in pairing.pairs:
            if p.base.path not in plans:
                plans[p.base.path] = self._plan(p.base.path, p.raw.path, base_groups, raw_groups)
        raw_taken = {p.raw_path for p in plans.values()}
        for path, classes in a.layers.items():  # layers that never ran: their updates, by the same path
            if path not in plans and path in b.layers and path not in raw_taken:
                plans[path] = plan_by_classes(a.framework, path, classes, b.framework, path, b.layers[path])
        return plans, []

    def _plan(self, bpath: str, rpath: str, base_groups: dict, raw_groups: dict) -> LayerWeights:
        """The plan of one recorded pair by the layers' classes; a fused group's from its members'."""
        a, b = self.a, self.b
        by_classes = lambda bp, rp: plan_by_classes(  # noqa: E731
            a.framework, bp, a.layers.get(bp, []), b.framework, rp, b.layers.get(rp, [])
        )
        group = base_groups.get(bpath)
        if group is not None and group.layout is not None:
            members = {member_name(m): by_classes(m, rpath) for m in group.members}
            btype = "+".join(p.base_type for p in members.values())
            return fused_plan(group, members, b.framework, rpath, (b.layers.get(rpath) or ["?"])[0], btype)
        group = raw_groups.get(rpath)
        if group is not None and group.layout is not None:
            members = {member_name(m): by_classes(bpath, m) for m in group.members}
            rtype = "+".join(p.raw_type for p in members.values())
            return unfused_plan(group, bpath, (a.layers.get(bpath) or ["?"])[0], a.framework, members, rtype)
        return by_classes(bpath, rpath)

    def grads_of(self, brec: StepRecord, rrec: StepRecord, grads: Any = None) -> GradsOf:
        plans = self.plans

        def of(p: Pair, b: Event, r: Event) -> tuple[tuple[TensorRecord, ...], dict[str, TensorRecord]]:
            plan = plans.get(b.path)
            bparams, rparams = b.params, r.params
            if plan is not None and plan.recursive:  # the rule's tensors include its sublayers'
                bparams, rparams = subtree_params(brec.backward, b.path), subtree_params(rrec.backward, r.path)
            if not bparams or not rparams:
                return (), {}
            return rparams, {t.name: t for t in converted_records(plan, bparams)}

        return of

    def local_layer(self, d: EventDiff, kids: list[tuple[Event, Event]]) -> tuple[TensorDiff, ...] | None:
        """Judged from what it received (no replay); a layer with sublayers only where its own code,
        not a sublayer, first hands on a difference. A BatchNorm is recomputed where the dump holds values."""
        if d.base.type_name in BATCH_NORMS:
            recomputed = self._recomputed(d)
            if recomputed is not None:
                return recomputed
        if not kids:
            measured = self._rebuilt(d)
            if measured is not None:
                return measured
        return self._own_code(
            self._after_amplified(api_local(d, self.tol, self.mode, "inputs", MARGIN)), kids, "inputs", "outputs"
        )

    def _after_amplified(self, own: tuple[TensorDiff, ...] | None) -> tuple[TensorDiff, ...] | None:
        """An error a statistics dump shows (its statistics or sampled values), after a BatchNorm whose
        amplified rounding was recomputed in this step: what the layer received is known as roughly,
        and differs where that does not look (a few channels, which a Linear mixes into every value).
        Up to :data:`MARGIN` times as far past tolerance as that BatchNorm: a larger one is no rounding."""
        if not own or not self._amplified:
            return own
        amplified = MARGIN * max(ratio for _, ratio in self._amplified)
        if all(t.passed or (by_statistics(t) and t.ratio <= amplified) for t in own):
            return ()
        return own

    def _own_code(
        self,
        own: tuple[TensorDiff, ...] | None,
        kids: list[tuple[Event, Event]],
        given: str,
        made: str,
    ) -> tuple[TensorDiff, ...] | None:
        """A layer's error that its sublayers' calls ``kids`` leave to its own code: it hands one a
        difference (in ``given``) before any of them made one (in ``made``); after the last of them, the
        difference is its own too. Events are in the order they ran (backward: the last sublayer first)."""
        if not own or not kids:
            return own
        worst = 0.0  # the largest difference a sublayer made so far, in multiples of its tolerance
        for b, r in sorted(kids, key=lambda k: k[0].order):
            handed = self._ratio(getattr(r, given), getattr(b, given))
            if handed > max(1.0, JUMP * worst):
                # Its code before this sublayer made the difference out of agreeing tensors, or out of
                # ones that differed by far less (a sublayer's rounding, then a bug of the code between):
                # then what it handed is named as the live replay names it, so blame says where.
                return own if not worst else own + self._handed(b, r, given)
            worst = max(worst, self._ratio(getattr(r, made), getattr(b, made)))
        return () if worst > 0 else own  # a sublayer's difference: what follows inherits it

    def local_backward(
        self, brec: StepRecord, rrec: StepRecord, d: EventDiff, kids: list[tuple[Event, Event]]
    ) -> tuple[TensorDiff, ...] | None:
        """Judged from the gradients arriving at its outputs and, as replaying it would on base's
        inputs, from its forward inputs: a parameter's gradient is the arriving gradient times them.
        A layer with sublayers: only where its own code first hands one a difference (backward order).
        A BatchNorm is recomputed where the dump holds values."""
        bf, rf = brec.forward_of(d.base), rrec.forward_of(d.raw)
        if bf is not None and rf is not None and d.base.type_name in BATCH_NORMS:
            recomputed = self._recomputed_backward(d, bf, rf)
            if recomputed is not None:
                return recomputed
        if bf is not None and rf is not None and not kids:
            measured = self._rebuilt_backward(d, bf, rf)
            if measured is not None:
                return measured
        own = self._after_amplified(api_local(d, self.tol, self.mode, "outputs", MARGIN))
        if own and bf is not None and rf is not None and self._differ(rf.inputs, bf.inputs):
            return ()
        return self._own_code(own, kids, "outputs", "inputs")

    def _rebuilt(self, d: EventDiff) -> tuple[TensorDiff, ...] | None:
        """Raw's layer rebuilt from its dump and run on base's inputs (:mod:`nbdiff.engine.recorded.rebuilt`)."""
        local = rebuilt_local(
            d.base, (self.sides[1], d.raw), self.position, self._compare, self._training(d.raw), self._followed(d.base)
        )
        if isinstance(local, str) and weightless(d.base, d.raw):
            side, compare = (self.sides[0], d.base), mirrored(self._compare)
            return self._recomputed_as(
                d, rebuilt_local(d.raw, side, self.position, compare, self._training(d.base, self.a)), local
            )
        return self._measured(d, local)

    def _recomputed_as(
        self, d: EventDiff, found: tuple[TensorDiff, ...] | str, why_not: str
    ) -> tuple[TensorDiff, ...] | None:
        """Where raw's layer cannot be rebuilt (a class made inside a function) and has no weights, base's
        is, and runs on raw's recorded data: raw's results judged against it, as a BatchNorm is recomputed."""
        if isinstance(found, str):
            return self._measured(d, why_not)
        self._recomputed_events.add(id(d.base))
        return found

    def _rebuilt_backward(self, d: EventDiff, bf: Event, rf: Event) -> tuple[TensorDiff, ...] | None:
        """Raw's layer rebuilt, run on base's inputs and the gradients arriving at base's outputs."""
        plan = self.plans.get(bf.path)

        def params(
            base: dict[str, np.ndarray], raw: dict[str, np.ndarray], hint: float, grad_out_shape: tuple[int, ...]
        ) -> list[TensorDiff]:
            return compare_param_grads(base, raw, plan, self.tol, self.mode, hint, grad_out_shape)

        sides = (bf, d.base), (self.sides[1], rf, d.raw)
        local = rebuilt_local_backward(
            *sides, self.position, self._compare, params, self._training(rf), self._followed(bf)
        )
        if isinstance(local, str) and weightless(d.base, d.raw):
            sides = (rf, d.raw), (self.sides[0], bf, d.base)
            found = rebuilt_local_backward(
                *sides, self.position, mirrored(self._compare), lambda *_: [], self._training(bf, self.a)
            )
            return self._recomputed_as(d, found, local)
        return self._measured(d, local)

    def read_step(self, k: int, rank: int) -> tuple[StepRecord, StepRecord]:
        """Step position ``k`` of both dumps, read once: compared, and their weights followed."""
        self.position = k
        events = self.a.steps[k], self.b.steps[k]
        for side, mine in zip(self.sides, events):
            side.saw(k, mine)
        return recorded_step(events[0], rank), recorded_step(events[1], rank)

    def _followed(self, base: Event) -> dict[str, np.ndarray] | None:
        """The weights raw's layer runs on for its local error: those base's updates would have given
        it (a layer with sublayers' or fused rule's are left to raw's own)."""
        plan = self.plans.get(base.path)
        return None if plan is None or plan.recursive else self.follow.get(base.path)

    def drift_at(self, k: int) -> Explanation | None:
        """How far raw's weights at step position ``k`` are from where base's updates since the first
        recorded step would have taken them (``follow``, which raw's rebuilt layers run on): the
        weights drifted through updates that each agreed. ``None``: no drift, or no weights recorded."""
        self.follow = {}
        if k == 0:
            return None
        (a0, ak), (b0, bk) = ((s.first, s.weights_at(k)) for s in self.sides)
        if a0 is None or ak is None or b0 is None or bk is None:
            return None
        plans = self.plans
        snap = lambda w, side: plan_snapshot(w, plans, side)  # noqa: E731
        self.follow = followed(plans, snap(a0, "base"), snap(ak, "base"), snap(b0, "raw"))
        return drift_note(k, self.follow, snap(bk, "raw"), self.tol)

    def _compare(
        self, got: list[TensorRecord], like: tuple[TensorRecord, ...], scale_hint: float = 0.0
    ) -> list[TensorDiff]:
        return tensor_diffs(got, like, self.tol, self.mode, scale_hint)

    def _training(self, event: Event, dump: RankDump | None = None) -> bool:
        """The mode a layer is rebuilt in (raw's; base's from ``dump``): a BatchNorm's as the dump
        recorded it, else eval (the dump keeps no mode; dropout was off while recording)."""
        return bool((dump or self.b).meta.get("batch_norm_training", {}).get(event.path, False))

    def _measured(self, d: EventDiff, local: tuple[TensorDiff, ...] | str) -> tuple[TensorDiff, ...] | None:
        if isinstance(local, str):
            self.not_measured[id(d.base)] = local
            return None
        self._rebuilt_events.add(id(d.base))
        return local

    def _recomputed(self, d: EventDiff) -> tuple[TensorDiff, ...] | None:
        """Base's BatchNorm run on raw's inputs (:mod:`nbdiff.engine.recorded.recomputed`): its own error, where
        the rounding it amplifies does not explain it."""
        call = self._batch_norm(d.base)
        x = _value(d.raw.inputs)
        if call is None or x is None or x.shape != d.base.inputs[0].shape:
            return None
        return self._judged(d, d.raw.outputs, d.base.outputs[0], call.forward, x, read_off(call, d.base))

    def _recomputed_backward(self, d: EventDiff, bf: Event, rf: Event) -> tuple[TensorDiff, ...] | None:
        """Base's BatchNorm backward on raw's forward inputs and the gradient arriving at raw's output."""
        call, x, g = self._batch_norm(bf), _value(rf.inputs), _value(d.raw.outputs)
        if call is None or x is None or g is None or not d.base.inputs or x.shape != bf.inputs[0].shape:
            return None
        fn = lambda v, dtype=np.float64: call.backward(v, g, dtype)  # noqa: E731
        return self._judged(d, d.raw.inputs, d.base.inputs[0], fn, x, read_off(call, bf))

    def _batch_norm(self, forward: Event) -> BatchNormCall | None:
        train = self.a.meta.get("batch_norm_training", {}).get(forward.path)
        return recorded_batch_norm(forward, self.arguments[0].get(forward.path, {}), train)

    def _judged(
        self,
        d: EventDiff,
        got: tuple[TensorRecord, ...],
        like: TensorRecord,
        fn: Callable[[np.ndarray, type], np.ndarray],
        x: np.ndarray,
        known_to: float,
    ) -> tuple[TensorDiff, ...] | None:
        """Raw's result against ``fn(x)``, base's layer recomputed on raw's inputs: an own error, or
        none where rounding explains it: the layer's own (one unit of ``x``, amplified), and what base's
        layer is known to when read off its own rounded results (``known_to``, relative)."""
        if not got or got[0].value is None:
            return None
        value = fn(x, np.float64)
        expected = replace(like, value=value, stats=None)
        local = tuple(tensor_diffs((replace(got[0], name=like.name),), (expected,), self.tol, self.mode))
        move = max(rounding_move(fn, x), known_to * float(np.abs(value).max(initial=0.0)))
        if all(t.passed or t.max_abs <= MARGIN * move for t in local):
            if not d.passed:
                self._amplified.append((d.base.path, d.ratio))
            return ()
        self._recomputed_events.add(id(d.base))
        return local

    def amplified_rounding(self) -> str | None:
        if not self._amplified:
            return None
        path, ratio = self._amplified[0]
        return (
            f"`{path}` (BatchNorm) turns differences within tolerance into {ratio:.3g}x it: base's own layer, "
            "recomputed on raw's inputs from the dump, gives raw's results (a train-mode BatchNorm over few values "
            "per channel divides by their tiny spread), so the differences after it are rounding, not the port"
        )

    def how_local(self, f: Divergence) -> Divergence:
        key = id(f.event.base) if f.event is not None else None
        if key in self._rebuilt_events:
            return replace(f, local_by="rebuilt")
        if key in self._recomputed_events:
            return replace(f, local_by="recomputed")
        if f.where not in ("layer", "between", "api"):  # an update, a statistic: compared directly
            return replace(f, local_by="received")
        why = self.not_measured.get(key) if key is not None else None  # type: ignore[arg-type]
        return replace(f, local_by="received", unmeasured=why or _NOT_REBUILT.get(f.where, "not rebuilt"))

    def done_reading(self) -> None:
        self._amplified = []
        self._recomputed_events = set()
        self._rebuilt_events = set()
        self.not_measured = {}

    def _differ(self, raw: tuple[TensorRecord, ...], base: tuple[TensorRecord, ...]) -> bool:
        return received_differ(raw, base, self.tol, self.mode)

    def _ratio(self, raw: tuple[TensorRecord, ...], base: tuple[TensorRecord, ...]) -> float:
        return received_ratio(raw, base, self.tol, self.mode)

    def _handed(self, b: Event, r: Event, given: str) -> tuple[TensorDiff, ...]:
        """What a sublayer was handed that differs, named ``path:input`` (see :func:`judge.blame._between`)."""
        label = (b.path or "<root>") + (f"#{b.call}" if b.call else "")
        got, want = received_pairs(getattr(r, given), getattr(b, given))
        return tuple(
            replace(t, name=f"{label}:{t.name}") for t in tensor_diffs(got, want, self.tol, self.mode) if not t.passed
        )

    def updates(self, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> dict[str, Updates]:
        """The step's optimizer events by plan (a fused group's members' as one), with the magnitude of
        raw's weights they moved (:attr:`RebuiltSide.scales`)."""
        ba, ra = updates_by_path(brec.optimizer, pairing, "base"), updates_by_path(rrec.optimizer, pairing, "raw")
        scales = self.sides[1].scales
        out = {}
        for key, plan in self.plans.items():
            be, re_ = ba.get(key), ra.get(plan.raw_path)
            if be is not None and re_ is not None:
                under = plan.raw_path + "." if plan.raw_path else ""
                scale = max((v for p, v in scales.items() if p == plan.raw_path or p.startswith(under)), default=0.0)
                out[key] = Updates(be, re_, scale)
        return out

    def compare_state(self, brec: StepRecord, rrec: StepRecord, k: int) -> StepComparison:
        """The running statistics step ``k`` moved, as the dumps kept them (:mod:`nbdiff.engine.training.state`)."""
        if not brec.state:
            return StepComparison()
        momenta = {path: args.get("momentum") for path, args in self.arguments[0].items()}
        found, diffs = recorded_state_diffs(
            (self.a.framework, self.b.framework), self.plans, brec, rrec, self.tol, self.mode, k, momenta
        )
        return StepComparison(found, diffs)

    def gradient_spread(self, k: int) -> GradientSpread | None:
        """How far apart the gradients each optimizer was given were, up to step ``k`` (read once an
        update fails)."""
        if self.spread is None:
            return None
        plans, a, b = self.plans, self.a, self.b

        def step_grads(s: int) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
            ga, gb = (
                step_param_grads(a.steps[s], self._groups, "base"),
                step_param_grads(b.steps[s], self._groups, "raw"),
            )
            out = {}
            for key, plan in plans.items():
                if key in ga:
                    base = converted(plan, ga[key])
                    out[key] = (base if base is not None else ga[key], gb.get(plan.raw_path, {}))
            return out

        return self.spread.catch_up(k, step_grads)
