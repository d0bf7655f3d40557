"""What the notebook view shows, as plain JSON-able data built from a ``DiffResult``.

No widget code here: the tree rows, the replay order and the details of one row
are computed from the result alone, so they are tested without a browser and
reused by the static HTML export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nbdiff.align.arguments import argument_diffs
from nbdiff.align.optimizer_settings import setting_differs
from nbdiff.judge.blame import EventDiff
from nbdiff.judge.findings import counted, grouped_findings
from nbdiff.judge.metrics import TensorDiff
from nbdiff.result import DiffResult
from nbdiff.trace.events import Event, Kind, Phase
from nbdiff.trace.origin.built import construction_site, root_layers
from nbdiff.trace.origin.stack import Frame, frame_label, inside_frames
from nbdiff.view.pictures import error_picture
from nbdiff.view.tensors import CallIndex, record_stats, scalar_value, tensor_pair, tensor_records, tensor_role
from nbdiff.view.tensors import json_ratio as _ratio

__all__ = ["TreeData", "build_tree", "node_detail", "start_row", "step_summary", "summary_line", "step_rows"]

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
    local_label: str = "run alone on base's inputs"
    """How a local error was found, as the panel says it (offline: judged from what was received)."""
    local_labels: dict[tuple[Any, ...], str] = field(default_factory=dict)
    """Per blamed event (its base event's phase and ``key``): how its local error was found, where it
    differs from ``local_label`` (offline: a layer rebuilt from its dump)."""
    code_stacks: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    """Per event blamed for its own code (``between``): both sides' frames, beginning inside its code
    at the lines between the two sublayers (``first``..``line``)."""
    calls: CallIndex = field(default_factory=lambda: CallIndex(()))
    """The forward calls, to find the sublayer call a tensor name speaks of (``proj:in[0]``)."""


def summary_line(result: DiffResult) -> str:
    """The view's headline: both models and SUCCESS, or where it failed."""
    head = f"{result.base_framework} {result.base_model} vs {result.raw_framework} {result.raw_model}: "
    if result.first_divergence is None:
        return head + f"SUCCESS ({len(result.events)} paired events, {result.steps} step(s))"
    d = result.first_divergence
    what = "optimizer settings differ" if d.where == "parameter" else "arguments differ"
    groups = grouped_findings(result.findings)
    several = len(groups) > 1 or any(g.also for g in groups)
    more = f" · {counted(result.findings)} in all (the 'own error' filter lists them)" if several else ""
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


def _status(
    d: EventDiff,
    is_first: bool,
    framework: frozenset[tuple[int, str, str]] | set[tuple[int, str, str]] = frozenset(),
    agreed: bool = False,
    own: float | None = None,
) -> str:
    """``own``: the event is a finding, with this local error (an optimizer update's own error is
    found per parameter, not as the event's ``local``)."""
    if is_first:
        return "blamed"
    if (d.base.step, d.base.phase.value, d.base.path) in framework:
        return "framework"  # a known framework difference, verified: not the port's bug
    if not d.tensors and d.local is None:
        return "none"  # nothing to compare (a backward root, a container): not a green 0
    if own is not None:
        return "local"
    # A local error past tolerance that is no finding (within what rounding explains, or a parent's whose
    # sublayer is blamed): counted nowhere, so not red; what it holds beyond tolerance it inherited.
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
    own = _own_errors(result)
    for step in steps:
        for phase in _PHASES:
            diffs = [d for d in result.events if d.base.step == step and d.base.phase == phase]
            if not diffs:
                continue
            group = len(nodes)
            worst = max(d.ratio for d in diffs)
            mine = [own[(phase, d.base.key)] for d in diffs if (phase, d.base.key) in own]
            status = "local" if mine else ("explained" if agreed else "inherited") if worst > 1 else "ok"
            nodes.append(
                dict(id=group, parent=-1, depth=0, label=f"step {step} · {phase.value}", base="", raw="",
                     base_type="", raw_type="", phase=phase.value, step=step, ratio=_ratio(worst),
                     local=_ratio(max(mine)) if mine else None, status=status, event=-1)
            )  # fmt: skip
            by_order: dict[int, int] = {}
            raw_order: dict[int, int] = {}
            for d in sorted(diffs, key=_tree_position):
                parent = by_order.get(d.base.parent, group) if d.base.parent is not None else group
                nid = len(nodes)
                is_first = _is_first(d, result)
                if is_first:
                    first = nid
                mine = own.get((phase, d.base.key))
                local = d.local_ratio if d.local_ratio is not None else mine
                nodes.append(
                    dict(id=nid, parent=parent, depth=nodes[parent]["depth"] + 1, label=_label(d), base=d.base.path,
                         raw=d.raw.path, base_type=d.base.type_name, raw_type=d.raw.type_name, phase=phase.value,
                         step=step, ratio=_ratio(d.ratio) if d.tensors else None, local=_ratio(local),
                         status=_status(d, is_first, framework, agreed, mine), event=len(events))
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
        "not measured, judged from the dump: what it received agrees"
        if "dumps" in result.options
        else "run alone on base's inputs"
    )
    labels = {
        (f.event.base.phase, f.event.base.key): _LOCAL_LABELS[f.local_by]
        for f in result.findings
        if f.event is not None and f.local_by in _LOCAL_LABELS
    }
    calls = CallIndex(result.events)
    return TreeData(
        nodes, order, first, events, (result.base_framework, result.raw_framework), roots, settings, local_label, labels,
        _code_stacks(result, calls), calls,
    )  # fmt: skip


def start_row(tree: TreeData) -> int:
    """The row a view opens on: the first divergence; in a result that agrees, the row closest to
    its tolerance (the model's inputs agree bit for bit, and say nothing); ``-1`` when there is none."""
    if tree.first >= 0:
        return tree.first
    rows = [n for n in tree.nodes if n["event"] >= 0 and n["ratio"] is not None and n["status"] != "none"]
    if rows:
        return max(rows, key=lambda n: (n["ratio"], -n["id"]))["id"]
    return tree.order[0] if tree.order else -1


def _own_errors(result: DiffResult) -> dict[tuple[Any, ...], float]:
    """The events the findings blame for an error of their own (by phase and ``key``), with the worst
    such error: every finding's, not only the first's."""
    out: dict[tuple[Any, ...], float] = {}
    for f in result.findings:
        if f.event is None or f.where in ("framework", "accumulated") or f.inherited:
            continue
        err = (f.local_error or f.metrics).ratio
        k = (f.event.base.phase, f.event.base.key)
        out[k] = max(out.get(k, 0.0), err)
    return out


def _code_stacks(result: DiffResult, calls: CallIndex) -> dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]]:
    out = {}
    for f in result.findings:
        if f.where != "between" or f.event is None:
            continue
        d = f.event
        prev, nxt = (calls.child(d, label) if label else None for label in f.between)
        stacks = {}
        for side, stack in (("base", f.base_stack), ("raw", f.raw_stack)):
            frames = [_frame(x) for x in stack]
            own = getattr(d, side).stack
            before = inside_frames(own, getattr(prev, side).stack) if prev is not None else ()
            after = inside_frames(own, getattr(nxt, side).stack) if nxt is not None else ()
            if before and after and frames and frames[0]["line"] == after[0].lineno:
                a, b = before[0], after[0]
                if (a.filename, a.function) == (b.filename, b.function) and a.lineno < b.lineno:
                    # The lines from one sublayer's call to the next: the code at fault.
                    frames[0]["first"] = a.lineno
                    frames[0]["label"] = f"{frame_label(a.filename, a.lineno)}-{b.lineno}"
            stacks[side] = frames
        out[(d.base.phase, d.base.key)] = stacks
    return out


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


