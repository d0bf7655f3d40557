"""User-code stacks: the frames of a call that belong to the user, not to a framework."""

from __future__ import annotations

import os
import re
import sys
import traceback
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

__all__ = [
    "Frame",
    "user_stack",
    "call_stack",
    "Anchor",
    "inside_frames",
    "tool_roots",
    "cell_number",
    "frame_label",
    "short_traceback",
    "ipython_shell",
    "remember_cell_number",
]

_NBDIFF_ROOT = os.path.abspath(__file__).rsplit(os.sep, 3)[0] + os.sep  # nbdiff/, from nbdiff/trace/origin/stack.py
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
    frame walk, no file reads; whether a function's frames are the user's is decided
    once per code object (every layer call walks the same frames above it).
    """
    return call_stack(hidden_roots, None, limit)[0]


Anchor = tuple[FrameType, tuple[Frame, ...]]
"""The framework's frame that called a layer call's hook, and the user frames above it: both stay
as they are while that call runs (see :func:`call_stack`)."""


def call_stack(
    hidden_roots: tuple[str, ...], above: Anchor | None = None, limit: int = 12
) -> tuple[tuple[Frame, ...], Anchor | None]:
    """:func:`user_stack` of a call made inside a layer call that is still running (``above``, that
    call's anchor), and this call's own anchor.

    Called from a hook: the first frame above nbdiff's own is the framework's that called it. While
    that layer call runs, that frame and every frame above it stay where they are, so a sublayer's
    walk stops there and takes the frames found then. A layer called from deep in a model walked the
    whole stack above it for every call. No anchor where that frame is the user's (no roots hidden):
    its line moves on as the call runs.
    """
    verdicts = _verdicts.get(hidden_roots)
    if verdicts is None or len(verdicts) > _VERDICTS_MAX:
        verdicts = _verdicts[hidden_roots] = {}
    stop = above[0] if above is not None else None
    frames: list[Frame] = []
    anchor_frame: FrameType | None = None
    own = True  # still in nbdiff's frames, below the anchor
    f: FrameType | None = sys._getframe(1)
    while f is not None and len(frames) < limit:
        if f is stop:
            frames += above[1][: limit - len(frames)]  # type: ignore[index]
            break
        code = f.f_code
        known = verdicts.get(id(code))
        if known is None:
            user = _is_user_code(code.co_filename, hidden_roots) and not _magic_call(code)
            known = verdicts[id(code)] = (code, user)
        if own and not code.co_filename.startswith(_NBDIFF_ROOT):
            own = False
            if not known[1]:
                anchor_frame = f  # nothing found below it: nbdiff's frames are never the user's
        if known[1]:
            frames.append(Frame(code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    stack = tuple(frames)
    return stack, (anchor_frame, stack) if anchor_frame is not None else None


def inside_frames(parent: tuple[Frame, ...], child: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The frames of a sublayer's call that run inside its parent layer's call, innermost first: the
    lines of the parent's own ``forward`` (and its helpers) around that sublayer. ``()`` when the
    child's stack does not continue the parent's (stacks are cut at a depth, from the outside)."""
    if not parent:
        return child  # the parent was called from no user code: every frame of the child's is inside it
    for i in range(len(child)):
        rest = child[i:]
        if rest[0] == parent[0] and rest[1:] == parent[1 : len(rest)]:
            return child[:i]
    return ()


_verdicts: dict[tuple[str, ...], dict[int, tuple[CodeType, bool]]] = {}
"""Per set of hidden roots: ``id`` of a code object -> (the code object, held so that its ``id``
is not reused; whether its frames are user code)."""
_VERDICTS_MAX = 4096  # code objects are held: a notebook compiles new ones for every cell it runs


def _magic_call(code: CodeType) -> bool:
    """A ``%%cell magic`` cell, which IPython runs as one line, ``get_ipython().run_cell_magic(...)``:
    the cell's own code runs again below it, so this frame only repeats it (``Cell In [5], line 1``)."""
    return code.co_name == "<module>" and "run_cell_magic" in code.co_names


def _is_user_code(name: str, hidden_roots: tuple[str, ...]) -> bool:
    hidden = (_NBDIFF_ROOT, *(r.rstrip(os.sep) + os.sep for r in hidden_roots))
    stdlib = name.startswith(_STDLIB_ROOT) and "site-packages" not in name
    # The kernel runs ipykernel_launcher.py as __main__, so it is not in sys.modules by name.
    launcher = name.endswith("ipykernel_launcher.py")
    return not (stdlib or launcher or name.startswith(hidden) or name.startswith("<frozen"))


def ipython_shell() -> Any:
    """The running IPython shell, or ``None`` (IPython is never imported here)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def cell_number(filename: str) -> int | None:
    """The execution count of the notebook cell compiled under ``filename``, or ``None``.

    ipykernel names cells by a hash (``/tmp/ipykernel_PID/2919664822.py``); IPython keeps
    which count each name belongs to, as its own tracebacks show (``Cell In[5]``).
    """
    names = getattr(getattr(ipython_shell(), "compile", None), "_filename_map", None)
    if isinstance(names, dict) and isinstance(names.get(filename), int):
        return names[filename]
    if filename in _REMEMBERED:
        return _REMEMBERED[filename]
    m = re.match(r"<ipython-input-(\d+)-", filename)
    return int(m.group(1)) if m else None


_REMEMBERED: dict[str, int] = {}
"""Cell numbers a saved result or a dump carried (:mod:`nbdiff.trace.origin.cells`), by file name."""


def remember_cell_number(filename: str, n: int) -> None:
    """``filename`` is the notebook cell ``n`` of the session that recorded it."""
    _REMEMBERED[filename] = n


def frame_label(filename: str, lineno: int) -> str:
    """``Cell In [5], line 13`` for a notebook cell, ``model.py:13`` for a file."""
    n = cell_number(filename)
    if n is not None:
        return f"Cell In [{n}], line {lineno}"
    return f"{os.path.basename(filename) or filename}:{lineno}"


def short_traceback(exc: BaseException) -> list[str]:
    """The user's frames and the message of ``exc`` (and of its cause), without nbdiff's
    or the frameworks' internals: what a notebook shows for an error nbdiff raised on purpose."""
    lines: list[str] = []
    cause = exc.__cause__
    if cause is not None and cause is not exc:
        lines += short_traceback(cause) + ["", "The above exception was the direct cause of:", ""]
    for fs in traceback.extract_tb(exc.__traceback__):
        name = fs.filename
        if name.startswith((_NBDIFF_ROOT, _STDLIB_ROOT, "<frozen")) or "site-packages" in name:
            continue
        lines.append(f"  {frame_label(name, fs.lineno or 0)}, in {fs.name}")
        if fs.line:
            lines.append(f"    {fs.line.strip()}")
    return lines + [f"{type(exc).__name__}: {exc}"]
