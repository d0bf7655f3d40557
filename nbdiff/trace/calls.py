"""Bookkeeping records of a recording in progress, and how its events are numbered and linked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbdiff.trace.events import TensorRecord
from nbdiff.trace.origin.stack import Frame

__all__ = ["Call", "Feed", "input_name"]


@dataclass
class Call:
    """Mutable bookkeeping for one layer call while the step runs."""

    order: int
    path: str
    layer: Any
    call: int
    depth: int
    parent: int | None
    stack: tuple[Frame, ...]
    template: Any = None
    inputs: list[TensorRecord] = field(default_factory=list)
    given: list[TensorRecord] = field(default_factory=list)
    """Single-step: what raw's own code handed the call, before base's value replaced it."""
    outputs: list[TensorRecord] = field(default_factory=list)
    grad_in: dict[str, TensorRecord] = field(default_factory=dict)
    backward_stack: tuple[Frame, ...] | None = None
    """User frames of the ``backward()`` call that reached this layer (set by its first gradient hook)."""
    grad_out: dict[str, TensorRecord] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    done: bool = False
    graph: bool = False
    """Some output needs a gradient (a backward through it may still come; read for root calls)."""
    api: str = ""
    """For an API call: the op's name (``layer`` is then ``None``)."""
    whole: bool = False
    """Its tensors are copied whole even where the recording summarises them (see
    :func:`nbdiff.trace.summary.keeps_values`)."""


class Feed:
    """Single-step feeding: values from the base trace given to raw layer calls."""

    def __init__(
        self,
        inputs: dict[tuple[str, int], list[np.ndarray | None]],
        grads: dict[tuple[str, int], dict[str, np.ndarray]],
    ):
        self.inputs = inputs
        """``(raw path, call)`` to base input arrays, leaf by leaf (``None``: keep raw's)."""
        self.grads = grads
        """``(raw path, call)`` to base output-gradient arrays, by output name."""


def input_name(key: str) -> str:
    """``[0][1]`` (second positional) becomes ``in[1]``; ``[1].x`` (keyword) becomes ``in.x``."""
    return "in" + key[3:]
