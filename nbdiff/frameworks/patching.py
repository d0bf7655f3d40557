"""Wrapping framework functions for API-level tracing, with one owner per wrapped function.

Several sessions may trace at once (two ``api_level=True`` comparisons, nested or ended in
any order). Each wrapped ``owner.attr`` is installed once and reference counted: every
session adds its callback, and the original comes back when the last one leaves, whatever
the order of exits.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from nbdiff.frameworks.interrupts import undone_whole

__all__ = ["patched", "ApiCallback", "active_patches"]

ApiCallback = Callable[[str, tuple, dict, Any], None]
"""``callback(name, args, kwargs, output)``, called after each intercepted call."""

_INHERITED = object()
_LOCK = threading.Lock()


class _Depth:
    """Calls inside an intercepted call are its implementation, not the user's: record the outermost."""

    level = 0


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Any
    """What ``vars(owner)[attr]`` held, or ``_INHERITED`` when the attribute came from a base class."""
    callbacks: list[tuple[ApiCallback, str]] = field(default_factory=list)


_PATCHES: dict[tuple[int, str], _Patch] = {}


def active_patches() -> int:
    """How many functions are wrapped right now (0 when no session traces APIs)."""
    return len(_PATCHES)


def _wrap(fn: Callable[..., Any], patch: _Patch) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _Depth.level or not patch.callbacks:
            return fn(*args, **kwargs)
        _Depth.level += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            _Depth.level -= 1
        for callback, name in list(patch.callbacks):
            callback(name, args, kwargs, out)
        return out

    return wrapper


def _add(owner: Any, attr: str, name: str, callback: ApiCallback) -> _Patch | None:
    key = (id(owner), attr)
    patch = _PATCHES.get(key)
    if patch is None:
        fn = getattr(owner, attr, None)
        if fn is None or not callable(fn):
            return None
        own = attr in vars(owner)  # on a class: defined here, or inherited (then delete on exit)
        patch = _PATCHES[key] = _Patch(owner, attr, vars(owner)[attr] if own else _INHERITED)
        setattr(owner, attr, _wrap(fn, patch))
    patch.callbacks.append((callback, name))
    return patch


def _remove(patch: _Patch, callback: ApiCallback) -> None:
    patch.callbacks[:] = [(c, n) for c, n in patch.callbacks if c is not callback]
    if patch.callbacks:
        return
    del _PATCHES[(id(patch.owner), patch.attr)]
    if patch.original is _INHERITED:
        delattr(patch.owner, patch.attr)
    else:
        setattr(patch.owner, patch.attr, patch.original)


@contextmanager
def patched(targets: Sequence[tuple[Any, str, str]], callback: ApiCallback) -> Iterator[None]:
    """Report each call of ``owner.attribute`` to ``callback`` while the block runs."""
    mine: list[_Patch] = []
    try:
        with _LOCK:
            for owner, attr, name in targets:
                patch = _add(owner, attr, name, callback)
                if patch is not None:
                    mine.append(patch)
        yield
    finally:

        def undone() -> None:
            with _LOCK:
                for patch in reversed(mine):
                    _remove(patch, callback)

        undone_whole(undone)  # every patch undone, even if Ctrl-C comes meanwhile