def _metrics(t: TensorDiff) -> dict[str, Any]:
    return dict(
        name=t.name, max_abs=_ratio(t.max_abs), max_rel=_ratio(t.max_rel), mean_abs=_ratio(t.mean_abs),
        cosine=t.cosine if math.isfinite(t.cosine) else None, ratio=_ratio(t.ratio), passed=t.passed, tolerance=t.tolerance.describe(), mode=t.mode,
        nan=[t.nan_base, t.nan_raw], inf=[t.inf_base, t.inf_raw], note=t.note,
    )  # fmt: skip


def node_detail(tree: TreeData, node_id: int) -> dict[str, Any]:
    """Everything the tensor and stack panels show for one row (no plots)."""
    node = tree.nodes[node_id]
    if node["event"] == -1:  # a group row: the step at a glance
        return dict(node=node, tensors=[], stacks=dict(base=[], raw=[]), step=step_summary(tree, node["step"]))
    if node["event"] < 0:  # a call paired with nothing
        return dict(node=node, tensors=[], stacks=dict(base=[], raw=[]))
    d = tree.events[node["event"]]
    tensors = _tensor_rows(tree, d, own=node["status"] in ("blamed", "local"))
    picture = None
    if tensors:  # the first tensor's error (the blamed one's, for an own error), drawn with the panel
        first = tensors[0]
        base, raw = tensor_pair(d, first["name"], tree.calls)
        if base is not None and raw is not None and base.size > 1:
            picture = error_picture(base, raw, (first["local"] or first["metrics"])["passed"])
    frames = tree.code_stacks.get((d.base.phase, d.base.key)) or {
        side: [_frame(f) for f in ev.stack]
        for side, ev in (("base", _forward_of(tree, d, "base")), ("raw", _forward_of(tree, d, "raw")))
    }
    frames = dict(frames)  # the built-at frames are added per call
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
            t["name"] = f"update of {t['name']}"
            for m in (t["metrics"], t["local"]):
                if m is not None:
                    m["name"] = t["name"]
        rows = tree.optimizer_settings.get(d.base.path, [])
        detail["settings"] = [dict(name=n, base=b, raw=r, differs=setting_differs(b, r)) for n, b, r in rows]
    return detail


