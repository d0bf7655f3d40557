"""Comparing paired events: metrics, tolerances and blame. Pure numpy."""

from __future__ import annotations

from nbdiff.judge.blame import Divergence, EventDiff, blame_all, blame_events, post_order
from nbdiff.judge.metrics import COMPARE_MODES, TensorDiff, compare_tensors
from nbdiff.judge.tolerance import Tolerance, resolve_tolerance

__all__ = [
    "COMPARE_MODES",
    "Divergence",
    "EventDiff",
    "TensorDiff",
    "Tolerance",
    "blame_all",
    "blame_events",
    "compare_tensors",
    "post_order",
    "resolve_tolerance",
]
