"""``auto_diff``: copy weights, run both models step by step, compare, and blame."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.engine.driver import Verdict
from nbdiff.engine.gc_pause import gc_paused
from nbdiff.engine.live.comparer import LiveComparer
from nbdiff.engine.live.steps import LiveSteps
from nbdiff.engine.options import (
    check_gradients,
    check_models,
    check_recordable,
    check_run,
)
from nbdiff.engine.spec import Comparison
from nbdiff.engine.spill import SPILL_ABOVE_MIB, spilled
from nbdiff.errors import WeightTransferError
from nbdiff.frameworks import Framework, framework_of
from nbdiff.result import DiffResult
from nbdiff.trace.inputs import split_inputs
from nbdiff.trace.modes import restore_state, save_weights
from nbdiff.trace.spool import MEMORY_MIB, Spool
from nbdiff.weights.assign import WeightMap, assign_weight, plan_weights, write_weights

__all__ = ["auto_diff"]


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
    check_models(base, raw, layer_map)
    spec = Comparison(atol, rtol, compare_mode, diff_phase, framework_differences)
    check_run(loss_fns, optimizers, diff_phase, steps, spill_above_mib, memory_mib)
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    check_recordable((bfw, rfw), (base, raw))
    check_gradients((bfw, rfw), (base, raw), diff_phase)
    calls = split_inputs(inputs, bfw, rfw, (base, raw))
    # A failure after the copy (or after training steps) leaves both models as they were given.
    # Base changes only when the optimizers train it: copy it only then (the copies cost memory).
    originals = [save_weights(bfw, base) if optimizers is not None else [], save_weights(rfw, raw)]
    pause = gc_paused()
    try:
        # The collector paused inside the try: a Ctrl-C as it is put back restores the models too.
        with pause:
            copied = _first_copy(bfw, base, rfw, raw, layer_map, inputs) if auto_init else None

            spool = Spool(None if memory_mib is None else int(memory_mib * 2**20))
            run = LiveSteps(
                bfw, base, rfw, raw, calls,
                list(loss_fns) if loss_fns is not None else [None, None],
                list(optimizers) if optimizers is not None else None,
                LiveComparer(bfw, base, rfw, raw, spec.tol, compare_mode, diff_phase, layer_map, spool, strict=auto_init),
                spool, copied, single_step, diff_phase, api_level, Verdict(framework_differences == "fail"),
            )  # fmt: skip
            run.all_steps(steps)
            options = dict(
                atol=atol, rtol=rtol, compare_mode=compare_mode, auto_init=auto_init, diff_phase=diff_phase,
                single_step=single_step, steps=steps, api_level=api_level,
                framework_differences=framework_differences, weight_map=run.wmap,
            )  # fmt: skip
            result = run.result(options)
    except BaseException:
        restore_state(bfw, originals[0])
        restore_state(rfw, originals[1])
        raise
    finally:
        pause.restore()  # again: a Ctrl-C handled as the pause's __exit__ began left the collector off
    return spilled(result, spill_above_mib)


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
