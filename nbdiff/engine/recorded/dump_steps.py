"""One recorded step's events as a step record, and looked up by layer: its updates (a fused group's as
one event), and its parameter gradients (a layer's with its sublayers', or summed over its calls); each
layer's constructor arguments, as the dump keeps them. What
:class:`nbdiff.engine.recorded.comparer.RecordedComparer` reads of a dump besides the events it pairs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.arguments import recorded_arguments
from nbdiff.align.fused import FusedGroup, member_name
from nbdiff.align.pairing import Pairing
from nbdiff.engine.types import StepRecord
from nbdiff.trace.dump.store import RankDump
from nbdiff.trace.events import Event, Phase, TensorRecord, changed
from nbdiff.trace.layer_paths import relative

__all__ = ["updates_by_path", "subtree_params", "step_param_grads", "recorded_step", "layer_args"]


def updates_by_path(events: list[Event], pairing: Pairing, side: str) -> dict[str, Event]:
    """Optimizer events by layer path; each fused group of ``side`` as one event under its path, its
    members' updates named ``member.name`` (as a fused plan converts them)."""
    out = {e.path: e for e in events}
    for g in pairing.fused:
        members = [out.get(m) for m in g.members]
        if g.side == side and all(members):
            outputs = tuple(changed(t, name=f"{member_name(m.path)}.{t.name}") for m in members if m for t in m.outputs)
            out[g.path] = replace(members[0], path=g.path, outputs=outputs)  # type: ignore[arg-type]
    return out


def subtree_params(events: list[Event], path: str) -> tuple[TensorRecord, ...]:
    """Parameter gradients of the layer at ``path`` and of its sublayers, under names relative to
    it (``q_proj.weight``), the first of each: what a recursive weight rule converts."""
    out: dict[str, TensorRecord] = {}
    for e in events:
        rel = relative(e.path, path)
        if rel is not None:
            for t in e.params:
                name = f"{rel}.{t.name}" if rel else t.name
                out.setdefault(name, t if t.name == name else changed(t, name=name))
    return tuple(out.values())


def step_param_grads(
    events: list[Event], groups: tuple[FusedGroup, ...], side: str
) -> dict[str, dict[str, np.ndarray]]:
    """One step's parameter gradients, by layer path then parameter name (summed over the layer's
    calls); a fused group of ``side`` also under its path, as ``member.name``."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for e in events:
        if e.phase is Phase.BACKWARD:
            for t in e.params:
                if t.value is not None:
                    held = out.setdefault(e.path, {})
                    held[t.name] = held[t.name] + t.value if t.name in held else t.value
    for g in groups:
        if g.side == side and all(m in out for m in g.members):
            out[g.path] = {f"{member_name(m)}.{n}": v for m in g.members for n, v in out[m].items()}
    return out


def layer_args(dump: RankDump) -> dict[str, dict[str, Any]]:
    """Each layer's constructor arguments, as the dump keeps them (none in dumps older than them)."""
    return {path: recorded_arguments(args) for path, args in dump.meta.get("layer_args", {}).items()}


def recorded_step(events: list[Event], rank: int) -> StepRecord:
    """A step of one rank's dump as a step record (its events carry the rank)."""
    if rank:
        events = [replace(e, rank=rank) for e in events]
    phase = lambda ph: [e for e in events if e.phase is ph]  # noqa: E731
    return StepRecord(
        phase(Phase.FORWARD), phase(Phase.BACKWARD), [], optimizer=phase(Phase.OPTIMIZER), state=phase(Phase.STATE)
    )
