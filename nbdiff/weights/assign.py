"""``assign_weight``: copy parameters and buffers from base into raw, all or nothing."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedGroup, member_name, parent_path
from nbdiff.align.fused_structure import fused_by_structure
from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing
from nbdiff.align.probe import pair_once
from nbdiff.align.typemap import equivalent_types
from nbdiff.errors import NbdiffError, WeightTransferError
from nbdiff.frameworks import Framework, framework_of
from nbdiff.trace.layer_paths import relative
from nbdiff.weights.by_shape import pairs_by_shape
from nbdiff.weights.fused import fused_layers, plan_fused, plan_unfused
from nbdiff.weights.plan import (
    SAME_BY_NAME,
    LayerWeights,
    all_class_names,
    convert_checked,
    layer_tensors,
    plan_layer,
    tensors_read_once,
)
from nbdiff.weights.rules import covers_sublayers
from nbdiff.weights.stacked import plan_stacked

__all__ = [
    "assign_weight",
    "WeightMap",
    "plan_weights",
    "plan_pairs",
    "write_weights",
    "execution_pairs",
    "plan_pairing",
]


@dataclass(frozen=True)
class WeightMap:
    """Which base layer's tensors went to which raw layer, and how."""

    layers: tuple[LayerWeights, ...]
    warnings: tuple[str, ...] = ()
    fused: tuple[FusedGroup, ...] = ()
    """Fused groups among the base paths (``a.q_proj+a.k_proj+a.v_proj``)."""

    def by_base_path(self) -> dict[str, LayerWeights]:
        return {lw.base_path: lw for lw in self.layers}

    def pairs(self) -> list[tuple[str, str]]:
        """``(base path, raw path)`` of every layer pair."""
        return [(lw.base_path, lw.raw_path) for lw in self.layers]

    def covers(self, other: WeightMap) -> bool:
        """Whether every tensor that ``other`` copies is copied the same way here.

        ``self`` is a structure copy, which plans every layer that owns tensors. A pair of
        ``other`` is covered when it is one of ours, when one of our whole-layer copies holds
        it at the same relative place, or when it is a same-framework whole copy (by relative
        name) of a subtree whose layers we all paired at the same relative places: the
        tensors end up where they would have (a same-framework ``Sequential`` pairs as one
        call, its layers by structure; without this, every step 0 ran twice).
        """
        mine = set(self.pairs())
        whole = {(lw.base_path, lw.raw_path) for lw in self.layers if lw.recursive}
        for lw in other.layers:
            pair = (lw.base_path, lw.raw_path)
            if pair in mine or _held_whole(pair, whole):
                continue
            if not (lw.recursive and lw.rule == SAME_BY_NAME and _same_subtree(pair, mine)):
                return False
        return True

    def __repr__(self) -> str:
        rows = [f"  {lw.base_path or '<root>'} -> {lw.raw_path or '<root>'}  [{lw.rule}]" for lw in self.layers]
        return "WeightMap(\n" + "\n".join(rows) + "\n)"


def _same_place(pair: tuple[str, str], root: tuple[str, str]) -> bool:
    """Whether base and raw paths of ``pair`` lie at the same relative place under ``root``'s."""
    rel = relative(pair[0], root[0])
    return rel is not None and rel == relative(pair[1], root[1])


def _held_whole(pair: tuple[str, str], whole: set[tuple[str, str]]) -> bool:
    """Whether a pair of ``whole`` holds ``pair`` at the same relative place: the ancestors that
    keep a common suffix are looked up, so a check stays linear in the number of layers."""
    b = pair[0].split(".") if pair[0] else []
    r = pair[1].split(".") if pair[1] else []
    n = 0  # components of the common suffix
    while True:
        if (".".join(b[: len(b) - n]), ".".join(r[: len(r) - n])) in whole:
            return True
        if n == min(len(b), len(r)) or b[-1 - n] != r[-1 - n]:
            return False
        n += 1


