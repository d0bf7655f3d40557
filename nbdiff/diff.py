"""``auto_diff``: copy weights, run both models step by step, compare, and blame."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing, pair_forward
from nbdiff.compare.blame import Divergence, EventDiff, blame_events, post_order
from nbdiff.compare.metrics import COMPARE_MODES, TensorDiff, compare_tensors
from nbdiff.compare.tolerance import Tolerance, resolve_tolerance
from nbdiff.errors import InputError, OptionError, PairingError, WeightTransferError
from nbdiff.frameworks import Framework, framework_of
from nbdiff.replay import Replayer, compare_param_grads, largest_shape, magnitude
from nbdiff.result import DiffResult
from nbdiff.step import StepRecord, run_optimizer, run_step
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.inputs import split_inputs
from nbdiff.trace.modes import no_dropout, restore_state, save_state, training_flags
from nbdiff.trace.recorder import Feed
from nbdiff.trace.structure import forward_structure
from nbdiff.weights.assign import WeightMap, assign_weight, execution_pairs, plan_pairs, plan_weights, write_weights
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = ["auto_diff"]

PHASES = ("both", "forward", "backward")
UPDATE_ATOL = 1e-3
"""Default tolerance of optimizer updates, relative to the largest update of the tensor."""
_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}


def _check_options(loss_fns: Any, optimizers: Any, compare_mode: str, diff_phase: str, steps: int) -> None:
    if compare_mode not in COMPARE_MODES:
        raise OptionError(f"compare_mode={compare_mode!r} is not one of {COMPARE_MODES}.")
    if diff_phase not in PHASES:
        raise OptionError(f"diff_phase={diff_phase!r} is not one of {PHASES}.")
    if not isinstance(steps, int) or steps < 1:
        raise OptionError(f"steps={steps!r} must be a positive integer.")
    for name, value in (("loss_fns", loss_fns), ("optimizers", optimizers)):
        if value is not None and (not isinstance(value, (list, tuple)) or len(value) != 2):
            raise InputError(f"{name} must be a pair [for base, for raw]; got {value!r}.")
    if steps > 1 and optimizers is None:
        raise OptionError(
            f"steps={steps} needs optimizers=[base_opt, raw_opt] (framework optimizers, or zero-argument "
            "callables that step and clear gradients): without them every step would be the same."
        )
    if steps > 1 and diff_phase == "forward":
        raise OptionError("steps > 1 trains the models, which needs backward; use diff_phase='both'.")


def auto_diff(
    base: Any,
    raw: Any,
    inputs: Any,
    loss_fns: Sequence[Callable[[Any], Any] | None] | None = None,
    optimizers: Sequence[Any] | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    compare_mode: str = "strict",
    auto_init: bool = True,
    diff_phase: str = "both",
    single_step: bool = False,
    steps: int = 1,
    layer_map: LayerMap | None = None,
) -> DiffResult:
    """Find where ``raw`` first stops agreeing with ``base``.

    ``inputs`` is ``(base_inputs, raw_inputs)`` (each a tensor, a tuple of positional
    arguments or a dict of keyword arguments) or one numpy array for both. With
    ``auto_init`` the base weights are copied into raw first. ``atol``/``rtol`` left
    as ``None`` use dtype-aware defaults under which equivalent models pass.
    Returns a :class:`DiffResult`, truthy when the models agree.
    """
    _check_options(loss_fns, optimizers, compare_mode, diff_phase, steps)
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(inputs, bfw, rfw)
    copied = _first_copy(bfw, base, rfw, raw, layer_map, inputs) if auto_init else None
    losses = list(loss_fns) if loss_fns is not None else [None, None]
    opts = list(optimizers) if optimizers is not None else None
    backward = diff_phase != "forward"

    def tol(a: str, b: str) -> Tolerance:
        return resolve_tolerance(atol, rtol, a, b)

    def run_pair(step: int, pairing: Pairing | None) -> tuple[StepRecord, StepRecord, Pairing]:
        for fw, model, opt in ((bfw, base, opts[0] if opts else None), (rfw, raw, opts[1] if opts else None)):
            fw.zero_grad(model, opt)
            fw.seed(step)
        brec = run_step(bfw, base, bcall, losses[0], side="base", step=step, backward=backward)
        feed = None
        if single_step:
            if pairing is None:
                # The pairing of this step's calls is needed before raw runs: take it from a first raw run.
                probe = StepRecord(forward_structure(rfw, raw, rcall, "raw", train=True), [], [])
                pairing = _pair(brec, probe, layer_map, bfw, base, rfw, raw)
            feed = _feed(brec, pairing, diff_phase)
        rrec = run_step(rfw, raw, rcall, losses[1], side="raw", step=step, backward=backward, feed=feed)
        return brec, rrec, _pair(brec, rrec, layer_map, bfw, base, rfw, raw)

    events: list[EventDiff] = []
    warnings: list[str] = []
    divergence: Divergence | None = None
    pairing: Pairing | None = None
    wmap: WeightMap | None = None
    done = 0
    with ExitStack() as stack:
        for fw, model in ((bfw, base), (rfw, raw)):
            stack.enter_context(training_flags(fw, model))
            stack.enter_context(no_dropout(fw, model))
            stack.callback(fw.zero_grad, model, None)
        initial = [save_state(bfw, base), save_state(rfw, raw)]
        if opts is None:
            # Not training: running statistics end as they were (raw's as copied from base).
            stack.callback(lambda: (restore_state(bfw, initial[0]), restore_state(rfw, initial[1])))
        for step in range(steps):
            brec, rrec, pairing = run_pair(step, pairing)
            if wmap is None:
                # Weights pair by execution order: this step's pairing decides. A structure copy
                # that paired any layer differently is redone from it, and the step run again.
                wmap = plan_pairs(bfw, base, rfw, raw, execution_pairs(pairing))
                if copied is not None and not copied.covers(wmap):
                    restore_state(bfw, initial[0])
                    restore_state(rfw, initial[1])
                    write_weights(bfw, base, rfw, raw, wmap)
                    initial[1] = save_state(rfw, raw)
                    brec, rrec, pairing = run_pair(step, pairing)
                warnings += wmap.warnings
                plans = wmap.by_base_path()
                replayer = Replayer(bfw, rfw, plans, tol, compare_mode)
            warnings += [f"base: {w}" for w in brec.warnings] + [f"raw: {w}" for w in rrec.warnings]
            fwd = _forward_diffs(pairing, brec, rrec, tol, compare_mode)
            bwd = (
                _backward_diffs(pairing, brec, rrec, plans, bfw, base, rfw, raw, tol, compare_mode) if backward else []
            )
            if divergence is None and diff_phase != "backward":
                divergence, fwd = blame_events(fwd, lambda d, rp=replayer: _local_forward(rp, d))
            if divergence is None and bwd:
                divergence, bwd = blame_events(bwd, lambda d, rp=replayer, b=brec, r=rrec: _local_backward(rp, b, r, d))
            events += fwd + bwd
            if opts is not None and backward:
                odiffs = _optimizer_step(step, plans, bfw, base, opts[0], rfw, raw, opts[1], tol, compare_mode)
                events += odiffs
                if divergence is None:
                    divergence, _ = blame_events(odiffs, lambda d: d.tensors)
                    if divergence is not None:
                        divergence = _name_parameter(divergence, plans)
            done = step + 1
            if divergence is not None:
                break
    return DiffResult(
        base_framework=bfw.name,
        raw_framework=rfw.name,
        base_model=type(base).__name__,
        raw_model=type(raw).__name__,
        first_divergence=divergence,
        events=tuple(events),
        steps=done,
        unmatched_base=pairing.unmatched_base if pairing else (),
        unmatched_raw=pairing.unmatched_raw if pairing else (),
        warnings=tuple(warnings),
        options=dict(
            atol=atol,
            rtol=rtol,
            compare_mode=compare_mode,
            auto_init=auto_init,
            diff_phase=diff_phase,
            single_step=single_step,
            steps=steps,
            weight_map=wmap,
        ),
    )


def _first_copy(
    bfw: Framework, base: Any, rfw: Framework, raw: Any, layer_map: LayerMap | None, inputs: Any
) -> WeightMap:
    """Copy base weights into raw before the first step.

    By structure when that pairs every layer (no extra forward pass); ``auto_diff``
    checks it against the execution pairing of step 0. Otherwise by execution order,
    from one no-grad forward of each model.
    """
    if layer_map is None or not layer_map.map:
        try:
            wmap = plan_weights(base, raw)[2]
            write_weights(bfw, base, rfw, raw, wmap)
            return wmap
        except WeightTransferError:
            pass
    return assign_weight(base, raw, layer_map, inputs)


def _pair(
    brec: StepRecord, rrec: StepRecord, layer_map: LayerMap | None, bfw: Framework, base: Any, rfw: Framework, raw: Any
) -> Pairing:
    b = [e for e in brec.forward if e.kind is Kind.LAYER]
    r = [e for e in rrec.forward if e.kind is Kind.LAYER]
    pairing = pair_forward(b, r, layer_map, dict(bfw.named_layers(base)), dict(rfw.named_layers(raw)))
    nb, nr = len(pairing.pairs) + len(pairing.unmatched_base), len(pairing.pairs) + len(pairing.unmatched_raw)
    if not pairing.pairs or len(pairing.unmatched_base) * 2 > nb or len(pairing.unmatched_raw) * 2 > nr:
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


def _records(
    raw: Sequence[TensorRecord],
    base: Sequence[TensorRecord],
    tol: Callable[[str, str], Tolerance],
    mode: str,
    scale_hint: float = 0.0,
) -> list[TensorDiff]:
    by_name = {t.name: t for t in base}
    out = []
    for i, r in enumerate(raw):
        b = by_name.get(r.name) or (base[i] if i < len(base) else None)
        if b is not None and r.value is not None and b.value is not None:
            out.append(compare_tensors(r.name, r.value, b.value, tol(b.dtype, r.dtype), mode, scale_hint))
    return out


def _forward_diffs(
    pairing: Pairing, brec: StepRecord, rrec: StepRecord, tol: Callable[[str, str], Tolerance], mode: str
) -> list[EventDiff]:
    diffs = [EventDiff(p.base, p.raw, tuple(_records(p.raw.outputs, p.base.outputs, tol, mode))) for p in pairing.pairs]
    ordered = post_order(diffs)
    bl = [e for e in brec.forward if e.kind is Kind.LOSS]
    rl = [e for e in rrec.forward if e.kind is Kind.LOSS]
    if bl and rl:
        ordered.append(EventDiff(bl[0], rl[0], tuple(_records(rl[0].outputs, bl[0].outputs, tol, mode))))
    return ordered


def _param_grads(fw: Framework, layer: Any, recursive: bool) -> dict[str, np.ndarray]:
    out = {}
    for n, p in layer_tensors(fw, layer, recursive).items():
        g = fw.grad_of(p) if fw.is_trainable(p) else None
        if g is not None:
            out[n] = fw.to_numpy(g)
    return out


def _backward_diffs(
    pairing: Pairing,
    brec: StepRecord,
    rrec: StepRecord,
    plans: dict[str, LayerWeights],
    bfw: Framework,
    base: Any,
    rfw: Framework,
    raw: Any,
    tol: Callable[[str, str], Tolerance],
    mode: str,
) -> list[EventDiff]:
    bb = {(e.path, e.call): e for e in brec.backward}
    rb = {(e.path, e.call): e for e in rrec.backward}
    blayers, rlayers = dict(bfw.named_layers(base)), dict(rfw.named_layers(raw))
    diffs = []
    for p in pairing.pairs:
        b, r = bb.get((p.base.path, p.base.call)), rb.get((p.raw.path, p.raw.call))
        if b is None or r is None:
            continue
        plan = plans.get(p.base.path)
        own = plan is not None and p.base.call == 0 and plan.raw_path == p.raw.path
        bgrads = _param_grads(bfw, blayers[p.base.path], plan.recursive) if own else {}
        hint = magnitude([t.value for t in b.outputs + b.inputs] + list(bgrads.values()))
        tensors = _records(r.inputs, b.inputs, tol, mode, hint)
        if own:
            tensors += compare_param_grads(
                bgrads,
                _param_grads(rfw, rlayers[p.raw.path], plan.recursive),
                plan,
                tol,
                mode,
                hint,
                largest_shape(b.outputs),
            )
        diffs.append(EventDiff(b, r, tuple(tensors)))
    return sorted(diffs, key=lambda d: d.base.order)


def _local_forward(replayer: Replayer, d: EventDiff) -> tuple[TensorDiff, ...] | None:
    if d.base.kind is Kind.LOSS:
        return d.tensors
    return replayer.forward(d.base, d.raw)


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


def _feed(brec: StepRecord, pairing: Pairing, diff_phase: str) -> Feed:
    """Base inputs (forward) and base output gradients (backward) for each paired raw call."""
    bwd = {(e.path, e.call): e for e in brec.backward}
    inputs: dict[tuple[str, int], list[np.ndarray | None]] = {}
    grads: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for p in pairing.pairs:
        key = (p.raw.path, p.raw.call)
        if diff_phase != "backward":
            inputs[key] = [t.value for t in p.base.inputs]
        g = bwd.get((p.base.path, p.base.call))
        if g is not None and diff_phase != "forward":
            grads[key] = {t.name: t.value for t in g.outputs}
    return Feed(inputs, grads)


def _snapshot(fw: Framework, model: Any, plans: dict[str, LayerWeights], side: str) -> dict[str, dict[str, np.ndarray]]:
    layers = dict(fw.named_layers(model))
    out = {}
    for plan in plans.values():
        layer = layers[plan.base_path if side == "base" else plan.raw_path]
        out[plan.base_path] = {
            n: fw.to_numpy(p).copy() for n, p in layer_tensors(fw, layer, plan.recursive).items() if fw.is_trainable(p)
        }
    return out


def _optimizer_step(
    step: int,
    plans: dict[str, LayerWeights],
    bfw: Framework,
    base: Any,
    bopt: Any,
    rfw: Framework,
    raw: Any,
    ropt: Any,
    tol: Callable[[str, str], Tolerance],
    mode: str,
) -> list[EventDiff]:
    before = (_snapshot(bfw, base, plans, "base"), _snapshot(rfw, raw, plans, "raw"))
    run_optimizer(bfw, bopt, "base")
    run_optimizer(rfw, ropt, "raw")
    after = (_snapshot(bfw, base, plans, "base"), _snapshot(rfw, raw, plans, "raw"))
    diffs = []
    for order, (key, plan) in enumerate(plans.items()):
        bd = {n: after[0][key][n] - before[0][key][n] for n in after[0][key]}
        rd = {n: after[1][key][n] - before[1][key][n] for n in after[1][key]}
        if not bd or not rd:
            continue

        def update_tol(a: str, b: str, _after: dict = after[1][key]) -> Tolerance:
            # An update is a small difference of large numbers: allow a few roundings of the weight itself.
            scale = max((float(np.abs(v).max()) for v in _after.values() if v.size), default=0.0)
            floor = 4 * max(_EPS.get(a, _EPS["float32"]), _EPS.get(b, _EPS["float32"])) * scale
            # Adam-like updates divide by |grad|: elements with tiny gradients change by a
            # visible fraction of the step for rounding-level gradient differences, so updates
            # get at least 0.1% of the largest update (a wrong learning rate is 10x beyond).
            user = tol(a, b)
            return replace(user, atol=max(user.atol, UPDATE_ATOL) if user.scaled else user.atol, floor=floor)

        tensors = compare_param_grads(bd, rd, plan, update_tol, mode)
        ev_b = Event(
            step,
            Phase.OPTIMIZER,
            Kind.PARAM,
            order,
            plan.base_path,
            plan.base_type,
            0,
            0,
            None,
            True,
            (),
            tuple(TensorRecord(n, v.shape, str(v.dtype), v) for n, v in bd.items()),
        )
        ev_r = Event(
            step,
            Phase.OPTIMIZER,
            Kind.PARAM,
            order,
            plan.raw_path,
            plan.raw_type,
            0,
            0,
            None,
            True,
            (),
            tuple(TensorRecord(n, v.shape, str(v.dtype), v) for n, v in rd.items()),
        )
        diffs.append(EventDiff(ev_b, ev_r, tuple(tensors)))
    return diffs


def _name_parameter(div: Divergence, plans: dict[str, LayerWeights]) -> Divergence:
    """Name the diverging parameter as the base model calls it."""
    name = div.metrics.name
    plan = plans.get(div.base_path)
    if plan is not None:
        try:
            back = plan.inverse({name: np.zeros((1, 1))})
            name = next(iter(back)) if len(back) == 1 else name
        except (KeyError, ValueError, StopIteration):
            pass
    prefix = f"{div.base_path}." if div.base_path else ""
    return replace(div, where="parameter", inherited=False, parameter=prefix + name)
