"""Where a layer was constructed: the ``self.norm = LayerNorm(...)`` line in its owner's ``__init__``.

Most porting bugs are an argument written where a layer is built, not where it is called, so
the view shows both sites. Found from source, on demand: the owner is the nearest enclosing
layer that is not one of the framework's own containers (``ModuleList``, ``Sequential``),
and its class's ``__init__`` (or a base class's) assigns the attribute.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from nbdiff.trace.origin.stack import Frame

__all__ = ["construction_site", "root_layers"]

_FRAMEWORKS = ("torch.", "paddle.")


def _child(layer: Any, name: str) -> Any:
    try:
        return getattr(layer, name)
    except Exception:  # a name the layer does not expose as an attribute
        return None


def root_layers(pairs: Any) -> tuple[Any, Any]:
    """The base and raw root models held by the compared pairs' events (``None`` when not recorded live)."""
    found: list[Any] = [None, None]
    for d in pairs:
        for i, e in enumerate((d.base, d.raw)):
            if found[i] is None and e.path == "" and e.depth == 0 and e.layer is not None and e.kind.value == "layer":
                found[i] = e.layer
        if None not in found:
            break
    return found[0], found[1]


def construction_site(root: Any, path: str) -> Frame | None:
    """The line that built the layer at dotted ``path`` under ``root``, or ``None`` when unknown."""
    if not path or root is None:
        return None
    parts = path.split(".")
    chain = [root]
    for name in parts[:-1]:
        chain.append(_child(chain[-1], name))
        if chain[-1] is None:
            return None
    # Walk up past framework containers: layers.0 is built where `self.layers = ...` is.
    for i in range(len(parts) - 1, -1, -1):
        owner = chain[i]
        if type(owner).__module__.startswith(_FRAMEWORKS):
            continue
        return _assignment(type(owner), parts[i])
    return None


@functools.lru_cache(maxsize=1024)  # a report asks for every row: read each class's source once
def _assignment(cls: type, attr: str) -> Frame | None:
    # `self.norm = ...`, `self.norm: X = ...`, `self.fc1, self.fc2 = ...`, setattr(self, "norm", ...); not `==`
    name = re.escape(attr)
    pattern = re.compile(rf"\bself\.{name}\b\s*(?::[^=\n]+)?(?:=(?!=)|,)|\bsetattr\(\s*self\s*,\s*['\"]{name}['\"]")
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass.__module__.startswith(_FRAMEWORKS) or klass is object:
            continue
        try:
            lines, first = inspect.getsourcelines(init)
            filename = inspect.getsourcefile(init) or init.__code__.co_filename
        except (OSError, TypeError):
            continue
        for i, line in enumerate(lines):
            if pattern.search(line):
                return Frame(filename, first + i, f"{klass.__name__}.__init__")
    return None
