"""How many findings a result holds, counted one way wherever it is said (the view's headline and its
next/previous jumps, the text report, the JSON verdict).

A finding is one place at fault: a layer's backward finding folds into its forward one (the same
layer in the same step, most often the same bug). Each finding holds one or more events with their
own error. Framework differences are counted apart: they do not fail a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbdiff.judge.blame import Divergence
from nbdiff.trace.events import Phase

__all__ = ["Finding", "grouped_findings", "counted"]


@dataclass
class Finding:
    """One place at fault: its first event, and the later events of the same layer (its backward)."""

    first: Divergence
    also: list[Divergence] = field(default_factory=list)

    @property
    def events(self) -> list[Divergence]:
        return [self.first, *self.also]


def grouped_findings(findings: tuple[Divergence, ...] | list[Divergence]) -> list[Finding]:
    """The findings in execution order, a layer's backward folded into its forward, framework differences left out."""
    out: list[Finding] = []
    forward: dict[tuple[int, str, str], Finding] = {}
    for f in findings:
        key = (f.step, f.base_path, f.raw_path)
        if f.where == "framework":
            continue
        if f.phase is Phase.BACKWARD and f.where == "layer" and key in forward:
            forward[key].also.append(f)
            continue
        out.append(Finding(f))
        if f.phase is Phase.FORWARD and f.where == "layer":
            forward[key] = out[-1]
    return out


def counted(findings: tuple[Divergence, ...] | list[Divergence]) -> str:
    """``3 findings (4 events)``, ``1 finding``: the one count every place says."""
    groups = grouped_findings(findings)
    events = sum(len(g.events) for g in groups)
    text = f"{len(groups)} finding{'s' if len(groups) != 1 else ''}"
    return text + (f" ({events} events)" if events != len(groups) else "")