def step_summary(tree: TreeData, step: int, worst: int = 3) -> dict[str, Any]:
    """One step at a glance: per phase, its own errors and its worst rows (ids, to jump to), and the
    loss on both sides."""
    phases = []
    in_step = [n for n in tree.nodes if n["step"] == step and n["event"] >= 0]
    for phase in _PHASES:
        rows = [n for n in in_step if n["phase"] == phase.value]
        if not rows:
            continue
        own = [n for n in rows if n["status"] in ("blamed", "local")]
        ranked = sorted(rows, key=lambda n: (n["status"] not in ("blamed", "local"), -(n["ratio"] or 0.0)))
        phases.append(
            dict(
                phase=phase.value, rows=len(rows), own=len(own),
                worst=[dict(id=n["id"], label=n["base"] or n["label"], ratio=n["ratio"], local=n["local"],
                            status=n["status"]) for n in ranked[:worst] if (n["ratio"] or 0.0) > 0],
            )
        )  # fmt: skip
    loss = next((d for d in tree.events if d.base.kind is Kind.LOSS and d.base.step == step), None)
    values = [scalar_value(e.outputs) for e in (loss.base, loss.raw)] if loss is not None else None
    return dict(step=step, phases=phases, loss=values)


def _tensor_rows(tree: TreeData, d: EventDiff, own: bool) -> list[dict[str, Any]]:
    """The panel's tensors: each compared one, and the local measurement's own (what the layer's code
    handed a sublayer). For an own error, the one carrying it comes first, else the worst."""
    local = {t.name: t for t in d.local or ()}
    label = tree.local_labels.get((d.base.phase, d.base.key), tree.local_label)
    rows: list[dict[str, Any]] = []
    compared = {t.name for t in d.tensors}
    # What the layer's code handed a sublayer, where it fails on base's inputs: the evidence of its own error.
    handed = [(n, None) for n, t in local.items() if n not in compared and not t.passed]
    for name, t in [(t.name, t) for t in d.tensors] + handed:
        bt, rt = tensor_records(d, name, tree.calls)
        # A code blame's own error is what its code handed a sublayer: the replay's own outputs (every
        # sublayer forced to base's) agree and said "local 0x" under a row reading "local 3.76e+4".
        lt = local.get(name) if not handed or t is None else None
        rows.append(
            dict(
                name=name,
                metrics=_metrics(t) if t is not None else None,
                local=_metrics(lt) if lt is not None else None,
                local_label=label,
                what=tensor_role(name),
                base=record_stats(bt),
                raw=record_stats(rt),
            )
        )
    size = lambda m: (m or {}).get("ratio") or 0.0  # noqa: E731
    rows.sort(key=lambda x: (-size(x["local"]), -size(x["metrics"])) if own else (-size(x["metrics"]),))
    return rows


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
