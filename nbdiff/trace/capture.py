"""What a recording keeps of a big model: which layers, which steps, and whose tensors in full.

A 7B model's every tensor of every step does not fit on a disk. ``record`` narrows it down:

- ``layers``: dotted-path patterns (``fnmatch``: ``model.layers.0.*``, ``*.mlp``) and ``depth``
  (of the calls: the root model's is 0, the layers it calls 1; a container such as a ``ModuleList``
  that is never called adds none): only those layer calls, their backward and their updates;
- ``steps``: the first N steps (an int), the steps listed (``range(0, 1000, 50)``), or those a
  function accepts;
- ``tensors``: in a ``tensor`` dump, the values of only these layers' calls (patterns, or
  ``result.blamed_paths(side)`` for a second recording aimed at what a first comparison
  found); every other call keeps its statistics.

The model's inputs and loss are always kept: pairing and the "different inputs" check need them.
So are the values of a BatchNorm over few values per channel (:func:`amplifies`), in any dump.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nbdiff.errors import OptionError
from nbdiff.trace.events import Event, Kind, Phase

__all__ = ["Capture", "BATCH_NORMS", "FEW_PER_CHANNEL", "amplifies", "few_per_channel"]

_ALWAYS = (Kind.INPUT, Kind.LOSS)

BATCH_NORMS = frozenset(
    {"BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D",
     "SyncBatchNorm"}
)  # fmt: skip
FEW_PER_CHANNEL = 64
"""Values per channel up to which a train-mode BatchNorm's division by their spread amplifies
rounding past any tolerance (two per channel at the end of a ResNet run on a batch of two)."""


def amplifies(e: Event) -> bool:
    """A BatchNorm call (or its gradient) over at most :data:`FEW_PER_CHANNEL` values per channel:
    every dump keeps its values, which are few, so that compare can recompute it
    (:mod:`nbdiff.engine.recorded.recomputed`) and tell its amplified rounding from a port difference. Running
    statistics (one value per channel) too: a known framework difference is verified from their values."""
    if e.phase is Phase.STATE:
        return True
    return e.kind is Kind.LAYER and bool(e.inputs) and few_per_channel(e.type_name, e.inputs[0].shape)


def few_per_channel(type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether a layer of this class, given an input of ``shape``, is a BatchNorm over at most
    :data:`FEW_PER_CHANNEL` values per channel (:func:`amplifies`; the recorder asks it of a live call)."""
    return (
        type_name in BATCH_NORMS
        and len(shape) >= 2
        and shape[1] > 0
        and math.prod(shape) // shape[1] <= FEW_PER_CHANNEL
    )


@dataclass(frozen=True)
class Capture:
    """The selection of a recording (every field ``None``: everything)."""

    layers: tuple[str, ...] | None = None
    depth: int | None = None
    steps: Callable[[int], bool] | None = None
    tensors: tuple[str, ...] | None = None
    described: dict[str, Any] | None = None
    """The options as the manifest records them (JSON)."""

    @classmethod
    def of(
        cls,
        layers: Sequence[str] | str | None = None,
        depth: int | None = None,
        steps: int | Iterable[int] | Callable[[int], bool] | None = None,
        tensors: Sequence[str] | str | None = None,
    ) -> Capture:
        """The options checked at the door: every bad one names itself and the fix."""
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise OptionError(f"depth={depth!r}: expected a whole number >= 0 (0 keeps the root model's calls only).")
        described: dict[str, Any] = {}
        pats = _patterns("layers", layers)
        kept = _patterns("tensors", tensors)
        which = _steps(steps)
        for name, value in (("layers", pats), ("depth", depth), ("tensors", kept)):
            if value is not None:
                described[name] = list(value) if isinstance(value, tuple) else value
        if steps is not None:
            described["steps"] = steps if isinstance(steps, int) else repr(steps)
        return cls(pats, depth, which, kept, described)

    @property
    def narrows(self) -> bool:
        """Whether anything is left out (else the recording keeps everything its dump type keeps)."""
        return bool(self.described)

    def keeps_step(self, k: int) -> bool:
        return self.steps is None or bool(self.steps(k))

    def keeps(self, e: Event, depth: int | None = None) -> bool:
        """Whether the event is written at all; ``depth``: its layer's call depth, where the event's
        own is not that (an update)."""
        if e.kind in _ALWAYS:
            return True
        if self.depth is not None and (e.depth if depth is None else depth) > self.depth:
            return False
        return self.layers is None or _matches(_layer_of(e), self.layers)

    def keeps_values(self, e: Event) -> bool:
        """Whether a ``tensor`` dump writes the event's values (else its statistics only)."""
        return self.tensors is None or e.kind in _ALWAYS or amplifies(e) or _matches(_layer_of(e), self.tensors)


def _layer_of(e: Event) -> str:
    """The layer an event belongs to: an API call's is the layer whose code made it (``owner::op``)."""
    return e.path.partition("::")[0] if e.kind is Kind.API else e.path


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(path == p or fnmatch.fnmatchcase(path, p) for p in patterns)


def _patterns(name: str, value: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    if not items or not all(isinstance(p, str) for p in items):
        raise OptionError(
            f"{name}={value!r}: expected dotted layer paths or patterns such as ['model.layers.0.*', 'lm_head'] "
            "('' is the root model)."
        )
    return items


def _steps(steps: int | Iterable[int] | Callable[[int], bool] | None) -> Callable[[int], bool] | None:
    if steps is None:
        return None
    if isinstance(steps, bool):
        raise OptionError(f"steps={steps!r}: expected the number of first steps, a list/range of steps, or a function.")
    if isinstance(steps, int):
        if steps < 0:
            raise OptionError(f"steps={steps}: expected a number of first steps >= 0.")
        return lambda k: k < steps
    if callable(steps):
        return steps
    try:
        wanted = frozenset(int(k) for k in steps)
    except (TypeError, ValueError) as exc:
        raise OptionError(
            f"steps={steps!r}: expected the number of first steps (3), the steps to keep (range(0, 1000, 50)) "
            "or a function of the step index."
        ) from exc
    return wanted.__contains__
