"""PaDiff's entry points on nbdiff: change ``from padiff import ...`` to ``from nbdiff.compat.padiff import ...``.

Both call forms PaDiff users have in their code are accepted:

- develop/tutorial: ``auto_diff(base, raw, inp, atol=..., rtol=..., compare_mode=..., single_step=...,
  diff_phase=..., auto_init=..., loss_fn(s)=[..], optimizer(s)=[..], steps=...)``;
- 0.2 interface: ``auto_diff(layer, module, example_inp, auto_weights=..., steps=..., options={...},
  layer_map=..., loss_fn=[..], optimizer=[..])`` with paddle first, torch second, and
  ``example_inp = (paddle_kwargs, torch_kwargs)``; torch is the base, as PaDiff copies torch into paddle.

Tolerances left unset use nbdiff's defaults (which do not false-alarm), not PaDiff's; explicit
``atol``/``rtol`` without ``compare_mode`` keep PaDiff's default ``"mean"`` mode they were tuned
for. The environment switches PaDiff read are mapped; see ``docs/migrating.md``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from nbdiff.align.layer_map import LayerMap as _LayerMap
from nbdiff.diff import auto_diff as _auto_diff
from nbdiff.errors import NbdiffError, OptionError
from nbdiff.frameworks import framework_of
from nbdiff.result import DiffResult
from nbdiff.trace.apis import register_api
from nbdiff.weights.assign import assign_weight as _assign_weight
from nbdiff.weights.rules import register_weight_rule

__all__ = ["auto_diff", "assign_weight", "LayerMap", "create_model", "add_special_init", "PadiffResult", "env_options"]

_DEVELOP = {"atol", "rtol", "compare_mode", "single_step", "diff_phase", "auto_init", "loss_fn", "loss_fns",
            "optimizer", "optimizers", "steps", "layer_map"}  # fmt: skip
_V02 = {"auto_weights", "steps", "options", "layer_map", "loss_fn", "optimizer"}
_OPTIONS = {"atol", "rtol", "compare_mode", "single_step", "diff_phase"}


class LayerMap(_LayerMap):
    """nbdiff's LayerMap; a ``map`` written raw-to-base (paddle layer to torch module, as some PaDiff
    code does) is accepted too."""

    def explicit_pairs(self, base_layers: dict[str, Any], raw_layers: dict[str, Any]) -> Any:
        try:
            return super().explicit_pairs(base_layers, raw_layers)
        except OptionError:
            swapped = _LayerMap({v: k for k, v in self.map.items()})
            return swapped.explicit_pairs(base_layers, raw_layers)


class PadiffResult:
    """Behaves like PaDiff's ``True``/``False`` (``result == False`` works); ``.result`` is the full
    :class:`~nbdiff.DiffResult` (and its attributes are reachable directly)."""

    def __init__(self, result: DiffResult) -> None:
        self.result = result

    def __bool__(self) -> bool:
        return bool(self.result)

    def __eq__(self, other: object) -> bool:
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    def __hash__(self) -> int:
        return hash(bool(self))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)

    def __repr__(self) -> str:
        return "SUCCESS" if self else f"FAILED ({self.result.first_divergence.describe()})"  # type: ignore[union-attr]


class ProxyModel:
    """What ``create_model`` returns: the model, plus PaDiff's ``auto_layer_map(role)``."""

    def __init__(self, model: Any, name: str | None = None) -> None:
        self.model, self.name = model, name or type(model).__name__
        self.role: str | None = None

    def auto_layer_map(self, role: str) -> None:
        """PaDiff needed a layer map for known models; nbdiff pairs by execution. Kept as the role."""
        if role not in ("base", "raw"):
            raise OptionError(f"auto_layer_map: role {role!r} must be 'base' or 'raw'.")
        self.role = role

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def create_model(model: Any, name: str | None = None) -> ProxyModel:
    """Wrap a model as PaDiff did, so ``model.auto_layer_map("base"|"raw")`` works."""
    return ProxyModel(model, name)


def _unwrap(m: Any) -> Any:
    return m.model if isinstance(m, ProxyModel) else m


def add_special_init(
    base_framework: str, base_model_name: str, raw_framework: str, raw_model_name: str, func: Any
) -> None:
    """PaDiff's special init: ``func(base_layer, raw_layer)`` copies weights for these two classes."""
    for fw in (base_framework, raw_framework):
        if fw not in ("torch", "paddle"):
            raise OptionError(f"add_special_init: framework {fw!r} must be 'torch' or 'paddle'.")
    register_weight_rule((base_framework, base_model_name), (raw_framework, raw_model_name), None, None, copy=func)


def env_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """nbdiff options from PaDiff's environment switches (documented in docs/migrating.md).

    ``PADIFF_API_CHECK=ON`` -> ``api_level=True``; ``PADDLE_THIRDPARTY_API=mod.op,...`` ->
    ``register_api`` for each op (intercepted while tracing); ``PADIFF_SIKP_WRAP_LAYER=TRUE`` ->
    layers without parameters are not compared on their own; ``PADIFF_PATH_LOG`` needs nothing:
    nbdiff always names layers by dotted path.
    """
    env = os.environ if environ is None else environ
    on = lambda k: env.get(k, "").strip().upper() in ("ON", "TRUE", "1", "YES")  # noqa: E731
    opts: dict[str, Any] = {"api_level": on("PADIFF_API_CHECK"), "skip_wrap_layers": on("PADIFF_SIKP_WRAP_LAYER")}
    for spec in filter(None, (s.strip() for s in env.get("PADDLE_THIRDPARTY_API", "").split(","))):
        module, _, attr = spec.rpartition(".")
        try:
            owner = importlib.import_module(module)
        except ImportError as exc:
            raise OptionError(f"PADDLE_THIRDPARTY_API: cannot import {module!r} for {spec!r} ({exc}).") from None
        register_api(attr, target=(owner, attr))
    return opts


