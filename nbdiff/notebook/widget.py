"""The interactive diff view: an anywidget whose front end is ``js/view.js``.

Python holds the result; the browser gets the tree rows once and asks for details
(statistics, error pictures, source) of the row the user clicks, so the page stays small.

A widget lives as long as the kernel: ipywidgets keeps every one it made, and a view that
held its result for good pinned every result a notebook ever drew (a cell run ten times,
ten results, their spilled tensors' disk space included). So a view holds its result only
while the browser draws it: each drawing says it is shown and, when its output is cleared,
gone. A view no drawing shows keeps its result weakly (the user's variables or ``_modeldiff``
may still hold it) behind the :data:`HIDDEN_KEPT` last hidden ones, which come back whole.
Where no browser can draw a view (IPython in a terminal, a script) it holds nothing once shown.
"""

from __future__ import annotations

import collections
import uuid
import weakref
from typing import Any

import anywidget
import traitlets as T

from nbdiff.result import DiffResult
from nbdiff.view.model import build_tree, node_detail, start_row, step_rows, summary_line
from nbdiff.view.page import STATIC, render_static
from nbdiff.view.sources import source_excerpt

__all__ = ["DiffView", "HIDDEN_KEPT"]

HIDDEN_KEPT = 4
"""How many results of views no longer drawn are still held, the latest hidden first kept."""

_hidden: collections.deque[DiffResult] = collections.deque(maxlen=HIDDEN_KEPT)

RELEASED = (
    "This view let go of its result: its output was cleared and nothing else held the result, "
    "so its tensors went back to memory and disk. The rows above stay; to open them again, keep "
    "the result in a variable (%%modeldiff ... --out NAME, or r = nbdiff.auto_diff(...)) and show it "
    "with r.show()."
)


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
        self._held: DiffResult | None = result
        self._weak = weakref.ref(result)
        self._drawn = 0  # drawings the browser says it shows
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
        self.on_msg(self._on_drawing)
        start = start_row(self._tree)
        if start >= 0:
            self.selected = start

    @property
    def result(self) -> DiffResult | None:
        """The result shown, or ``None`` once the view let go of it and nothing else held it."""
        return self._held if self._held is not None else self._weak()

    def _on_drawing(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """The browser's word on this view's drawings: one is ``shown``, or one is ``gone``."""
        said = content.get("drawing") if isinstance(content, dict) else None
        if said == "shown":
            self._drawn += 1
            self._hold()
        elif said == "gone" and self._drawn > 0:
            self._drawn -= 1
            if self._drawn == 0:
                self._let_go()

    def _hold(self) -> None:
        if self._held is None and (result := self._weak()) is not None:
            self._held, self._tree = result, build_tree(result)

    def _let_go(self) -> None:
        if self._held is not None:
            _hidden.append(self._held)  # a drawing back soon (a moved output) finds it whole
        self._held = self._tree = None

    def _after_display(self) -> None:
        # No browser can draw it, so none will ever ask it anything.
        from IPython import get_ipython

        shell = get_ipython()
        if getattr(shell, "kernel", None) is None:
            self._held = self._tree = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, plus a static ``text/html`` copy for wherever the widget cannot be drawn."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        if (result := self.result) is None:  # let go: the rows and the verdict are all there is
            return {**data, "text/plain": self.summary}, meta
        html = render_static(result, self.static_id)
        self._after_display()
        return {**data, "text/html": html}, meta

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
        if (result := self.result) is None:  # let go: no copy can be drawn, the verdict still can
            display({**data, "text/plain": self.summary}, metadata=meta, raw=True)
            return
        # The copy carries the text too (a terminal, nbconvert to text); the view's own text is empty,
        # not "<DiffView object at 0x...>", where it cannot be drawn (an untrusted reopen, nbconvert).
        static = {"text/html": render_static(result, self.static_id), "text/plain": summary_line(result)}
        display(static, raw=True)
        display({**data, "text/plain": ""}, metadata=meta, raw=True)
        self._after_display()

    def _on_select(self, change: dict[str, Any]) -> None:
        node_id = change["new"]
        if not 0 <= node_id < len(self.nodes):
            return
        # A view that let go still answers from a result the user holds, without holding it again.
        tree = self._tree if self._tree is not None else (build_tree(r) if (r := self._weak()) is not None else None)
        if tree is None:
            self.detail = {"node": self.nodes[node_id], "released": RELEASED, "tensors": [], "stacks": {}}
            return
        # The panel carries the data of its error pictures: the browser draws them with it.
        self.detail = node_detail(tree, node_id)

    def _on_frame(self, change: dict[str, Any]) -> None:
        req = change["new"] or {}
        frames = self.detail.get("stacks", {}).get(req.get("side"), [])
        i = req.get("index", -1)
        if isinstance(i, int) and 0 <= i < len(frames):
            f = frames[i]
            self.source = source_excerpt(f["file"], f["line"], since=f.get("first"))