def _same_subtree(root: tuple[str, str], pairs: set[tuple[str, str]]) -> bool:
    """Whether the pairs touching ``root``'s subtree on either side all keep their relative places."""
    inside = [p for p in pairs if relative(p[0], root[0]) is not None or relative(p[1], root[1]) is not None]
    return bool(inside) and all(_same_place(p, root) for p in inside)


def _owns_tensors(fw: Framework, layer: Any) -> bool:
    return bool(layer_tensors(fw, layer))


def execution_pairs(pairing: Pairing) -> list[tuple[str, str]]:
    """``(base path, raw path)`` of paired layer calls, first call of each base layer only.

    A fused group keeps its path (its members are copied together); the members of an
    explicit many-to-one pair (layers run back to back) are listed one by one.
    """
    fused = {g.path for g in pairing.fused if g.side == "base"}
    seen: set[str] = set()
    out = []
    for p in pairing.pairs:
        for bp in p.members if p.members and p.base.path not in fused else [p.base.path]:
            if bp not in seen:
                seen.add(bp)
                out.append((bp, p.raw.path))
    return out


def plan_pairing(
    bfw: Framework, base: Any, rfw: Framework, raw: Any, pairing: Pairing, strict: bool = True
) -> WeightMap:
    """The copy plan of the layer pairs (and fused groups) of a forward pairing."""
    pairs = execution_pairs(pairing)
    return plan_pairs(bfw, base, rfw, raw, pairs + _by_place(bfw, base, rfw, raw, pairs), pairing.fused, strict)


