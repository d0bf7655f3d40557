"""A tensor-parallel run's shards gathered into whole tensors, so that it compares with a run of
another degree (a single-process reference, or TP=2 against TP=4).

Each rank of a tensor-parallel run records its own shard of some tensors. Gathering needs each
tensor's layout over the ranks: ``shard(d)`` (concatenated along ``d``), ``replicate`` (every
rank holds all of it) or ``partial`` (each holds a part of a sum, as a row-parallel layer's output
before its all-reduce). It is found, in this order:

1. what the framework said: a torch ``DTensor``'s placements (:attr:`TensorRecord.layout`);
2. the user's map, ``compare(..., shards={"layers.*.mlp.up": "column"})``;
3. the shape of the other run's tensor of the same layer, where that run is whole (one rank): the
   one dimension along which the shards add up to it, or ``replicate`` where it is the same;
4. the layer's shard rule, by its parameters' recorded layouts (a torch ``Linear`` whose weight is
   split along dimension 0 is column-parallel) or its class (paddle's ``ColumnParallelLinear``);
5. one tensor seen by two layers keeps its layout (an activation's input is the output before it);
   a gradient is laid out as its value was (a partial sum's gradient is whole); a layer without
   parameters passes its input's layout on to its output (and its output gradient's to its input
   gradient);
6. copies that are the same on every rank are ``replicate``; anything else is reported, and rank
   0's shard stands for it.

The rules are data (:data:`SHARD_RULES`); :func:`register_shard_rule` adds others.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbdiff.errors import DumpError, OptionError
from nbdiff.gather.data_parallel import data_parallel_groups, joined_groups, run_mesh
from nbdiff.gather.gathering import Gathering, event_key, fit_layout, joined_stats, mate_record, same_record
from nbdiff.gather.micro_batches import folded
from nbdiff.gather.shard_rules import (
    RULE_BY_CLASS,
    RULE_BY_WEIGHT,
    SHARD_RULES,
    from_rule,
    normal,
    parse,
    register_shard_rule,
)
from nbdiff.gather.stages import joined_stages
from nbdiff.trace.events import Event, Phase, TensorRecord, changed
from nbdiff.trace.mesh import Mesh, Placement, placements

__all__ = [
    "SHARD_RULES",
    "RULE_BY_CLASS",
    "RULE_BY_WEIGHT",
    "register_shard_rule",
    "Gathered",
    "Gathering",
    "shard_slices",
]

_HELD = 3
"""Steps of whole tensors held at once."""


@dataclass
class Gathered:
    """Both runs' steps, each whole: one side gathered from its ranks (or both, degrees differing)."""

    a: list[Any]
    """Base's rank dumps (:class:`~nbdiff.trace.dump.store.RankDump`), by rank."""
    b: list[Any]
    """Raw's rank dumps, by rank."""
    user_map: Mapping[str, str] = field(default_factory=dict)
    """Layer path pattern -> rule name (``compare``'s ``shards``)."""
    gatherings: dict[int, dict[int, Gathering]] = field(default_factory=dict)
    """Step -> ``id`` of a gathered record -> how it was gathered (the steps held)."""
    notes: list[str] = field(default_factory=list)
    """What could not be told this step (a layout guessed), said once each."""
    _said: set[str] = field(default_factory=set)
    _into: dict[int, Gathering] = field(default_factory=dict)
    _steps: dict[int, tuple[list[Event], list[Event]]] = field(default_factory=dict)
    """The last few steps gathered (a comparison reads a step, and the one before, more than once)."""

    def __post_init__(self) -> None:
        for pattern, rule in self.user_map.items():
            if rule not in SHARD_RULES:
                raise OptionError(
                    f"shards={{{pattern!r}: {rule!r}}}: no shard rule {rule!r}; known: {sorted(SHARD_RULES)} "
                    "(register_shard_rule adds one)."
                )
        self._meshes = (run_mesh(self.a), run_mesh(self.b))  # checked once: every step reads them

    def step(self, k: int) -> tuple[list[Event], list[Event]]:
        """Step ``k`` of both runs, every tensor whole."""
        if k not in self._steps:
            self._into = self.gatherings[k] = {}
            ranks = ([d.steps[k] for d in self.a], [d.steps[k] for d in self.b])
            whole: list[list[Event] | None] = [None, None]
            # The side of fewer ranks first: gathered, its shapes tell the other's layouts.
            for side in sorted((0, 1), key=lambda s: len(ranks[s])):
                whole[side] = self._whole(ranks[side], side, whole[1 - side], k)
            self._steps[k] = (whole[0], whole[1])  # type: ignore[assignment]
            for old in sorted(self._steps)[:-_HELD]:
                del self._steps[old], self.gatherings[old]
        return self._steps[k]

    def _whole(self, ranks: list[list[Event]], side: int, other: list[Event] | None, k: int) -> list[Event]:
        """One run's step gathered: each pipeline stage's (each data-parallel group's tensor-parallel
        shards, then the groups), then the stages."""
        dumps, mesh = (self.a, self.b)[side], self._meshes[side]
        if mesh is None or not mesh.pipeline:
            return self._stage(ranks, dumps, other, k, mesh)
        if len(mesh.pipeline) > 1:
            raise DumpError(f"{dumps[0].path.parent}: {len(mesh.pipeline)} pipeline dimensions "
                            f"({', '.join(mesh.pipeline)}); nbdiff joins the stages of one.")  # fmt: skip
        at = mesh.names.index(mesh.pipeline[0])
        stage_of = [int(d.meta["mesh"]["coordinate"][at]) for d in dumps]
        stages = [[i for i in range(len(dumps)) if stage_of[i] == s] for s in sorted(set(stage_of))]
        wholes = [self._stage([ranks[i] for i in m], [dumps[i] for i in m], other, k, mesh) for m in stages]
        return joined_stages(wholes, dumps[0].path.parent)

    def _stage(
        self, ranks: list[list[Event]], dumps: list[Any], other: list[Event] | None, k: int, mesh: Mesh | None
    ) -> list[Event]:
        """The ranks holding the same layers gathered (each data-parallel group's tensor-parallel
        shards, then the groups), then their micro-batches joined."""
        m = int(dumps[0].meta.get("micro_batches", 1))
        before = set(self._into)
        if len(ranks) == 1:
            events = ranks[0] if m == 1 and mesh is None else [e for e in ranks[0] if e.phase is not Phase.WEIGHTS]
        elif mesh is None or not mesh.data_parallel:
            # A micro-batch is a slice of the other run's batch: its shapes tell nothing then.
            events = self._gather(ranks, dumps, other if m == 1 else None, k, mesh)
        else:
            events = self._groups(ranks, dumps, other, k, mesh)
        if m == 1:
            return events
        parts = self._taken_since(before)
        reduce = str(dumps[0].meta.get("micro_batch_reduce", "mean"))
        ids = [int(d.meta["rank"]) for d in dumps]
        return folded(events, m, other, reduce, ids, parts, self._into, self._note, dumps[0].path)

    def _groups(
        self, ranks: list[list[Event]], dumps: list[Any], other: list[Event] | None, k: int, mesh: Mesh
    ) -> list[Event]:
        """Each data-parallel group's tensor-parallel shards gathered, then the groups joined."""
        groups = data_parallel_groups(dumps)
        wholes, parts = [], {}
        for _, members in groups:
            if len(members) == 1:
                wholes.append([e for e in ranks[members[0]] if e.phase is not Phase.WEIGHTS])
                continue
            # Within a group the batch is a slice of the other run's: its shapes tell nothing here.
            before = set(self._into)
            wholes.append(self._gather([ranks[i] for i in members], [dumps[i] for i in members], None, k, mesh))
            parts.update(self._taken_since(before))
        return joined_groups(
            wholes, other, mesh, [(place, [int(dumps[i].meta["rank"]) for i in m]) for place, m in groups], parts,
            self._into, self._note, k,
        )  # fmt: skip

    def _taken_since(self, before: set[int]) -> dict[int, Gathering]:
        """How the tensors gathered since ``before`` were, taken out of the step's: a later join's parts."""
        return {key: self._into.pop(key) for key in set(self._into) - before}

    def place(self, side: int, rank: int) -> str:
        """Where ``rank`` of run ``side`` (0 base, 1 raw) sits on its mesh (``dp=1, tp=0``); ``""``
        where the run records no mesh."""
        for d in (self.a, self.b)[side]:
            if int(d.meta["rank"]) == rank and (mesh := d.meta.get("mesh")):
                return ", ".join(f"{n}={c}" for n, c in zip(mesh["names"], mesh["coordinate"]))
        return ""

    def _note(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self.notes.append(text)

    def _gather(
        self, ranks: list[list[Event]], dumps: list[Any], other: list[Event] | None, k: int, mesh: Mesh | None = None
    ) -> list[Event]:
        keyed = [{event_key(e): e for e in events} for events in ranks]
        others = {event_key(e): e for e in other} if other is not None else {}
        framework = str(dumps[0].meta["framework"])
        # The other run's framework (``dumps`` may be some of a run's ranks: a group, a stage).
        mate_framework = str((self.b if any(d is dumps[0] for d in self.a) else self.a)[0].meta["framework"])
        known: dict[Any, str] = {}  # rank 0's tensor (_same_tensor) -> layout: one tensor seen by two layers
        forward: dict[tuple, str] = {}
        out: list[Event] = []
        for e in ranks[0]:
            if e.phase is Phase.WEIGHTS:  # a rank's own shards rebuild no whole layer: not gathered
                continue
            copies = []
            for r, by_key in enumerate(keyed):
                c = by_key.get(event_key(e))
                if c is None:
                    raise DumpError(
                        f"{dumps[r].path}: step {k} has no {e.phase.value} call of `{e.path or '<root>'}`, which "
                        f"{dumps[0].path} has; the ranks did not run the same steps."
                    )
                copies.append(c)
            ctx = _Layer(
                e, copies, self._rule(e, dumps[0]), others.get(event_key(e)), framework, mate_framework, known, forward,
                mesh, [int(d.meta["rank"]) for d in dumps], dumps[0].path,
            )  # fmt: skip
            # What flows in is laid out first: a parameter-less layer passes its layout on.
            order = ("outputs", "inputs", "params") if e.phase is Phase.BACKWARD else ("inputs", "outputs", "params")
            slots = {
                group: tuple(r for i, t in enumerate(getattr(e, group)) if (r := self._record(ctx, group, i, t)))
                for group in order
            }
            out.append(changed(e, inputs=slots["inputs"], outputs=slots["outputs"], params=slots["params"]))
        return out

    def _record(self, ctx: _Layer, group: str, i: int, t: TensorRecord) -> TensorRecord | None:
        shards = [same_record(getattr(c, group), i, t) for c in ctx.copies]
        tp, dp = _split(ctx, t)
        t = changed(t, layout=tp)
        layout = self._layout(ctx, group, i, t, shards)
        ctx.known[_same_tensor(t)] = layout
        if ctx.event.phase is Phase.FORWARD:
            ctx.forward[(ctx.event.path, ctx.event.call, group, t.name)] = layout
        slot = _slot(ctx.event.phase, group)
        if slot in ("in", "grad_out") and ctx.passes is None:
            ctx.passes = layout
        return self._joined(ctx.event, t, shards, layout, ctx.rank_ids, ",".join(p.written() for p in dp))

    def _rule(self, e: Event, dump: Any) -> str | None:
        for pattern, rule in self.user_map.items():
            if fnmatch.fnmatchcase(e.path, pattern):
                return rule
        weight = dump.meta.get("param_layouts", {}).get(e.path, {}).get("weight")
        if weight:  # its tensor-parallel placement (a mesh's data-parallel ones say nothing of the rule)
            tp = [p for p in placements(weight) if not p.name or p.name not in _data_parallel(dump)]
            weight = tp[0].text() if len(tp) == 1 else None
        for cls in dump.layers.get(e.path) or [e.type_name]:
            if weight and (cls, weight) in RULE_BY_WEIGHT:
                return RULE_BY_WEIGHT[(cls, weight)]
            if cls in RULE_BY_CLASS:
                return RULE_BY_CLASS[cls]
        return None

    def _layout(self, ctx: _Layer, group: str, i: int, t: TensorRecord, shards: list[TensorRecord]) -> str:
        e, ndim = ctx.event, len(t.shape)
        if t.layout:
            kind, d = parse(t.layout) or ("", 0)
            if kind == "shard" and not -ndim <= d < ndim:  # a 0-d tensor "sharded": no dimension to join along
                raise DumpError(
                    f"`{e.path or '<root>'}` {t.name} (step {e.step}): recorded as laid out {t.layout!r}, but its shape "
                    f"{tuple(t.shape)} has no such dimension; the dump was edited or written by another tool."
                )
            return normal(t.layout, ndim)
        slot = _slot(e.phase, group, t.name)
        ruled = from_rule(ctx.rule, slot, t.name, ctx.framework, ndim) if ctx.rule is not None else None
        if ruled is not None and (ruled == "partial" or self._user(e.path)):
            return ruled
        # Shapes tell a layout where both lay the tensor out alike: values always, weights within a framework.
        alike = slot != "param" or ctx.mate_framework == ctx.framework
        if ctx.mate is not None and alike and (fit := fit_layout(shards, mate_record(ctx.mate, group, i, t.name))):
            return fit
        if ruled is not None:
            return ruled
        if _same_tensor(t) in ctx.known:
            return ctx.known[_same_tensor(t)]
        if e.phase is Phase.BACKWARD and (forward := ctx.forward.get((e.path, e.call, group, t.name))) is not None:
            return "replicate" if forward == "partial" else forward  # a gradient is laid out as its value was
        if slot in ("out", "grad_in") and ctx.passes is not None and ctx.rule is None and not e.weights:
            first = (e.inputs if group == "outputs" else e.outputs)[:1]
            if first and first[0].shape == t.shape:
                return ctx.passes
        if all(s.value is not None and np.array_equal(s.value, shards[0].value) for s in shards[1:]) or all(
            s.value is None and s.stats == shards[0].stats for s in shards
        ):
            return "replicate"
        self._note(
            f"`{e.path or '<root>'}` {t.name}: not told how it is spread over the ranks, and the ranks' copies "
            f"differ; rank 0's is compared. Pass compare(..., shards={{'{e.path}': 'column'}}) (or row, vocab, "
            "a registered rule) to say."
        )
        return "rank0"

    def _user(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, p) for p in self.user_map)

    def _joined(
        self, e: Event, t: TensorRecord, shards: list[TensorRecord], layout: str, ranks: list[int], dp: str
    ) -> TensorRecord | None:
        """The shards joined by ``layout`` into a whole, laid out as ``dp`` over the data-parallel groups."""
        values = [s.value for s in shards]
        kind, d = parse(layout) or ("rank0", 0)
        if kind == "shard":
            value = np.concatenate(values, axis=d) if all(v is not None for v in values) else None
            shape = list(t.shape)
            shape[d] = sum(s.shape[d] for s in shards)
            stats = None if value is not None else joined_stats(shards)
            whole = TensorRecord(t.name, tuple(shape), t.dtype, value, stats, dp)
        elif kind == "partial":
            if any(v is None for v in values):
                self._note(
                    f"`{e.path or '<root>'}` {t.name} ({e.phase.value}): partial sums kept as statistics only cannot be "
                    "added up; not compared."
                )
                return None
            else:
                total = np.sum(np.stack(values), axis=0, dtype=values[0].dtype)
                whole = TensorRecord(t.name, t.shape, t.dtype, total, None, dp)
        else:
            whole = changed(t, layout=dp)
        self._into[id(whole)] = Gathering(layout if kind != "rank0" else "replicate", values, ranks)
        return whole


