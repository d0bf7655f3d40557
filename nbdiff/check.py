"""``check_config``: a pre-flight listing every constructor argument that differs between
paired layers, before the first training run. It runs no model unless ``inputs`` is given
(then one no-grad forward of each, to pair layers by execution)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from nbdiff.align.arguments import ArgDiff, argument_diffs
from nbdiff.align.layer_map import LayerMap
from nbdiff.align.probe import pair_once
from nbdiff.align.typemap import activation_kind, type_affinity
from nbdiff.engine.options import check_models
from nbdiff.frameworks import Framework, framework_of

__all__ = ["check_config", "ConfigCheck", "ConfigMismatch"]


@dataclass(frozen=True)
class ConfigMismatch:
    """A paired layer whose arguments differ."""

    base_path: str
    raw_path: str
    base_type: str
    raw_type: str
    arguments: tuple[ArgDiff, ...]

    def describe(self) -> str:
        where = (
            f"`{self.base_path or '<root>'}` ({self.base_type}) ~ raw `{self.raw_path or '<root>'}` ({self.raw_type})"
        )
        return f"{where}: " + "; ".join(a.describe() for a in self.arguments)


@dataclass(frozen=True)
class ConfigCheck:
    """What :func:`check_config` found; truthy when no paired layer's arguments differ."""

    base_model: str
    raw_model: str
    paired: int
    """Layer pairs whose arguments were read."""
    mismatches: tuple[ConfigMismatch, ...]
    unpaired_base: tuple[str, ...] = ()
    unpaired_raw: tuple[str, ...] = ()
    by: str = "structure"
    """How layers were paired: ``structure`` (names and classes) or ``execution`` (one forward)."""

    def __bool__(self) -> bool:
        return not self.mismatches

    def report(self) -> str:
        head = (
            f"nbdiff check_config: {self.base_model} vs {self.raw_model}: {self.paired} layer pairs (by {self.by}), "
            + (f"{len(self.mismatches)} with differing arguments" if self.mismatches else "no argument differs")
        )
        lines = [head, *(f"  {m.describe()}" for m in self.mismatches)]
        if self.unpaired_base or self.unpaired_raw:
            lines.append(f"  unpaired: base {list(self.unpaired_base[:5])}, raw {list(self.unpaired_raw[:5])}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><code>{html.escape(m.base_path or '<root>')}</code> ({html.escape(m.base_type)})</td>"
            f"<td><code>{html.escape(a.name)}</code></td><td>{html.escape(a.shown()[0])}</td>"
            f"<td>{html.escape(a.shown()[1])}</td></tr>"
            for m in self.mismatches
            for a in m.arguments
        )
        table = (
            "<table><tr><th>layer</th><th>argument</th><th>base</th><th>raw</th></tr>" + rows + "</table>"
            if rows
            else ""
        )
        return f"<div><b>{html.escape(self.report().splitlines()[0])}</b>{table}</div>"


def check_config(base: Any, raw: Any, inputs: Any = None, layer_map: LayerMap | None = None) -> ConfigCheck:
    """List every paired layer whose constructor arguments differ (eps, momentum, padding...).

    Layers pair by structure (the same path and a related class, then in order by class),
    or, with ``inputs``, by one no-grad forward of each model, as ``auto_diff`` pairs them.
    """
    check_models(base, raw, layer_map)
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    if inputs is not None:
        pairing = pair_once(base, raw, inputs, layer_map)
        pairs = [(p.base.path, p.base.layer, p.raw.path, p.raw.layer) for p in pairing.pairs]
        ub, ur = tuple(e.path for e in pairing.unmatched_base), tuple(e.path for e in pairing.unmatched_raw)
        by = "execution"
    else:
        pairs, ub, ur = _by_structure(bfw, base, rfw, raw)
        by = "structure"
    mismatches = []
    seen = set()
    for bpath, blayer, rpath, rlayer in pairs:
        if (bpath, rpath) in seen:
            continue
        seen.add((bpath, rpath))
        diffs = argument_diffs(bfw.name, blayer, rfw.name, rlayer)
        kinds = [activation_kind((type(x).__name__, *fw.class_names(x))) for x, fw in ((blayer, bfw), (rlayer, rfw))]
        if None not in kinds and kinds[0] != kinds[1]:  # a swapped activation (ReLU6 where Hardswish was)
            diffs.insert(0, ArgDiff("activation", type(blayer).__name__, type(rlayer).__name__))
        if diffs:
            mismatches.append(ConfigMismatch(bpath, rpath, type(blayer).__name__, type(rlayer).__name__, tuple(diffs)))
    return ConfigCheck(type(base).__name__, type(raw).__name__, len(seen), tuple(mismatches), ub, ur, by)


def _by_structure(
    bfw: Framework, base: Any, rfw: Framework, raw: Any
) -> tuple[list[tuple[str, Any, str, Any]], tuple[str, ...], tuple[str, ...]]:
    """Same path and related classes first; the rest in order, by class."""
    b, r = bfw.named_layers(base), rfw.named_layers(raw)

    def related(x: Any, fx: Framework, y: Any, fy: Framework) -> bool:
        tx, ty = type(x).__name__, type(y).__name__
        return type_affinity(tx, tuple(fx.class_names(x)), ty, tuple(fy.class_names(y))) >= 2

    raw_at = {p: layer for p, layer in r}
    pairs: dict[str, tuple[str, Any, str, Any]] = {}
    for path, layer in b:
        if path in raw_at and (path == "" or related(layer, bfw, raw_at[path], rfw)):  # the roots always pair
            pairs[path] = (path, layer, path, raw_at[path])
    used = {p[2] for p in pairs.values()}
    rest = [(p, layer) for p, layer in r if p not in used]
    at = 0
    for path, layer in b:
        if path in pairs:
            continue
        for j in range(at, len(rest)):
            if related(layer, bfw, rest[j][1], rfw):
                pairs[path] = (path, layer, rest[j][0], rest[j][1])
                at = j + 1
                break
    used = {p[2] for p in pairs.values()}
    ordered = [pairs[p] for p, _ in b if p in pairs]
    return ordered, tuple(p for p, _ in b if p not in pairs), tuple(p for p, _ in r if p not in used)
