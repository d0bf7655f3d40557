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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbdiff.errors import DumpError, OptionError
from nbdiff.trace.events import Event, Phase, TensorRecord, changed
from nbdiff.trace.stats import Stats, concatenated_stats

__all__ = [
    "SHARD_RULES",
    "RULE_BY_CLASS",
    "RULE_BY_WEIGHT",
    "register_shard_rule",
    "Gathered",
    "Gathering",
    "shard_slices",
]

_COLUMN_PARAMS = {
    "torch": {"weight": "shard(0)", "bias": "shard(0)"},
    "paddle": {"weight": "shard(1)", "bias": "shard(0)"},
}
_ROW_PARAMS = {
    "torch": {"weight": "shard(1)", "bias": "replicate"},
    "paddle": {"weight": "shard(0)", "bias": "replicate"},
}
SHARD_RULES: dict[str, dict[str, Any]] = {
    # slot -> layout; "grad_in"/"grad_out" default to "in"/"out" (a partial sum's gradient is whole).
    # params: per framework, as each lays its weights out (torch Linear [out, in], paddle [in, out]).
    "column": {"in": "replicate", "out": "shard(-1)", "params": _COLUMN_PARAMS},
    # a column-parallel layer that gathers its output (paddle's gather_output=True)
    "column_gathered": {"in": "replicate", "out": "replicate", "params": _COLUMN_PARAMS},
    "row": {"in": "shard(-1)", "out": "replicate", "params": _ROW_PARAMS},
    # a row-parallel layer recorded before its all-reduce
    "row_partial": {"in": "shard(-1)", "out": "partial", "grad_out": "replicate", "params": _ROW_PARAMS},
    # a vocabulary-parallel embedding: each rank looks up its rows, the outputs are summed
    "vocab": {
        "in": "replicate",
        "out": "replicate",
        "params": {"torch": {"weight": "shard(0)"}, "paddle": {"weight": "shard(0)"}},
    },
    "replicate": {"in": "replicate", "out": "replicate", "params": {}},
}
"""Layouts of a parallel layer's inputs, outputs and parameters, by the rule's name."""

RULE_BY_WEIGHT: dict[tuple[str, str], str] = {
    # (class, the recorded layout of its weight) -> rule, for torch's DTensor parallel styles
    ("Linear", "shard(0)"): "column",
    ("Linear", "shard(1)"): "row",
    ("Embedding", "shard(0)"): "vocab",
    ("Embedding", "shard(1)"): "column",
}
"""A layer's rule from its weight's layout, as ``parallelize_module`` leaves it."""

RULE_BY_CLASS: dict[str, str] = {
    # paddle.distributed.fleet's model-parallel layers, whose tensors are plain
    "ColumnParallelLinear": "column",
    "RowParallelLinear": "row",
    "VocabParallelEmbedding": "vocab",
}
"""A layer's rule from its class."""


def register_shard_rule(name: str, layouts: Mapping[str, Any], classes: Sequence[str] = ()) -> None:
    """Add (or replace) the shard rule ``name``: ``layouts`` maps ``in``, ``out`` (and optionally
    ``grad_in``, ``grad_out``, ``params`` ``{framework: {parameter: layout}}``) to ``shard(d)``,
    ``replicate`` or ``partial``; ``classes`` are layer classes it applies to by default. Use it in
    ``compare(..., shards={"path pattern": name})`` too."""
    if not isinstance(name, str) or not name:
        raise OptionError(f"register_shard_rule: name={name!r}: expected a non-empty string.")
    rule = dict(layouts)
    for slot in ("in", "out", "grad_in", "grad_out"):
        if slot in rule:
            _check_layout(rule[slot], f"register_shard_rule({name!r}): {slot}")
    for fw, params in dict(rule.get("params", {})).items():
        for p, lay in dict(params).items():
            _check_layout(lay, f"register_shard_rule({name!r}): params[{fw!r}][{p!r}]")
    rule.setdefault("params", {})
    SHARD_RULES[name] = rule
    for cls in classes:
        RULE_BY_CLASS[cls] = name


def _check_layout(layout: Any, where: str) -> None:
    if not isinstance(layout, str) or _parse(layout) is None:
        raise OptionError(f"{where}: {layout!r} is not shard(d), replicate or partial.")


def _parse(layout: str) -> tuple[str, int] | None:
    """``("shard", d)``, ``("replicate", 0)`` or ``("partial", 0)``; ``None`` if it is none of them."""
    if layout in ("replicate", "partial"):
        return layout, 0
    if layout.startswith("shard(") and layout.endswith(")"):
        try:
            return "shard", int(layout[6:-1])
        except ValueError:
            return None
    return None


_HELD = 3
"""Steps of whole tensors held at once."""


@dataclass
class Gathering:
    """How one gathered tensor was put together, for naming the rank whose shard differs."""

    layout: str
    """``shard(d)`` (``d`` non-negative), ``replicate`` or ``partial``."""
    shards: list[np.ndarray | None]
    """Each rank's own values (``None`` where only statistics were kept)."""


