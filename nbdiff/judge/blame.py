"""Blame: the earliest event whose *local* error exceeds tolerance.

The normal run gives accumulated error per event. A layer whose inputs already
differ produces outputs that differ: that is inherited, not its fault. So for the
events whose accumulated error exceeds tolerance, in execution order (children
before their parent), we ask for the local error: the same layer run on the base
side's inputs (``local_fn``, supplied by the orchestrator, which can replay
layers). The first event over tolerance locally is blamed. If it has sublayers
that are all fine locally, the fault is in its own code between two of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nbdiff.align.arguments import ArgDiff
from nbdiff.judge.metrics import TensorDiff, compare_tensors, worst_ratio
from nbdiff.judge.tolerance import Tolerance
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.origin.stack import Frame, inside_frames

__all__ = [
    "EventDiff",
    "Divergence",
    "blame_events",
    "blame_all",
    "first_nonfinite",
    "worst_of",
    "post_order",
    "divergence_of",
]


@dataclass(frozen=True)
class EventDiff:
    """A paired event and how its tensors differ."""

    base: Event
    raw: Event
    tensors: tuple[TensorDiff, ...]
    """Accumulated error: forward outputs, backward input and parameter gradients,
    optimizer updates."""
    local: tuple[TensorDiff, ...] | None = None
    """Error the event adds on identical inputs, when it was measured."""
    evidence: tuple[TensorRecord, ...] = field(default=(), compare=False, repr=False)
    """Raw's values of what this layer's own code handed a sublayer when it ran again on base's
    inputs, for the local tensors that fail (``proj:in[0]``): the panel shows them beside base's."""

    @property
    def ratio(self) -> float:
        """Worst accumulated error over what tolerance allows (above 1 diverges)."""
        return worst_ratio(self.tensors)

    @property
    def local_ratio(self) -> float | None:
        return None if self.local is None else max((t.ratio for t in self.local), default=0.0)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)


_WRITTEN_OUTSIDE = (
    "no optimizer setting: code between the steps wrote the parameter outside the optimizer (weight clipping, an EMA, "
    "spectral norm, a manual write); compare that code on both sides"
)


