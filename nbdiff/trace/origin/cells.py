"""Notebook cells that frames point into, carried with a saved result or a dump.

A frame of a notebook cell names a file only the kernel that ran it knows (``/tmp/ipykernel_7/
1606949816.py``): read back in another process (``nbdiff.load``, ``nbdiff view``, ``compare`` of a
dump), it said ``1606949816.py:3`` and had no source. So what is kept with frames also keeps each
cell's number and text (:func:`cells_of`), and reading it back makes them known again
(:func:`remember_cells`): the label says ``Cell In [3], line 3`` and the source shows.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Iterable
from typing import Any

from nbdiff.errors import DumpError
from nbdiff.trace.origin.stack import cell_number, ipython_shell, remember_cell_number

__all__ = ["cell_lines", "cells_of", "is_cell", "remember_cells"]

MAX_CELLS = 1000
MAX_CELL_CHARS = 1 << 20
_CELL_NAME = re.compile(r"<ipython-input-\d+-[0-9a-f]+>|.*[/\\]ipykernel_\d+[/\\]\d+\.py|<cell[^<>]*>")
"""What IPython and ipykernel name a cell: only such a name read from a file becomes a cell here (a
dump naming a project's real file could otherwise show other text as its source)."""


def is_cell(filename: str) -> bool:
    """Whether ``filename`` names a notebook cell (IPython's ``<ipython-input-N-...>``, ipykernel's
    ``.../ipykernel_PID/NNN.py``)."""
    return filename.startswith("<ipython-input-") or "ipykernel_" in filename or filename.startswith("<cell")


def cell_lines(filename: str) -> list[str]:
    """The cell as the user wrote it: IPython's history has the raw text (``%magic`` lines, not
    their ``get_ipython().run_line_magic(...)`` rewrite); the compiled text when lines would not match."""
    compiled = [x.rstrip("\n") for x in linecache.getlines(filename)]
    n = cell_number(filename)
    raw_cells = getattr(getattr(ipython_shell(), "history_manager", None), "input_hist_raw", None)
    if n is not None and isinstance(raw_cells, list) and 0 <= n < len(raw_cells):
        raw = raw_cells[n].rstrip("\n").split("\n")
        if len(raw) == len(compiled):
            return raw
    return compiled


def cells_of(filenames: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{filename: {"cell": n, "lines": [...]}}`` for the notebook cells among ``filenames`` whose text
    this process has (the session that ran them, or a result read back). Lines, not one text: reading
    JSON back makes every string printable (a newline in one would read as ``\\n``)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(filenames)):
        if len(out) >= MAX_CELLS or not is_cell(name):
            continue
        n, lines = cell_number(name), cell_lines(name)
        if n is not None and lines and sum(len(line) for line in lines) <= MAX_CELL_CHARS:
            out[name] = {"cell": n, "lines": lines}
    return out


def remember_cells(cells: Any, where: str) -> None:
    """Make the cells a saved result or dump carries known to this process (labels and sources); a cell
    this process knows already (the session that ran it) keeps its own. ``where``: the file, for errors."""
    if cells is None:
        return
    if not isinstance(cells, dict) or len(cells) > MAX_CELLS:
        raise DumpError(f"{where}: cells is not an object of at most {MAX_CELLS} notebook cells; the file was edited.")
    for name, cell in cells.items():
        ok = isinstance(cell, dict) and len(name) <= 4096 and _CELL_NAME.fullmatch(name) is not None
        n, lines = (cell.get("cell"), cell.get("lines")) if ok else (None, None)
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 10**9):
            raise DumpError(f"{where}: cells[{name[:80]!r}] has no cell number; the file was edited.")
        if not (isinstance(lines, list) and all(isinstance(x, str) for x in lines)) or (
            sum(len(x) for x in lines) > MAX_CELL_CHARS
        ):
            raise DumpError(f"{where}: cells[{name[:80]!r}] has no lines of source; the file was edited.")
        if name in linecache.cache or cell_number(name) is not None:
            continue
        linecache.cache[name] = (sum(len(x) + 1 for x in lines), None, [x + "\n" for x in lines], name)
        remember_cell_number(name, n)
