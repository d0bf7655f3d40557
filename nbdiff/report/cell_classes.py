"""The source of layer classes defined in notebook cells, for a script that must define them again.

IPython keeps every cell's code (``linecache``), so a class from ``__main__`` can be written into
``repro.py``: its own definition, and what it uses from the session, once each and before whatever
uses it: the imports the session's cells made (a class names ``nn`` imported in another cell), its
base classes, the helper classes and functions its code calls (a ``torch.autograd.Function`` of the
same cell), and the plain constants it reads (``WIDTH = 12``).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import sys
import textwrap
from typing import Any

__all__ = ["CellDefinitions"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


class CellDefinitions:
    """The session's definitions a script needs, gathered class by class (:meth:`add`), written once
    (:meth:`source`)."""

    def __init__(self) -> None:
        self._blocks: dict[str, str] = {}  # name -> its definition, each after what it uses
        self._visiting: set[str] = set()
        self._imports = _session_imports()
        self._imported = _bound_by(self._imports)
        self._names = _session_names()

    def add(self, cls: type) -> bool:
        """``cls`` and what it uses from the session; ``False`` (nothing added) where a cell's text is not at
        hand (a class made by ``exec`` or ``type()``)."""
        chain = [c for c in reversed(cls.__mro__) if c.__module__ == "__main__"]
        blocks = [_definition_block(c) for c in chain]
        if any(b is None for b in blocks):
            return False
        for c, block in zip(chain, blocks):
            self._add(c.__name__, block)  # type: ignore[arg-type]
        return True

    def source(self) -> str:
        """The imports, then every definition, dependencies first (``""``: none)."""
        if not self._blocks:
            return ""
        return "\n".join([*self._imports, "", *("\n" + b for b in self._blocks.values())]).strip() + "\n"

    def _add(self, name: str, block: str) -> None:
        if name in self._blocks or name in self._visiting:
            return
        self._visiting.add(name)
        for used in _free_names(block):
            if used != name and used not in self._imported and not hasattr(builtins, used):
                self._add_used(used)
        self._visiting.discard(name)
        self._blocks[name] = block

    def _add_used(self, name: str) -> None:
        """A name the code reads: a class or function of a cell, or a plain constant, from the session."""
        if name not in self._names:
            return
        obj = self._names[name]
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == "__main__":
            if obj.__name__ == name and "<locals>" not in obj.__qualname__:
                block = _definition_block(obj)
                if block is not None:
                    self._add(name, block)
        elif _plain(obj):
            self._blocks.setdefault(name, f"{name} = {obj!r}")


def _definition_block(obj: Any) -> str | None:
    """The cell text defining the class or function ``obj`` (with its decorators), or ``None``."""
    if inspect.isfunction(obj):
        code = obj.__code__
    else:
        code = next((f.__code__ for f in vars(obj).values() if inspect.isfunction(f)), None)
        if code is None:
            code = next(
                (f.__func__.__code__ for f in vars(obj).values() if isinstance(f, (staticmethod, classmethod))), None
            )
    if code is None:
        return None
    text = "".join(linecache.getlines(code.co_filename))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if inspect.isfunction(obj) else (ast.ClassDef,)
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.name == obj.__name__:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if start <= code.co_firstlineno <= (node.end_lineno or 0):
                # Dedented: a definition inside a cell's `if` or `with` is written at the script's top level.
                return textwrap.dedent("\n".join(text.splitlines()[start - 1 : node.end_lineno]))
    return None


def _free_names(block: str) -> list[str]:
    """Names the code reads, in the order they first appear (those it binds itself are harmless extra)."""
    seen: dict[str, None] = {}
    try:
        tree = ast.parse(block)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            seen.setdefault(node.id)
    return list(seen)


def _plain(value: Any, depth: int = 0) -> bool:
    """A constant whose ``repr`` is its definition (numbers, strings, and tuples, lists, dicts of them)."""
    if isinstance(value, _PLAIN):
        if isinstance(value, float) and value != value:  # nan's repr is not a literal
            return False
        try:
            return ast.literal_eval(repr(value)) == value
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False
    if depth < 3 and isinstance(value, (tuple, list)):
        return len(value) <= 1000 and all(_plain(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return len(value) <= 1000 and all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _session_names() -> dict[str, Any]:
    """The notebook's global names (IPython's user namespace, else ``__main__``'s)."""
    from nbdiff.trace.origin.stack import ipython_shell

    ns = getattr(ipython_shell(), "user_ns", None)
    if isinstance(ns, dict):
        return ns
    main = sys.modules.get("__main__")
    return dict(vars(main)) if main is not None else {}


def _bound_by(imports: list[str]) -> set[str]:
    """The names the import lines bind (``nn`` for ``from torch import nn``)."""
    names = set()
    for line in imports:
        for node in ast.walk(ast.parse(line)):
            if isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return names


def _session_imports() -> list[str]:
    """Every top-level import of the cells run so far (IPython's ``In``), in order, once each."""
    from nbdiff.trace.origin.stack import ipython_shell

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