@dataclass(frozen=True)
class Divergence:
    """Where the two models first stop agreeing."""

    phase: Phase
    step: int
    base_path: str
    raw_path: str
    base_type: str
    raw_type: str
    metrics: TensorDiff
    """The worst tensor of the blamed event (accumulated error)."""
    tolerance: Tolerance
    local_error: TensorDiff | None
    """The worst tensor when the event runs on identical inputs (``None``: not measurable)."""
    inherited: bool
    """True when no event exceeds tolerance locally: small errors grew past it downstream."""
    base_stack: tuple[Frame, ...]
    raw_stack: tuple[Frame, ...]
    where: str
    """``layer``, ``api`` (a framework call in a layer's own code, API-level tracing),
    ``between`` (the layer's own code between two sublayers), ``parameter`` (an optimizer update),
    ``outside`` (a parameter written between two steps), ``state`` (a running statistic), ``inputs`` (the models were
    given different inputs), ``nonfinite`` (the first event producing NaN/Inf), ``framework``
    (a known framework difference, verified exactly: not the port's bug) or ``accumulated``."""
    between: tuple[str | None, str | None] = (None, None)
    """For ``between``: the sublayer events just before and just after the fault."""
    parameter: str | None = None
    """For ``parameter``: the parameter's dotted path (base side)."""
    rank: int = 0
    """Distributed rank of the events (compared dumps of multi-rank jobs)."""
    arguments: tuple[ArgDiff, ...] = ()
    """Constructor arguments of the blamed pair that differ (``eps: base 1e-05, raw 0.001``)."""
    explanation: str = ""
    """``framework``: what differs between the frameworks and how it was verified; ``outside``: who wrote what."""
    unpaired: tuple[str, ...] = ()
    """For ``between``: the calls that stayed unpaired there (``raw `act` (BadAct)``): the code at fault
    may be theirs."""
    local_by: str = "replay"
    """How ``local_error`` was found: ``replay`` (the layer run again on base's inputs, live),
    ``rebuilt`` (raw's layer rebuilt from its dump and run on base's recorded inputs),
    ``recomputed`` (base's layer recomputed from a dump, on raw's inputs) or ``received`` (from a
    dump without re-running: what the event received agrees, what it made does not; the local
    error is then not measured, and ``unmeasured`` says why)."""
    unmeasured: str = ""
    """For ``received``: why no rebuild measured the local error (a statistics dump, a class not
    imported where ``compare`` runs...)."""
    shards: str = ""
    """For a tensor-parallel run compared as whole tensors: which rank's shard of the blamed tensor
    differs (``raw rank 1: its shard (shard(2)) differs; rank 0 agrees``)."""
    event: EventDiff | None = field(default=None, compare=False, repr=False)
    """The blamed pair itself (with its layers, when recorded live), for ``DiffResult.repro``."""
    forward: EventDiff | None = field(default=None, compare=False, repr=False)
    """For a backward divergence: the same layer call's forward pair (its layers and inputs)."""

    def describe(self) -> str:
        """One line naming the place (and, for a gathered tensor-parallel run, the rank)."""
        return self._place() + (f" [{self.shards}]" if self.shards else "")

    def _place(self) -> str:
        b = self.base_path or "<root>"
        r = self.raw_path or "<root>"
        head = f"step {self.step}{f', rank {self.rank}' if self.rank else ''}, {self.phase.value}"
        if self.where == "parameter":
            return f"{head}: update of parameter `{self.parameter}` (layer `{b}` ~ raw `{r}`)"
        if self.where == "outside":
            return f"{head}: {self.explanation} (layer `{b}` ~ raw `{r}`)"
        if self.where == "framework":
            return f"{head}: framework difference in `{self.parameter}` (layer `{b}` ~ raw `{r}`)"
        if self.where == "state":
            return f"{head}: running statistic `{self.parameter}` (layer `{b}` ~ raw `{r}`)"
        if self.where == "inputs":
            return f"{head}: the two models were given different inputs (`{self.metrics.name}`), before any layer ran"
        if self.where == "nonfinite":
            m = self.metrics
            given = "gradients" if self.phase is Phase.BACKWARD else "inputs"
            return (
                f"{head}: layer `{b}` ({self.base_type}) ~ raw `{r}` produces NaN/Inf from finite {given} "
                f"(base {m.nan_base} NaN {m.inf_base} Inf, raw {m.nan_raw} NaN {m.inf_raw} Inf)"
            )
        if self.where == "api":
            owner, _, op = self.base_path.rpartition("::")
            raw_op = self.raw_path.rpartition("::")[2]
            swap = f" (raw calls `{raw_op}`)" if raw_op != op else ""
            return f"{head}: API call `{op}` in the code of `{owner or '<root>'}`{swap}"
        if self.where == "between":
            prev, nxt = self.between
            place = {(True, False): f"after `{prev}`", (False, True): f"before `{nxt}`"}.get(
                (bool(prev), bool(nxt)), f"between `{prev}` and `{nxt}`" if prev else "before any sublayer"
            )
            found = f"code of `{b}` ({self.base_type}) itself, {place} (raw `{r}`)"
            if self.local_error is None:
                found += " (not measured: it could not be run again, e.g. it keeps state between calls; the error first appears there)"
            if self.unpaired:
                found = f"the unpaired calls {', '.join(self.unpaired)} or the {found}"
            return f"{head}: {found}"
        tail = " (inherited: no single layer exceeds tolerance on its own)" if self.inherited else ""
        return f"{head}: layer `{b}` ({self.base_type}) ~ raw `{r}` ({self.raw_type}){tail}"

    def why(self) -> str:
        """What differs between the blamed pair: constructor arguments, or for an update the optimizer settings; ``""`` when nothing known does."""
        if self.where == "framework":
            return self.explanation
        if self.where == "outside":
            return _WRITTEN_OUTSIDE
        if (self.base_type == "Loss" or self.where == "parameter") and not self.arguments and self.metrics.note:
            # e.g. the two models return different numbers of outputs; an update's step size read from a dump
            return self.metrics.note
        if self.where == "between" and not self.arguments:
            prev, nxt = self.between
            place = " and ".join(f"`{x}`" for x in (prev, nxt) if x) or "its sublayers"
            traced = any(x and "::" in x for x in (prev, nxt))  # API calls were recorded: they all agreed
            return (
                f"no constructor argument differs; the code of `{self.base_path or '<root>'}` itself around {place} "
                + (
                    "computes something else, in an operation that API-level tracing does not record (an operator on a "
                    "Python number, a tensor method, an in-place write)"
                    if traced
                    else "computes something else: run again with api_level=True (`%%modeldiff ... --api`) to name the call"
                )
            )
        return "; ".join(a.describe() for a in self.arguments)


