"""How a layer was built: its class and the constructor arguments read off the layer object.

``repro`` writes them into a script, and ``record`` keeps them in the dump, so that ``compare``
can rebuild a blamed layer from its class and measure its local error as ``auto_diff`` does
(:mod:`nbdiff.engine.recorded.rebuilt`). Only literal arguments are kept (numbers, strings, booleans and
tuples of them): a layer built from a config object cannot be rebuilt this way.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from nbdiff.frameworks import Framework
from nbdiff.trace.origin.built_with import built_with

__all__ = ["Constructor", "NotRebuildable", "constructor_of"]

_SKIP = {"self", "device", "dtype", "name", "weight_attr", "factory_kwargs"}
_LITERALS = (bool, int, float, str, type(None))
_ALIASES = {"eps": ("variance_epsilon", "epsilon", "_epsilon"), "epsilon": ("_epsilon", "variance_epsilon", "eps")}
"""Attributes that keep an argument under another name (transformers' RMSNorm keeps ``eps`` as
``variance_epsilon``)."""
_SIZES = ("size", "dim", "features", "channels")


class NotRebuildable(ValueError):
    """The layer's constructor arguments are not all kept on it as literals (the message says which)."""


@dataclass(frozen=True)
class Constructor:
    """``module.qualname(**kwargs)`` rebuilds the layer (without its weights)."""

    module: str
    qualname: str
    kwargs: dict[str, Any]

    @property
    def importable(self) -> bool:
        """Whether another process could import the class (not a notebook's, nor a function's)."""
        return self.module not in ("__main__", "builtins") and "<locals>" not in self.qualname

    def call_text(self) -> str:
        """The call as Python source (``torch.nn.modules.linear.Linear(in_features=4, ...)``)."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.module}.{self.qualname}({args})"

    def to_json(self) -> dict[str, Any]:
        return {"class": f"{self.module}:{self.qualname}", "kwargs": {k: _plain(v) for k, v in self.kwargs.items()}}

    @staticmethod
    def from_json(data: Any) -> Constructor | None:
        """As a dump keeps it; ``None`` for anything else (a dump is untrusted input)."""
        if not isinstance(data, dict) or not isinstance(data.get("class"), str) or ":" not in data["class"]:
            return None
        kwargs = data.get("kwargs")
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) and _literal(v) for k, v in kwargs.items()):
            return None
        module, _, qualname = data["class"].partition(":")
        return Constructor(module, qualname, {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()})


def _literal(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_literal(x) for x in v)
    return isinstance(v, _LITERALS)


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def constructor_of(fw: Framework, layer: Any) -> Constructor:
    """The class and literal constructor arguments of ``layer``, read from the attributes that hold
    them (``in_features``, or ``_in_features``); :class:`NotRebuildable` when one is not kept."""
    cls = type(layer)
    kwargs: dict[str, Any] = {}
    weight = getattr(layer, "weight", None)
    shape = fw.shape_of(weight) if weight is not None and fw.is_tensor(weight) else None
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        raise NotRebuildable(f"the constructor of {cls.__qualname__} has no signature") from None
    remembered = built_with(layer)  # the arguments it was built with, where nbdiff saw it built
    for p in params:
        if p.name in _SKIP or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in remembered:
            kwargs[p.name] = remembered[p.name]
            continue
        if p.name in ("bias", "bias_attr"):
            if getattr(layer, "bias", None) is None:
                kwargs[p.name] = False
            continue
        names = (p.name, "_" + p.name, *_ALIASES.get(p.name, ()))
        found = next((getattr(layer, a) for a in names if hasattr(layer, a)), inspect.Parameter.empty)
        if found is inspect.Parameter.empty and shape is not None and p.name in ("in_features", "out_features"):
            # paddle's Linear keeps only its [in, out] weight; torch's is [out, in]
            inward = shape[0] if fw.name == "paddle" else shape[1]
            found = inward if p.name == "in_features" else (shape[1] if fw.name == "paddle" else shape[0])
        elif found is inspect.Parameter.empty and shape is not None and len(shape) == 1 and p.name.endswith(_SIZES):
            found = shape[0]  # a norm's size (LlamaRMSNorm(hidden_size)) is its weight's; a rebuild checks it
        if isinstance(found, list):
            found = tuple(found)
        if found is not inspect.Parameter.empty and _literal(found):
            kwargs[p.name] = found
        elif p.default is inspect.Parameter.empty:
            raise NotRebuildable(
                f"cannot rebuild {cls.__qualname__}: its argument {p.name!r} is not kept on the layer. "
                "Store it as an attribute of the same name, or build the layer after %load_ext nbdiff "
                "(which remembers the arguments layers are built with)"
            )
    return Constructor(cls.__module__, cls.__qualname__, kwargs)
