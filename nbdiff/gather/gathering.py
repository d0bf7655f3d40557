"""What gathering a distributed run's tensors shares between its stages (:mod:`nbdiff.gather.shards`,
tensor-parallel shards; :mod:`nbdiff.gather.data_parallel`, data-parallel groups): how a gathered
tensor was put together, and the lookups both make."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.stats import Stats, concatenated_stats

__all__ = ["Gathering", "event_key", "same_record", "mate_record", "fit_layout", "joined_stats"]


@dataclass
class Gathering:
    """How one gathered tensor was put together, for naming the rank whose shard differs."""

    layout: str
    """``shard(d)`` (``d`` non-negative), ``replicate`` or ``partial``."""
    shards: list[np.ndarray | None]
    """Each rank's own values (``None`` where only statistics were kept)."""
    ranks: list[int] = field(default_factory=list)
    """The rank that held each shard (its number in the job); a data-parallel group's first. Of
    micro-batches: the ranks that ran them all."""
    parts: list[Gathering | None] = field(default_factory=list)
    """Per shard, how it was gathered in turn (a data-parallel group's tensor-parallel shards)."""
    scale: float = 1.0
    """What each shard was multiplied by as it joined (a data-parallel mean's ``1/n``)."""
    unit: str = "rank"
    """What held each shard: a ``rank``, or a ``micro-batch`` of one rank's step."""


def event_key(e: Event) -> tuple:
    return (e.phase, e.kind, e.path, e.call)


def same_record(records: tuple[TensorRecord, ...], i: int, t: TensorRecord) -> TensorRecord:
    if i < len(records) and records[i].name == t.name:
        return records[i]
    for r in records:
        if r.name == t.name:
            return r
    raise DumpError(f"tensor {t.name!r} is recorded on one rank and not on another; the ranks ran different code.")


def mate_record(mate: Event, group: str, i: int, name: str) -> TensorRecord | None:
    records = getattr(mate, group)
    if i < len(records) and records[i].name == name:
        return records[i]
    return next((r for r in records if r.name == name), None)


def fit_layout(shards: list[TensorRecord], whole: TensorRecord | None) -> str | None:
    """The layout under which ``shards`` make ``whole``'s shape: the same shape is ``replicate``,
    shards adding up along one dimension are ``shard(d)``."""
    if whole is None or any(len(s.shape) != len(whole.shape) for s in shards):
        return None
    if all(s.shape == whole.shape for s in shards):
        return "replicate"
    for d in range(len(whole.shape)):
        rest = [n for j, n in enumerate(whole.shape) if j != d]
        if all([n for j, n in enumerate(s.shape) if j != d] == rest for s in shards):
            if sum(s.shape[d] for s in shards) == whole.shape[d]:
                return f"shard({d})"
    return None


def joined_stats(shards: list[TensorRecord]) -> Stats | None:
    """Statistics of the concatenation, from each shard's (population) statistics."""
    stats = [s.statistics() for s in shards]
    if any(s is None for s in stats):
        return None
    return concatenated_stats([(s, math.prod(t.shape)) for s, t in zip(stats, shards)])  # type: ignore[misc]
