"""Framework adapters, chosen by the type of the object, never by strings.

A framework is only considered if the user already imported it (``sys.modules``),
so importing nbdiff never imports torch or paddle. Beside the adapters, what every stage above
uses to change a framework's objects and undo it whole: :mod:`.patching` (wrapped framework
functions) and :mod:`.interrupts` (the undo, safe from Ctrl-C).
"""

from __future__ import annotations

import sys
from typing import Any

from nbdiff.errors import InputError
from nbdiff.frameworks.base import Framework, Handle

__all__ = ["Framework", "Handle", "framework_of", "known_frameworks"]

_CACHE: dict[str, Framework] = {}


def known_frameworks() -> list[Framework]:
    """Adapters for the frameworks the user has imported."""
    found: list[Framework] = []
    if "torch" in sys.modules:
        if "torch" not in _CACHE:
            from nbdiff.frameworks.torch import TorchFramework

            _CACHE["torch"] = TorchFramework()
        found.append(_CACHE["torch"])
    if "paddle" in sys.modules:
        if "paddle" not in _CACHE:
            from nbdiff.frameworks.paddle import PaddleFramework

            _CACHE["paddle"] = PaddleFramework()
        found.append(_CACHE["paddle"])
    return found


def framework_of(obj: Any, what: str = "model") -> Framework:
    """The adapter owning the model ``obj``; anything else (a tensor, an optimizer) is an InputError."""
    for fw in known_frameworks():
        if fw.owns(obj):
            if not fw.is_layer(obj):
                raise InputError(
                    f"{what} is a {fw.name} {type(obj).__qualname__}, not a model (torch.nn.Module or "
                    "paddle.nn.Layer). Pass the models first, then their inputs: auto_diff(base, raw, inputs)."
                )
            return fw
    raise InputError(
        f"{what} is a {type(obj).__module__}.{type(obj).__qualname__}, which is neither a "
        "torch.nn.Module nor a paddle.nn.Layer; pass a model of one of these frameworks."
    )
