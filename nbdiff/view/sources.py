"""Source around a stack frame: a notebook cell's code, or an excerpt of a file."""

from __future__ import annotations

import functools
import linecache
import os
import sys
from typing import Any

from nbdiff.trace.origin.cells import cell_lines, is_cell
from nbdiff.trace.origin.stack import cell_number, frame_label

__all__ = ["source_excerpt"]


def _may_read(filename: str) -> bool:
    """Frames can come from a dump, which is untrusted: read only Python sources of this project
    (under the working folder), of a module this process loaded, or already in the line cache."""
    if filename in linecache.cache:
        return True
    if not filename.endswith(".py"):
        return False
    real = os.path.realpath(filename)
    if real.startswith(os.path.realpath(os.getcwd()) + os.sep):
        return True
    return real in _loaded_files(len(sys.modules))


@functools.lru_cache(maxsize=1)
def _loaded_files(_modules: int) -> frozenset[str]:
    # Keyed by how many modules are loaded: recomputed only after an import, not for every frame.
    return frozenset(os.path.realpath(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None)))


def _span_label(filename: str, since: int, lineno: int) -> str:
    """``Cell In [5], lines 20-24`` for a frame standing for several lines (a layer's own code between
    two sublayers), ``Cell In [5], line 24`` for one."""
    label = frame_label(filename, lineno)
    return label.replace(f"line {lineno}", f"lines {since}-{lineno}") if since < lineno else label


def source_excerpt(filename: str, lineno: int, context: int = 6, since: int | None = None) -> dict[str, Any]:
    """``{kind, file, line, first, lines, relpath, since}``: ``kind`` is ``cell`` (the whole cell) or ``file``.

    ``since``: the frame stands for lines ``since``..``lineno`` (a layer's own code between two of
    its sublayers' calls), all marked and all in the excerpt.

    Cells come from IPython's line cache; files are read through ``linecache`` too,
    so nothing is read twice. ``relpath`` is the file relative to the kernel's working
    directory (where the notebook usually is), for a link that opens it in JupyterLab;
    ``None`` when the file lies outside it.
    """
    lines = linecache.getlines(filename) if _may_read(filename) else []
    since = lineno if since is None or not 0 < since <= lineno else since
    if not lines:
        return dict(kind="missing", file=filename, line=lineno, first=1, lines=[], relpath=None, since=since)
    if is_cell(filename) or cell_number(filename) is not None:
        return dict(
            kind="cell", file=filename, line=lineno, first=1, lines=cell_lines(filename), relpath=None,
            label=_span_label(filename, since, lineno), since=since,
        )  # fmt: skip
    lo = max(1, since - context)
    hi = min(len(lines), lineno + context)
    rel = os.path.relpath(filename, os.getcwd()) if os.path.isabs(filename) else filename
    return dict(
        kind="file",
        file=filename,
        line=lineno,
        first=lo,
        lines=[x.rstrip("\n") for x in lines[lo - 1 : hi]],
        relpath=None if rel.startswith("..") else rel,
        since=since,
    )
