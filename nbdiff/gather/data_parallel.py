"""A data-parallel run's groups joined into one whole step (DP, DP x TP, FSDP, FSDP + TP).

Each data-parallel group (the ranks sharing a data-parallel coordinate) has been gathered into
whole tensor-parallel tensors by :mod:`nbdiff.gather.shards`; what differs between groups is the
slice of the batch each ran on. A tensor is joined:

1. by its recorded data-parallel placement (FSDP's sharded parameters, their reduced gradients and
   updates: ``shard(d)`` concatenated, ``strided(d,k)`` interleaved with the tensor-parallel
   pieces, ``partial`` summed, ``replicate`` one copy);
2. else by the other run's shape: the one dimension along which the groups add up to it is the
   batch's (concatenated); the same shape is a copy where every group holds the same values, and a
   reduction where they differ (a loss, a gradient each rank computed from its own slice, before
   the all-reduce): their mean (``dp_reduce="mean"``, DDP's and FSDP's) or sum;
3. with no other run to tell (both data-parallel), along dimension 0, the batch's by convention.

A gradient concatenated from the groups' own backward passes is scaled by ``1/n`` under a mean:
each rank's loss was the mean over its own slice, ``n`` times the global mean's share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.gather.gathering import Gathering, event_key, fit_layout, joined_stats, mate_record, same_record
from nbdiff.trace.events import Event, Phase, TensorRecord, changed
from nbdiff.trace.mesh import Mesh, Placement
from nbdiff.trace.stats import Stats

__all__ = ["run_mesh", "data_parallel_groups", "joined_groups", "scaled_stats"]

_WHOLE_PHASES = (Phase.OPTIMIZER, Phase.STATE)
"""Phases of parameters and buffers, which no rank holds a slice of the batch of."""


def run_mesh(dumps: Sequence[Any]) -> Mesh | None:
    """The mesh every rank of one run recorded (checked to be one mesh, each place held once)."""
    given = [d.meta.get("mesh") for d in dumps]
    if all(m is None for m in given):
        return None
    meshes = []
    for d, m in zip(dumps, given):
        if m is None:
            raise DumpError(f"{d.path}: records no mesh, while the run's other ranks do; its folder is of another job.")
        meshes.append(Mesh.from_json(m, str(d.path)))
    first = meshes[0]
    for d, m in zip(dumps, meshes):
        if (m.shape, m.names, m.data_parallel, m.reduce) != (
            first.shape,
            first.names,
            first.data_parallel,
            first.reduce,
        ):
            raise DumpError(f"{d.path}: its mesh {m.to_json()} is not rank 0's {first.to_json()}; the ranks' folders "
                            "are of different jobs.")  # fmt: skip
    sizes = dict(zip(first.names, first.shape))
    if math.prod(first.shape) != len(dumps):
        raise DumpError(f"{dumps[0].path.parent}: the mesh {sizes} has {math.prod(first.shape)} places, but "
                        f"{len(dumps)} ranks were recorded; copy in every rank's folder, or record the mesh the job ran on.")  # fmt: skip
    seen: dict[tuple[int, ...], Any] = {}
    for d, m in zip(dumps, meshes):
        if m.coordinate in seen:
            raise DumpError(f"{d.path} and {seen[m.coordinate].path} both say they are at {m.coordinate} of the mesh "
                            f"{sizes}; the ranks' folders are of different jobs.")  # fmt: skip
        seen[m.coordinate] = d
    return first


def data_parallel_groups(dumps: Sequence[Any]) -> list[tuple[dict[str, int], list[int]]]:
    """Each data-parallel group: its data-parallel coordinates, and the indices of its ``dumps`` in
    tensor-parallel order; the groups in row-major order."""
    groups: dict[int, tuple[dict[str, int], list[tuple[int, int]]]] = {}
    for i, d in enumerate(dumps):
        m = Mesh.from_json(d.meta["mesh"], str(d.path))
        place = {n: c for n, c in zip(m.names, m.coordinate) if n in m.data_parallel}
        groups.setdefault(m.group(), (place, []))[1].append((m.position(), i))
    return [(groups[g][0], [i for _, i in sorted(groups[g][1])]) for g in sorted(groups)]


def joined_groups(
    wholes: list[list[Event]],
    other: list[Event] | None,
    mesh: Mesh,
    groups: list[tuple[dict[str, int], list[int]]],
    parts: dict[int, Gathering],
    into: dict[int, Gathering],
    note: Callable[[str], None],
    k: int,
    placed: bool = True,
) -> list[Event]:
    """One step from each data-parallel group's whole step (``groups``: each one's data-parallel
    coordinates and ranks, ``parts``: how its tensors were gathered, by ``id``); ``into`` learns how
    each joined tensor was. ``placed=False``: the tensors' layouts are not over these groups (one
    rank's micro-batches), kept as they are for a later gathering."""
    ranks = [members for _, members in groups]
    keyed = [{event_key(e): e for e in events} for events in wholes]
    mates = {event_key(e): e for e in other} if other is not None else {}
    out = []
    for e in wholes[0]:
        copies = []
        for g, by_key in enumerate(keyed):
            c = by_key.get(event_key(e))
            if c is None:
                raise DumpError(f"rank {ranks[g][0]}: step {k} has no {e.phase.value} call of `{e.path or '<root>'}`, "
                                f"which rank {ranks[0][0]} has; the data-parallel ranks did not run the same steps.")  # fmt: skip
            copies.append(c)
        join = _Join(e, mesh, mates.get(event_key(e)), groups, parts, into, note, placed)
        joined = {
            group: tuple(r for i, t in enumerate(getattr(e, group)) if (r := join.record(group, i, t, copies)))
            for group in ("inputs", "outputs", "params")
        }
        out.append(changed(e, **joined))
    return out