def worst_of(tensors: Sequence[TensorDiff]) -> TensorDiff | None:
    return max(tensors, key=lambda t: t.ratio, default=None)


def post_order(diffs: Sequence[EventDiff]) -> list[EventDiff]:
    """Forward diffs in completion order: every layer after its sublayers."""
    kids: dict[int | None, list[EventDiff]] = {}
    known = {d.base.order for d in diffs}
    for d in sorted(diffs, key=lambda d: d.base.order):
        parent = d.base.parent if d.base.parent in known else None  # parents are paired ancestors
        kids.setdefault(parent, []).append(d)
    out: list[EventDiff] = []
    for root in kids.get(None, ()):
        _visit(root, kids, out)
    return out


def _visit(d: EventDiff, kids: dict[int | None, list[EventDiff]], out: list[EventDiff]) -> None:
    # Not a recursive closure: that is a reference cycle, left for the cyclic collector.
    for c in kids.get(d.base.order, ()):
        _visit(c, kids, out)
    out.append(d)


def blame_events(
    diffs: Sequence[EventDiff],
    local_fn: Callable[[EventDiff], tuple[TensorDiff, ...] | None],
    final: Callable[[EventDiff], bool] = lambda d: True,
    noise: Callable[[Event, tuple[TensorDiff, ...]], bool] | None = None,
) -> tuple[Divergence | None, list[EventDiff]]:
    """The first of :func:`blame_all`'s findings (it stops measuring there)."""
    found, diffs = blame_all(diffs, local_fn, final, noise, every=False)
    return (found[0] if found else None), diffs


def blame_all(
    diffs: Sequence[EventDiff],
    local_fn: Callable[[EventDiff], tuple[TensorDiff, ...] | None],
    final: Callable[[EventDiff], bool] = lambda d: True,
    noise: Callable[[Event, tuple[TensorDiff, ...]], bool] | None = None,
    every: bool = True,
    isolated: bool = True,
    parent_of: Mapping[int, int | None] | None = None,
) -> tuple[list[Divergence], list[EventDiff]]:
    """Blame within one step and phase. ``diffs`` must be in completion order.

    Returns every event whose own (local) error exceeds its tolerance, in order (with ``every``;
    else the first), and the diffs with local errors filled in where they were measured. A port
    often has several bugs: an event downstream of the first is measured on base's inputs, so
    its own error shows apart from what it inherited. When no event exceeds its tolerance on its
    own, the accumulated error fails the step only if it reaches a ``final`` event (the model's
    outputs, the loss, a parameter gradient); a blip that vanishes downstream is not a
    divergence (:func:`inherited_notes` describes it). ``noise(event, tensors)`` says whether an
    error is within the model's own sensitivity to rounding (:mod:`nbdiff.engine.conditioning`);
    such an error is never blamed. ``isolated``: a layer's local error leaves out its sublayers'
    (forward replays force their outputs); where not (backward), a layer with a sublayer found
    at fault is not blamed for its own code as well. ``parent_of``: each event's nearest compared
    ancestor (by base order), where calls left unpaired lie between (default: the direct parent).
    """
    diffs = list(diffs)
    blamed: set[int] = set()
    children: dict[int, list[int]] = {}
    order_to_i = {d.base.order: i for i, d in enumerate(diffs)}
    for i, d in enumerate(diffs):
        parent = parent_of.get(d.base.order, d.base.parent) if parent_of is not None else d.base.parent
        if parent is not None and parent in order_to_i:
            children.setdefault(order_to_i[parent], []).append(i)
    found: list[Divergence] = []
    first_acc: int | None = None
    for i, d in enumerate(diffs):
        if d.passed:
            continue
        if first_acc is None:
            first_acc = i
        local = local_fn(d)
        diffs[i] = d = replace(d, local=local)
        if local is None:
            continue  # not measurable: never blamed; the nearest measurable event is
        if max((t.ratio for t in local), default=0.0) <= 1.0 or (noise is not None and noise(d.base, local)):
            continue
        kids = sorted(children.get(i, []), key=lambda k: diffs[k].base.order)
        if not kids:
            where = {Kind.API: "api", Kind.INPUT: "inputs"}.get(d.base.kind, "layer")
            found.append(divergence_of(d, where))
            blamed.add(i)
        elif any(diffs[k].local is None and not diffs[k].passed for k in kids):
            continue  # a sublayer could not be measured; do not blame the parent's code
        elif not isolated and any(k in blamed for k in kids):
            blamed.add(i)  # its local error holds the sublayer's; its ancestors' too
            continue
        else:
            found.append(_between(d, [diffs[k] for k in kids]))
            blamed.add(i)
        if not every:
            return found, diffs
    if found:
        return found, diffs
    if first_acc is not None and any(
        not d.passed and final(d) and not (noise is not None and noise(d.base, d.tensors)) for d in diffs
    ):
        return [
            _unmeasured_parent(diffs, first_acc, children)
            or divergence_of(diffs[first_acc], "accumulated", inherited=True)
        ], diffs
    return [], diffs


