"""Single-step feeding: the base values each paired raw call is given."""

from __future__ import annotations

import numpy as np

from nbdiff.align.fused import fuse_events
from nbdiff.align.pairing import Pairing
from nbdiff.step import StepRecord
from nbdiff.trace.recorder import Feed

__all__ = ["feed_for"]


def feed_for(brec: StepRecord, pairing: Pairing, diff_phase: str) -> Feed:
    """Base inputs (forward) and base output gradients (backward) for each paired raw call."""
    groups = [g for g in pairing.fused if g.side == "base"]
    bwd = {(e.path, e.call): e for e in fuse_events(brec.backward, groups, backward=True)}
    inputs: dict[tuple[str, int], list[np.ndarray | None]] = {}
    grads: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for p in pairing.pairs:
        key = (p.raw.path, p.raw.call)
        if diff_phase != "backward" and p.base.depth > 0:  # the root keeps the user's inputs: compared first
            inputs[key] = [t.data for t in p.base.inputs]
        g = bwd.get((p.base.path, p.base.call))
        if g is not None and diff_phase != "forward":
            grads[key] = {t.name: t.data for t in g.outputs}
    return Feed(inputs, grads)