class _Join:
    """One event's tensors joined over the data-parallel groups."""

    def __init__(
        self,
        e: Event,
        mesh: Mesh,
        mate: Event | None,
        groups: list[tuple[dict[str, int], list[int]]],
        parts: dict[int, Gathering],
        into: dict[int, Gathering],
        note: Callable[[str], None],
        placed: bool,
    ) -> None:
        self.e, self.mesh, self.mate, self.groups, self.parts, self.into, self.note, self.placed = (
            e, mesh, mate, groups, parts, into, note, placed,
        )  # fmt: skip

    def record(self, group: str, i: int, t: TensorRecord, copies: list[Event]) -> TensorRecord | None:
        records = [same_record(getattr(c, group), i, t) for c in copies]
        where = f"`{self.e.path or '<root>'}` {t.name} (step {self.e.step}, {self.e.phase.value})"
        dp = self.mesh.split(t.layout, where)[1] if self.placed else []
        placed = [p for p in dp if p.kind != "replicate"]
        if len(placed) > 1:
            raise DumpError(f"{where}: sharded over {len(placed)} data-parallel dimensions ({t.layout}); nbdiff "
                            "joins a tensor sharded over one of them.")  # fmt: skip
        keep = list(range(len(records)))
        if dp:  # a distributed tensor: copies along every data-parallel dimension it is not sharded over
            along = {p.name for p in placed}
            keep = [
                g for g, (place, _) in enumerate(self.groups) if all(c == 0 or n in along for n, c in place.items())
            ]
        how, scale = self._how(group, i, [records[g] for g in keep], placed[0] if placed else None)
        return self._joined(t, [records[g] for g in keep], how, scale, keep)

    def _how(self, group: str, i: int, records: list[TensorRecord], placed: Placement | None) -> tuple[Any, float]:
        """How the groups' copies make the whole: a :class:`Placement` to concatenate by, ``"same"``
        or a reduction (``"mean"``, ``"sum"``); and the scale of a concatenated gradient."""
        if placed is not None:  # a distributed tensor's own placement: FSDP's, already reduced
            return (placed, 1.0) if placed.kind != "partial" else ("sum", 1.0)
        e, n = self.e, len(records)
        scale = 1.0 / n if e.phase is Phase.BACKWARD and self.mesh.reduce == "mean" else 1.0
        mate = mate_record(self.mate, group, i, records[0].name) if self.mate is not None else None
        fit = fit_layout(records, mate)
        if fit is not None and fit.startswith("shard"):
            return Placement("shard", int(fit[6:-1])), scale
        if _all_same(records):
            return "same", 1.0
        if fit == "replicate" or not records[0].shape or group == "params" or e.phase in _WHOLE_PHASES:
            return self.mesh.reduce, 1.0
        return Placement("shard", 0), scale  # no other run to tell: the batch's dimension by convention

    def _joined(
        self, t: TensorRecord, records: list[TensorRecord], how: Any, scale: float, keep: list[int]
    ) -> TensorRecord | None:
        values = [r.value for r in records]
        have = all(v is not None for v in values)
        parts = [self.parts.get(id(r)) for r in records]
        firsts = [self.groups[g][1][0] for g in keep]
        kept = "" if self.placed else t.layout  # a later gathering's to read
        if how == "same":
            whole = changed(t, layout=kept)
            self.into[id(whole)] = Gathering("replicate", values, firsts, parts)
            return whole
        if how in ("mean", "sum"):
            if not have:
                self.note("Gradients each data-parallel rank computed from its own slice of the batch (before their "
                          "all-reduce), kept as statistics only, cannot be added up: not compared. Record "
                          "dump_type='tensor' to compare them.")  # fmt: skip
                return None
            total = np.sum(np.stack(values), axis=0, dtype=np.float64)
            total = (total / len(values) if how == "mean" else total).astype(values[0].dtype)  # type: ignore[union-attr]
            whole = TensorRecord(t.name, t.shape, t.dtype, total, None, kept)
            self.into[id(whole)] = Gathering(how, values, firsts, parts)
            return whole
        d = how.dim
        shape = list(t.shape)
        shape[d] = sum(r.shape[d] for r in records)
        if have:
            scaled = [v if scale == 1.0 else (v * scale).astype(v.dtype) for v in values]  # type: ignore[operator,union-attr]
            value = np.concatenate(_interleaved(scaled, how) if how.kind == "strided" else scaled, axis=d)
            whole = TensorRecord(t.name, tuple(shape), t.dtype, value, None, kept)
        else:
            scaled, stats = [None] * len(values), joined_stats(records)
            whole = TensorRecord(
                t.name, tuple(shape), t.dtype, None, scaled_stats(stats, scale) if stats else None, kept
            )
        layout = how.text() if how.kind == "shard" else how.written()
        self.into[id(whole)] = Gathering(layout, scaled, firsts, parts, scale)  # type: ignore[arg-type]
        return whole


def _all_same(records: list[TensorRecord]) -> bool:
    first = records[0]
    if all(r.value is not None for r in records):
        return all(r.shape == first.shape and np.array_equal(r.value, first.value) for r in records[1:])  # type: ignore[arg-type]
    return all(r.value is None and r.stats == first.stats for r in records)


def _interleaved(values: list[np.ndarray], how: Placement) -> list[np.ndarray]:
    """FSDP's shards of a tensor-parallel shard in the whole's order: each group's value is its
    sub-shard of each of the ``split`` tensor-parallel pieces, in turn."""
    if any(v.shape[how.dim] % how.split for v in values):
        raise DumpError(f"a shard laid out {how.written()} does not split {how.split} ways evenly; not gathered.")
    pieces = [np.split(v, how.split, axis=how.dim) for v in values]
    return [pieces[g][c] for c in range(how.split) for g in range(len(values))]


def scaled_stats(stats: Stats, c: float) -> Stats:
    """The statistics of a tensor multiplied by ``c > 0``."""
    return replace(
        stats, min=stats.min * c, max=stats.max * c, mean=stats.mean * c, std=stats.std * c, abs_mean=stats.abs_mean * c
    )
