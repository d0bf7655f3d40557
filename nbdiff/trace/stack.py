"""User-code stacks: the frames of a call that belong to the user, not to a framework."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType

__all__ = ["Frame", "user_stack", "tool_roots"]

_NBDIFF_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_ROOT = os.path.dirname(os.__file__) + os.sep
# Notebook machinery between the user's cell and their model: never the user's code.
_TOOLS = (
    "IPython", "ipykernel", "traitlets", "tornado", "zmq", "jupyter_client", "comm",
    "anywidget", "ipywidgets",
)  # fmt: skip


def tool_roots() -> tuple[str, ...]:
    """Folders of the notebook packages loaded in this process, to hide from user stacks."""
    roots = []
    for name in _TOOLS:
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if path:
            path = os.path.abspath(path)
            # A package hides its folder; a single-module file (ipykernel_launcher.py) only itself.
            roots.append(os.path.dirname(path) + os.sep if path.endswith("__init__.py") else path)
    return tuple(roots)


@dataclass(frozen=True)
class Frame:
    """One user-code frame."""

    filename: str
    """File path, or an IPython cell name such as ``<ipython-input-3-...>``."""
    lineno: int
    """1-based line number of the call."""
    function: str
    """Name of the function executing."""


def user_stack(hidden_roots: tuple[str, ...], limit: int = 12) -> tuple[Frame, ...]:
    """Innermost-first user frames of the current call, at most ``limit``.

    Frames from nbdiff, the standard library and ``hidden_roots`` (framework
    packages) are left out. Only names and numbers are taken: the cost is a
    frame walk, no file reads.
    """
    hidden = (_NBDIFF_ROOT, *(r.rstrip(os.sep) + os.sep for r in hidden_roots))
    frames: list[Frame] = []
    f: FrameType | None = sys._getframe(1)
    while f is not None and len(frames) < limit:
        code = f.f_code
        name = code.co_filename
        stdlib = name.startswith(_STDLIB_ROOT) and "site-packages" not in name
        # The kernel runs ipykernel_launcher.py as __main__, so it is not in sys.modules by name.
        launcher = name.endswith("ipykernel_launcher.py")
        if not (stdlib or launcher or name.startswith(hidden) or name.startswith("<frozen")):
            frames.append(Frame(name, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(frames)
