"""The source of a layer class defined in a notebook cell, for a script that must define it again.

IPython keeps every cell's code (``linecache``), so a class from ``__main__`` can be written into
``repro.py``: its own definition, those of its base classes defined in cells too, and the imports
the session's cells made (a class names ``nn`` or ``F`` imported in another cell).
"""

from __future__ import annotations

import ast
import inspect
import linecache
from typing import Any

__all__ = ["cell_class_source"]


def cell_class_source(cls: type) -> str | None:
    """Python source defining ``cls`` (and its bases from cells), preceded by the session's imports;
    ``None`` when a cell's text is not at hand (a class made by ``exec`` or ``type()``)."""
    chain = [c for c in reversed(cls.__mro__) if c.__module__ == "__main__"]
    blocks = []
    for c in chain:
        block = _class_block(c)
        if block is None:
            return None
        blocks.append(block)
    return "\n".join([*_session_imports(), "", *("\n" + b for b in blocks)]).strip() + "\n"


def _class_block(cls: type) -> str | None:
    code = next((f.__code__ for f in vars(cls).values() if inspect.isfunction(f)), None)
    if code is None:
        return None
    text = "".join(linecache.getlines(code.co_filename))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ClassDef)
            and node.name == cls.__name__
            and node.lineno <= code.co_firstlineno <= (node.end_lineno or 0)
        ):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = text.splitlines()[start - 1 : node.end_lineno]
            return "\n".join(lines)
    return None


def _session_imports() -> list[str]:
    """Every top-level import of the cells run so far (IPython's ``In``), in order, once each."""
    from nbdiff.trace.stack import ipython_shell

    cells: Any = getattr(ipython_shell(), "user_ns", {}).get("In", [])
    found: list[str] = []
    for text in cells if isinstance(cells, list) else []:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and "nbdiff" not in ast.unparse(node):
                line = ast.unparse(node)
                if line not in found:
                    found.append(line)
    return found
