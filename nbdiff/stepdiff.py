"""Comparing one recorded step of two models: pairing, forward, backward, updates, blame.

Shared by :func:`nbdiff.auto_diff` (which runs the steps itself) and
:class:`nbdiff.watch` (which records the user's own code). Parameter gradients come
from a function, so each caller reads them where it has them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nbdiff.align.fused import fuse_events
from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing, pair_forward
from nbdiff.compare.blame import Divergence, EventDiff, blame_all, first_nonfinite
from nbdiff.compare.metrics import TensorDiff
from nbdiff.compare.unpaired import with_unpaired
from nbdiff.conditioning import MARGIN, Floor, Noise
from nbdiff.errors import PairingError
from nbdiff.forwarddiff import TolFn, api_local, at_least_as_loose, forward_diffs, tensor_diffs
from nbdiff.frameworks import Framework
from nbdiff.replay import Replayer, compare_paired_grads, largest_shape, magnitude, paired_param_grads
from nbdiff.statediff import State, has_state, state_diffs
from nbdiff.step import StepRecord
from nbdiff.trace.events import Event, Kind
from nbdiff.trace.spool import Spool
from nbdiff.trace.stack import Frame
from nbdiff.updates import (
    UPDATE_ATOL,
    GradientSpread,
    Snapshot,
    name_parameter,
    snapshot,
    update_diffs,
    update_tolerance,
)
from nbdiff.weights.fused import fused_layers
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = [
    "StepComparer",
    "ParamGrads",
    "live_param_grads",
    "held_param_grads",
    "UPDATE_ATOL",
    "snapshot",
    "update_tolerance",
    "name_parameter",
]


ParamGrads = Callable[[Framework, Any, bool], dict[str, np.ndarray]]
"""``(framework, layer, recursive) -> {name: gradient}`` of a layer's parameters."""


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


