"""Recorded steps: two dumps written by :func:`nbdiff.record`, without the models (``compare``).

Without the models there is no replay, so the local error of an event is judged from what the
dump holds: an event whose own inputs agree (forward: the tensors passed in; backward: the
gradients arriving at its outputs) but whose results do not is where the error arises; one whose
inputs already differ inherited it. Parameter gradients and updates are converted between layouts
with the same weight rules as ``assign_weight``, found by the layer classes the dump recorded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.pairing import Pair, Pairing
from nbdiff.engine.backward import GradsOf
from nbdiff.engine.comparer import Plans, StepComparer
from nbdiff.engine.forward import TolFn, api_local
from nbdiff.engine.layouts import converted, converted_records
from nbdiff.engine.stepping import StepRecord
from nbdiff.engine.updates import GradientSpread, Updates
from nbdiff.judge.blame import EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, changed
from nbdiff.trace.layer_paths import relative
from nbdiff.trace.store import RankDump
from nbdiff.weights.plan import plan_by_classes

__all__ = ["RecordedComparer", "recorded_step"]


def recorded_step(dump: RankDump, k: int, rank: int) -> StepRecord:
    """Step ``k`` of one rank's dump as a step record (its events carry the rank)."""
    events = dump.steps[k]
    if rank:
        events = [replace(e, rank=rank) for e in events]
    phase = lambda ph: [e for e in events if e.phase is ph]  # noqa: E731
    return StepRecord(phase(Phase.FORWARD), phase(Phase.BACKWARD), [], optimizer=phase(Phase.OPTIMIZER))


class RecordedComparer(StepComparer):
    """Steps of one rank of two dumps (``a``: base, ``b``: raw)."""

    require_pairs = False

    def __init__(self, a: RankDump, b: RankDump, tol: TolFn, mode: str) -> None:
        super().__init__(tol, mode)
        self.a, self.b = a, b
        self.spread: GradientSpread | None = GradientSpread()
        """The gradients each optimizer was given, folded in up to the step compared (until a divergence)."""

    def decide_plans(self, pairing: Pairing) -> tuple[Plans, list[str]]:
        a, b = self.a, self.b
        plans: Plans = {}
        for p in pairing.pairs:
            if p.base.path not in plans:
                bc, rc = a.layers.get(p.base.path, []), b.layers.get(p.raw.path, [])
                plans[p.base.path] = plan_by_classes(a.framework, p.base.path, bc, b.framework, p.raw.path, rc)
        raw_taken = {p.raw_path for p in plans.values()}
        for path, classes in a.layers.items():  # layers that never ran: their updates, by the same path
            if path not in plans and path in b.layers and path not in raw_taken:
                plans[path] = plan_by_classes(a.framework, path, classes, b.framework, path, b.layers[path])
        return plans, []

    def grads_of(self, brec: StepRecord, rrec: StepRecord, grads: Any = None) -> GradsOf:
        plans = self.plans

        def of(p: Pair, b: Event, r: Event) -> tuple[tuple[TensorRecord, ...], dict[str, TensorRecord]]:
            plan = plans.get(b.path)
            bparams, rparams = b.params, r.params
            if plan is not None and plan.recursive:  # the rule's tensors include its sublayers'
                bparams, rparams = _subtree_params(brec.backward, b.path), _subtree_params(rrec.backward, r.path)
            if not bparams or not rparams:
                return (), {}
            return rparams, {t.name: t for t in converted_records(plan, bparams)}

        return of

    def local_forward(
        self, d: EventDiff, kids: list[tuple[Event, Event]], outputs_agree: bool
    ) -> tuple[TensorDiff, ...] | None:
        if d.base.kind is Kind.INPUT:
            return d.tensors
        if d.base.kind is Kind.LOSS:
            return d.tensors if outputs_agree else None
        return api_local(d, self.tol, self.mode)

    def local_backward(self, brec: StepRecord, rrec: StepRecord, d: EventDiff) -> tuple[TensorDiff, ...] | None:
        return api_local(d, self.tol, self.mode, "outputs")

    def updates(self, k: int, brec: StepRecord, rrec: StepRecord) -> dict[str, Updates]:
        """Step ``k``'s optimizer events by plan: the dump keeps updates, not the weights."""
        by_path = {e.path: e for e in rrec.optimizer}
        out = {}
        for key, plan in self.plans.items():
            be = next((e for e in brec.optimizer if e.path == key), None)
            re_ = by_path.get(plan.raw_path)
            if be is not None and re_ is not None:
                out[key] = Updates(be, re_)
        return out

    def gradient_spread(self, k: int) -> GradientSpread | None:
        """How far apart the gradients each optimizer was given were, up to step ``k`` (read once an
        update fails)."""
        if self.spread is None:
            return None
        plans, a, b = self.plans, self.a, self.b

        def step_grads(s: int) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
            ga, gb = _param_grads(a.steps[s]), _param_grads(b.steps[s])
            out = {}
            for key, plan in plans.items():
                if key in ga:
                    base = converted(plan, ga[key])
                    out[key] = (base if base is not None else ga[key], gb.get(plan.raw_path, {}))
            return out

        return self.spread.catch_up(k, step_grads)


def _subtree_params(events: list[Event], path: str) -> tuple[TensorRecord, ...]:
    """Parameter gradients of the layer at ``path`` and of its sublayers, under names relative to
    it (``q_proj.weight``), the first of each: what a recursive weight rule converts."""
    out: dict[str, TensorRecord] = {}
    for e in events:
        rel = relative(e.path, path)
        if rel is not None:
            for t in e.params:
                name = f"{rel}.{t.name}" if rel else t.name
                out.setdefault(name, t if t.name == name else changed(t, name=name))
    return tuple(out.values())


def _param_grads(events: list[Event]) -> dict[str, dict[str, np.ndarray]]:
    """One step's parameter gradients, by layer path then parameter name (summed over the layer's calls)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for e in events:
        if e.phase is Phase.BACKWARD:
            for t in e.params:
                if t.value is not None:
                    held = out.setdefault(e.path, {})
                    held[t.name] = held[t.name] + t.value if t.name in held else t.value
    return out
