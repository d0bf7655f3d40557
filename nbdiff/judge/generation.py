"""Generation step by step: a decode loop calls the model once per new token (after the prompt),
so its steps are token positions. Where it diverges says what kind of bug it is: at the prompt,
the code differs everywhere; only past some position, something position-dependent does (a
rotary embedding past a length, position ids, a cache written at the wrong offset)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.trace.events import Kind, Phase

__all__ = ["Generation", "sequence_length", "generation"]


@dataclass(frozen=True)
class Generation:
    """Where a decode loop diverged, in steps and token positions."""

    steps: int
    """Decode steps compared (the prompt's is step 0)."""
    positions: tuple[tuple[int, int], ...]
    """Each step's token positions, ``[start, end)``, counted from the first step's first token."""
    step: int | None
    """The first step whose outputs diverge (``None``: none does)."""
    position: int | None
    """The first token position whose values differ in that step (within a prompt too)."""
    late: bool
    """Whether it diverged only past the first positions (the steps or positions before it agree)."""

    def describe(self) -> str:
        if self.step is None:
            return f"generation: {self.steps} decode steps, positions 0-{self.positions[-1][1] - 1}, agree"
        start, end = self.positions[self.step]
        position = self.position if self.position is not None else start
        step = "the prompt (step 0" if self.step == 0 else f"decode step {self.step}"
        at = f"{step} of {self.steps}{')' if self.step == 0 else ''}, token position {position}"
        if not self.late:
            return (
                f"generation: {at}: an early divergence, from the first position on: the code differs "
                "wherever it runs, not past some position"
            )
        agree = "position 0 agrees" if position == 1 else f"positions 0-{position - 1} agree"
        return (
            f"generation: {at} ({agree}): a late divergence: something that depends on the position "
            "goes wrong from there (rotary frequencies or a rotary past a length, position ids, a KV cache "
            "written at the wrong offset)"
        )


def sequence_length(d: EventDiff) -> int | None:
    """Tokens a step computes, read off its model inputs or the first block's output: dimension 1
    of a (batch, positions, features) tensor."""
    e = d.base
    if e.phase is not Phase.FORWARD or not (e.kind is Kind.INPUT or (e.kind is Kind.LAYER and e.depth == 1)):
        return None
    for t in e.outputs:
        if len(t.shape) == 3 and t.floating:
            return int(t.shape[1])
    return None


def generation(rows: Sequence[dict[str, Any]], first: Divergence | None) -> Generation | None:
    """The decode loop these step rows make (inference only, every step after the first computing
    one token), or ``None`` when they are not one."""
    if len(rows) < 2 or any(r.get("gradients") is not None or r.get("updates") is not None for r in rows):
        return None
    tokens = [r.get("tokens") for r in rows]
    if tokens[0] is None or any(t != 1 for t in tokens[1:]):
        return None
    positions, at = [], 0
    for n in tokens:
        positions.append((at, at + int(n)))  # type: ignore[arg-type]
        at += int(n)  # type: ignore[arg-type]
    step = position = None
    if first is not None and first.step < len(positions):
        step = first.step
        position = positions[step][0] + _first_differing_position(first)
    late = step is not None and (step > 0 or (position or 0) > 0)
    return Generation(len(rows), tuple(positions), step, position, late)


def _first_differing_position(d: Divergence) -> int:
    """The first position (dimension 1) of the blamed tensor past its tolerance, within its step."""
    pair = d.event
    if pair is None:
        return 0
    b, r = pair.base.tensor(d.metrics.name), pair.raw.tensor(d.metrics.name)
    if (
        b is None
        or r is None
        or b.value is None
        or r.value is None
        or b.value.shape != r.value.shape
        or b.value.ndim != 3
    ):
        return 0
    tol = d.metrics.tolerance
    base, raw = b.value.astype(np.float64), r.value.astype(np.float64)
    scale = float(np.max(np.abs(base))) if tol.scaled and base.size else 1.0
    allowed = tol.atol * scale + tol.floor + tol.rtol * np.abs(base)
    over = np.abs(raw - base) > allowed
    per_position = over.any(axis=(0, 2))
    hits = np.flatnonzero(per_position)
    return int(hits[0]) if hits.size else 0
