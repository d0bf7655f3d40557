"""The Python-side state of a user's layers (a KV cache, a step counter), as nbdiff's own calls found it.

A replay (a layer run again on base's inputs, to measure its own error) or a structure probe
calls the user's layers once more than the user's code did. Layers that keep state between
calls (a cache appended to, a counter) would see that call: :func:`kept_user_state` puts every
user attribute back as it was, in place (the same list, with its old items), and says whether
the call changed any: such a layer's replay is not the call it made in the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nbdiff.frameworks import Framework

__all__ = ["UserState", "kept_user_state"]

_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_MISSING = object()


class UserState:
    """What a layer tree holds outside its tensors, sublayers and the framework's own attributes."""

    def __init__(self, fw: Framework, model: Any) -> None:
        self.changed = False
        """Set on :meth:`restore`: the block changed some of it (now put back)."""
        self._fw, self._internals = fw, fw.layer_internals()
        self._kept: list[tuple[Any, dict[str, Any], dict[str, tuple[Any, Any]]]] = []
        seen: dict[int, tuple[Any, Any]] = {}  # every layer of a transformers model holds the one config
        for _, layer in fw.named_layers(model):
            own = {k: v for k, v in vars(layer).items() if self._users(k, v)}
            self._kept.append((layer, own, {k: _snapshot(v, seen) for k, v in own.items()}))

    def _users(self, name: str, value: Any) -> bool:
        return name not in self._internals and not (self._fw.is_layer(value) or callable(value))

    def restore(self) -> None:
        tensor = self._fw.is_tensor
        seen: dict[int, tuple[Any, Any]] = {}
        put_back: set[int] = set()
        for layer, own, snapshots in self._kept:
            attrs = vars(layer)
            for name in [k for k, v in attrs.items() if k not in own and self._users(k, v)]:
                # An attribute the call added; a tensor kept to look at later (attention weights) is no state.
                self.changed |= not tensor(attrs[name])
                del attrs[name]
            for name, value in own.items():
                key, data = snapshots[name]
                now = attrs.get(name, _MISSING)
                # Rebound to an equal value (a new list of the same ints), or to another tensor, is no change.
                if not (tensor(value) and tensor(now)) and (
                    _snapshot(now, seen)[0] != key or _snapshot(value, seen)[0] != key
                ):
                    self.changed = True
                attrs[name] = value
                if id(value) not in put_back:  # an object held by many layers is put back once
                    put_back.add(id(value))
                    _put_back(value, data)


def _snapshot(v: Any, seen: dict[int, tuple[Any, Any]]) -> tuple[Any, Any]:
    """``(key, data)``: a key that changes when ``v`` changes in place (items compared by identity,
    never by value: tensors compare elementwise), and what puts it back. ``seen``: the objects'
    snapshots taken so far (by ``id``; they are alive while it is): one held by many layers is
    taken once (a config object of a hundred fields, referenced by every layer of a model)."""
    if isinstance(v, _SCALARS):
        return ("scalar", "nan" if isinstance(v, float) and math.isnan(v) else v), None
    if isinstance(v, list):
        return ("list", tuple(id(x) for x in v)), list(v)
    if isinstance(v, dict):
        return ("dict", tuple((k, id(x)) for k, x in v.items())), dict(v)
    if isinstance(v, set):
        return ("set", frozenset(id(x) for x in v)), set(v)
    if hasattr(v, "__dict__") and not isinstance(v, type):  # a cache object: its lists and counters
        hit = seen.get(id(v))
        if hit is not None:
            return hit
        seen[id(v)] = (("cycle", id(v)), None)  # an object that refers back to itself, while it is taken
        inner = {k: _snapshot(x, seen) for k, x in vars(v).items()}
        snap = ("object", tuple((k, id(x), inner[k][0]) for k, x in vars(v).items())), (dict(vars(v)), inner)
        seen[id(v)] = snap
        return snap
    return ("opaque", id(v)), None


def _put_back(value: Any, data: Any) -> None:
    if isinstance(value, list):
        value[:] = data
    elif isinstance(value, (dict, set)):
        value.clear()
        value.update(data)
    elif data is not None and hasattr(value, "__dict__"):
        attrs, inner = data
        now = vars(value)
        now.clear()
        now.update(attrs)
        for k, x in attrs.items():
            _put_back(x, inner[k][1])


@contextmanager
def kept_user_state(fw: Framework, model: Any) -> Iterator[UserState]:
    """Run the block, then put the layers' Python-side state back; ``state.changed`` says if it moved."""
    state = UserState(fw, model)
    try:
        yield state
    finally:
        state.restore()
