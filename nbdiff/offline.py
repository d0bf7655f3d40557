"""``compare``: two dumps written by :func:`nbdiff.record`, every step of every rank.

Without the models there is no replay, so the local error of an event is judged
from what the dump holds: an event whose own inputs agree (forward: the tensors
passed in; backward: the gradients arriving at its outputs) but whose results do
not is where the error arises; one whose inputs already differ inherited it.
Parameter gradients and updates are converted between layouts with the same
weight rules as ``assign_weight``, found by the layer classes the dump recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.pairing import Pairing, pair_forward
from nbdiff.compare.blame import Divergence, EventDiff, blame_events, first_nonfinite
from nbdiff.compare.tolerance import Tolerance, resolve_tolerance
from nbdiff.errors import DumpError, OptionError
from nbdiff.forwarddiff import api_local, forward_diffs, tensor_diffs
from nbdiff.layer_paths import relative
from nbdiff.options import check_tolerances
from nbdiff.replay import largest_shape, magnitude, param_grad_hint
from nbdiff.result import DiffResult, StepRow, step_error_rows
from nbdiff.step import StepRecord
from nbdiff.stepdiff import name_parameter, update_tolerance
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord, changed
from nbdiff.trace.store import RankDump, rank_dirs, read_dump
from nbdiff.updates import GradientSpread, discount_updates
from nbdiff.weights.rules import WeightRule, find_rule

__all__ = ["compare"]

TolFn = Callable[[str, str], Tolerance]


def compare(
    dir_a: str | os.PathLike[str],
    dir_b: str | os.PathLike[str],
    *,
    atol: float | None = None,
    rtol: float | None = None,
    compare_mode: str = "strict",
    ignore_unmatched: bool = False,
    keep_steps: int = 4,
) -> DiffResult:
    """Compare dump ``dir_b`` (raw) against ``dir_a`` (base): every rank, every step.

    The first divergence is the earliest step's, then the lowest rank's. Unmatched
    ranks or steps are an error unless ``ignore_unmatched``; unpaired events are
    reported in the result either way.

    Every step's worst errors are kept (``result.step_errors()``); events are kept for the first
    ``keep_steps`` steps and for the blamed step, so memory stays bounded by a few steps.
    """
    ranks_a, ranks_b = _ranks_at_the_door(dir_a, dir_b, atol, rtol, compare_mode, keep_steps, ignore_unmatched)

    def tol(a: str, b: str) -> Tolerance:
        return resolve_tolerance(atol, rtol, a, b)

    kept = _KeptSteps(keep_steps)
    warnings: list[str] = []
    unmatched = _Unmatched()
    steps = 0
    first_a = first_b = None
    for rank in sorted(set(ranks_a) & set(ranks_b)):
        a, b = read_dump(ranks_a[rank], lazy=True), read_dump(ranks_b[rank], lazy=True)
        first_a, first_b = first_a or a, first_b or b
        if len(a.steps) != len(b.steps):
            msg = f"rank {rank}: {dir_a} has {len(a.steps)} step(s), {dir_b} has {len(b.steps)}"
            if not ignore_unmatched:
                raise DumpError(msg + "; pass ignore_unmatched=True to compare the common steps.")
            warnings.append(msg + ": compared the common steps.")
        for dump in (a, b):
            if not dump.closed:
                warnings.append(
                    f"{dump.path}: the recording did not end cleanly (crash or kill); its {len(dump.steps)} "
                    "complete step(s) are compared."
                )
        spread: GradientSpread | None = GradientSpread()  # until the first divergence; then only the chart reads
        for k in range(min(len(a.steps), len(b.steps))):
            cut = [str(d.path) for d in (a, b) if k in d.incomplete]
            if cut:
                warnings.append(f"rank {rank}, step {k}: cut short by an exception in {', '.join(cut)}; not compared.")
                continue
            div, diffs, pairing = _compare_step(a, b, rank, k, tol, compare_mode, spread)
            spread = spread if div is None else None
            kept.add(k, rank, div, diffs)
            unmatched.add(pairing)
            steps = max(steps, k + 1)
    if first_a is None or first_b is None:
        raise DumpError(f"{dir_a} and {dir_b} have no rank in common.")
    if not kept.compared:
        # Nothing compared is never agreement (a scope that matched nothing, only cut-short steps).
        raise DumpError(
            f"{dir_a} and {dir_b}: no event was compared ({'; '.join(warnings) or 'the dumps hold no events'}). "
            "Check the recording's mode/scope, and that each dump holds a complete step."
        )
    return DiffResult(
        base_framework=first_a.framework,
        raw_framework=first_b.framework,
        base_model=str(first_a.meta["model"]),
        raw_model=str(first_b.meta["model"]),
        first_divergence=kept.divergence,
        events=kept.events(),
        steps=steps,
        unmatched_base=tuple(unmatched.base.values()),
        unmatched_raw=tuple(unmatched.raw.values()),
        warnings=tuple(warnings),
        notes=kept.summarised(),
        options=dict(
            atol=atol, rtol=rtol, compare_mode=compare_mode, keep_steps=keep_steps, dumps=(str(dir_a), str(dir_b))
        ),
        step_summary=tuple(kept.rows[k] for k in sorted(kept.rows)),
    )


def _ranks_at_the_door(
    dir_a: Any, dir_b: Any, atol: Any, rtol: Any, mode: Any, keep_steps: Any, ignore_unmatched: bool
) -> tuple[dict[int, Any], dict[int, Any]]:
    """The options checked, and each dump's rank folders (the same ranks unless ``ignore_unmatched``)."""
    check_tolerances(atol, rtol, mode)
    if isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < 0:
        raise OptionError(f"keep_steps={keep_steps!r}: expected a whole number >= 0 (steps whose events are kept).")
    ranks_a, ranks_b = rank_dirs(dir_a), rank_dirs(dir_b)
    if set(ranks_a) != set(ranks_b) and not ignore_unmatched:
        raise DumpError(
            f"{dir_a} has ranks {sorted(ranks_a)} but {dir_b} has {sorted(ranks_b)}; "
            "record every rank, or pass ignore_unmatched=True to compare the common ones."
        )
    return ranks_a, ranks_b


