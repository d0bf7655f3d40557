"""Forward comparisons of one recorded step: each pair of events' outputs, what raw was given
(single-step), the models' inputs and the loss; and an event's own error judged from what it
received (:func:`api_local`), where nothing can be replayed. Blame over them is
:class:`nbdiff.engine.comparer.StepComparer`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from nbdiff.align.calls import api_pairs, under_paired_ancestors
from nbdiff.align.pairing import Pairing
from nbdiff.align.received import received_pairs
from nbdiff.engine.replay import magnitude
from nbdiff.engine.types import StepRecord, TolFn
from nbdiff.judge.blame import EventDiff, post_order
from nbdiff.judge.bulk import Comparisons
from nbdiff.judge.by_statistics import BY_STATISTICS, compare_statistics
from nbdiff.judge.metrics import TensorDiff, compare_tensors
from nbdiff.judge.tolerance import Tolerance, loosest
from nbdiff.trace.events import Event, Kind, TensorRecord

__all__ = [
    "tensor_diffs",
    "add_tensor_diffs",
    "by_statistics",
    "forward_diffs",
    "api_local",
    "at_least_as_loose",
    "loose_tols",
    "remembered",
]


def tensor_diffs(
    raw: Sequence[TensorRecord],
    base: Sequence[TensorRecord],
    tol: Callable[[str, str], Tolerance],
    mode: str,
    scale_hint: float = 0.0,
    hint_covers: bool = False,
) -> list[TensorDiff]:
    """Compare tensors paired by name (else position); ``hint_covers``: ``scale_hint`` is at least
    every base tensor's largest magnitude (see :func:`compare_tensors`)."""
    batch = Comparisons(mode)
    add_tensor_diffs(batch, raw, base, tol, scale_hint, hint_covers)
    return batch.made()


def add_tensor_diffs(
    batch: Comparisons,
    raw: Sequence[TensorRecord],
    base: Sequence[TensorRecord],
    tol: Callable[[str, str], Tolerance],
    scale_hint: float = 0.0,
    hint_covers: bool = False,
) -> None:
    """:func:`tensor_diffs`, added to ``batch``: a step's comparisons are decided together."""
    by_name = {t.name: t for t in base}
    for i, r in enumerate(raw):
        b = by_name.get(r.name) or (base[i] if i < len(base) else None)
        if b is None:
            continue
        if r.value is not None and b.value is not None:
            # Recorded values are copies nothing writes again: passing ones get their metrics lazily.
            batch.add(r.name, r.value, b.value, tol(b.dtype, r.dtype), scale_hint, hint_covers)
        elif r.stats is not None and b.stats is not None:  # statistics-only dumps
            tolerance, mode = tol(b.dtype, r.dtype), batch.mode
            found = compare_statistics(r.name, r.stats, b.stats, tolerance, mode, b.shape, r.shape, scale_hint)
            batch.put(_with_sample(found, r, b, tolerance, mode, scale_hint))


def _with_sample(
    found: TensorDiff, r: TensorRecord, b: TensorRecord, tol: Tolerance, mode: str, scale_hint: float
) -> TensorDiff:
    """A statistics comparison, or its sampled values' where they differ more: drawn at the same
    positions of tensors of the same shape, they show what moves no statistic (shuffled channels)
    or moves each less than its tolerance (a small epsilon)."""
    if r.sample is None or b.sample is None or r.sample.shape != b.sample.shape or r.shape != b.shape:
        return found
    if mode != "strict" or not np.isfinite(found.ratio):
        return found
    scale = max(abs(b.stats.min), abs(b.stats.max), scale_hint) if b.stats is not None else scale_hint
    sampled = compare_tensors(r.name, r.sample, b.sample, tol, mode, scale, lazy=True, hint_covers=True)
    if sampled.ratio <= found.ratio:
        return found
    return replace(sampled, note=f"{BY_STATISTICS} and {r.sample.size} sampled values")


def by_statistics(t: TensorDiff) -> bool:
    """Whether the comparison's verdict came from a statistics dump (its statistics or sampled values)."""
    return BY_STATISTICS in t.note