def _skip_wrap_layers(base: Any, raw: Any, layer_map: LayerMap | None) -> LayerMap:
    lm = layer_map if layer_map is not None else LayerMap()
    for model in (base, raw):
        fw = framework_of(model, "model")
        empty = [
            lay for path, lay in fw.named_layers(model) if path and not list(fw.direct_params(lay)) and fw.children(lay)
        ]
        if empty:
            lm.set_black_list(empty, mode="self")
    return lm


def auto_diff(*args: Any, **kwargs: Any) -> PadiffResult:
    """PaDiff's ``auto_diff``, either call form (see the module docstring)."""
    if len(args) < 3:
        raise OptionError("auto_diff(base, raw, inp, ...): pass both models and the inputs.")
    first, second, inp = (_unwrap(a) for a in args[:3])
    if len(args) > 3:
        raise OptionError("auto_diff: pass options after the inputs as keywords, e.g. atol=1e-4.")
    v02 = "options" in kwargs or "auto_weights" in kwargs
    allowed = _V02 if v02 else _DEVELOP
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        form = "0.2 interface (options={...})" if v02 else "develop"
        raise OptionError(
            f"auto_diff: unknown option(s) {unknown} for the PaDiff {form} form; known: {sorted(allowed)}."
        )
    if v02:
        options = dict(kwargs.get("options") or {})
        bad = sorted(set(options) - _OPTIONS)
        if bad:
            raise OptionError(f"auto_diff: unknown key(s) {bad} in options; known: {sorted(_OPTIONS)}.")
        base, raw = second, first  # layer (paddle) first, module (torch) second: torch is the base
        if not isinstance(inp, (tuple, list)) or len(inp) != 2:
            raise OptionError("auto_diff: example_inp must be (paddle_input, torch_input), each a dict of keywords.")
        inputs = (inp[1], inp[0])
        losses = _reverse(kwargs.get("loss_fn"), "loss_fn")
        opts = _reverse(kwargs.get("optimizer"), "optimizer")
        call = dict(options, auto_init=bool(kwargs.get("auto_weights", False)), steps=kwargs.get("steps", 1))
    else:
        base, raw, inputs = first, second, inp
        losses = _pair_arg(kwargs.get("loss_fns", kwargs.get("loss_fn")), "loss_fn")
        opts = _by_framework(kwargs.get("optimizers", kwargs.get("optimizer")), base, raw)
        call = {
            k: kwargs[k]
            for k in ("atol", "rtol", "compare_mode", "single_step", "diff_phase", "auto_init", "steps")
            if k in kwargs
        }
    if ("atol" in call or "rtol" in call) and "compare_mode" not in call:
        # Tolerances tuned for PaDiff were tuned for its default "mean" mode; keep that pairing.
        call["compare_mode"] = "mean"
    env = env_options()
    layer_map = kwargs.get("layer_map") or None
    if isinstance(layer_map, dict):
        layer_map = LayerMap(layer_map)
    if env["skip_wrap_layers"]:
        layer_map = _skip_wrap_layers(base, raw, layer_map)
    result = _auto_diff(base, raw, inputs, losses, opts, layer_map=layer_map, api_level=env["api_level"], **call)
    print(result.report(), file=sys.stdout)
    return PadiffResult(result)


def _reverse(pair: Any, name: str) -> list[Any] | None:
    p = _pair_arg(pair, name)
    return None if p is None else [p[1], p[0]]


def _pair_arg(pair: Any, name: str) -> list[Any] | None:
    if pair is None:
        return None
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise OptionError(f"auto_diff: {name} must be a list of two (one per model); got {pair!r}.")
    return list(pair)


def _by_framework(pair: Any, base: Any, raw: Any) -> list[Any] | None:
    """Optimizers in the models' order: framework optimizers by their framework (PaDiff's
    tutorials list paddle's first whatever the model order), callables as given."""
    p = _pair_arg(pair, "optimizer")
    if p is None:
        return None
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    if bfw.name != rfw.name and rfw.is_optimizer(p[0]) and bfw.is_optimizer(p[1]):
        return [p[1], p[0]]
    return p


def assign_weight(layer: Any, module: Any, layer_map: LayerMap | dict | None = None) -> bool:
    """PaDiff's ``assign_weight(paddle_layer, torch_module)``: copies torch into paddle (the second
    into the first within one framework). Returns False on failure, printing why, as PaDiff did."""
    raw, base = _unwrap(layer), _unwrap(module)
    lm = LayerMap(layer_map) if isinstance(layer_map, dict) else (layer_map or None)
    try:
        _assign_weight(base, raw, lm)
    except NbdiffError as exc:
        print(f"assign_weight failed: {exc}")
        return False
    return True