@dataclass
class StepComparer:
    """Compares steps of ``base`` and ``raw`` under one tolerance, mode and weight plan."""

    bfw: Framework
    base: Any
    rfw: Framework
    raw: Any
    tol: TolFn
    mode: str
    diff_phase: str = "both"
    layer_map: LayerMap | None = None
    plans: dict[str, LayerWeights] | None = None
    spool: Spool | None = None
    """Where the recordings are held: told what each comparison read, so their pages can go."""

    def __post_init__(self) -> None:
        self.notes: list[str] = []
        """Findings that are not divergences (conditioning, drift), for the result's warnings."""
        self._drift_noted = False
        self.blayers = dict(self.bfw.named_layers(self.base))
        self.rlayers = dict(self.rfw.named_layers(self.raw))

    def set_plans(self, plans: dict[str, LayerWeights]) -> None:
        self.plans = plans
        self.replayer = Replayer(self.bfw, self.rfw, plans, self.tol, self.mode)

    def pair(self, brec: StepRecord, rrec: StepRecord) -> Pairing:
        pairing = _pair(brec, rrec, self.layer_map, self.blayers, self.rlayers)
        # A fused group stands for its members wherever a base layer is looked up by path.
        self.blayers.update(fused_layers(self.blayers, pairing.fused))
        self.rlayers.update(fused_layers(self.rlayers, pairing.fused, "raw"))
        return pairing

    def compare(
        self,
        pairing: Pairing,
        brec: StepRecord,
        rrec: StepRecord,
        grads: ParamGrads | None = None,
        floor: Callable[[], Floor | None] | None = None,
        drift: str | None = None,
        every: bool = True,
    ) -> tuple[list[Divergence], list[EventDiff]]:
        """Forward then backward diffs of one step, with the findings among them: every event with an
        own error (``every``; else the first), forward ones first, then backward. The first is the
        step's divergence.

        ``floor`` measures base's own sensitivity to rounding (:mod:`nbdiff.conditioning`), asked
        for only when blame would report something: a difference within it is a note. ``drift``
        says the weights drifted apart through earlier updates that agreed (:mod:`nbdiff.drift`):
        an error no layer makes on its own is then a note, not a divergence. ``grads``: the
        parameter gradients; by default the copies the records hold, else the live ones.
        """
        assert self.plans is not None, "set_plans first"
        if grads is None:
            grads = held_param_grads({**brec.param_grads, **rrec.param_grads})
        found: list[Divergence] = []
        noise = Noise(floor) if floor is not None else None

        read = _reader(self.spool)
        fwd = forward_diffs(pairing, brec, rrec, self.tol, self.mode, read)
        bwd = []
        if self.diff_phase != "forward":
            bwd = _backward_diffs(pairing, brec, rrec, self.plans, self, grads)
        if self.diff_phase != "backward":
            kids = _paired_children(fwd)
            # The loss is computed from the model's outputs: its own error is measurable only where they agree.
            outputs_agree = all(d.passed for d in fwd if _final_forward(d) and d.base.kind is Kind.LAYER)
            found, fwd = blame_all(
                fwd, lambda d: _local_forward(self.replayer, d, kids, outputs_agree), _final_forward, noise, every
            )
            found = self._unless_drift(found, drift)
            # The first event that produces NaN/Inf comes first, even where both sides agree on it (a
            # NaN weight copied into both): what the frameworks then do with NaN differs downstream.
            nonfinite = first_nonfinite(fwd, read)
            if nonfinite is not None and (not found or _before(nonfinite, found[0])):
                found = [nonfinite, *(f for f in found if f.where != "accumulated")]
        # Backward is measured on base's inputs and output gradients: its own errors show after a
        # forward one too (a backward-only bug in a port that also has a forward bug).
        if bwd and (every or not found):
            more, bwd = blame_all(
                bwd, lambda d: _local_backward(self.replayer, brec, rrec, d), _final_backward, noise, every, False
            )
            more = self._unless_drift(more, drift)
            found += [m for m in more if not (found and m.where == "accumulated")]
        found = [with_unpaired(f, pairing) if f.where == "between" else f for f in found]
        if self.spool is not None:
            self.spool.trim()
        if noise is not None and noise.dismissed:
            self.notes += [_conditioning_note(e, err, limit) for e, err, limit in noise.dismissed[:3]]
        return found, fwd + bwd

    def _unless_drift(self, found: list[Divergence], drift: str | None) -> list[Divergence]:
        if not found or drift is None or found[0].where != "accumulated":
            return found
        if not self._drift_noted:  # once: every later step inherits the same drift
            self.notes.append(drift)
            self._drift_noted = True
        return []

    def snapshot(self) -> tuple[Snapshot, Snapshot]:
        """Trainable tensors of every planned layer, both sides, as copies."""
        assert self.plans is not None
        return snapshot(self.bfw, self.blayers, self.plans, "base"), snapshot(self.rfw, self.rlayers, self.plans, "raw")

    def feed_optimizer(self, grads: ParamGrads | None = live_param_grads) -> None:
        """Give raw base's weights and gradients (converted), so both optimizers step from the same
        point: their updates then differ only by the optimizers' own error. Without this, Adam turns
        rounding-level gradients (a key bias whose true gradient is 0) into lr-sized differences.
        ``grads=None``: the weights only (before a step, so it starts where base's does)."""
        assert self.plans is not None
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
        self, step: int, before: State | None = None, forward: tuple[Event, ...] | list[Event] = ()
    ) -> tuple[list[Divergence], list[EventDiff]]:
        """Running statistics after a train-mode step, then raw's set to base's (as weights are);
        ``before`` and ``forward`` (base's) let known framework differences be verified (:mod:`nbdiff.statediff`)."""
        assert self.plans is not None
        return state_diffs(
            (self.bfw, self.rfw), (self.blayers, self.rlayers), self.plans, self.tol, self.mode, step, before, forward
        )

    def keeps_state(self) -> bool:
        """Whether a planned base layer in train mode keeps running statistics (compare them after each step)."""
        assert self.plans is not None
        return has_state(self.bfw, self.blayers, self.plans)

    def compare_updates(
        self,
        step: int,
        before: tuple[Snapshot, Snapshot],
        after: tuple[Snapshot, Snapshot],
        stacks: tuple[tuple[Frame, ...], tuple[Frame, ...]] = ((), ()),
        grads: Callable[[], GradientSpread] | None = None,
    ) -> tuple[list[Divergence], list[EventDiff]]:
        """Optimizer updates (after minus before) per planned layer; every own error names its parameter.
        ``stacks``: where each side's optimizer was stepped, shown for its updates. ``grads``: how
        far apart the gradients each optimizer was given were, when they differ (not fed base's, as
        ``auto_diff`` does)."""
        assert self.plans is not None
        diffs = update_diffs(step, self.plans, before, after, self.tol, self.mode, grads)
        if stacks != ((), ()):
            diffs = [
                replace(d, base=replace(d.base, stack=stacks[0]), raw=replace(d.raw, stack=stacks[1])) for d in diffs
            ]
        found, _ = blame_all(diffs, lambda d: d.tensors)
        return [name_parameter(f, self.plans) for f in found], diffs


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


