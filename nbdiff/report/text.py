"""The text report of a :class:`~nbdiff.result.DiffResult`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.findings import counted, grouped_findings
from nbdiff.judge.metrics import TensorDiff
from nbdiff.trace.origin.built import construction_site, root_layers
from nbdiff.trace.origin.stack import Frame, cell_number, frame_label

if TYPE_CHECKING:
    from nbdiff.result import DiffResult

LOCAL_BY = {
    "replay": "this event alone, run on the base side's inputs",
    "rebuilt": "the raw layer rebuilt from its dump (class, arguments, weights at that step) and run on the base side's "
    "recorded inputs",
    "recomputed": "base's layer recomputed from the dump and run on the raw side's inputs",
    "received": "not measured; its own error is judged from what was recorded: what this event received agrees within "
    "tolerance, what it made does not",
}
"""How a divergence's local error was found, as the report says it."""

__all__ = ["render_text", "format_diff"]

TREE_ROWS = 40


def format_diff(t: TensorDiff) -> str:
    """One line of metrics for a tensor comparison."""
    nan = f", NaN base/raw {t.nan_base}/{t.nan_raw}" if t.nan_base or t.nan_raw else ""
    inf = f", Inf base/raw {t.inf_base}/{t.inf_raw}" if t.inf_base or t.inf_raw else ""
    note = f" [{t.note}]" if t.note else ""
    return (
        f"{t.name}: max_abs={t.max_abs:.3g} max_rel={t.max_rel:.3g} mean_abs={t.mean_abs:.3g} "
        f"cosine={t.cosine:.6f}{nan}{inf}; {t.ratio:.3g}x what {t.mode} {t.tolerance.describe()} allows{note}"
    )


def _stack(frames: tuple[Frame, ...]) -> list[str]:
    def where(f: Frame) -> str:
        cell = cell_number(f.filename) is not None
        return frame_label(f.filename, f.lineno) if cell else f'File "{f.filename}", line {f.lineno}'

    return [f"    {where(f)}, in {f.function}" for f in frames] or ["    (no user frames)"]


def _built(result: DiffResult, d: Any) -> list[str]:
    """Where each side constructed the blamed layer (its arguments are written there)."""
    if d.where not in ("layer", "between", "state", "nonfinite"):
        return []
    sites = [construction_site(root, path) for root, path in zip(root_layers(result.events), (d.base_path, d.raw_path))]
    if None in sites:
        return []
    return ["Built at:", *(f"    {side}: {_stack((s,))[0].strip()}" for side, s in zip(("base", "raw"), sites)), ""]