def _unmeasured_parent(diffs: list[EventDiff], first: int, children: dict[int, list[int]]) -> Divergence | None:
    """Where the first failing event is fine on its own, inside a parent that could not be run again (it
    keeps state between calls, a KV cache): the error arose in the parent's code just before it."""
    d = diffs[first]
    if d.local is None or d.local_ratio is None or d.local_ratio > 1.0:
        return None
    parent = next((i for i, kids in children.items() if first in kids), None)
    if parent is None or diffs[parent].local is not None or diffs[parent].passed:
        return None
    kids = sorted(children[parent], key=lambda k: diffs[k].base.order)
    before = [diffs[k] for k in kids if diffs[k].base.order < d.base.order]
    if any(not k.passed for k in before):
        return None
    return _between(diffs[parent], [*before, d])


def require_compared(diffs: Sequence[EventDiff], base_model: str) -> None:
    """Comparing nothing but the inputs is never agreement: a ``forward`` that is a generator, or
    returns no tensor while no layer runs, would otherwise pass silently."""
    from nbdiff.errors import InputError

    if not any(d.tensors for d in diffs if d.base.kind is not Kind.INPUT):
        raise InputError(
            f"nothing was compared: {base_model}'s call ran no layer and returned no tensor (is forward a "
            "generator, or does it return something else?). nbdiff compares the tensors layers return."
        )


def first_nonfinite(
    diffs: Sequence[EventDiff], read: Callable[[Event, Event], None] = lambda b, r: None, backward: bool = False
) -> Divergence | None:
    """The first event (in completion order) whose outputs hold NaN/Inf on either side while its
    inputs are finite: where non-finite values are produced, even when both sides agree.
    ``backward``: the events are gradients, made from the gradients arriving at the outputs (a custom
    backward function that makes NaN). ``read(base, raw)`` is told each pair of events once its
    values were read."""
    made = (lambda e: e.inputs + e.params) if backward else (lambda e: e.outputs)
    given = (lambda e: e.outputs) if backward else (lambda e: e.inputs)
    for d in diffs:
        if not d.tensors or _outputs_finite(d, made):
            continue
        outs = [t.value for e in (d.base, d.raw) for t in made(e) if t.value is not None]
        # -inf where the two sides agree, or masked alike (-1e9): an attention mask, not a fault.
        mask = d.passed and all(_masked(a) for a in outs)
        ins = [t.value for e in (d.base, d.raw) for t in given(e) if t.value is not None] if not mask else []
        produced = not mask and any(not _finite(a) for a in outs) and all(_finite(a) for a in ins)
        read(d.base, d.raw)
        if produced:
            worst = max(d.tensors, key=lambda t: (_counted(t), t.ratio))
            return replace(divergence_of(d, "nonfinite"), metrics=worst)
    return None