def forward_diffs(
    pairing: Pairing,
    brec: StepRecord,
    rrec: StepRecord,
    tol: Callable[[str, str], Tolerance],
    mode: str,
    read: Callable[[Event, Event], None] = lambda b, r: None,
) -> list[EventDiff]:
    """``read(base, raw)`` is told each pair of events once its outputs were compared."""
    pairs = [(p.base, p.raw) for p in pairing.pairs] + api_pairs(pairing, brec.forward, rrec.forward)
    pairs = under_paired_ancestors(pairs, brec.forward)
    batch, spans, loose = Comparisons(mode), [], loose_tols(tol)
    for b, r in pairs:
        start = len(batch)
        add_tensor_diffs(batch, r.outputs, b.outputs, loose([t.dtype for t in b.inputs + r.inputs]))
        spans.append((b, r, start, len(batch)))
        batch.when_decided(partial(read, b, r))
    made = batch.made()
    diffs = [EventDiff(b, r, tuple(made[start:end])) for b, r, start, end in spans]
    diffs = _given_diffs(diffs, tol, mode)
    ordered = _input_diffs(pairing, tol, mode) + post_order(diffs)
    bl = [e for e in brec.forward if e.kind is Kind.LOSS]
    rl = [e for e in rrec.forward if e.kind is Kind.LOSS]
    if bl and rl:
        # A loss is a reduction of the outputs: its rounding is relative to them, not to its own
        # value (the mean of LayerNorm outputs is about 0).
        roots = [e for e in brec.forward if e.kind is Kind.LAYER and e.parent is None]
        hint = _reduction_scale([t.value for e in roots for t in e.outputs if t.value is not None], tol)
        # ... and it is as precise as the outputs it reduces: bf16 outputs give a bf16-precise loss,
        # whatever dtype the mean was taken in.
        raw_roots = [e for e in rrec.forward if e.kind is Kind.LAYER and e.parent is None]
        loss_tol = at_least_as_loose(tol, [t.dtype for e in roots + raw_roots for t in e.outputs])
        loss = tensor_diffs(rl[0].outputs, bl[0].outputs, loss_tol, mode, hint)
        counts = [sum(1 for e in side for t in e.outputs if t.floating) for side in (roots, raw_roots)]
        if counts[0] != counts[1]:
            note = (f"the models return {counts[0]} (base) and {counts[1]} (raw) floating outputs, and the default "
                    "loss weighs them all: return the same outputs, or pass loss_fns")  # fmt: skip
            loss = [replace(t, note=note) for t in loss]
        ordered.append(EventDiff(bl[0], rl[0], tuple(loss)))
    return ordered


def _given_diffs(diffs: list[EventDiff], tol: TolFn, mode: str) -> list[EventDiff]:
    """Single-step: each raw layer ran on base's inputs, so its output agrees even when the code
    before it is wrong. What raw's own code had computed for it is compared with base's input,
    on the layer (``given:in[0]``) and on its parent (``fc2:in[0]``), whose code produced it."""
    at = {d.base.order: i for i, d in enumerate(diffs)}
    extra: dict[int, list[TensorDiff]] = {}
    for i, d in enumerate(diffs):
        if not d.raw.given:
            continue
        names = {g.name for g in d.raw.given}
        found = tensor_diffs(
            d.raw.given, [t for t in d.base.inputs if t.name in names], _input_tol(tol, d.base, d.raw), mode
        )
        extra.setdefault(i, []).extend(t.renamed(f"given:{t.name}") for t in found)
        if d.base.parent in at:
            name = d.base.path + (f"#{d.base.call}" if d.base.call else "")
            extra.setdefault(at[d.base.parent], []).extend(t.renamed(f"{name}:{t.name}") for t in found)
    return [replace(d, tensors=d.tensors + tuple(extra[i])) if i in extra else d for i, d in enumerate(diffs)]


def _input_diffs(pairing: Pairing, tol: TolFn, mode: str) -> list[EventDiff]:
    """The root calls' inputs, compared before any layer: different inputs are a finding of their
    own, not a divergence of the first layer or the loss."""
    roots = [p for p in pairing.pairs if p.base.parent is None and p.base.depth == 0 and p.raw.depth == 0]
    if not roots:
        return []
    b, r = roots[0].base, roots[0].raw
    as_input = lambda e: replace(  # noqa: E731
        e, kind=Kind.INPUT, order=-1, path="<inputs>", type_name="Inputs", parent=None, inputs=(), outputs=e.inputs
    )
    return [EventDiff(as_input(b), as_input(r), tuple(tensor_diffs(r.inputs, b.inputs, tol, mode)))]


