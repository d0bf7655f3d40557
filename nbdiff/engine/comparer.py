"""One step of two models, compared and blamed: pairing, forward, backward, updates, findings.

:class:`StepComparer` is the one comparison every verb runs; the two kinds of step differ only in
where what is not in the records comes from. A live step (:class:`nbdiff.engine.live.comparer.LiveComparer`:
``auto_diff``, ``watch``) has the models: it measures local errors by replay and reads parameter
gradients from the layers. A recorded step (:class:`nbdiff.engine.recorded.comparer.RecordedComparer`:
``compare``) has the dumps: local errors are judged from what they hold, gradients read from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing, structure_of
from nbdiff.engine.backward import GradsOf, backward_diffs
from nbdiff.engine.conditioning import MARGIN, Floor, Noise
from nbdiff.engine.forward import api_local, forward_diffs
from nbdiff.engine.step_structure import (
    final_backward,
    final_forward,
    layer_calls,
    pair_step,
    paired_children,
    paired_parents,
)
from nbdiff.engine.training.drift import Explanation
from nbdiff.engine.training.outside import Writes, as_outside
from nbdiff.engine.training.step_size import noted, step_sizes_apart
from nbdiff.engine.training.updates import GradientSpread, Updates, name_parameter, update_diffs
from nbdiff.engine.types import Plans, StepRecord, TolFn
from nbdiff.judge.blame import Divergence, EventDiff, blame_all, first_nonfinite
from nbdiff.judge.metrics import TensorDiff
from nbdiff.judge.unpaired import with_unpaired
from nbdiff.trace.events import Event, Kind, Phase
from nbdiff.weights.plan import tensors_read_once

__all__ = ["StepComparer", "StepComparison", "StepSource", "WholeStep", "BeforeCompare"]


@dataclass
class StepComparison:
    """What comparing one step (or its updates, or its running statistics) found."""

    findings: list[Divergence] = field(default_factory=list)
    """Every own error, in execution order; the first is the step's divergence."""
    diffs: list[EventDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What is not a divergence (conditioning, drift, the first step's plan), for the result's warnings."""


@dataclass(frozen=True)
class WholeStep:
    """One step compared whole (:meth:`StepComparer.whole_step`): its pairing, and each part in order:
    the pairing's notes, forward and backward, the optimizers' updates, the running statistics."""

    pairing: Pairing
    parts: tuple[StepComparison, ...]

    @property
    def findings(self) -> list[Divergence]:
        return [f for p in self.parts for f in p.findings]

    @property
    def diffs(self) -> list[EventDiff]:
        return [d for p in self.parts for d in p.diffs]

    @property
    def notes(self) -> list[str]:
        return [n for p in self.parts for n in p.notes]


@dataclass(frozen=True)
class BeforeCompare:
    """What a step's forward and backward comparison is given (see :meth:`StepComparer.compare`)."""

    grads: Any = None
    floor: Callable[[], Floor | None] | None = None
    drift: Explanation | Callable[[], Explanation | None] | None = None
    """Or a function making it: asked only where an error no layer makes on its own is found."""
    every: bool = True
    ready: Callable[[], None] | None = None
    """Loads the weights a replay of the step runs with: called before the step's first replay, so a
    step within tolerance, which replays nothing, loads nothing (``watch``)."""


class StepSource(Protocol):
    """What one loop knows of step ``k`` beyond its records (``auto_diff`` has the models, ``watch`` the
    weights each step ran with, ``compare`` the dumps): each part of :meth:`StepComparer.whole_step`
    asks it in turn, so a comparison added to the whole step reaches every verb."""

    def before_compare(self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord) -> BeforeCompare:
        """Set up for the step's forward and backward comparison (a replay's weights), and what it is given."""
        ...

    def updates(
        self, k: int, pairing: Pairing, brec: StepRecord, rrec: StepRecord, step: StepComparison
    ) -> StepComparison:
        """The optimizers' updates of step ``k`` compared (none where no optimizer ran); ``step``: its
        forward and backward comparison, whose differing gradients an update inherits."""
        ...

    def state(self, k: int, brec: StepRecord, rrec: StepRecord) -> StepComparison:
        """The running statistics step ``k`` moved, compared (framework differences among them)."""
        ...


class StepComparer:
    """Compares steps of ``base`` and ``raw`` under one tolerance, mode and weight plan; the plan is
    decided from the first step's pairing. Subclasses say where local errors and gradients come from."""

    require_pairs = True
    """Two models whose layer calls do not pair at all are an error (a dump may hold API calls only)."""

    def __init__(self, tol: TolFn, mode: str, diff_phase: str = "both", layer_map: LayerMap | None = None) -> None:
        self.tol, self.mode, self.diff_phase, self.layer_map = tol, mode, diff_phase, layer_map
        self._plans: Plans | None = None
        self._last_pairing: tuple[Any, Any, Pairing] | None = None
        """The last step's calls' structure, both sides, and its pairing: a step built alike takes it."""
        self._drift_noted = False
        self._ready: Callable[[], None] | None = None

    # -- what a kind of step supplies ----------------------------------------------
    def layers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Base's and raw's layers by path, for pairing (what can be known of them)."""
        return {}, {}

    def decide_plans(self, pairing: Pairing) -> tuple[Plans, list[str]]:
        """The weight plans from the first step's pairing, and notes about them."""
        raise NotImplementedError

    def grads_of(self, brec: StepRecord, rrec: StepRecord, grads: Any) -> GradsOf:
        raise NotImplementedError

    def local_forward(
        self, d: EventDiff, kids: list[tuple[Event, Event]], outputs_agree: bool
    ) -> tuple[TensorDiff, ...] | None:
        """A forward event's own error (None: not measurable). ``outputs_agree``: the model's outputs
        agree, so the loss computed from them can be judged on its own."""
        if d.base.kind is Kind.INPUT:
            return d.tensors
        if d.base.kind is Kind.LOSS:
            return d.tensors if outputs_agree else None
        if d.base.kind is Kind.API:
            return api_local(d, self.tol, self.mode)
        return self.local_layer(d, kids)

    def local_layer(self, d: EventDiff, kids: list[tuple[Event, Event]]) -> tuple[TensorDiff, ...] | None:
        """A layer call's own error, its paired sublayer calls ``kids`` left out."""
        raise NotImplementedError

    def _local_or_received(
        self, d: EventDiff, kids: list[tuple[Event, Event]], outputs_agree: bool, failing: set[int]
    ) -> tuple[TensorDiff, ...] | None:
        """:meth:`local_forward`, else (a layer call it could not measure, every paired sublayer call inside
        it agreeing) :meth:`judged_from_received`."""
        local = self.local_forward(d, kids, outputs_agree)
        if local is not None or d.base.kind is not Kind.LAYER or any(b.order in failing for b, _ in kids):
            return local
        return self.judged_from_received(d)

    def judged_from_received(self, d: EventDiff) -> tuple[TensorDiff, ...] | None:
        """A layer call :meth:`local_layer` could not measure, whose paired sublayer calls all agree: its own
        error judged from what it received, where this kind of step says so (``None``: not measured)."""
        return None

    def local_backward(
        self, brec: StepRecord, rrec: StepRecord, d: EventDiff, kids: list[tuple[Event, Event]]
    ) -> tuple[TensorDiff, ...] | None:
        """A backward event's own error, its paired sublayer calls ``kids`` (their backward events) known."""
        raise NotImplementedError

    def replay_ready(self) -> None:
        """Before a replay runs a layer of the step: its weights loaded, once (:attr:`BeforeCompare.ready`)."""
        ready, self._ready = self._ready, None
        if ready is not None:
            ready()

    def with_evidence(
        self, diffs: list[EventDiff], found: list[Divergence]
    ) -> tuple[list[EventDiff], list[Divergence]]:
        """``diffs`` with the values behind their measured local errors (``EventDiff.evidence``), where
        a measurement kept any, and the findings pointing at those pairs."""
        return diffs, found

    def how_local(self, f: Divergence) -> Divergence:
        """The finding saying how its local error was found (``Divergence.local_by``, ``unmeasured``)."""
        return f

    def amplified_rounding(self) -> str | None:
        """After the forward blame of a step: where a layer was found to amplify differences within
        tolerance past it (base's own layer, run on raw's inputs, gives raw's results), a note saying
        so; an error no layer then makes on its own is that note, not a divergence."""
        return None

    def rounding_gated(self, brec: StepRecord, rrec: StepRecord, found: Divergence) -> str | None:
        """After the backward blame of a step whose forward found nothing: where the first backward finding
        is an error no layer makes on its own, and base's own layer, run on raw's forward inputs, gives raw's
        gradients, a note saying so; that error is then not a divergence (a ReLU mask a few elements of
        which rounding flipped: every gradient behind them differs by whole values)."""
        return None

    def read(self, b: Event, r: Event) -> None:
        """Told each pair of events a comparison read (a live recording's pages can then go)."""

    def done_reading(self) -> None:
        """One step's comparison is done."""

    # -- the comparison ----------------------------------------------------------
    @property
    def plans(self) -> Plans:
        if self._plans is None:
            raise RuntimeError("no step was paired yet: pair() the first step before comparing")
        return self._plans

    def pair(self, brec: StepRecord, rrec: StepRecord, plan: bool = True) -> tuple[Pairing, list[str]]:
        """The step's layer calls paired; the first one paired with ``plan`` decides the weight plans
        (returned notes: what that plan found)."""
        shape = structure_of(layer_calls(brec)), structure_of(layer_calls(rrec))
        last = self._last_pairing
        like = last[2] if last is not None and last[:2] == shape else None
        pairing = pair_step(brec, rrec, self.layer_map, *self.layers(), self.require_pairs, like)
        self._last_pairing = (*shape, pairing)
        self.paired(pairing)
        return pairing, self.plan_from(pairing) if plan else []

    def plan_from(self, pairing: Pairing) -> list[str]:
        """Decide the weight plans from this pairing, unless decided already; notes about them."""
        if self._plans is not None:
            return []
        self._plans, notes = self.decide_plans(pairing)
        return notes

    def paired(self, pairing: Pairing) -> None:
        """Told each pairing (live layers learn their fused groups here)."""

    def compare(
        self,
        pairing: Pairing,
        brec: StepRecord,
        rrec: StepRecord,
        grads: Any = None,
        floor: Callable[[], Floor | None] | None = None,
        drift: Explanation | Callable[[], Explanation | None] | None = None,
        every: bool = True,
        ready: Callable[[], None] | None = None,
    ) -> StepComparison:
        """Forward then backward diffs of one step, with the findings among them: every event with an
        own error (``every``; else the first), forward ones first, then backward.

        ``floor`` measures base's own sensitivity to rounding (:mod:`nbdiff.engine.conditioning`), asked
        for only when blame would report something: a difference within it is a note. ``drift``
        says the weights drifted apart through earlier updates that agreed (:mod:`nbdiff.engine.training.drift`):
        an error no layer makes on its own is then a note, not a divergence. ``grads``: where the
        parameter gradients come from (the subclass's; by default, the records'). ``ready``: see
        :attr:`BeforeCompare.ready`.
        """
        out = StepComparison()
        self._ready = ready
        noise = Noise(floor) if floor is not None else None
        fwd = forward_diffs(pairing, brec, rrec, self.tol, self.mode, self.read)
        bwd = []
        if self.diff_phase != "forward":
            bwd = backward_diffs(pairing, brec, rrec, self.tol, self.mode, self.grads_of(brec, rrec, grads), self.read)
        found: list[Divergence] = []
        amplified = None
        if self.diff_phase != "backward":
            up = paired_parents(fwd, brec.forward)
            kids = paired_children(fwd, up)
            # The loss is computed from the model's outputs: its own error is measurable only where they agree.
            agree = all(d.passed for d in fwd if final_forward(d) and d.base.kind is Kind.LAYER)
            failing = {d.base.order for d in fwd if not d.passed}
            local = lambda d: self._local_or_received(d, kids.get(d.base.order, []), agree, failing)  # noqa: E731
            found, fwd = blame_all(fwd, local, final_forward, noise, every, parent_of=up)
            fwd, found = self.with_evidence(fwd, found)
            found = self._unless_drift(found, drift, out.notes)
            said = self.amplified_rounding()
            amplified = Explanation(said) if said else None
            found = _explained(found, amplified, out.notes)
            # The first event that produces NaN/Inf comes first, even where both sides agree on it (a
            # NaN weight copied into both): what the frameworks then do with NaN differs downstream.
            nonfinite = first_nonfinite(fwd, self.read)
            if nonfinite is not None and (not found or _before(nonfinite, found[0])):
                found = [nonfinite, *(f for f in found if f.where != "accumulated")]
        # Backward is measured on base's inputs and output gradients: its own errors show after a
        # forward one too (a backward-only bug in a port that also has a forward bug).
        if bwd and (every or not found):
            bwd, more = self._blame_backward(brec, rrec, bwd, found, noise, every, drift, amplified, out.notes)
            found += [m for m in more if not (found and m.where == "accumulated")]
        found = [self.how_local(f) for f in found]
        out.findings = [with_unpaired(f, pairing) if f.where == "between" else f for f in found]
        out.diffs = fwd + bwd
        self.done_reading()
        # The step's own: held on, it tied the comparer to whoever gave it (watch's steps) in a cycle, and a
        # dropped watch kept its result's memory till the collector's next full pass.
        self._ready = None
        if noise is not None and noise.dismissed:
            out.notes += [_conditioning_note(e, err, limit) for e, err, limit in noise.dismissed[:3]]
        return out

    def _blame_backward(
        self,
        brec: StepRecord,
        rrec: StepRecord,
        bwd: list[EventDiff],
        found: list[Divergence],
        noise: Noise | None,
        every: bool,
        drift: Explanation | Callable[[], Explanation | None] | None,
        amplified: Explanation | None,
        notes: list[str],
    ) -> tuple[list[EventDiff], list[Divergence]]:
        """The backward's own errors, measured on base's inputs and output gradients, after the forward's
        ``found``; the diffs with their local errors filled in."""
        bup = paired_parents(bwd, brec.backward)
        bkids = paired_children(bwd, bup)
        local = lambda d: self.local_backward(brec, rrec, d, bkids.get(d.base.order, []))  # noqa: E731
        more, bwd = blame_all(bwd, local, final_backward, noise, every, False, parent_of=bup)
        more = self._unless_drift(more, drift, notes)
        # Only where the forward found nothing: its inputs' differences were then accepted there.
        if more and more[0].where == "accumulated" and not found and (said := self.rounding_gated(brec, rrec, more[0])):
            more = _explained(more, Explanation(said), notes)
        more = _explained(more, amplified, [])  # the forward's note says it
        # A gradient made NaN/Inf from finite ones (a custom backward) is where it comes from.
        made = None if any(f.where == "nonfinite" for f in found) else first_nonfinite(bwd, self.read, True)
        if made is not None:
            same = lambda f: (
                (f.base_path, f.event and f.event.base.call) == (made.base_path, made.event and made.event.base.call)
            )  # noqa: E731
            more = [made, *(m for m in more if not same(m) and m.where != "accumulated")]
        return bwd, more

    def whole_step(
        self, k: int, brec: StepRecord, rrec: StepRecord, source: StepSource, pairing: Pairing | None = None
    ) -> WholeStep:
        """Step ``k`` compared whole, in the order every verb shares: pair (and plan, at the first step),
        forward, backward, the updates, the running statistics. ``pairing``: the step's, where the loop
        paired it already (``single_step`` feeds raw by it)."""
        notes: list[str] = []
        # The models hold the same layers and tensors while a step is compared: each layer's are read once
        # (its gradients, its weights before and after, each side, each ask a plan's layers for them).
        with tensors_read_once():
            if pairing is None:
                pairing, notes = self.pair(brec, rrec)
            given = source.before_compare(k, pairing, brec, rrec)
            step = self.compare(pairing, brec, rrec, given.grads, given.floor, given.drift, given.every, given.ready)
            updates = source.updates(k, pairing, brec, rrec, step)
            return WholeStep(pairing, (StepComparison(notes=notes), step, updates, source.state(k, brec, rrec)))

    def compare_updates(
        self,
        updates: dict[str, Updates],
        grads: Callable[[], GradientSpread] | None = None,
        step: StepComparison | None = None,
        writes: Writes | None = None,
    ) -> StepComparison:
        """Optimizer updates per planned layer; every own error names its parameter. ``grads``: how
        far apart the gradients each optimizer was given were, when they differ (not fed base's,
        as ``auto_diff`` does). ``step``: the step's forward and backward comparison: an update
        whose parameter's gradient already differed there inherits that (its cause is a finding of
        the step), where ``grads`` cannot say by how much (a statistics dump)."""
        diffs = update_diffs(self.plans, updates, self.tol, self.mode, grads)
        compared, differed = _gradients(step.diffs) if step is not None else (set(), set())
        if differed:
            # A parameter whose gradients were not compared (its layer has no backward pair) may have
            # been given what differed too: judged only where it evidently was not.
            differed |= {(d.raw.path, t.name) for d in diffs for t in d.tensors} - compared
        if differed and step is not None:
            # Where the gradients differed, each side's update over its own gradient still tells a
            # learning rate apart (plain SGD); those updates are the optimizers' own error.
            apart = step_sizes_apart(self.plans, updates, step.diffs)
            diffs, differed = noted(diffs, apart), differed - apart.keys()
        own = lambda d: tuple(t for t in d.tensors if (d.raw.path, t.name) not in differed)  # noqa: E731
        found, _ = blame_all(diffs, own, final=lambda d: not all(t.passed for t in own(d)))
        named = [name_parameter(f, self.plans) for f in found]
        # ``writes``: the parameters written outside the optimizer after this step's update (engine/outside).
        return StepComparison(as_outside(named, writes) if writes else named, diffs)

    def _unless_drift(
        self, found: list[Divergence], drift: Explanation | Callable[[], Explanation | None] | None, notes: list[str]
    ) -> list[Divergence]:
        """An error no layer makes on its own, once the weights drifted, is the drift's note (said once:
        every later step inherits the same drift)."""
        if not found:
            return found
        why = drift() if callable(drift) else drift
        kept = _explained(found, why, [] if self._drift_noted else notes)
        self._drift_noted = self._drift_noted or len(kept) < len(found)
        return kept


def _gradients(diffs: list[EventDiff]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """``(raw layer path, parameter name)`` of every parameter gradient a step's backward compared, and of
    those it found differing, or near it (within :data:`MARGIN` of its tolerance: an update is judged
    by its own tolerance)."""
    compared, differed = set(), set()
    for d in diffs:
        if d.base.phase is not Phase.BACKWARD:
            continue
        names = {t.name for t in d.raw.params}
        for t in d.tensors:
            if t.name not in names:
                continue
            # A sublayer used without being called (MultiheadAttention's out_proj): its gradient is in
            # its caller's event, its update under its own path.
            owner, _, leaf = t.name.rpartition(".")
            keys = {(d.raw.path, t.name)} | (
                {(f"{d.raw.path}.{owner}" if d.raw.path else owner, leaf)} if owner else set()
            )
            compared |= keys
            if t.ratio_bound * MARGIN > 1 and t.ratio * MARGIN > 1:
                differed |= keys
    return compared, differed


def _explained(found: list[Divergence], why: Explanation | None, notes: list[str]) -> list[Divergence]:
    """No finding where the only one is an accumulated error that ``why`` explains (weights that
    drifted, a layer amplifying rounding); its note goes to ``notes`` once."""
    if why is None or not found or not why.explains(found[0]):
        return found
    if why.note not in notes:
        notes.append(why.note)
    return []


def _before(a: Divergence, b: Divergence) -> bool:
    """Whether ``a``'s event ran before ``b``'s (both forward events of one step)."""
    return a.event is not None and b.event is not None and a.event.base.order < b.event.base.order


def _conditioning_note(e: Event, err: float, limit: float) -> str:
    return (
        f"step {e.step}, {e.phase.value}: `{e.path or '<root>'}` differs by {err:.3g} (max abs), within "
        f"{MARGIN:g}x the {limit:.3g} that base itself moves when its inputs change by one rounding unit: "
        "the computation amplifies rounding here (e.g. a train-mode BatchNorm over few values), so it is not "
        "reported as a divergence"
    )
