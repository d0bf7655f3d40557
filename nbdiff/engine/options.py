"""Options checked at the door, before any model runs: a bad one is an OptionError that
names the option and the fix, never a ValueError from deep inside a comparison."""

from __future__ import annotations

import math
from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.errors import InputError, OptionError
from nbdiff.judge.metrics import COMPARE_MODES

__all__ = [
    "PHASES",
    "FRAMEWORK_DIFFERENCES",
    "check_models",
    "check_framework_differences",
    "check_gradients",
    "check_mib",
    "check_run",
    "check_tolerances",
]

PHASES = ("both", "forward", "backward")


def check_models(base: Any, raw: Any, layer_map: Any) -> None:
    """What ``auto_diff``, ``watch`` and ``check_config`` share besides the options
    (:class:`~nbdiff.engine.spec.Comparison` checks those): two models, and a map if any."""
    if base is raw:
        raise InputError(
            "base and raw are the same object, so they agree by construction and nothing would be checked. "
            "Compare two models: raw = copy.deepcopy(base), then change raw."
        )
    if layer_map is not None and not isinstance(layer_map, LayerMap):
        hint = f"LayerMap({layer_map!r:.80})" if isinstance(layer_map, dict) else "LayerMap({...})"
        raise OptionError(f"layer_map must be a nbdiff.LayerMap, not {type(layer_map).__name__}: use {hint}.")


def check_tolerances(atol: Any, rtol: Any, compare_mode: Any) -> None:
    """Tolerances and the comparison mode, for every verb (``compare`` and the CLI too: ``--atol inf``
    or ``rtol=-1`` would pass any divergence)."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise OptionError(f"{name}={value!r} must be a finite number >= 0 (or None for dtype-aware defaults).")
    if compare_mode not in COMPARE_MODES:
        raise OptionError(f"compare_mode={compare_mode!r} is not one of {COMPARE_MODES}.")


def check_recordable(fws: Any, models: Any, sides: tuple[str, ...] = ("base", "raw")) -> None:
    """A model built on torch's ``meta`` device has shapes but no values, and a layer whose forward is
    compiled so that hooks break it cannot be recorded: say so before running it (it failed deep
    inside with a bare NotImplementedError, or blamed the model)."""
    for side, fw, model in zip(sides, fws, models):
        for path, layer in fw.named_layers(model):
            why = fw.unhookable(layer)
            if why is not None:
                raise InputError(f"{side} ({type(model).__name__}): `{path or '<root>'}`: {why}.")
            for name, t in (*fw.direct_params(layer), *fw.direct_buffers(layer)):
                if not fw.has_values(t):
                    where = f"{path}.{name}" if path else name
                    raise InputError(
                        f"{side} ({type(model).__name__}): `{where}` is on the meta device (a shape without values), "
                        "so there is nothing to compare. Materialize the model first (model.to_empty(device='cpu') "
                        "and load its weights)."
                    )


def check_gradients(fws: Any, models: Any, diff_phase: str) -> None:
    """Backward needs gradients: under ``no_grad``, or with nothing trainable, say so up front
    (paddle gave a silent SUCCESS with no backward compared, torch a deep autograd error)."""
    if diff_phase == "forward":
        return
    for side, fw, model in zip(("base", "raw"), fws, models):
        if not fw.grad_enabled():
            raise InputError(
                f"{fw.name} gradients are off ({side} runs under no_grad), so backward cannot be compared. "
                "Call nbdiff outside the no_grad block, or pass diff_phase='forward' to compare the forward pass only."
            )
        if not any(fw.is_trainable(p) for _, layer in fw.named_layers(model) for _, p in fw.direct_params(layer)):
            raise InputError(
                f"{side} ({type(model).__name__}) has no trainable parameter, so there is no backward to compare. "
                "Pass diff_phase='forward', or unfreeze the parameters."
            )


FRAMEWORK_DIFFERENCES = ("report", "fail")
"""What a verified framework difference does: reported without failing, or failing the result."""


def check_framework_differences(value: Any) -> None:
    if value not in FRAMEWORK_DIFFERENCES:
        raise OptionError(f"framework_differences={value!r} is not one of {FRAMEWORK_DIFFERENCES}.")


def check_mib(**limits: Any) -> None:
    """Each of ``limits`` is a number of MiB >= 0, or ``None`` (no limit: tensors stay in memory)."""
    for name, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise OptionError(f"{name}={value!r} must be a number of MiB >= 0, or None to keep tensors in memory.")


def check_keep_steps(keep_steps: Any) -> None:
    """How many steps' events a comparison of many steps keeps (:class:`~nbdiff.engine.kept.KeptSteps`)."""
    if isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < 0:
        raise OptionError(f"keep_steps={keep_steps!r}: expected a whole number >= 0 (steps whose events are kept).")


def check_run(
    loss_fns: Any, optimizers: Any, diff_phase: str, steps: Any, spill_above_mib: Any = None, memory_mib: Any = None
) -> None:
    """What only ``auto_diff`` takes: losses, optimizers, a step count and where tensors are held."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise OptionError(f"steps={steps!r} must be a positive integer.")
    check_mib(spill_above_mib=spill_above_mib, memory_mib=memory_mib)
    for name, value in (("loss_fns", loss_fns), ("optimizers", optimizers)):
        if value is not None and (not isinstance(value, (list, tuple)) or len(value) != 2):
            raise InputError(f"{name} must be a pair [for base, for raw]; got {value!r}.")
    for i, opt in enumerate(optimizers or ()):
        side = ("base", "raw")[i]
        if hasattr(opt, "forward") and hasattr(opt, "parameters"):
            raise InputError(
                f"optimizers[{i}] ({side}) is a model ({type(opt).__name__}), not an optimizer. Pass the optimizer "
                "that trains it: torch.optim.AdamW(model.parameters()) / paddle.optimizer.AdamW(parameters="
                "model.parameters()), or a zero-argument function that steps and clears gradients."
            )
        if not (hasattr(opt, "step") or callable(opt)):
            raise InputError(
                f"optimizers[{i}] ({side}) is a {type(opt).__name__}: an optimizer (with .step()) or a "
                "zero-argument function that steps and clears gradients is needed."
            )
    if steps > 1 and optimizers is None:
        raise OptionError(
            f"steps={steps} needs optimizers=[base_opt, raw_opt] (framework optimizers, or zero-argument "
            "callables that step and clear gradients): without them every step would be the same."
        )
    if steps > 1 and diff_phase == "forward":
        raise OptionError("steps > 1 trains the models, which needs backward; use diff_phase='both'.")
