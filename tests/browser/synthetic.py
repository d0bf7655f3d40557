"""A large synthetic DiffResult (no framework needed) for the view's 10,000-row checks."""

from __future__ import annotations

import numpy as np

from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import resolve_tolerance
from nbdiff.result import DiffResult
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.origin.stack import Frame


def big_result(n: int = 10_000, fan: int = 9, bad: int | None = None, shift: float = 0.1) -> DiffResult:
    """``n`` forward events: a root, blocks of ``fan`` layers each; event ``bad`` diverges (its
    output moved by ``shift``)."""
    tol = resolve_tolerance(None, None, "float32")
    bad = n * 2 // 3 if bad is None else bad
    rng = np.random.RandomState(0)
    diffs = []
    block = 0
    for i in range(n):
        depth = 0 if i == 0 else (1 if (i - 1) % (fan + 1) == 0 else 2)
        if depth == 1:
            block = i
        path = (
            ""
            if i == 0
            else (f"blocks.{(i - 1) // (fan + 1)}" if depth == 1 else f"blocks.{(i - 1) // (fan + 1)}.fc{i - block}")
        )
        parent = None if i == 0 else (0 if depth == 1 else block)
        base = rng.randn(4, 8).astype("float32")
        raw = base + (shift if i == bad else 0.0)
        frames = (Frame("/work/models/net.py", 10 + depth, "forward"),)
        ev = lambda v, p=path, d=depth, par=parent, i=i, fr=frames: Event(  # noqa: E731
            0, Phase.FORWARD, Kind.LAYER, i, p, "Linear" if d == 2 else "Block", 0, d, par, d == 2,
            (), (TensorRecord("out", (4, 8), "float32", v),), stack=fr,
        )  # fmt: skip
        t = compare_tensors("out", raw, base, tol)
        diffs.append(EventDiff(ev(base), ev(raw), (t,), (t,) if i == bad else None))
    b = diffs[bad]
    div = Divergence(
        Phase.FORWARD, 0, b.base.path, b.raw.path, "Linear", "Linear", b.tensors[0], tol, b.tensors[0], False,
        b.base.stack, b.raw.stack, "layer",
    )  # fmt: skip
    return DiffResult("torch", "paddle", "Big", "Big", div, tuple(diffs), 1)
