"""Backward comparisons of one step: each paired layer call's input gradients and its parameters'
gradients, judged against the gradients arriving there. Live and recorded steps alike: where the
parameter gradients come from is the caller's (:data:`GradsOf`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from nbdiff.align.fused import fuse_events
from nbdiff.align.pairing import Pair, Pairing
from nbdiff.engine.forward import add_tensor_diffs, loose_tols, remembered
from nbdiff.engine.replay import array_magnitude, largest_shape, param_grad_hint, read_magnitudes
from nbdiff.engine.types import StepRecord, TolFn
from nbdiff.judge.blame import EventDiff
from nbdiff.judge.bulk import Comparisons
from nbdiff.trace.events import Event, TensorRecord

__all__ = ["GradsOf", "backward_diffs", "record_magnitude"]

GradsOf = Callable[[Pair, Event, Event], tuple[tuple[TensorRecord, ...], dict[str, TensorRecord]]]
"""``(pair, base backward event, raw's) -> (raw's parameter gradients, base's in raw's layout by name)``."""

Cache = dict[int, tuple[object, float]]


def record_magnitude(records: Iterable[TensorRecord], cache: Cache) -> float:
    """Largest absolute value over the records: from their values, or (statistics dumps) min and max."""
    out = 0.0
    for t in records:
        if t.value is not None:
            m = array_magnitude(t.value, cache)  # type: ignore[arg-type]
        elif t.stats is not None:
            m = max(abs(t.stats.min), abs(t.stats.max))
        else:
            continue
        if m > out:
            out = m
    return out


def backward_diffs(
    pairing: Pairing,
    brec: StepRecord,
    rrec: StepRecord,
    tol: TolFn,
    mode: str,
    grads_of: GradsOf,
    read: Callable[[Event, Event], None] = lambda b, r: None,
) -> list[EventDiff]:
    """Every paired call's backward event compared, in base's completion order."""
    base_groups = [g for g in pairing.fused if g.side == "base"]
    raw_groups = [g for g in pairing.fused if g.side == "raw"]
    bb = {(e.path, e.call): e for e in fuse_events(brec.backward, base_groups, backward=True)}
    rb = {(e.path, e.call): e for e in fuse_events(rrec.backward, raw_groups, backward=True)}
    batch, spans = Comparisons(mode), []
    tol, loose = remembered(tol), loose_tols(tol)
    cache: Cache = {}  # a layer's input gradient is often the next one's output's
    arriving = 0.0  # largest gradient arriving at any layer so far, in backward order
    paired = [(p, bb.get((p.base.path, p.base.call)), rb.get((p.raw.path, p.raw.call))) for p in pairing.pairs]
    paired = sorted(
        ((p, b, r) for p, b, r in paired if b is not None and r is not None), key=lambda x: -x[0].base.order
    )
    # The recorded gradients' magnitudes in one pass (the parameters' are made per pair below, and let go once compared).
    read_magnitudes((t.value for _, b, _ in paired for t in (*b.outputs, *b.inputs) if t.value is not None), cache)
    for p, b, r in paired:
        raw_params, base_params = grads_of(p, b, r)
        # A gradient is computed from the ones arriving before it: a sum of such terms that
        # cancels to ~0 (everything in front of a final LayerNorm under a mean loss) rounds
        # relative to them, not to itself.
        arriving = max(arriving, record_magnitude(b.outputs, cache))
        hint = max(arriving, record_magnitude(b.inputs, cache), record_magnitude(base_params.values(), cache))
        start = len(batch)
        # Handed as many tensors: the gradients leaving them compare one by one. paddle's attention takes
        # (h, h, h) where GPT-2's takes h once: each of its input gradients is a part of the other's.
        if _floats(p.base.inputs) == _floats(p.raw.inputs):
            add_tensor_diffs(batch, r.inputs, b.inputs, tol, hint, hint_covers=True)
        # Parameter gradients arrive as arrays (bf16 as float32): judge them at the layer's gradients' dtype.
        gtol = loose([t.dtype for e in (b, r) for t in (*e.inputs, *e.outputs)])
        out_shape = largest_shape(b.outputs)
        for rt in raw_params:  # each with its own summed-terms scale
            bt = base_params.get(rt.name)
            if bt is not None:
                scale = param_grad_hint(hint, tuple(rt.shape), out_shape)
                add_tensor_diffs(batch, (rt,), (bt,), gtol, scale, hint_covers=True)
        spans.append((b, r, start, len(batch)))
        batch.when_decided(partial(read, b, r))
    made = batch.made()
    diffs = [EventDiff(b, r, tuple(made[start:end])) for b, r, start, end in spans]
    return sorted(diffs, key=lambda d: d.base.order)


def _floats(records: tuple[TensorRecord, ...]) -> int:
    return sum(1 for t in records if t.floating)