class _KeptSteps:
    """What ``compare`` keeps of the steps it compared: every step's worst errors, the events of the
    first ``keep`` steps (statistics only once settled) and all of the blamed step's. Memory is
    bounded by a few steps, however many the dumps hold."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.rows: dict[int, StepRow] = {}
        self.compared = 0
        self.divergence: Divergence | None = None
        self._blamed: tuple[int, int, list[EventDiff]] | None = None
        self._settled: dict[tuple[int, int], list[EventDiff]] = {}
        self._dropped: set[int] = set()

    def add(self, k: int, rank: int, div: Divergence | None, diffs: list[EventDiff]) -> None:
        self.compared += len(diffs)
        step_error_rows(diffs, into=self.rows)
        if div is not None and (self.divergence is None or (k, rank) < (self.divergence.step, self.divergence.rank)):
            if self._blamed is not None:  # an earlier step (of a later rank) diverged too: it is the answer
                self._settle(*self._blamed)
            self.divergence, self._blamed = div, (k, rank, diffs)
        else:
            self._settle(k, rank, diffs)

    def _settle(self, k: int, rank: int, diffs: list[EventDiff]) -> None:
        if k < self.keep:
            self._settled[(k, rank)] = [_settled(d) for d in diffs]
        else:
            self._dropped.add(k)

    def events(self) -> tuple[EventDiff, ...]:
        chunks = dict(self._settled)
        if self._blamed is not None:
            k, rank, diffs = self._blamed
            chunks[(k, rank)] = diffs
        return tuple(d for key in sorted(chunks) for d in chunks[key])

    def summarised(self) -> tuple[str, ...]:
        dropped = sorted(self._dropped - ({self._blamed[0]} if self._blamed else set()))
        if not dropped:
            return ()
        return (
            f"{len(dropped)} step(s) from step {dropped[0]} on are summarised by their worst errors "
            f"(result.step_errors(), the step chart), not kept event by event, so that memory stays bounded; "
            f"pass keep_steps={dropped[-1] + 1} to keep them all.",
        )


class _Unmatched:
    """Events left unpaired, each layer call once, however many steps it went unpaired in."""

    def __init__(self) -> None:
        self.base: dict[tuple[int, str, str, int], Event] = {}
        self.raw: dict[tuple[int, str, str, int], Event] = {}

    def add(self, pairing: Pairing) -> None:
        for into, events in ((self.base, pairing.unmatched_base), (self.raw, pairing.unmatched_raw)):
            for e in events:
                into.setdefault((e.rank, e.phase.value, e.path, e.call), e)


def _settled(d: EventDiff) -> EventDiff:
    """``d`` with every metric computed and its events' tensors reduced to statistics."""

    def records(ts: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
        return tuple(t if t.value is None else replace(t, value=None, stats=t.statistics()) for t in ts)

    def event(e: Event) -> Event:
        return replace(e, inputs=records(e.inputs), outputs=records(e.outputs), params=records(e.params))

    metrics = lambda ts: None if ts is None else tuple(replace(t, detail=None) for t in ts)  # noqa: E731
    return replace(d, base=event(d.base), raw=event(d.raw), tensors=metrics(d.tensors), local=metrics(d.local))


def _ranked(events: list[Event], rank: int) -> list[Event]:
    return [replace(e, rank=rank) for e in events] if rank else events


def _compare_step(
    a: RankDump, b: RankDump, rank: int, k: int, tol: TolFn, mode: str, spread: GradientSpread | None = None
) -> tuple[Divergence | None, list[EventDiff], Pairing]:
    ea, eb = _ranked(a.steps[k], rank), _ranked(b.steps[k], rank)
    by_phase = lambda es, ph: [e for e in es if e.phase is ph]  # noqa: E731
    fa, fb = by_phase(ea, Phase.FORWARD), by_phase(eb, Phase.FORWARD)
    pairing = pair_forward([e for e in fa if e.kind is Kind.LAYER], [e for e in fb if e.kind is Kind.LAYER])
    brec, rrec = StepRecord(fa, by_phase(ea, Phase.BACKWARD), []), StepRecord(fb, by_phase(eb, Phase.BACKWARD), [])
    fwd = forward_diffs(pairing, brec, rrec, tol, mode)
    divergence, fwd = blame_events(fwd, lambda d: d.tensors if d.base.kind is Kind.LOSS else api_local(d, tol, mode))
    # The first event producing NaN/Inf is a finding even where both runs agree on it, as in auto_diff.
    nonfinite = first_nonfinite(fwd)
    if nonfinite is not None and (divergence is None or _ran_before(nonfinite, divergence)):
        divergence = nonfinite
    bwd = _backward(pairing, brec, rrec, a, b, tol, mode)
    if divergence is None:
        divergence, bwd = blame_events(bwd, lambda d: api_local(d, tol, mode, "outputs"))

    # Each run's optimizer stepped from its own gradients: updates may differ by what those explain.
    # Each step's gradients are read once, when an update first fails, and folded into ``spread``.
    raw_of = {p.base.path: p.raw.path for p in pairing.pairs}

    def step_grads(s: int) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        ga, gb = _param_grads(a.steps[s]), _param_grads(b.steps[s])
        paths = {bp: raw_of.get(bp, bp) for bp in ga}
        return {bp: (_convert(_rule(a, b, bp, rp), ga[bp]), gb.get(rp, {})) for bp, rp in paths.items()}

    def grads() -> GradientSpread | None:
        return spread.catch_up(k, step_grads) if spread is not None else None

    upd = _updates(raw_of, by_phase(ea, Phase.OPTIMIZER), by_phase(eb, Phase.OPTIMIZER), a, b, tol, mode, grads)
    if divergence is None:
        divergence, _ = blame_events(upd, lambda d: d.tensors)
        if divergence is not None:
            divergence = name_parameter(divergence, {})
    return divergence, fwd + bwd + upd, pairing


def _ran_before(a: Divergence, b: Divergence) -> bool:
    return a.event is not None and b.event is not None and a.event.base.order < b.event.base.order


_Rule = tuple[WeightRule, bool] | None
"""A weight rule and whether its inverse applies (:func:`find_rule`), or None: the same layout."""


def _rule(a: RankDump, b: RankDump, bpath: str, rpath: str) -> _Rule:
    """The weight rule for the two layers' classes, looked up once per pair."""
    return find_rule(a.framework, a.layers.get(bpath, []), b.framework, b.layers.get(rpath, []))


def _convert(found: _Rule, arrays: dict[str, Any]) -> dict[str, Any]:
    """Base arrays in raw's layout, by the weight rule for the two layer classes (if any)."""
    if found is None:
        return arrays
    rule, inverted = found
    try:
        return (rule.inverse if inverted else rule.convert)(dict(arrays))
    except (KeyError, ValueError):
        return arrays


def _converted_records(found: _Rule, records: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
    if not records:
        return records
    if any(t.value is None for t in records):
        return _converted_stats(found, records)
    out = _convert(found, {t.name: t.value for t in records})
    dtype = records[0].dtype
    return tuple(TensorRecord(n, tuple(v.shape), dtype, v) for n, v in out.items())


def _converted_stats(found: _Rule, records: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
    """Statistics survive renames and transposes, not splits: follow each tensor through the rule
    with a constant stand-in (tensor ``i`` filled with ``i``) and keep the outputs that are one
    whole tensor (made of it alone, and as large)."""
    # Broadcast views: no memory is allocated from a shape the (untrusted) dump claims.
    dummies = {t.name: np.broadcast_to(np.float64(i), t.shape) for i, t in enumerate(records)}
    out = _convert(found, dummies)
    kept = []
    for name, arr in out.items():
        if arr.size == 0:
            continue
        if any(s != 0 for s in arr.strides):  # the rule copied (a reshape, a split, a concatenation)
            values = np.unique(arr)
            if values.size != 1:
                continue  # made of several tensors: no one tensor's statistics
        i = int(arr.flat[0])
        if 0 <= i < len(records) and arr.size == np.prod(records[i].shape):  # not a piece of it (a split)
            src = records[i]
            kept.append(TensorRecord(name, tuple(arr.shape), src.dtype, None, src.stats))
    return tuple(kept)


def _backward(
    pairing: Pairing, brec: StepRecord, rrec: StepRecord, a: RankDump, b: RankDump, tol: TolFn, mode: str
) -> list[EventDiff]:
    bb = {(e.path, e.call): e for e in brec.backward}
    rb = {(e.path, e.call): e for e in rrec.backward}
    diffs = []
    for p in pairing.pairs:
        be, re_ = bb.get((p.base.path, p.base.call)), rb.get((p.raw.path, p.raw.call))
        if be is None or re_ is None:
            continue
        bparams, rparams = be.params, re_.params
        found = _rule(a, b, be.path, re_.path)
        if found is not None and found[0].recursive:  # the rule's tensors include its sublayers'
            bparams, rparams = _subtree_params(brec.backward, be.path), _subtree_params(rrec.backward, re_.path)
        hint = _magnitude(be.outputs + be.inputs + bparams)
        tensors = tensor_diffs(re_.inputs, be.inputs, tol, mode, hint)
        if bparams and rparams:
            base_params = {t.name: t for t in _converted_records(found, bparams)}
            out_shape = largest_shape(be.outputs)
            for r in rparams:  # each with its own summed-terms scale, as compare_param_grads does
                b_t = base_params.get(r.name)
                if b_t is not None:
                    tensors += tensor_diffs((r,), (b_t,), tol, mode, param_grad_hint(hint, tuple(r.shape), out_shape))
        diffs.append(EventDiff(be, re_, tuple(tensors)))
    return sorted(diffs, key=lambda d: d.base.order)


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


def _magnitude(records: tuple[TensorRecord, ...]) -> float:
    """Largest absolute value over the records, from values or (statistics dumps) from min/max."""
    values = [t.value for t in records if t.value is not None]
    stats = [t.stats for t in records if t.value is None and t.stats is not None]
    return max(magnitude(values), max((max(abs(s.min), abs(s.max)) for s in stats), default=0.0))


def _values(records: tuple[TensorRecord, ...]) -> dict[str, np.ndarray]:
    return {t.name: t.value for t in records if t.value is not None}


StepGrads = dict[str, dict[str, np.ndarray]]
"""One step's parameter gradients, by layer path then parameter name (summed over the layer's calls)."""


def _param_grads(events: list[Event]) -> StepGrads:
    out: StepGrads = {}
    for e in events:
        if e.phase is Phase.BACKWARD:
            for t in e.params:
                if t.value is not None:
                    held = out.setdefault(e.path, {})
                    held[t.name] = held[t.name] + t.value if t.name in held else t.value
    return out


def _updates(
    raw_of: dict[str, str],
    ua: list[Event],
    ub: list[Event],
    a: RankDump,
    b: RankDump,
    tol: TolFn,
    mode: str,
    grads: Callable[[], GradientSpread | None],
) -> list[EventDiff]:
    by_path = {e.path: e for e in ub}
    diffs = []
    for e in ua:
        r = by_path.get(raw_of.get(e.path, e.path))
        if r is None:
            continue
        converted = _converted_records(_rule(a, b, e.path, r.path), e.outputs)

        def utol(x: str, y: str) -> Tolerance:
            return update_tolerance(tol, x, y, 0.0)  # the dump keeps updates, not the weights

        tensors = tensor_diffs(r.outputs, converted, utol, mode)
        known = grads() if not all(t.passed for t in tensors) else None
        if known is not None:
            tensors = discount_updates(tensors, _values(converted), _values(r.outputs), known.of(e.path), mode)
        diffs.append(EventDiff(e, r, tuple(tensors)))
    return diffs
