"""Parameters written outside the optimizer between two steps (weight clipping, an EMA, spectral
norm, a manual write): their own finding, never an optimizer update's.

A watched step's update is read as the weights the next step began with minus those the step began
with; each side's session also knows which parameters changed after their optimizer stepped
(:attr:`~nbdiff.trace.session.ModelSession.outside`). An update that fails where only one side (or
each side by another amount) wrote the parameter is that write's finding, and no optimizer setting
is named for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nbdiff.frameworks import Framework
from nbdiff.judge.blame import Divergence
from nbdiff.trace.events import Event
from nbdiff.weights.plan import LayerWeights, layer_tensors

__all__ = ["Writes", "outside_writes", "recorded_writes", "as_outside"]


@dataclass(frozen=True)
class Writes:
    """Each side's parameters written outside the optimizer after one step's update, by dotted name
    (base's as base names them, raw's as raw does), with the norm after the write over before it."""

    base: dict[str, float]
    raw: dict[str, float]

    def __bool__(self) -> bool:
        return bool(self.base or self.raw)


def outside_writes(
    fws: tuple[Framework, Framework],
    layers: tuple[dict[str, Any], dict[str, Any]],
    plans: dict[str, LayerWeights],
    written: tuple[dict[int, float], dict[int, float]],
) -> Writes:
    """``written``: each side's norm ratios by ``id`` of the parameter, named by the planned layers."""
    named: tuple[dict[str, float], dict[str, float]] = ({}, {})
    if not any(written):
        return Writes(*named)
    for plan in plans.values():
        for i, path in enumerate((plan.base_path, plan.raw_path)):
            if not written[i]:
                continue
            for n, p in layer_tensors(fws[i], layers[i][path], plan.recursive).items():
                if id(p) in written[i]:
                    named[i][f"{path}.{n}" if path else n] = written[i][id(p)]
    return Writes(*named)


def recorded_writes(base: list[Event], raw: list[Event]) -> Writes:
    """The writes a dump kept with each side's optimizer events of a step (their ``params``)."""
    return Writes(_written(base), _written(raw))


def _written(events: list[Event]) -> dict[str, float]:
    out = {}
    for e in events:
        for t in e.params:  # a scalar each; a statistics dump keeps it as its statistics
            ratio = float(t.value) if t.value is not None else t.stats.max if t.stats is not None else float("nan")
            out[f"{e.path}.{t.name}" if e.path else t.name] = ratio
    return out


def as_outside(found: list[Divergence], writes: Writes) -> list[Divergence]:
    """Update findings whose parameter was written outside the optimizer after their step's update, on
    one side or by different amounts, told as that write."""
    if not writes:
        return found
    out = []
    for f in found:
        raw_name = f"{f.raw_path}.{f.metrics.name}" if f.raw_path else f.metrics.name
        b, r = writes.base.get(f.parameter or ""), writes.raw.get(raw_name)
        if f.where != "parameter" or (b is None and r is None) or (b is not None and r is not None and _alike(b, r)):
            out.append(f)
            continue
        if b is not None and r is not None:
            who = f"both sides wrote `{f.parameter}` (raw `{raw_name}`) outside the optimizer, by other amounts"
            size = f"norm base x{b:.4g}, raw x{r:.4g}"
        elif r is not None:
            who, size = f"raw's `{raw_name}` changed outside the optimizer", f"norm x{r:.4g}"
        else:
            who, size = f"base's `{f.parameter}` changed outside the optimizer", f"norm x{b:.4g}"
        said = f"{who} between step {f.step}'s update and step {f.step + 1} ({size})"
        out.append(replace(f, where="outside", explanation=said))
    return out


def _alike(b: float, r: float) -> bool:
    # A write both sides made alike (the same clipping: norms within 0.1%) leaves the update itself
    # to blame; the update comparison already found the values apart.
    return abs(b - r) <= 1e-3 * max(abs(b), abs(r))
