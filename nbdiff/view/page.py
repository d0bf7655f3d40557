"""A standalone HTML report: the notebook view without a kernel, data embedded, offline.

The same ``js/view.js`` runs against a small in-page model that answers clicks from
the embedded details (statistics, metrics, stacks and error pictures of every row, and
the source around every user frame, so the report reads the same on a machine without
the code).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from nbdiff.errors import OptionError
from nbdiff.report.text import render_text
from nbdiff.view.model import build_tree, node_detail, start_row, step_rows, summary_line
from nbdiff.view.sources import source_excerpt
from nbdiff.view.svg_chart import step_chart_svg

if TYPE_CHECKING:
    from nbdiff.result import DiffResult

__all__ = ["STATIC", "render_html", "render_static", "write_html"]

# The one renderer (js/, linked here): the widget loads it as its module, the page inlines it.
STATIC = Path(__file__).resolve().parent / "static"

_MODEL = """
const data = JSON.parse(document.getElementById("nbd-data").textContent);
const state = { ...data.state, detail: {}, source: {}, frame_request: {} };
const listeners = {};
const fire = (k) => (listeners["change:" + k] || []).forEach((f) => f());
const model = {
  get: (k) => state[k],
  on: (ev, f) => (listeners[ev] = listeners[ev] || []).push(f),
  save_changes: () => {},
  set: (k, v) => {
    state[k] = v;
    if (k === "selected") {
      const node = state.nodes[v];
      state.detail = data.details[v] || { node, tensors: [], stacks: { base: [], raw: [] } };
      fire("detail");
    }
    if (k === "frame_request") {
      const f = (state.detail.stacks[v.side] || [])[v.index];
      const missing = f && { kind: "file", file: f.file, line: f.line, first: f.line, lines: ["(source not found when the report was written)"], relpath: null };
      state.source = f ? data.sources[`${f.file}:${f.line}${f.first ? ":" + f.first : ""}`] || missing : {};
      fire("source");
    }
    fire(k);
  },
};
const el = document.getElementById("nbd-root");
"""


def render_html(result: DiffResult, title: str | None = None) -> str:
    """The report as one HTML string (no external resources)."""
    tree = build_tree(result)
    details = {n["id"]: node_detail(tree, n["id"]) for n in tree.nodes if n["event"] != -2}
    start = start_row(tree)
    state = dict(nodes=tree.nodes, order=tree.order, first=tree.first, summary=summary_line(result), selected=start,
                 steps=step_rows(result))  # fmt: skip
    sources = {}
    for d in details.values():
        for frames in d["stacks"].values():
            for f in frames:
                key = f"{f['file']}:{f['line']}" + (f":{f['first']}" if f.get("first") else "")
                if key not in sources:
                    sources[key] = dict(source_excerpt(f["file"], f["line"], since=f.get("first")), relpath=None)
    # No "<" or "&" in the script element: "</script>" would end it and "<!--" changes how the
    # browser parses it. JSON spells them as \u escapes.
    payload = (
        json.dumps({"state": state, "details": details, "sources": sources}, allow_nan=False)
        .replace("<", "\\u003c")
        .replace("&", "\\u0026")
    )
    js = (STATIC / "view.js").read_text()
    css = (STATIC / "view.css").read_text()
    title = title or f"nbdiff: {result.base_model} vs {result.raw_model}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{css}
body {{ margin: 16px; }}</style></head>
<body><div id="nbd-root"></div>
<script type="application/json" id="nbd-data">{payload}</script>
<script type="module">
{js}
{_MODEL}
render({{ model, el }});
if (state.selected >= 0) model.set("selected", state.selected);
</script></body></html>
"""


def render_static(result: DiffResult, static_id: str = "") -> str:
    """A small static HTML summary: what a notebook shows where the live view cannot run
    (reopened without its kernel, GitHub, nbviewer, nbconvert): the verdict, the step chart as SVG
    and the text report. No script. ``static_id`` lets the live view find and hide it."""
    colour = "#3c763d" if result else "#a94442"
    mark = f' data-nbd-static="{html.escape(static_id)}"' if static_id else ""
    first = result.first_divergence
    chart = step_chart_svg(step_rows(result), first.step if first is not None else None)
    return (
        f'<div class="nbd-static"{mark}>{_HIDE_LOST_VIEW if static_id else ""}'
        f'<div style="font-weight:600;color:{colour}">{html.escape(summary_line(result))}</div>{chart}'
        f'<pre style="font-size:11px;max-height:480px;overflow:auto">{html.escape(render_text(result))}</pre>'
        "<div><i>Static copy of the nbdiff view: run the cell again for the interactive view, or save "
        "<code>result.to_html(path)</code> for a standalone one.</i></div></div>"
    )


_HIDE_LOST_VIEW = (
    "<style>.jp-OutputArea-child:has([data-nbd-static]) + .jp-OutputArea-child:not(:has(.nbd)) "
    "{ display: none; }</style>"
)
"""A notebook reopened without its widget state shows "Error displaying widget: model not found" in the
output after this copy: the copy is the answer there, alone. While the live view draws, the copy is hidden
instead (the view's output then holds ``.nbd``)."""


def write_html(result: DiffResult, path: str | os.PathLike[str]) -> Path:
    """Write the page; a link at ``path`` is refused, never written through (``nbdiff view`` writes into
    a result folder that someone else may have prepared)."""
    out = Path(path)
    page = render_html(result).encode("utf-8")
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        if out.is_symlink():
            raise OptionError(f"{out}: a link; the page is not written through it. Name another file.") from None
        raise OptionError(f"{out}: cannot write the page ({exc.strerror or exc}).") from None
    with os.fdopen(fd, "wb") as f:
        f.write(page)
    return out
