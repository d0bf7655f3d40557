"""Source around a stack frame: a notebook cell's code, or an excerpt of a file."""

from __future__ import annotations

import linecache
import os
from typing import Any

__all__ = ["source_excerpt"]


def _is_cell(filename: str) -> bool:
    # IPython names cells `<ipython-input-N-...>`; ipykernel writes them as `.../ipykernel_PID/NNN.py`.
    return filename.startswith("<ipython-input-") or "ipykernel_" in filename or filename.startswith("<cell")


def source_excerpt(filename: str, lineno: int, context: int = 6) -> dict[str, Any]:
    """``{kind, file, line, first, lines, relpath}``: ``kind`` is ``cell`` (the whole cell) or ``file``.

    Cells come from IPython's line cache; files are read through ``linecache`` too,
    so nothing is read twice. ``relpath`` is the file relative to the kernel's working
    directory (where the notebook usually is), for a link that opens it in JupyterLab;
    ``None`` when the file lies outside it.
    """
    lines = linecache.getlines(filename)
    if not lines:
        return dict(kind="missing", file=filename, line=lineno, first=1, lines=[], relpath=None)
    if _is_cell(filename):
        return dict(
            kind="cell", file=filename, line=lineno, first=1, lines=[x.rstrip("\n") for x in lines], relpath=None
        )
    lo = max(1, lineno - context)
    hi = min(len(lines), lineno + context)
    rel = os.path.relpath(filename, os.getcwd()) if os.path.isabs(filename) else filename
    return dict(
        kind="file",
        file=filename,
        line=lineno,
        first=lo,
        lines=[x.rstrip("\n") for x in lines[lo - 1 : hi]],
        relpath=None if rel.startswith("..") else rel,
    )
