"""Why, not only where: the constructor arguments that differ between paired layers.

The blamed pair's differing arguments go into the divergence (``epsilon: base 1e-05, raw
0.001``); a pair whose arguments differ while its outputs agree (a branch the inputs do not
take) is a warning, not a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nbdiff.align.arguments import ArgDiff, differing_arguments, layer_arguments
from nbdiff.align.optimizer_settings import OptimizerLog, optimizer_diffs, optimizer_settings
from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.result import DiffResult
from nbdiff.trace.events import Event, Kind, Phase

__all__ = ["explain"]


def explain(
    result: DiffResult,
    frameworks: tuple[Framework, Framework] | None = None,
    models: tuple[Any, Any] | None = None,
    optimizers: OptimizerLog | None = None,
    recorded: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {}),
) -> DiffResult:
    """``result`` with each finding's argument differences and warnings for the silent ones.

    A finding in an optimizer update gets the settings its two optimizers apply to that parameter
    (learning rate, betas, eps, weight decay and its style and filter, grad clipping). Layers are
    read live where the events hold them, else from ``recorded``: each side's arguments by layer
    path, as a dump keeps them (``layer_args``).
    """
    findings = list(result.findings)
    blamed = result.first_divergence
    layer_args: dict[tuple[str, str], tuple[ArgDiff, ...]] = {}
    warnings: list[str] = []
    for d in result.events:
        if d.base.phase is not Phase.FORWARD or d.base.kind is not Kind.LAYER:
            continue
        key = (d.base.path, d.raw.path)
        if key in layer_args:
            continue
        layer_args[key] = diffs = tuple(
            differing_arguments(
                _arguments(result.base_framework, d.base, recorded[0]),
                _arguments(result.raw_framework, d.raw, recorded[1]),
            )
        )
        if diffs and d.passed and not any(_names(f) == key for f in findings):
            warnings.append(
                f"`{d.base.path or '<root>'}` ~ raw `{d.raw.path or '<root>'}` differ in "
                f"{'; '.join(x.describe() for x in diffs)}, but its outputs agree (a branch these inputs do not take?)"
            )
    # Every finding says why where it can: its pair's differing arguments, or an update's optimizer settings.
    for i, f in enumerate(findings):
        found: tuple[ArgDiff, ...] = ()
        if f.where == "parameter":
            if frameworks and models and optimizers:
                found = tuple(_optimizer_why(f, frameworks, models, optimizers))
        elif f.where != "framework":
            found = layer_args.get(_names(f), ())
        if f.phase is Phase.BACKWARD and f.event is not None:
            f = replace(f, forward=_forward_of(result, f))
        findings[i] = replace(f, arguments=found) if found else f
    if blamed is not None:
        blamed = next((f for f in findings if _same(f, blamed)), blamed)
    options = result.options
    if frameworks and models and optimizers and optimizers.optimizers:
        settings = _update_settings(result, frameworks, models, optimizers)
        if settings:
            options = {**options, "optimizer_settings": settings}
    return replace(
        result,
        first_divergence=blamed,
        findings=tuple(findings),
        warnings=result.warnings + tuple(warnings),
        options=options,
    )


def _arguments(framework: str, e: Event, recorded: Mapping[str, Any]) -> dict[str, Any]:
    if e.layer is not None:
        return layer_arguments(framework, e.layer)
    return dict(recorded.get(e.path, {}))


def _names(f: Divergence) -> tuple[str, str]:
    return (f.base_path, f.raw_path)


def _same(a: Divergence, b: Divergence) -> bool:
    return (a.step, a.phase, a.where, a.base_path, a.raw_path, a.parameter) == (
        b.step, b.phase, b.where, b.base_path, b.raw_path, b.parameter
    )  # fmt: skip


def _forward_of(result: DiffResult, f: Divergence) -> EventDiff | None:
    """For a backward finding: the same layer call's forward pair (its layers and inputs)."""
    assert f.event is not None
    key = (f.event.base.step, f.event.base.path, f.event.base.call)
    return next((d for d in result.events if d.base.phase is Phase.FORWARD and d.base.kind is Kind.LAYER
                 and (d.base.step, d.base.path, d.base.call) == key), None)  # fmt: skip


def _update_settings(
    result: DiffResult, fws: tuple[Framework, Framework], models: tuple[Any, Any], log: OptimizerLog
) -> dict[str, list[list[Any]]]:
    """Per updated layer (base path): ``[setting, base value, raw value]`` of the two optimizers for its
    first parameter, for the view's optimizer rows."""
    layers = [dict(fw.named_layers(m)) for fw, m in zip(fws, models)]
    owners = [
        log.owner({id(p) for _, lay in fw.named_layers(m) for _, p in fw.direct_params(lay)})
        for fw, m in zip(fws, models)
    ]
    if None in owners:
        return {}
    out: dict[str, list[list[Any]]] = {}
    for d in result.events:
        if d.base.phase is not Phase.OPTIMIZER or d.base.path in out:
            continue
        params = []
        for fw, found, path in zip(fws, layers, (d.base.path, d.raw.path)):
            own = fw.direct_params(found[path]) if path in found else []
            params.append(own[0][1] if own else None)
        lrs = (log.lr_at(owners[0], d.base.step, params[0]), log.lr_at(owners[1], d.base.step, params[1]))
        a, b = (optimizer_settings(o, p) for o, p in zip(owners, params))
        for side, lr in zip((a, b), lrs):
            side.setdefault("grad_clip", "none")  # torch clips in the loop, not in the optimizer
            if lr is not None:
                side["lr"] = lr
        out[d.base.path] = [[k, _shown(a.get(k)), _shown(b.get(k))] for k in dict.fromkeys([*a, *b])]
    return out


def _shown(v: Any) -> Any:
    return v if isinstance(v, (int, float, str)) or v is None else repr(v)


def _optimizer_why(
    blamed: Divergence, fws: tuple[Framework, Framework], models: tuple[Any, Any], log: OptimizerLog
) -> list[ArgDiff]:
    layer, _, name = (blamed.parameter or "").rpartition(".")
    params, opts = [], []
    for fw, model, path in ((fws[0], models[0], layer), (fws[1], models[1], blamed.raw_path)):
        owner = dict(fw.named_layers(model)).get(path)
        own = dict(fw.direct_params(owner)) if owner is not None else {}
        params.append(own.get(name, next(iter(own.values()), None)))
        opts.append(log.owner({id(p) for _, lay in fw.named_layers(model) for _, p in fw.direct_params(lay)}))
    if None in opts:
        return []
    lrs = (log.lr_at(opts[0], blamed.step, params[0]), log.lr_at(opts[1], blamed.step, params[1]))
    found = optimizer_diffs(opts[0], params[0], opts[1], params[1], lrs)
    trainable = [p is not None and fw.is_trainable(p) for fw, p in zip(fws, params)]
    if params[0] is not None and params[1] is not None and trainable[0] != trainable[1]:
        found.insert(0, ArgDiff("trainable", trainable[0], trainable[1]))  # frozen on one side only
    return found