@dataclass
class _Layer:
    """One event being gathered: its ranks' copies and what tells its tensors' layouts."""

    event: Event
    copies: list[Event]
    rule: str | None
    mate: Event | None
    """The other run's event of the same call, where that run is whole."""
    framework: str
    mate_framework: str
    known: dict[Any, str]
    forward: dict[tuple, str]
    """Each forward tensor's layout by (path, call, group, name): its gradient's, unless recorded."""
    mesh: Mesh | None
    """The run's mesh, where it has data-parallel dimensions beside the tensor-parallel one."""
    rank_ids: list[int]
    """The rank of each copy, by its number in the job."""
    folder: Any
    """The first copy's rank folder, for errors."""
    passes: str | None = None
    """The layout of what flowed in first (a parameter-less layer hands it on)."""


def _same_tensor(t: TensorRecord) -> Any:
    """What one tensor recorded twice (a layer's output, the next one's input) shares: its values'
    array as read, or, kept as statistics only, its shape and statistics."""
    if t.value is not None:
        return id(t.value)
    return (t.shape, tuple(t.stats.as_dict().items())) if t.stats is not None else id(t)


def _data_parallel(dump: Any) -> list[str]:
    return list((dump.meta.get("mesh") or {}).get("data_parallel", ()))


def _split(ctx: _Layer, t: TensorRecord) -> tuple[str, list[Placement]]:
    """``t``'s recorded layout as its tensor-parallel placement and its data-parallel ones."""
    e = ctx.event
    where = f"{ctx.folder}: `{e.path or '<root>'}` {t.name} (step {e.step}, {e.phase.value})"
    if ctx.mesh is not None:
        return ctx.mesh.split(t.layout, where)
    found = placements(t.layout)
    if len(found) > 1:
        raise DumpError(
            f"{where}: laid out over a mesh of {len(found)} dimensions ({t.layout}), but the dump does not say the "
            "mesh. Record with nbdiff.record(..., mesh=your_device_mesh) (or mesh={'dp': 2, 'tp': 2})."
        )
    return (found[0].text() if found else ""), []


def _slot(phase: Phase, group: str, name: str = "") -> str:
    if group == "params" or phase is Phase.OPTIMIZER:
        return "param"
    side = "in" if group == "inputs" else "out"
    return f"grad_{side}" if phase is Phase.BACKWARD else side


def shard_slices(layout: str, shards: Sequence[np.ndarray | None], whole: np.ndarray) -> list[np.ndarray] | None:
    """``whole`` cut as the ranks held it (``None`` for partial sums, which no rank holds alone)."""
    kind, d = parse(layout) or ("replicate", 0)
    if kind == "partial" or any(s is None for s in shards):
        return None
    if kind == "replicate":
        return [whole] * len(shards)
    cuts = np.cumsum([s.shape[d] for s in shards])[:-1]  # type: ignore[union-attr]
    return np.split(whole, cuts, axis=d)
