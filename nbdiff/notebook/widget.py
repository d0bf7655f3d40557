"""The interactive diff view: an anywidget whose front end is ``js/view.js``.

Python holds the result; the browser gets the tree rows once and asks for details
(statistics, error pictures, source) of the row the user clicks, so the page stays small.
"""

from __future__ import annotations

import uuid
from typing import Any

import anywidget
import traitlets as T

from nbdiff.result import DiffResult
from nbdiff.view.model import build_tree, node_detail, start_row, step_rows, summary_line
from nbdiff.view.page import STATIC, render_static
from nbdiff.view.sources import source_excerpt

__all__ = ["DiffView"]


class DiffView(anywidget.AnyWidget):
    """Paired trees coloured by error, a tensor panel, a stack panel and a replay of the events."""

    _esm = STATIC / "view.js"
    _css = STATIC / "view.css"

    nodes: T.List = T.List().tag(sync=True)
    """Tree rows (see :func:`nbdiff.view.model.build_tree`)."""
    order: T.List = T.List().tag(sync=True)
    """Row ids in execution order, for the replay."""
    first = T.Int(-1).tag(sync=True)
    """Row id of the first divergence, or -1."""
    summary = T.Unicode("").tag(sync=True)
    steps = T.List().tag(sync=True)
    """Per-step worst error over tolerance (:meth:`DiffResult.step_errors`), for the step chart."""
    selected = T.Int(-1).tag(sync=True)
    """Row the user clicked (or the replay is at)."""
    detail = T.Dict().tag(sync=True)
    """Statistics, metrics and stacks of the selected row."""
    frame_request = T.Dict().tag(sync=True)
    """``{side, index}`` of a clicked stack frame."""
    source = T.Dict().tag(sync=True)
    """Source around the requested frame."""
    static_id = T.Unicode("").tag(sync=True)
    """Marks this view's static copy (a separate output), which the live view hides."""

    def __init__(self, result: DiffResult, **kwargs: Any) -> None:
        self.result = result
        self._tree = build_tree(result)
        super().__init__(
            nodes=self._tree.nodes,
            order=self._tree.order,
            first=self._tree.first,
            summary=summary_line(result),
            steps=step_rows(result),
            static_id=uuid.uuid4().hex,
            **kwargs,
        )
        self.observe(self._on_select, "selected")
        self.observe(self._on_frame, "frame_request")
        start = start_row(self._tree)
        if start >= 0:
            self.selected = start

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, plus a static ``text/html`` copy for wherever the widget cannot be drawn."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        return {**data, "text/html": render_static(self.result, self.static_id)}, meta

    def _ipython_display_(self) -> None:
        """Two outputs: the static copy, then the live view, which hides the copy while it runs.

        A notebook saved without widget state and reopened in JupyterLab (trusted, so Lab
        prefers the widget and finds no model) still shows the answer: the copy is an output
        of its own. GitHub, nbviewer and nbconvert show the copy alone.
        """
        from IPython.display import display

        bundle = super()._repr_mimebundle_()
        if bundle is None:
            return
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        # The copy carries the text too (a terminal, nbconvert to text); the view's own text is empty,
        # not "<DiffView object at 0x...>", where it cannot be drawn (an untrusted reopen, nbconvert).
        static = {"text/html": render_static(self.result, self.static_id), "text/plain": summary_line(self.result)}
        display(static, raw=True)
        display({**data, "text/plain": ""}, metadata=meta, raw=True)

    def _on_select(self, change: dict[str, Any]) -> None:
        node_id = change["new"]
        if not 0 <= node_id < len(self._tree.nodes):
            return
        # The panel carries the data of its error pictures: the browser draws them with it.
        self.detail = node_detail(self._tree, node_id)

    def _on_frame(self, change: dict[str, Any]) -> None:
        req = change["new"] or {}
        frames = self.detail.get("stacks", {}).get(req.get("side"), [])
        i = req.get("index", -1)
        if isinstance(i, int) and 0 <= i < len(frames):
            f = frames[i]
            self.source = source_excerpt(f["file"], f["line"], since=f.get("first"))
