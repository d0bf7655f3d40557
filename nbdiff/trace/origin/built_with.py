"""The arguments a layer was built with, remembered while nbdiff is loaded in a notebook.

A hand-written layer often does not keep its constructor arguments (``self.scale = ...`` computed
from them), so ``repro`` and ``compare``'s rebuild could not call its class again. With
``%load_ext nbdiff``, each layer built afterwards has the literal arguments of its own class's
``__init__`` remembered beside it (a weak map: nothing is added to the layer, and nothing is held).
The frameworks' base ``__init__`` is wrapped: it reads the caller's arguments, once, as it returns.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from typing import Any

__all__ = ["remember_arguments", "forget_arguments", "built_with"]

_BASES = (("torch", "nn", "Module"), ("paddle", "nn", "Layer"))
_built: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_wrapped: dict[type, Any] = {}
_LITERALS = (bool, int, float, str, type(None))


def built_with(layer: Any) -> dict[str, Any]:
    """The literal arguments ``layer``'s class was called with, as remembered (``{}`` if none were)."""
    try:
        return dict(_built.get(layer, {}))
    except TypeError:  # not weakly referenceable
        return {}


def remember_arguments() -> None:
    """Wrap the base ``__init__`` of each framework already imported (again: a no-op once wrapped)."""
    for root, sub, name in _BASES:
        module = sys.modules.get(f"{root}.{sub}")
        base = getattr(module, name, None) if module is not None else None
        if isinstance(base, type) and base not in _wrapped:
            _wrapped[base] = base.__init__
            base.__init__ = _remembering(base.__init__)


def forget_arguments() -> None:
    """Put the frameworks' ``__init__`` back (what was remembered stays with its layers)."""
    for base, original in _wrapped.items():
        base.__init__ = original
    _wrapped.clear()


def _remembering(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _remember(self, sys._getframe(1))
        except Exception:  # noqa: BLE001 - remembering is a convenience: never the user's error
            pass

    return __init__


def _remember(layer: Any, caller: Any) -> None:
    """``caller`` is the frame that called the base ``__init__``: the layer's own class's ``__init__``
    when it is the most derived one (an intermediate class's arguments are not the class's)."""
    own = type(layer).__dict__.get("__init__")
    if own is None or getattr(own, "__code__", None) is not caller.f_code:
        return
    params = list(inspect.signature(own).parameters.values())[1:]
    found = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name not in caller.f_locals:
            continue
        value = caller.f_locals[p.name]
        value = tuple(value) if isinstance(value, list) else value
        if isinstance(value, _LITERALS) or (isinstance(value, tuple) and all(isinstance(v, _LITERALS) for v in value)):
            found[p.name] = value
    if found:
        _built[layer] = found