def _tree(events: list[EventDiff], mark: tuple[str, int] | None) -> list[str]:
    rows: list[str] = []
    at = 0
    shown: list[int] = []  # depths of the rows this one is nested in (pre-order): an unpaired container has none
    for e in sorted(events, key=lambda d: d.base.order):
        while shown and shown[-1] >= e.base.depth:
            shown.pop()
        indent = len(shown)
        shown.append(e.base.depth)
        name = e.base.path or "<root>"
        status = "ok" if e.passed else f"x {e.ratio:.3g}"
        local = "" if e.local_ratio is None else f" (local {e.local_ratio:.3g})"
        here = (e.base.path, e.base.call) == mark
        if here:
            at = len(rows)
        raw = f"  ~ {e.raw.path or '<root>'}" if e.raw.path != e.base.path else ""
        rows.append(
            f"  {'  ' * indent}{name} ({e.base.type_name}){raw}  {status}{local}{'   <--- first divergence' if here else ''}"
        )
    if len(rows) > TREE_ROWS:
        lo = max(0, min(at - TREE_ROWS // 2, len(rows) - TREE_ROWS))
        rows = (["  ..."] if lo else []) + rows[lo : lo + TREE_ROWS] + (["  ..."] if lo + TREE_ROWS < len(rows) else [])
    return rows


def render_text(result: DiffResult) -> str:
    """Summary line, first divergence with metrics, a compact tree, and both stacks."""
    head = f"nbdiff: base {result.base_framework} {result.base_model} vs raw {result.raw_framework} {result.raw_model}"
    counts = {
        ph: len([e for e in result.events if e.base.phase.value == ph])
        for ph in ("forward", "backward", "optimizer", "state")
    }
    lines = [
        f"{head}: {'SUCCESS' if result else 'FAILED'}",
        f"  compared {counts['forward']} forward, {counts['backward']} backward and {counts['optimizer']} optimizer "
        f"events over {result.steps} step(s)",
    ]
    if result.unmatched_base or result.unmatched_raw:
        lines.append(
            f"  unpaired: {len(result.unmatched_base)} base call(s) "
            f"{[e.path for e in result.unmatched_base[:5]]}, {len(result.unmatched_raw)} raw call(s) "
            f"{[e.path for e in result.unmatched_raw[:5]]}"
        )
    for w in result.warnings[:10]:
        lines.append(f"  warning: {w}")
    for n in result.notes[:10]:
        lines.append(f"  note: {n}")
    lines += _findings(result)
    d = result.first_divergence
    decoding = result.generation()
    if d is None:
        return "\n".join(lines + ([f"  {decoding.describe()}"] if decoding else []))
    lines += ["", f"First divergence: {d.describe()}"]
    if decoding is not None:
        lines.append(f"  {decoding.describe()}")
    if d.arguments:
        what = "optimizer settings differ" if d.where == "parameter" else "arguments differ"
        lines.append(f"  why          {what}: {d.why()}")
    elif d.why():
        lines.append(f"  why          {d.why()}")
    lines.append(f"  accumulated  {format_diff(d.metrics)}")
    if d.unmeasured and not d.inherited:
        lines.append(f"  local        not measured ({d.unmeasured})")
    elif d.local_error is not None:
        lines.append(f"  local        {format_diff(d.local_error)}")
    lines.append(f"  (local = {LOCAL_BY.get(d.local_by, LOCAL_BY['replay'])})")
    phase_events = result.select(d.step, d.phase)
    lines += [
        "",
        f"Tree (step {d.step}, {d.phase.value}):",
        *_tree(phase_events, (d.base_path, 0) if d.phase.value not in ("optimizer", "state") else None),
    ]
    lines += [
        "",
        *_built(result, d),
        "Base stack (innermost first):",
        *_stack(d.base_stack),
        "Raw stack (innermost first):",
        *_stack(d.raw_stack),
    ]
    return "\n".join(lines)


def _findings(result: DiffResult) -> list[str]:
    """Every own error (a port often has several bugs), one line each (:func:`grouped_findings`: a layer's
    backward finding folds into its forward one), then the framework differences, one line per kind."""
    rows = grouped_findings(result.findings)
    framework: dict[str, list[Divergence]] = {}
    for f in result.findings:
        if f.where == "framework":
            framework.setdefault(f.explanation, []).append(f)
    out = []
    if len(rows) > 1:
        out += ["", f"Findings: {counted(result.findings)}, in execution order:"]
        for i, row in enumerate(rows, 1):
            f = row.first
            more = "".join(f"; its backward too, {_own(b):.3g}x" for b in row.also)
            out.append(f"  {i}. {f.describe()} [own error {_own(f):.3g}x{more}]")
            if f.why():
                out.append(f"       why: {f.why()}")
    for why, found in framework.items():
        steps = sorted({f.step for f in found})
        tensors = sorted({f.parameter or f.base_path for f in found})
        out += [
            "",
            f"Framework differences (do not fail; framework_differences='fail' makes them): {len(tensors)} "
            f"tensor(s) over {len(steps)} step(s), first `{found[0].parameter}` at step {found[0].step}",
            f"  {why}",
        ]
    return out


def _own(f: Divergence) -> float:
    return f.local_error.ratio if f.local_error is not None else f.metrics.ratio