def _pair(
    brec: StepRecord, rrec: StepRecord, layer_map: LayerMap | None, blayers: dict[str, Any], rlayers: dict[str, Any]
) -> Pairing:
    b = [e for e in brec.forward if e.kind is Kind.LAYER]
    r = [e for e in rrec.forward if e.kind is Kind.LAYER]
    pairing = pair_forward(b, r, layer_map, blayers, rlayers)
    nb, nr = len(pairing.pairs) + len(pairing.unmatched_base), len(pairing.pairs) + len(pairing.unmatched_raw)
    inner = [p for p in pairing.pairs if p.base.depth > 0 or p.raw.depth > 0]
    # Structures that differ a lot still pair what they can (blame then names the first layer that
    # differs); only two models with sublayers and not one pair between them is an error.
    if not pairing.pairs or (not inner and pairing.unmatched_base and pairing.unmatched_raw):
        # The roots rarely tell the user anything: name the first unpaired sublayers.
        ub = next((e for e in pairing.unmatched_base if e.path), next(iter(pairing.unmatched_base), None))
        ur = next((e for e in pairing.unmatched_raw if e.path), next(iter(pairing.unmatched_raw), None))
        show = lambda e: (
            "none" if e is None else f"`{e.path or '<root>'}` ({e.type_name}, outputs {[t.shape for t in e.outputs]})"
        )  # noqa: E731
        raise PairingError(
            f"The two models' layer calls could not be paired: {len(pairing.unmatched_base)} of {nb} base and "
            f"{len(pairing.unmatched_raw)} of {nr} raw calls have no counterpart. First unpaired: base {show(ub)}, "
            f"raw {show(ur)}. Pair them explicitly: LayerMap({{{ub.path if ub else 'base.path'!r}: "
            f"{ur.path if ur else 'raw.path'!r}}}), or ignore layers with LayerMap(ignore=[...])."
        )
    return pairing


