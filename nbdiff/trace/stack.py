"""User-code stacks: the frames of a call that belong to the user, not to a framework."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["Frame", "user_stack"]

_NBDIFF_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_ROOT = os.path.dirname(os.__file__) + os.sep


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
    f = sys._getframe(1)
    while f is not None and len(frames) < limit:
        code = f.f_code
        name = code.co_filename
        stdlib = name.startswith(_STDLIB_ROOT) and "site-packages" not in name
        if not (stdlib or name.startswith(hidden) or name.startswith("<frozen")):
            frames.append(Frame(name, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(frames)
