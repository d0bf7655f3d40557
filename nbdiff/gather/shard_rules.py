"""Shard rules: how a parallel layer lays its inputs, outputs and parameters out over the ranks,
kept as data (:data:`SHARD_RULES`), found by a layer's class or its weight's recorded layout, and
extended with :func:`register_shard_rule`. Read by :mod:`nbdiff.gather.shards`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nbdiff.errors import OptionError

__all__ = ["SHARD_RULES", "RULE_BY_CLASS", "RULE_BY_WEIGHT", "register_shard_rule", "parse", "normal", "from_rule"]

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
    if not isinstance(layout, str) or parse(layout) is None:
        raise OptionError(f"{where}: {layout!r} is not shard(d), replicate or partial.")


def parse(layout: str) -> tuple[str, int] | None:
    """``("shard", d)``, ``("replicate", 0)`` or ``("partial", 0)``; ``None`` if it is none of them."""
    if layout in ("replicate", "partial"):
        return layout, 0
    if layout.startswith("shard(") and layout.endswith(")"):
        try:
            return "shard", int(layout[6:-1])
        except ValueError:
            return None
    return None


def normal(layout: str, ndim: int) -> str:
    kind, d = parse(layout) or ("replicate", 0)
    return f"shard({d % max(ndim, 1)})" if kind == "shard" else kind


def from_rule(rule: str, slot: str, name: str, framework: str, ndim: int) -> str | None:
    spec = SHARD_RULES.get(rule, {})
    if slot == "param":
        lay = spec.get("params", {}).get(framework, {}).get(name.rpartition(".")[2])
    else:
        lay = spec.get(slot)
        if lay is None and slot.startswith("grad_"):
            lay = spec.get(slot[5:])
            lay = "replicate" if lay == "partial" else lay
    return normal(lay, ndim) if lay is not None else None