def _backward_diffs(
    pairing: Pairing,
    brec: StepRecord,
    rrec: StepRecord,
    plans: dict[str, LayerWeights],
    sides: StepComparer,
    grads: ParamGrads,
) -> list[EventDiff]:
    base_groups = [g for g in pairing.fused if g.side == "base"]
    raw_groups = [g for g in pairing.fused if g.side == "raw"]
    bb = {(e.path, e.call): e for e in fuse_events(brec.backward, base_groups, backward=True)}
    rb = {(e.path, e.call): e for e in fuse_events(rrec.backward, raw_groups, backward=True)}
    bfw, rfw, blayers, rlayers, tol, mode = sides.bfw, sides.rfw, sides.blayers, sides.rlayers, sides.tol, sides.mode
    read = _reader(sides.spool)
    diffs = []
    magnitudes: dict[int, tuple[np.ndarray, float]] = {}  # a layer's input gradient is often the next one's output's
    arriving = 0.0  # largest gradient arriving at any layer so far, in backward order
    for p in sorted(pairing.pairs, key=lambda p: -p.base.order):
        b, r = bb.get((p.base.path, p.base.call)), rb.get((p.raw.path, p.raw.call))
        if b is None or r is None:
            continue
        plan = plans.get(p.base.path)
        own = plan is not None and p.base.call == 0 and plan.raw_path == p.raw.path
        paired = (
            paired_param_grads(
                grads(bfw, blayers[p.base.path], plan.recursive), grads(rfw, rlayers[p.raw.path], plan.recursive), plan
            )
            if plan is not None and own
            else []
        )
        # A gradient is computed from the ones arriving before it: a sum of such terms that
        # cancels to ~0 (everything in front of a final LayerNorm under a mean loss) rounds
        # relative to them, not to itself.
        arriving = max(arriving, magnitude([t.data for t in b.outputs], magnitudes))
        hint = max(arriving, magnitude([t.data for t in b.inputs] + [g for _, _, g in paired], magnitudes))
        tensors = tensor_diffs(r.inputs, b.inputs, tol, mode, hint, hint_covers=True)
        # Parameter gradients arrive as arrays (bf16 as float32): judge them at the layer's gradients' dtype.
        gtol = at_least_as_loose(tol, [t.dtype for e in (b, r) for t in (*e.inputs, *e.outputs)])
        tensors += compare_paired_grads(paired, gtol, mode, hint, largest_shape(b.outputs), hint_covers=True)
        diffs.append(EventDiff(b, r, tuple(tensors)))
        read(b, r)
    return sorted(diffs, key=lambda d: d.base.order)


def _reader(spool: Spool | None) -> Callable[[Event, Event], None]:
    """Tells ``spool`` what comparing a pair of events read (nothing to tell without one)."""
    if spool is None:
        return lambda b, r: None

    def read(b: Event, r: Event) -> None:
        if spool.written:  # nothing in the file: no pages to count (a check under the limit)
            spool.read(*(t.value for e in (b, r) for t in (*e.inputs, *e.outputs, *e.params, *e.given)))

    return read


def _final_forward(d: EventDiff) -> bool:
    """The model's own outputs and the loss: what the user sees of a forward pass."""
    return d.base.kind is Kind.LOSS or (d.base.kind is Kind.LAYER and d.base.parent is None and d.base.depth == 0)


def _final_backward(d: EventDiff) -> bool:
    """Parameter gradients: what the optimizer sees of a backward pass."""
    params = {t.name for t in d.raw.params} | {t.name for t in d.base.params}
    return any(not t.passed and t.name in params for t in d.tensors) or bool(
        params and any(not t.passed and not t.name.startswith("in") for t in d.tensors)
    )


def _paired_children(diffs: list[EventDiff]) -> dict[int, list[tuple[Event, Event]]]:
    """Base order of a layer call -> the paired layer calls directly under it."""
    out: dict[int, list[tuple[Event, Event]]] = {}
    for d in diffs:
        if d.base.kind is Kind.LAYER and d.base.parent is not None:
            out.setdefault(d.base.parent, []).append((d.base, d.raw))
    return out


def _local_forward(
    replayer: Replayer, d: EventDiff, kids: dict[int, list[tuple[Event, Event]]], outputs_agree: bool = True
) -> tuple[TensorDiff, ...] | None:
    if d.base.kind is Kind.INPUT:
        return d.tensors
    if d.base.kind is Kind.LOSS:
        return d.tensors if outputs_agree else None
    if d.base.kind is Kind.API:
        return api_local(d, replayer.tol, replayer.mode)
    return replayer.forward(d.base, d.raw, kids.get(d.base.order, []))


def _local_backward(
    replayer: Replayer, brec: StepRecord, rrec: StepRecord, d: EventDiff
) -> tuple[TensorDiff, ...] | None:
    bf = next(
        (e for e in brec.forward if e.kind is Kind.LAYER and (e.path, e.call) == (d.base.path, d.base.call)), None
    )
    rf = next((e for e in rrec.forward if e.kind is Kind.LAYER and (e.path, e.call) == (d.raw.path, d.raw.call)), None)
    if bf is None or rf is None:
        return None
    return replayer.backward(bf, rf, d.base)