@dataclass
class Gathered:
    """Both runs' steps, each whole: one side gathered from its ranks (or both, degrees differing)."""

    a: list[Any]
    """Base's rank dumps (:class:`~nbdiff.trace.store.RankDump`), by rank."""
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

    def step(self, k: int) -> tuple[list[Event], list[Event]]:
        """Step ``k`` of both runs, every tensor whole."""
        if k not in self._steps:
            self._into = self.gatherings[k] = {}
            a_ranks = [d.steps[k] for d in self.a]
            b_ranks = [d.steps[k] for d in self.b]
            a_whole = a_ranks[0] if len(a_ranks) == 1 else None
            b_whole = b_ranks[0] if len(b_ranks) == 1 else None
            a = a_whole if a_whole is not None else self._gather(a_ranks, self.a, b_whole, k)
            b = b_whole if b_whole is not None else self._gather(b_ranks, self.b, a_whole, k)
            self._steps[k] = (a, b)
            for old in sorted(self._steps)[:-_HELD]:
                del self._steps[old], self.gatherings[old]
        return self._steps[k]

    def _note(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self.notes.append(text)

    def _gather(self, ranks: list[list[Event]], dumps: list[Any], other: list[Event] | None, k: int) -> list[Event]:
        keyed = [{_key(e): e for e in events} for events in ranks]
        others = {_key(e): e for e in other} if other is not None else {}
        framework = str(dumps[0].meta["framework"])
        mate_framework = str((self.b if dumps is self.a else self.a)[0].meta["framework"])
        known: dict[int, str] = {}  # id of rank 0's values -> layout: one tensor seen by two layers
        forward: dict[tuple, str] = {}
        out: list[Event] = []
        for e in ranks[0]:
            if e.phase is Phase.WEIGHTS:  # a rank's own shards rebuild no whole layer: not gathered
                continue
            copies = []
            for r, by_key in enumerate(keyed):
                c = by_key.get(_key(e))
                if c is None:
                    raise DumpError(
                        f"{dumps[r].path}: step {k} has no {e.phase.value} call of `{e.path or '<root>'}`, which "
                        f"{dumps[0].path} has; the ranks did not run the same steps."
                    )
                copies.append(c)
            ctx = _Layer(
                e, copies, self._rule(e, dumps[0]), others.get(_key(e)), framework, mate_framework, known, forward
            )
            # What flows in is laid out first: a parameter-less layer passes its layout on.
            order = ("outputs", "inputs", "params") if e.phase is Phase.BACKWARD else ("inputs", "outputs", "params")
            slots = {
                group: tuple(r for i, t in enumerate(getattr(e, group)) if (r := self._record(ctx, group, i, t)))
                for group in order
            }
            out.append(changed(e, inputs=slots["inputs"], outputs=slots["outputs"], params=slots["params"]))
        return out

    def _record(self, ctx: _Layer, group: str, i: int, t: TensorRecord) -> TensorRecord | None:
        shards = [_same_record(getattr(c, group), i, t) for c in ctx.copies]
        layout = self._layout(ctx, group, i, t, shards)
        if t.value is not None:
            ctx.known[id(t.value)] = layout
        if ctx.event.phase is Phase.FORWARD:
            ctx.forward[(ctx.event.path, ctx.event.call, group, t.name)] = layout
        slot = _slot(ctx.event.phase, group)
        if slot in ("in", "grad_out") and ctx.passes is None:
            ctx.passes = layout
        return self._joined(ctx.event, t, shards, layout)

    def _rule(self, e: Event, dump: Any) -> str | None:
        for pattern, rule in self.user_map.items():
            if fnmatch.fnmatchcase(e.path, pattern):
                return rule
        weight = dump.meta.get("param_layouts", {}).get(e.path, {}).get("weight")
        for cls in dump.layers.get(e.path) or [e.type_name]:
            if weight and (cls, weight) in RULE_BY_WEIGHT:
                return RULE_BY_WEIGHT[(cls, weight)]
            if cls in RULE_BY_CLASS:
                return RULE_BY_CLASS[cls]
        return None

    def _layout(self, ctx: _Layer, group: str, i: int, t: TensorRecord, shards: list[TensorRecord]) -> str:
        e, ndim = ctx.event, len(t.shape)
        if t.layout:
            if "," in t.layout:
                raise DumpError(
                    f"`{e.path}` {t.name}: laid out over a mesh of several dimensions ({t.layout}); nbdiff gathers "
                    "tensor parallelism over one dimension only. Record with a 1-d mesh (tensor parallel only)."
                )
            kind, d = _parse(t.layout) or ("", 0)
            if kind == "shard" and not -ndim <= d < ndim:  # a 0-d tensor "sharded": no dimension to join along
                raise DumpError(
                    f"`{e.path or '<root>'}` {t.name} (step {e.step}): recorded as laid out {t.layout!r}, but its shape "
                    f"{tuple(t.shape)} has no such dimension; the dump was edited or written by another tool."
                )
            return _normal(t.layout, ndim)
        slot = _slot(e.phase, group, t.name)
        ruled = _from_rule(ctx.rule, slot, t.name, ctx.framework, ndim) if ctx.rule is not None else None
        if ruled is not None and (ruled == "partial" or self._user(e.path)):
            return ruled
        # Shapes tell a layout where both lay the tensor out alike: values always, weights within a framework.
        alike = slot != "param" or ctx.mate_framework == ctx.framework
        if ctx.mate is not None and alike and (fit := _fit(shards, _mate_record(ctx.mate, group, i, t.name))):
            return fit
        if ruled is not None:
            return ruled
        if t.value is not None and id(t.value) in ctx.known:
            return ctx.known[id(t.value)]
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

    def _joined(self, e: Event, t: TensorRecord, shards: list[TensorRecord], layout: str) -> TensorRecord | None:
        values = [s.value for s in shards]
        kind, d = _parse(layout) or ("rank0", 0)
        if kind == "shard":
            value = np.concatenate(values, axis=d) if all(v is not None for v in values) else None
            shape = list(t.shape)
            shape[d] = sum(s.shape[d] for s in shards)
            stats = None if value is not None else _joined_stats(shards)
            whole = TensorRecord(t.name, tuple(shape), t.dtype, value, stats)
        elif kind == "partial":
            if any(v is None for v in values):
                self._note(
                    f"`{e.path or '<root>'}` {t.name} ({e.phase.value}): partial sums kept as statistics only cannot be "
                    "added up; not compared."
                )
                return None
            else:
                whole = TensorRecord(t.name, t.shape, t.dtype, np.sum(np.stack(values), axis=0, dtype=values[0].dtype))
        else:
            whole = changed(t, layout="")
        self._into[id(whole)] = Gathering(layout if kind != "rank0" else "replicate", values)
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
    known: dict[int, str]
    forward: dict[tuple, str]
    """Each forward tensor's layout by (path, call, group, name): its gradient's, unless recorded."""
    passes: str | None = None
    """The layout of what flowed in first (a parameter-less layer hands it on)."""


def _key(e: Event) -> tuple:
    return (e.phase, e.kind, e.path, e.call)


def _same_record(records: tuple[TensorRecord, ...], i: int, t: TensorRecord) -> TensorRecord:
    if i < len(records) and records[i].name == t.name:
        return records[i]
    for r in records:
        if r.name == t.name:
            return r
    raise DumpError(f"tensor {t.name!r} is recorded on one rank and not on another; the ranks ran different code.")


def _slot(phase: Phase, group: str, name: str = "") -> str:
    if group == "params" or phase is Phase.OPTIMIZER:
        return "param"
    side = "in" if group == "inputs" else "out"
    return f"grad_{side}" if phase is Phase.BACKWARD else side


def _normal(layout: str, ndim: int) -> str:
    kind, d = _parse(layout) or ("replicate", 0)
    return f"shard({d % max(ndim, 1)})" if kind == "shard" else kind


def _from_rule(rule: str, slot: str, name: str, framework: str, ndim: int) -> str | None:
    spec = SHARD_RULES.get(rule, {})
    if slot == "param":
        lay = spec.get("params", {}).get(framework, {}).get(name.rpartition(".")[2])
    else:
        lay = spec.get(slot)
        if lay is None and slot.startswith("grad_"):
            lay = spec.get(slot[5:])
            lay = "replicate" if lay == "partial" else lay
    return _normal(lay, ndim) if lay is not None else None


def _mate_record(mate: Event, group: str, i: int, name: str) -> TensorRecord | None:
    records = getattr(mate, group)
    if i < len(records) and records[i].name == name:
        return records[i]
    return next((r for r in records if r.name == name), None)


def _fit(shards: list[TensorRecord], whole: TensorRecord | None) -> str | None:
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


def _joined_stats(shards: list[TensorRecord]) -> Stats | None:
    """Statistics of the concatenation, from each shard's (population) statistics."""
    stats = [s.statistics() for s in shards]
    if any(s is None for s in stats):
        return None
    return concatenated_stats([(s, math.prod(t.shape)) for s, t in zip(stats, shards)])  # type: ignore[misc]


def shard_slices(layout: str, shards: Sequence[np.ndarray | None], whole: np.ndarray) -> list[np.ndarray] | None:
    """``whole`` cut as the ranks held it (``None`` for partial sums, which no rank holds alone)."""
    kind, d = _parse(layout) or ("replicate", 0)
    if kind == "partial" or any(s is None for s in shards):
        return None
    if kind == "replicate":
        return [whole] * len(shards)
    cuts = np.cumsum([s.shape[d] for s in shards])[:-1]  # type: ignore[union-attr]
    return np.split(whole, cuts, axis=d)