def _by_place(
    bfw: Framework, base: Any, rfw: Framework, raw: Any, pairs: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Layers holding weights that no call paired (a list of experts runs as its experts, never as one
    call; a router's output is another function of the same weights): each with the raw layer of its
    attribute name under its parent's counterpart, where that is unpaired too."""
    partner = dict(reversed(pairs))  # the first pair of each base path
    paired_r = {rp for _, rp in pairs}
    rlayers = dict(rfw.named_layers(raw))
    out = []
    for path, layer in bfw.named_layers(base):
        rparent = partner.get(parent_path(path)) if path else None
        if path in partner or rparent is None or not layer_tensors(bfw, layer, True):
            continue
        there = f"{rparent}.{member_name(path)}" if rparent else member_name(path)
        if there in rlayers and there not in paired_r and layer_tensors(rfw, rlayers[there], True):
            out.append((path, there))
    return out


def _weight_units(fw: Framework, model: Any) -> list[tuple[str, Any]]:
    """Layers that own tensors, in definition order; a layer with a recursive rule is one unit."""
    units: list[tuple[str, Any]] = []
    whole: set[str] = set()
    for path, layer in fw.named_layers(model):
        if _inside(path, whole):
            continue
        if fw.is_library_layer(layer) and covers_sublayers(fw.name, all_class_names(layer)):
            whole.add(path)
            units.append((path, layer))
        elif _owns_tensors(fw, layer):
            units.append((path, layer))
    return units


def _pairs_by_structure(
    bfw: Framework, base: Any, rfw: Framework, raw: Any
) -> tuple[list[tuple[str, str]], tuple[FusedGroup, ...]]:
    b, r = _weight_units(bfw, base), _weight_units(rfw, raw)
    fused: tuple[FusedGroup, ...] = ()
    if len(b) != len(r):  # a fused qkv_proj on one side: paired from the weights, not by a probe forward
        blayers, rlayers = dict(bfw.named_layers(base)), dict(rfw.named_layers(raw))
        b, r, groups = fused_by_structure(bfw, b, rfw, r, blayers, rlayers)
        fused = tuple(groups)
    grouped = {g.path for g in fused}
    problem = None
    if len(b) != len(r):
        problem = f"base has {len(b)} layers with weights, raw has {len(r)}"
    else:
        for (bp, bl), (rp, rl) in zip(b, r):
            if bp in grouped or rp in grouped:
                continue
            custom = not bfw.is_library_layer(bl) and not rfw.is_library_layer(rl)
            if not custom and not equivalent_types(type(bl).__name__, type(rl).__name__):
                problem = f"base `{bp}` is a {type(bl).__name__} but raw `{rp}` is a {type(rl).__name__}"
                break
    if problem:
        raise WeightTransferError(
            f"Cannot pair the layers by structure: {problem}. Pass `inputs=` so nbdiff pairs them by "
            "execution order instead (definition order does not matter then), or give a LayerMap."
        )
    return _named_alike(bfw, b, rfw, r) if not fused else [(bp, rp) for (bp, _), (rp, _) in zip(b, r)], fused


def _named_alike(
    bfw: Framework, b: list[tuple[str, Any]], rfw: Framework, r: list[tuple[str, Any]]
) -> list[tuple[str, str]]:
    """The layer pairs by definition order, unless they cross names that the pairing by class and weight
    shapes keeps, every pair alike: a port defining ``o_proj`` before ``q_proj`` (both square) had its
    weights copied crosswise, silently."""
    zipped = [(bp, rp) for (bp, _), (rp, _) in zip(b, r)]
    if all(member_name(bp) == member_name(rp) for bp, rp in zipped):
        return zipped
    named = pairs_by_shape(bfw, b, rfw, r)
    # Attribute names, not a Sequential's indexes: those are places, which definition order already follows.
    if named is not None and all(
        member_name(bp) == member_name(rp) != "" and not member_name(bp).isdigit() for bp, rp in named
    ):
        return named
    return zipped


def plan_weights(
    base: Any, raw: Any, layer_map: LayerMap | None = None, inputs: Any = None
) -> tuple[Framework, Framework, WeightMap]:
    """Pair the layers and plan the copy of every tensor, without changing anything."""
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    fused: tuple[FusedGroup, ...] = ()
    if inputs is not None:
        pairing = pair_once(base, raw, inputs, layer_map)
        pairs, fused = execution_pairs(pairing), pairing.fused
        pairs += _by_place(bfw, base, rfw, raw, pairs)
    with tensors_read_once():
        if inputs is None:
            pairs, fused = _pairs_by_structure(bfw, base, rfw, raw)
        return bfw, rfw, plan_pairs(bfw, base, rfw, raw, pairs, fused)


@tensors_read_once()
def plan_pairs(
    bfw: Framework,
    base: Any,
    rfw: Framework,
    raw: Any,
    pairs: list[tuple[str, str]],
    fused: tuple[FusedGroup, ...] = (),
    strict: bool = True,
) -> WeightMap:
    """The copy plan for these ``(base path, raw path)`` layer pairs (and fused groups among them).

    Not ``strict`` (nothing is copied: ``auto_init=False``), a pair nbdiff cannot plan is a warning,
    and its gradients and updates are not compared, instead of an error.
    """
    blayers, rlayers = dict(bfw.named_layers(base)), dict(rfw.named_layers(raw))
    blayers.update(fused_layers(blayers, fused))
    rlayers.update(fused_layers(rlayers, fused, "raw"))
    groups = {g.path: g for g in fused if g.side == "base"}
    raw_groups = {g.path: g for g in fused if g.side == "raw"}
    plans: list[LayerWeights] = []
    covered_b: set[str] = set()
    covered_r: set[str] = set()
    done_raw: set[str] = set()
    unplanned: list[str] = []
    for bp, rp in pairs:
        if _inside(bp, covered_b) or _inside(rp, covered_r) or rp in done_raw:
            continue
        bl, rl = blayers[bp], rlayers[rp]
        try:
            if bp in groups:
                plan = plan_fused(bfw, groups[bp], bl, rfw, rp, rl)
            elif rp in raw_groups:
                plan = plan_unfused(bfw, bp, bl, raw_groups[rp], rl, rfw)
            else:
                plan = plan_stacked(bfw, bp, bl, rfw, rp, rl) or plan_layer(bfw, bp, bl, rfw, rp, rl)
        except WeightTransferError as exc:
            if not strict:
                unplanned.append(
                    f"gradients and updates of base `{bp or '<root>'}` and raw `{rp or '<root>'}` are not compared: "
                    f"{str(exc).splitlines()[0]}"
                )
                done_raw.add(rp)
                continue
            raise WeightTransferError(f"{exc}\n\n{_trees(bfw, base, bp, rfw, raw, rp)}") from None
        if plan.recursive:
            covered_b.add(bp)
            covered_r.add(rp)
        if plan.recursive or _owns_tensors(bfw, bl) or _owns_tensors(rfw, rl):
            plans.append(plan)
            done_raw.add(rp)
    warnings = unplanned
    planned_b = (
        {p.base_path for p in plans}
        | {bp for bp, rp in pairs if rp in done_raw}
        | {m for p in plans if p.base_path in groups for m in groups[p.base_path].members}
    )
    planned_r = {p.raw_path for p in plans} | done_raw
    planned_r |= {m for p in plans if p.raw_path in raw_groups for m in raw_groups[p.raw_path].members}
    for p, lay in blayers.items():
        if p not in groups and _owns_tensors(bfw, lay) and p not in planned_b and not _inside(p, covered_b):
            warnings.append(f"base `{p}` ({type(lay).__name__}) has weights but was not paired (it did not run?)")
    for p, lay in rlayers.items():
        if p not in raw_groups and _owns_tensors(rfw, lay) and p not in planned_r and not _inside(p, covered_r):
            warnings.append(f"raw `{p}` ({type(lay).__name__}) has weights but nothing was copied into it")
    return WeightMap(tuple(plans), tuple(warnings), fused)


def _inside(path: str, roots: set[str]) -> bool:
    """Whether ``path`` lies strictly inside one of the layers at ``roots``: its ancestors are
    looked up, so planning stays linear in the number of layers."""
    if not roots or not path:
        return False
    if "" in roots:
        return True
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in roots:
            return True
    return False


def assign_weight(base: Any, raw: Any, layer_map: LayerMap | None = None, inputs: Any = None) -> WeightMap:
    """Copy every parameter and buffer of ``base`` into ``raw``.

    Works torch->paddle, paddle->torch and within one framework. With ``inputs``
    (as for :func:`nbdiff.auto_diff`) layers are paired by execution order, from one
    no-grad forward of each; otherwise by structure. Everything is converted and
    checked before the first value is written; if writing still fails, raw is
    restored, so raw is never half-copied.
    """
    bfw, rfw, wmap = plan_weights(base, raw, layer_map, inputs)
    try:
        tied = write_weights(bfw, base, rfw, raw, wmap)
    except WeightTransferError as exc:
        if inputs is not None or wmap.fused:
            raise
        # Paired by definition order: the other consistent assignment is tried before raising.
        wmap, tied = _copied_by_shape(bfw, base, rfw, raw, exc)
    return replace(wmap, warnings=wmap.warnings + tuple(tied)) if tied else wmap


def _copied_by_shape(
    bfw: Framework, base: Any, rfw: Framework, raw: Any, failed: WeightTransferError
) -> tuple[WeightMap, list[str]]:
    """The copy with the layers paired by class and weight shapes (:mod:`nbdiff.weights.by_shape`);
    ``failed`` (the copy by definition order), told to pass ``inputs=``, where that cannot be made."""
    try:
        with tensors_read_once():
            pairs = pairs_by_shape(bfw, _weight_units(bfw, base), rfw, _weight_units(rfw, raw))
            if pairs is not None:
                wmap = plan_pairs(bfw, base, rfw, raw, pairs)
        if pairs is not None:
            wmap = replace(wmap, warnings=(*wmap.warnings, _BY_SHAPE))
            return wmap, write_weights(bfw, base, rfw, raw, wmap)
    except WeightTransferError:
        pass
    raise WeightTransferError(
        f"{failed}\n\nThe layers were paired by definition order, since no `inputs=` was given, and no other "
        "pairing by class and weight shapes fits. Pass `inputs=` (as for auto_diff) so nbdiff pairs them by "
        "execution order, or give a LayerMap."
    ) from None


_BY_SHAPE = (
    "layers paired by class and weight shapes, not by definition order (the two models define them in another "
    "order); pass `inputs=` to pair them by execution order, which is certain"
)


def write_weights(
    bfw: Framework, base: Any, rfw: Framework, raw: Any, wmap: WeightMap, restore_on_failure: bool = True
) -> list[str]:
    """Convert every planned tensor, then write them all; on failure raw is restored (unless the
    caller, holding raw's weights already, restores them itself: ``restore_on_failure=False``).

    Returns warnings: a raw tensor that two different base tensors are written into is
    tied on the raw side only (``tie_word_embeddings``), and the last copy wins.
    """
    blayers, rlayers = dict(bfw.named_layers(base)), dict(rfw.named_layers(raw))
    blayers.update(fused_layers(blayers, wmap.fused))
    rlayers.update(fused_layers(rlayers, wmap.fused, "raw"))
    writes: list[tuple[Any, Any]] = []
    names: dict[int, str] = {}
    copies: list[tuple[Any, Any, Any]] = []
    for plan in wmap.layers:
        if plan.copy is not None:  # a special-init function writes this layer itself
            copies.append((plan.copy, blayers[plan.base_path], rlayers[plan.raw_path]))
            writes += [(t, None) for t in layer_tensors(rfw, rlayers[plan.raw_path], True).values()]
            continue
        btensors = layer_tensors(bfw, blayers[plan.base_path], plan.recursive)
        rtensors = layer_tensors(rfw, rlayers[plan.raw_path], plan.recursive)
        arrays = {n: bfw.to_numpy(t) for n, t in btensors.items()}
        try:
            out = convert_checked(plan, arrays, {n: rfw.shape_of(t) for n, t in rtensors.items()})
        except NbdiffError as exc:
            raise WeightTransferError(
                f"{exc}\n\n{_trees(bfw, base, plan.base_path, rfw, raw, plan.raw_path)}"
            ) from None
        writes += [(rtensors[n], a) for n, a in out.items()]
        names.update({id(rtensors[n]): f"{plan.raw_path}.{n}".lstrip(".") for n in out})
    backup = [(t, rfw.to_numpy(t).copy()) for t, _ in writes] if restore_on_failure else []
    try:
        for t, a in writes:
            if a is not None:
                rfw.set_value(t, a)
        for copy, blayer, rlayer in copies:
            copy(blayer, rlayer)
    except BaseException:
        for t, a in backup:
            rfw.set_value(t, a)
        raise
    return _tied_on_raw_only(writes, names)


def _tied_on_raw_only(writes: list[tuple[Any, Any]], names: dict[int, str]) -> list[str]:
    first: dict[int, Any] = {}
    out = []
    for t, a in writes:
        if a is None:
            continue
        prev = first.setdefault(id(t), a)
        if prev is not a and (prev.shape != a.shape or not np.array_equal(prev, a)):
            out.append(
                f"raw `{names.get(id(t), '?')}` is one tensor shared by several raw layers (tied weights), but "
                "the base layers paired with them hold different values: only the last copy is kept. Tie or untie "
                "both models the same way (e.g. tie_word_embeddings in both configs)."
            )
    return list(dict.fromkeys(out))


def _trees(bfw: Framework, base: Any, bpath: str, rfw: Framework, raw: Any, rpath: str, context: int = 4) -> str:
    return "base model:\n" + _tree(bfw, base, bpath, context) + "\nraw model:\n" + _tree(rfw, raw, rpath, context)


def _tree(fw: Framework, model: Any, mark: str, context: int) -> str:
    rows = []
    at = 0
    for i, (path, layer) in enumerate(fw.named_layers(model)):
        depth = path.count(".") + 1 if path else 0
        name = path.rsplit(".", 1)[-1] if path else type(model).__name__
        shapes = ", ".join(f"{n}{tuple(fw.shape_of(t))}" for n, t in fw.direct_params(layer))
        flag = "  <-- here" if path == mark else ""
        if path == mark:
            at = i
        rows.append(f"  {'  ' * depth}{name}: {type(layer).__name__}{f' [{shapes}]' if shapes else ''}{flag}")
    lo, hi = max(0, at - context), min(len(rows), at + context + 1)
    cut = rows[lo:hi]
    if lo:
        cut.insert(0, "  ...")
    if hi < len(rows):
        cut.append("  ...")
    return "\n".join(cut)