def _reduction_scale(outputs: list[np.ndarray], tol: TolFn) -> float:
    """The magnitude a mean of ``outputs`` is judged against: its error is at most the mean of the
    outputs' allowed errors, ``atol * max|x| + rtol * mean|x|``, written as a scale for ``atol``."""
    floats = [a for a in outputs if a.size and a.dtype.kind == "f"]
    if not floats:
        return 0.0
    t = tol(str(floats[0].dtype), str(floats[0].dtype))
    mean_abs = max(float(np.mean(np.abs(a))) for a in floats)
    return magnitude(floats) + (t.rtol / t.atol * mean_abs if t.scaled and t.atol > 0 else 0.0)


def _input_tol(tol: TolFn, b: Event, r: Event) -> TolFn:
    """The tolerance of an event's outputs also allows for its inputs' dtype (fp16 in, fp32 out)."""
    return at_least_as_loose(tol, [t.dtype for t in b.inputs + r.inputs])


def loose_tols(tol: TolFn) -> Callable[[Sequence[str]], TolFn]:
    """``at_least_as_loose(tol, dtypes)``, each made once per list of dtypes, its tolerances once per pair
    of dtypes: a step asks it of every event, and each event of every tensor."""
    made: dict[tuple[str, ...], TolFn] = {}

    def of(dtypes: Sequence[str]) -> TolFn:
        key = tuple(dtypes)
        found = made.get(key)
        if found is None:
            found = made[key] = remembered(at_least_as_loose(tol, key))
        return found

    return of


def remembered(tol: TolFn) -> TolFn:
    """``tol``, asked once per pair of dtypes (a tolerance is a pure function of them)."""
    known: dict[tuple[str, str], Tolerance] = {}

    def of(a: str, b: str) -> Tolerance:
        found = known.get((a, b))
        if found is None:
            found = known[a, b] = tol(a, b)
        return found

    return of


def at_least_as_loose(tol: TolFn, dtypes: Sequence[str]) -> TolFn:
    """``tol``, at least as loose as the loosest of ``dtypes``: what a result is computed from (a loss
    from bf16 outputs, a gradient whose array is float32 only because numpy has no bfloat16)."""
    worst = loosest(list(dtypes))
    return lambda x, y: tol(loosest([x, y, worst]), worst)


def api_local(
    d: EventDiff, tol: TolFn, mode: str, received: str = "inputs", amplified: float = 0.0
) -> tuple[TensorDiff, ...] | None:
    """Local error without replay: the event's own results' error when what it received agrees
    (``received``: its inputs in forward, the gradients at its outputs in backward), else none.
    ``amplified``: what it received differing within tolerance, made that many times larger,
    explains as much of its error (a projection onto a large vocabulary after a bug upstream),
    relative to each side's tolerance or in plain size: a tanh hands on at most the difference it
    was given, whose tolerance (relative to larger inputs) was looser than its own output's."""
    raw, base = received_pairs(getattr(d.raw, received), getattr(d.base, received))
    got = tensor_diffs(raw, base, tol, mode)
    if not got:
        return None  # nothing to judge by
    if not all(t.passed for t in got):
        return ()
    if d.ratio <= amplified * max(t.ratio for t in got):
        return ()
    given = max(t.max_abs for t in got)
    made = max((t.max_abs for t in d.tensors), default=0.0)
    return () if given > 0 and made <= amplified * given else d.tensors


def received_differ(raw: Sequence[TensorRecord], base: Sequence[TensorRecord], tol: TolFn, mode: str) -> bool:
    """Whether what two calls received (inputs, or the gradients arriving) differs beyond tolerance."""
    return received_ratio(raw, base, tol, mode) > 1.0


def received_ratio(raw: Sequence[TensorRecord], base: Sequence[TensorRecord], tol: TolFn, mode: str) -> float:
    """How far what two calls received differs, in multiples of its tolerance (the worst tensor; 0: none)."""
    r, b = received_pairs(raw, base)
    return max((0.0 if t.passed else max(t.ratio, 1.0 + 1e-9) for t in tensor_diffs(r, b, tol, mode)), default=0.0)
