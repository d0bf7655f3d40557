"""What the notebook view shows, as plain JSON-able data built from a ``DiffResult``.

No widget code here: the tree rows, the replay order and the details of one row
are computed from the result alone, so they are tested without a browser and
reused by the static HTML export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbdiff.align.arguments import argument_diffs
from nbdiff.judge.blame import EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.result import DiffResult
from nbdiff.trace.built import construction_site, root_layers
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.stack import Frame, frame_label
from nbdiff.view.pictures import error_picture

__all__ = ["TreeData", "build_tree", "node_detail", "record_stats", "tensor_pair", "summary_line", "step_rows"]

_PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.STATE)


@dataclass(frozen=True)
class TreeData:
    """Rows of the paired tree and the replay order."""

    nodes: list[dict[str, Any]]
    """``{id, parent, depth, label, base, raw, base_type, raw_type, phase, step, ratio, local, status, event}``;
    group rows (one per step and phase) have ``event: -1``, calls paired with nothing ``event: -2``."""
    order: list[int]
    """Node ids in execution order: forward, backward, optimizer, step after step."""
    first: int
    """Node id of the first divergence, or -1."""
    events: list[EventDiff]
    """``nodes[i]["event"]`` indexes this list."""
    frameworks: tuple[str, str] = ("", "")
    """Base and raw framework names, to read the layers' arguments."""
    roots: tuple[Any, Any] = (None, None)
    """The two root models (live results only), to find where each layer was built."""
    optimizer_settings: dict[str, list[list[Any]]] = field(default_factory=dict)
    """Per updated layer: ``[setting, base, raw]`` of the two optimizers (live results that trained)."""
    local_label: str = "same inputs"
    """How a local error was found, as the panel says it (offline: judged from what was received)."""
    local_labels: dict[tuple[Any, ...], str] = field(default_factory=dict)
    """Per blamed event (its base event's phase and ``key``): how its local error was found, where it
    differs from ``local_label`` (offline: a layer rebuilt from its dump)."""


def summary_line(result: DiffResult) -> str:
    """The view's headline: both models and SUCCESS, or where it failed."""
    head = f"{result.base_framework} {result.base_model} vs {result.raw_framework} {result.raw_model}: "
    if result.first_divergence is None:
        return head + f"SUCCESS ({len(result.events)} paired events, {result.steps} step(s))"
    d = result.first_divergence
    what = "optimizer settings differ" if d.where == "parameter" else "arguments differ"
    own = sum(1 for f in result.findings if f.where != "framework")
    more = f" · {own} findings in all (the 'own error' filter lists them)" if own > 1 else ""
    return head + "FAILED at " + d.describe() + (f" · {what}: {d.why()}" if d.arguments else "") + more


def step_rows(result: DiffResult) -> list[dict[str, Any]]:
    """:meth:`DiffResult.step_errors` as JSON (no inf), for the view's step chart; a decode loop's
    rows carry their first token position (the chart's axis then reads positions)."""
    rows = [{k: (_ratio(v) if isinstance(v, float) else v) for k, v in r.items()} for r in result.step_errors()]
    decoding = result.generation()
    if decoding is not None:
        for r, (start, _) in zip(rows, decoding.positions):
            r["position"] = start
    return rows