def _outputs_finite(d: EventDiff, made: Callable[[Event], tuple[TensorRecord, ...]]) -> bool:
    """Whether the comparisons already show both sides' outputs (``made``) finite: NaN and Inf carry
    into ``a - b``, so a finite largest difference with nothing counted means neither array holds one."""
    finite = {t.name for t in d.tensors if math.isfinite(t.max_abs) and not _counted(t)}
    return all(t.name in finite for e in (d.base, d.raw) for t in made(e) if t.value is not None)


def _counted(t: TensorDiff) -> int:
    return t.nan_base + t.nan_raw + t.inf_base + t.inf_raw


def _masked(a: np.ndarray) -> bool:
    """No NaN and no +inf: at most -inf, what ``masked_fill(mask, -inf)`` writes."""
    return a.dtype.kind not in "fc" or not bool((np.isnan(a) | (a == np.inf)).any())


def _finite(a: np.ndarray) -> bool:
    return a.dtype.kind not in "fc" or bool(np.isfinite(a).all())


def _between(d: EventDiff, kids: list[EventDiff]) -> Divergence:
    """``d``'s own code is at fault around its first failing sublayer call (the last, if none fails).
    Its stacks begin inside ``d``'s code, at the lines that call that sublayer."""
    # The replay on base's inputs says which sublayer the own code handed a different value first
    # (``path:input``); the accumulated run cannot, once the layer's own input already differs.
    handed = {t.name.rpartition(":")[0] for t in d.local or () if not t.passed and ":" in t.name}
    at = next((n for n, k in enumerate(kids) if _label(k) in handed), None)
    if at is None:  # the first sublayer that fails, unless it was handed what base's was (drifted weights)
        at = next((n for n, k in enumerate(kids) if not k.passed and not _handed_alike(k)), None)
    prev, nxt = (kids[at - 1] if at else None, kids[at]) if at is not None else (kids[-1], None)
    near = nxt or prev
    assert near is not None
    found = divergence_of(d, "between", (_label(prev) if prev else None, _label(nxt) if nxt else None))
    return replace(
        found,
        base_stack=inside_frames(d.base.stack, near.base.stack) + d.base.stack,
        raw_stack=inside_frames(d.raw.stack, near.raw.stack) + d.raw.stack,
    )


def _handed_alike(k: EventDiff) -> bool:
    """A sublayer call whose own error was measured and passed, handed the values base's was: what it
    makes differs by its weights (drifted through earlier updates), not by what the code around it did."""
    if not k.local or not all(t.passed for t in k.local) or not k.base.inputs or not k.tensors:
        return False
    tol = k.tensors[0].tolerance
    for b, r in zip(k.base.inputs, k.raw.inputs):
        if b.value is None or r.value is None or b.value.shape != r.value.shape:
            return False
        if not compare_tensors(b.name, r.value, b.value, tol, "strict").passed:
            return False
    return len(k.base.inputs) == len(k.raw.inputs)


def _label(d: EventDiff) -> str:
    return (d.base.path or "<root>") + (f"#{d.base.call}" if d.base.call else "")


def divergence_of(
    d: EventDiff, where: str, between: tuple[str | None, str | None] = (None, None), inherited: bool = False
) -> Divergence:
    worst = worst_of(d.tensors)
    assert worst is not None
    local = worst_of(d.local) if d.local else None
    return Divergence(
        phase=d.base.phase,
        step=d.base.step,
        base_path=d.base.path,
        raw_path=d.raw.path,
        base_type=d.base.type_name,
        raw_type=d.raw.type_name,
        metrics=worst,
        tolerance=worst.tolerance,
        local_error=local,
        inherited=inherited,
        base_stack=d.base.stack,
        raw_stack=d.raw.stack,
        where=where,
        between=between,
        rank=d.base.rank,
        event=d,
    )
