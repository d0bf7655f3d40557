"""``auto_diff``: copy weights, run both models step by step, compare, and blame."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.optimizer_settings import OptimizerLog
from nbdiff.align.pairing import Pairing
from nbdiff.compare.blame import Divergence, EventDiff, inherited_notes, inherited_warning, require_compared
from nbdiff.compare.tolerance import Tolerance, resolve_tolerance
from nbdiff.conditioning import Floor, measure_floor
from nbdiff.constants import constant_differences
from nbdiff.errors import WeightTransferError
from nbdiff.explain import explain
from nbdiff.feed import feed_for, guessed_feed, same_feed
from nbdiff.frameworks import Framework, framework_of
from nbdiff.gc_pause import gc_paused
from nbdiff.options import check_comparison, check_framework_differences, check_gradients, check_run
from nbdiff.progress import progress
from nbdiff.result import DiffResult
from nbdiff.spill import SPILL_ABOVE_MIB, spilled
from nbdiff.statediff import state_of
from nbdiff.step import StepRecord, run_optimizer, run_step
from nbdiff.stepdiff import StepComparer, live_param_grads
from nbdiff.trace.calls import Feed
from nbdiff.trace.inputs import split_inputs
from nbdiff.trace.modes import kept_rng, no_dropout, restore_state, save_state, save_weights, training_flags
from nbdiff.trace.spool import MEMORY_MIB, Spool
from nbdiff.weights.assign import WeightMap, assign_weight, execution_pairs, plan_pairing, plan_weights, write_weights

__all__ = ["auto_diff"]


@gc_paused()
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
    api_level: bool | str = False,
    spill_above_mib: float | None = SPILL_ABOVE_MIB,
    memory_mib: float | None = MEMORY_MIB,
    framework_differences: str = "report",
) -> DiffResult:
    """Find where ``raw`` first stops agreeing with ``base``.

    ``inputs`` is ``(base_inputs, raw_inputs)`` (each a tensor, a tuple of positional
    arguments or a dict of keyword arguments) or one numpy array for both. ``loss_fns``
    (base's, raw's) default to a fixed weighted mean of the outputs. With
    ``auto_init`` the base weights are copied into raw first. ``atol``/``rtol`` left
    as ``None`` use dtype-aware defaults under which equivalent models pass.
    ``api_level`` also records the framework functions each layer's own code calls
    (``F.gelu``, ``x @ w``), so blame can name the call inside a layer; ``"all"`` also
    records the calls inside framework-provided layers (``nn.Linear``'s own ``linear``).
    The result keeps every compared tensor for the view; once they take more than
    ``spill_above_mib`` MiB they are kept in a temporary file instead, read back when shown
    (``None``: always in memory). While it runs, a check holds at most ``memory_mib`` MiB
    of what it records in memory: the rest goes to a temporary file as it is recorded, so
    the peak stays that close to the models' own (``0``: bounded mode; ``None``: no limit).
    A difference a known framework difference explains exactly (paddle's biased BatchNorm
    ``running_var``) is a finding that does not fail the result; ``framework_differences="fail"``
    makes it fail. ``result.findings`` lists every own error of the step that diverged.
    Returns a :class:`DiffResult`, truthy when the models agree.
    """
    check_comparison(base, raw, atol, rtol, compare_mode, diff_phase, layer_map)
    check_run(loss_fns, optimizers, diff_phase, steps, spill_above_mib, memory_mib)
    check_framework_differences(framework_differences)
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    check_gradients((bfw, rfw), (base, raw), diff_phase)
    bcall, rcall = split_inputs(inputs, bfw, rfw)
    # A failure after the copy (or after training steps) leaves both models as they were given.
    # Base changes only when the optimizers train it: copy it only then (the copies cost memory).
    originals = [save_weights(bfw, base) if optimizers is not None else [], save_weights(rfw, raw)]
    try:
        copied = _first_copy(bfw, base, rfw, raw, layer_map, inputs) if auto_init else None
        losses = list(loss_fns) if loss_fns is not None else [None, None]
        opts = list(optimizers) if optimizers is not None else None
        backward = diff_phase != "forward"

        def tol(a: str, b: str) -> Tolerance:
            return resolve_tolerance(atol, rtol, a, b)

        spool = Spool(None if memory_mib is None else int(memory_mib * 2**20))
        cmp = StepComparer(bfw, base, rfw, raw, tol, compare_mode, diff_phase, layer_map, spool=spool)

        def run_pair(step: int, pairing: Pairing | None) -> tuple[StepRecord, StepRecord, Pairing]:
            def fresh(fw: Framework, model: Any, opt: Any) -> None:
                fw.zero_grad(model, opt)
                fw.seed(step)

            sides = ((bfw, base, opts[0] if opts else None), (rfw, raw, opts[1] if opts else None))
            for side in sides:
                fresh(*side)
            brec = run_step(
                bfw, base, bcall, losses[0], side="base", step=step, backward=backward, api_level=api_level, spool=spool
            )

            def run_raw(feed: Feed | None) -> tuple[StepRecord, Pairing]:
                rrec = run_step(
                    rfw, raw, rcall, losses[1], side="raw", step=step, backward=backward, feed=feed,
                    api_level=api_level, spool=spool,
                )  # fmt: skip
                return rrec, cmp.pair(brec, rrec)

            if not single_step:
                return brec, *run_raw(None)
            if pairing is not None:
                return brec, *run_raw(feed_for(brec, pairing, diff_phase))
            # Raw's calls are paired only once it has run: feed it by a guess (same paths, or the weight
            # copy's), then check the guess against the pairing; run raw again only where it was wrong.
            guess = guessed_feed(brec, diff_phase, copied.pairs() if copied else (), copied.fused if copied else ())
            rrec, pairing = run_raw(guess)
            right = feed_for(brec, pairing, diff_phase)
            if same_feed(guess, right, rrec):
                return brec, rrec, pairing
            restore_state(rfw, initial[1])
            fresh(*sides[1])
            return brec, *run_raw(right)

        events: list[EventDiff] = []
        warnings: list[str] = []
        divergence: Divergence | None = None
        found: list[Divergence] = []  # every finding: those of the step that diverged, and framework differences
        pairing: Pairing | None = None
        wmap: WeightMap | None = None
        done = 0
        log = OptimizerLog()  # the optimizers that step, and their learning rates, to say why an update differs
        with ExitStack() as stack:
            stack.callback(spool.close)
            stack.enter_context(kept_rng((bfw, rfw)))
            log.listen(stack, (bfw, rfw))
            for fw, model in ((bfw, base), (rfw, raw)):
                stack.enter_context(training_flags(fw, model))
                stack.enter_context(no_dropout(fw, model))
                stack.callback(fw.zero_grad, model, None)
            initial = [save_state(bfw, base), save_state(rfw, raw)]
            if opts is None:
                # Not training: running statistics end as they were (raw's as copied from base).
                stack.callback(restore_state, bfw, initial[0])
                stack.callback(lambda: restore_state(rfw, initial[1]))  # initial[1] may be replaced below
            for step in progress(range(steps), "nbdiff: steps", total=steps):
                if step and opts is not None and backward:
                    # Each step starts where base's does: the last update's own error was compared, and
                    # weights drifted by it (Adam: lr-sized) would flip ReLU masks and fail the next step.
                    cmp.feed_optimizer(grads=None)
                state_before = state_of(bfw, base)
                brec, rrec, pairing = run_pair(step, pairing)
                if wmap is None:
                    # Weights pair by execution order: this step's pairing decides. A structure copy
                    # that paired any layer differently is redone from it, and the step run again.
                    wmap = plan_pairing(bfw, base, rfw, raw, pairing, strict=auto_init)
                    if copied is not None and not copied.covers(wmap):
                        restore_state(bfw, initial[0])
                        restore_state(rfw, initial[1])
                        tied = write_weights(bfw, base, rfw, raw, wmap, restore_on_failure=False)
                        wmap = replace(wmap, warnings=wmap.warnings + tuple(tied))
                        initial[1] = save_state(rfw, raw)
                        brec, rrec, pairing = run_pair(step, pairing)
                    elif copied is not None:
                        wmap = replace(wmap, warnings=wmap.warnings + tuple(w for w in copied.warnings if "tied" in w))
                    warnings += wmap.warnings
                    warnings += constant_differences(
                        bfw, cmp.blayers, rfw, cmp.rlayers, execution_pairs(pairing), lambda a, b: tol(a, b)
                    )
                    cmp.set_plans(wmap.by_base_path())
                warnings += [f"base: {w}" for w in brec.warnings] + [f"raw: {w}" for w in rrec.warnings]
                floor = _floor_of(bfw, base, bcall, losses[0], brec, cmp, backward) if not single_step else None
                findings, diffs = cmp.compare(pairing, brec, rrec, floor=floor)
                events += diffs
                warnings += cmp.notes
                cmp.notes.clear()
                if opts is not None and backward:
                    cmp.feed_optimizer()
                    before = cmp.snapshot()
                    run_optimizer(bfw, opts[0], "base")
                    run_optimizer(rfw, opts[1], "raw")
                    stacks = (log.stack_at(bfw.name, step), log.stack_at(rfw.name, step))
                    updated, odiffs = cmp.compare_updates(step, before, cmp.snapshot(), stacks)
                    events += odiffs
                    findings += updated
                if cmp.keeps_state():
                    # Running statistics move in any train-mode forward, with or without optimizers.
                    stated, sdiffs = cmp.compare_state(step, state_before, brec.forward)
                    events += sdiffs
                    findings += stated
                done = step + 1
                failing = [f for f in findings if f.where != "framework" or framework_differences == "fail"]
                found += findings if failing else [f for f in findings if f.where == "framework"]
                if failing:
                    divergence = failing[0]
                    break
        require_compared(events, type(base).__name__)
        if spool.failure:
            warnings.append(f"{spool.failure}: the rest of the recording was held in memory")
        if divergence is None:
            warnings += inherited_warning(events)
        result = explain(
            DiffResult(
                base_framework=bfw.name,
                raw_framework=rfw.name,
                base_model=type(base).__name__,
                raw_model=type(raw).__name__,
                first_divergence=divergence,
                findings=tuple(found),
                events=tuple(events),
                steps=done,
                unmatched_base=pairing.unmatched_base if pairing else (),
                unmatched_raw=pairing.unmatched_raw if pairing else (),
                warnings=tuple(warnings),
                notes=tuple(inherited_notes(events)) if divergence is None else (),
                options=dict(
                    atol=atol,
                    rtol=rtol,
                    compare_mode=compare_mode,
                    auto_init=auto_init,
                    diff_phase=diff_phase,
                    single_step=single_step,
                    steps=steps,
                    api_level=api_level,
                    framework_differences=framework_differences,
                    weight_map=wmap,
                ),
            ),
            (bfw, rfw),
            (base, raw),
            log,
        )
    except BaseException:
        restore_state(bfw, originals[0])
        restore_state(rfw, originals[1])
        raise
    return spilled(result, spill_above_mib)


def _floor_of(
    bfw: Framework, base: Any, call: Any, loss_fn: Any, brec: StepRecord, cmp: StepComparer, backward: bool
) -> Callable[[], Floor | None]:
    """Base's sensitivity to rounding in this step, measured only if blame asks (:mod:`nbdiff.conditioning`)."""

    def param_grads(layer: Any, path: str) -> dict[str, Any]:
        return live_param_grads(bfw, layer if layer is not None else cmp.blayers[path], False)

    return lambda: measure_floor(bfw, base, call, loss_fn, brec, param_grads if backward else None)


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
            tied = write_weights(bfw, base, rfw, raw, wmap, restore_on_failure=False)  # auto_diff restores raw
            return replace(wmap, warnings=wmap.warnings + tuple(tied))
        except WeightTransferError:
            pass
    return assign_weight(base, raw, layer_map, inputs)