def _ratio(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else 1e300  # JSON has no inf; the view shows it as "inf"


def _status(
    d: EventDiff,
    is_first: bool,
    framework: frozenset[tuple[int, str, str]] | set[tuple[int, str, str]] = frozenset(),
    agreed: bool = False,
) -> str:
    if is_first:
        return "blamed"
    if (d.base.step, d.base.phase.value, d.base.path) in framework:
        return "framework"  # a known framework difference, verified: not the port's bug
    if not d.tensors and d.local is None:
        return "none"  # nothing to compare (a backward root, a container): not a green 0
    local = d.local_ratio
    if local is not None and local > 1:
        return "local"
    if d.ratio > 1:
        # In a result that agrees, an inherited excess is explained (result.warnings says why): no orange.
        return "explained" if agreed else "inherited"
    return "ok"


def _is_first(d: EventDiff, result: DiffResult) -> bool:
    div = result.first_divergence
    return (
        div is not None
        and d.base.step == div.step
        and d.base.phase == div.phase
        and d.base.path == div.base_path
        and d.raw.path == div.raw_path
    )


def build_tree(result: DiffResult) -> TreeData:
    """One group row per (step, phase), then the paired events nested by their layers."""
    nodes: list[dict[str, Any]] = []
    order: list[int] = []
    events: list[EventDiff] = []
    first = -1
    steps = sorted({d.base.step for d in result.events})
    framework = {(f.step, f.phase.value, f.base_path) for f in result.findings if f.where == "framework"}
    agreed = result.first_divergence is None
    for step in steps:
        for phase in _PHASES:
            diffs = [d for d in result.events if d.base.step == step and d.base.phase == phase]
            if not diffs:
                continue
            group = len(nodes)
            worst = max(d.ratio for d in diffs)
            nodes.append(
                dict(id=group, parent=-1, depth=0, label=f"step {step} · {phase.value}", base="", raw="",
                     base_type="", raw_type="", phase=phase.value, step=step, ratio=_ratio(worst), local=None,
                     status=("explained" if agreed else "inherited") if worst > 1 else "ok", event=-1)
            )  # fmt: skip
            by_order: dict[int, int] = {}
            raw_order: dict[int, int] = {}
            for d in sorted(diffs, key=_tree_position):
                parent = by_order.get(d.base.parent, group) if d.base.parent is not None else group
                nid = len(nodes)
                is_first = _is_first(d, result)
                if is_first:
                    first = nid
                nodes.append(
                    dict(id=nid, parent=parent, depth=nodes[parent]["depth"] + 1, label=_label(d), base=d.base.path,
                         raw=d.raw.path, base_type=d.base.type_name, raw_type=d.raw.type_name, phase=phase.value,
                         step=step, ratio=_ratio(d.ratio) if d.tensors else None,
                         local=_ratio(d.local_ratio), status=_status(d, is_first, framework, agreed), event=len(events))
                )  # fmt: skip
                events.append(d)
                if d.base.kind is Kind.LAYER:
                    by_order[d.base.order] = nid
                    raw_order[d.raw.order] = nid
            # Replay runs in execution order within the group (backward order for backward).
            order += sorted(range(group + 1, len(nodes)), key=lambda i: events[nodes[i]["event"]].base.order)
            if phase is Phase.FORWARD and step == steps[-1]:
                _add_unpaired(nodes, group, result.unmatched_base, by_order, "base")
                _add_unpaired(nodes, group, result.unmatched_raw, raw_order, "raw")
    roots = root_layers(result.events)
    settings = dict(result.options.get("optimizer_settings") or {})
    # Offline, an event's own error is judged from what it received, not measured by re-running it.
    local_label = (
        "not measured, judged from the dump: what it received agrees" if "dumps" in result.options else "same inputs"
    )
    labels = {
        (f.event.base.phase, f.event.base.key): _LOCAL_LABELS[f.local_by]
        for f in result.findings
        if f.event is not None and f.local_by in _LOCAL_LABELS
    }
    return TreeData(
        nodes, order, first, events, (result.base_framework, result.raw_framework), roots, settings, local_label, labels
    )


_LOCAL_LABELS = {
    "rebuilt": "rebuilt from the dump, on base's inputs",
    "recomputed": "base's layer recomputed from the dump, on raw's inputs",
}


def _add_unpaired(
    nodes: list[dict[str, Any]], group: int, unpaired: tuple[Event, ...], by_order: dict[int, int], side: str
) -> None:
    """Calls with no counterpart, under their parent's row, marked as such (not in the replay)."""
    for e in sorted(unpaired, key=lambda e: e.order):
        parent = by_order.get(e.parent, group) if e.parent is not None else group
        nid = len(nodes)
        nodes.append(
            dict(id=nid, parent=parent, depth=nodes[parent]["depth"] + 1, label=e.path or "<root>",
                 base=e.path if side == "base" else "", raw=e.path if side == "raw" else "",
                 base_type=e.type_name if side == "base" else "", raw_type=e.type_name if side == "raw" else "",
                 phase=Phase.FORWARD.value, step=e.step, ratio=None, local=None, status="unpaired", event=-2)
        )  # fmt: skip
        by_order[e.order] = nid


def _tree_position(d: EventDiff) -> tuple[int, int, int]:
    # Parents before children, so a row's parent exists when it is added; the loss last.
    # Backward events run children first, so they are placed by depth, then by order.
    loss = 1 if d.base.kind is Kind.LOSS else 0
    return (loss, d.base.depth if d.base.phase is Phase.BACKWARD else 0, d.base.order)


def _label(d: EventDiff) -> str:
    if d.base.kind is Kind.LOSS:
        return "<loss>"
    name = d.base.path.rsplit(".", 1)[-1] if d.base.path else "<root>"
    raw = d.raw.path.rsplit(".", 1)[-1] if d.raw.path else "<root>"
    return name if name == raw else f"{name} ~ {raw}"


def record_stats(t: TensorRecord | None) -> dict[str, Any] | None:
    """Shape, dtype, min/max/mean/std and NaN/Inf counts of one recorded tensor, for the panel.

    From :meth:`TensorRecord.statistics`, so statistics-only dumps show them too.
    """
    if t is None:
        return None
    out: dict[str, Any] = dict(shape=list(t.shape), dtype=t.dtype)
    st = t.statistics()
    if st is not None:
        out.update({k: _ratio(v) if isinstance(v, float) else v for k, v in st.as_dict().items()})
    return out


def _records(e: Event) -> dict[str, TensorRecord]:
    """An event's tensors by the names its comparisons use."""
    if e.phase is Phase.FORWARD:
        return {t.name: t for t in e.outputs}
    if e.phase is Phase.BACKWARD:
        return {t.name: t for t in (*e.inputs, *e.params)}
    return {t.name: t for t in e.outputs}


def tensor_pair(d: EventDiff, name: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Base and raw values of one compared tensor (base ``None`` when its layout differs)."""
    b, r = _records(d.base).get(name), _records(d.raw).get(name)
    return (b.value if b is not None else None), (r.value if r is not None else None)


def _metrics(t: TensorDiff) -> dict[str, Any]:
    return dict(
        name=t.name, max_abs=_ratio(t.max_abs), max_rel=_ratio(t.max_rel), mean_abs=_ratio(t.mean_abs),
        cosine=t.cosine if math.isfinite(t.cosine) else None, ratio=_ratio(t.ratio), passed=t.passed, tolerance=t.tolerance.describe(), mode=t.mode,
        nan=[t.nan_base, t.nan_raw], inf=[t.inf_base, t.inf_raw], note=t.note,
    )  # fmt: skip


def node_detail(tree: TreeData, node_id: int) -> dict[str, Any]:
    """Everything the tensor and stack panels show for one row (no plots)."""
    node = tree.nodes[node_id]
    if node["event"] < 0:  # a group row, or a call paired with nothing
        return dict(node=node, tensors=[], stacks=dict(base=[], raw=[]))
    d = tree.events[node["event"]]
    local = {t.name: t for t in d.local or ()}
    tensors: list[dict[str, Any]] = []
    for t in d.tensors:
        bt, rt = _records(d.base).get(t.name), _records(d.raw).get(t.name)
        tensors.append(
            dict(
                metrics=_metrics(t),
                local=_metrics(local[t.name]) if t.name in local else None,
                local_label=tree.local_labels.get((d.base.phase, d.base.key), tree.local_label),
                base=record_stats(bt),
                raw=record_stats(rt),
            )
        )
    tensors.sort(key=lambda x: -(x["metrics"]["ratio"] or 0.0))
    picture = None
    if tensors:  # the worst tensor's error, drawn by the browser with the panel
        worst = tensors[0]["metrics"]
        base, raw = tensor_pair(d, worst["name"])
        if base is not None and raw is not None:
            picture = error_picture(base, raw, worst["passed"])
    frames = {
        side: [_frame(f) for f in ev.stack]
        for side, ev in (("base", _forward_of(tree, d, "base")), ("raw", _forward_of(tree, d, "raw")))
    }
    fb, fr = _forward_of(tree, d, "base"), _forward_of(tree, d, "raw")
    for side, ev, root in (("base", fb, tree.roots[0]), ("raw", fr, tree.roots[1])):
        site = construction_site(root, ev.path) if ev.kind is Kind.LAYER else None
        frames[f"{side}_built"] = [] if site is None else [_frame(site)]
    arguments = [
        dict(name=a.name, base=a.shown()[0], raw=a.shown()[1])
        for a in argument_diffs(tree.frameworks[0], fb.layer, tree.frameworks[1], fr.layer)
    ]
    detail: dict[str, Any] = dict(node=node, tensors=tensors, stacks=frames, arguments=arguments, picture=picture)
    if d.base.phase is Phase.OPTIMIZER:
        # An update row: its tensors are updates (after - before), and both optimizers' settings show.
        for t in tensors:
            t["metrics"]["name"] = f"update of {t['metrics']['name']}"
        rows = tree.optimizer_settings.get(d.base.path, [])
        detail["settings"] = [dict(name=n, base=b, raw=r, differs=b != r) for n, b, r in rows]
    return detail


def _frame(f: Frame) -> dict[str, Any]:
    return dict(file=f.filename, line=f.lineno, function=f.function, label=frame_label(f.filename, f.lineno))


def _forward_of(tree: TreeData, d: EventDiff, side: str) -> Event:
    """Backward and optimizer events carry no stack of their own: use the matching forward call's."""
    ev = d.base if side == "base" else d.raw
    if ev.stack or ev.phase is Phase.FORWARD:
        return ev
    for other in tree.events:
        o = other.base if side == "base" else other.raw
        if o.phase is Phase.FORWARD and o.step == ev.step and o.path == ev.path and o.call == ev.call:
            return o
    return ev
