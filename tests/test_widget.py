"""The anywidget view through its synced state, as the front end sees it (no browser)."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")
pytest.importorskip("anywidget")

import nbdiff  # noqa: E402
from nbdiff.notebook.widget import DiffView  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _send(view, state):
    """A front-end `update` message, as ipywidgets receives it over the comm."""
    view._handle_msg({"content": {"data": {"method": "update", "state": state, "buffer_paths": []}}, "buffers": []})


@pytest.fixture(scope="module")
def view():
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    return result.show()


def test_opens_on_the_first_divergence_with_its_error_pictures(view):
    state = view.get_state()
    assert "export default" in state["_esm"] and ".nbd-tree" in state["_css"]
    assert state["selected"] == state["first"] >= 0
    detail = state["detail"]
    assert detail["node"]["base"] == "norm"
    # The pictures' data comes with the panel (drawn by the browser): no second message, no PNG.
    picture = detail["picture"]
    assert not picture["passed"] and sum(picture["counts"]) + picture["zeros"] == picture["total"]
    assert "plots" not in state
    assert "FAILED at step 0, forward" in state["summary"]


def test_clicking_a_row_and_a_frame(view):
    fc2 = next(n["id"] for n in view.nodes if n["base"] == "fc2" and n["phase"] == "forward")
    _send(view, {"selected": fc2})
    assert view.detail["node"]["base"] == "fc2"
    frames = view.detail["stacks"]["raw"]
    at = next(i for i, f in enumerate(frames) if f["file"].endswith("models.py"))
    _send(view, {"frame_request": {"side": "raw", "index": at, "nonce": 1}})
    src = view.source
    assert src["kind"] == "file" and src["line"] == frames[at]["line"]
    assert src["first"] <= src["line"] < src["first"] + len(src["lines"])
    assert "self.fc2" in src["lines"][src["line"] - src["first"]]


def test_a_group_row_and_a_bad_request_do_not_break_the_view(view):
    _send(view, {"selected": 0})
    assert view.detail["tensors"] == [] and view.detail["node"]["event"] == -1
    _send(view, {"frame_request": {"side": "raw", "index": 99}})
    _send(view, {"selected": 10**6})
    assert view.detail["node"]["id"] == 0  # unchanged


def test_a_successful_result_opens_on_the_row_closest_to_its_tolerance():
    # Not on `<inputs>`, which agree bit for bit (an empty histogram, a blank map).
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"))
    view = DiffView(result)
    worst = max((n for n in view.nodes if n["event"] >= 0 and n["ratio"] is not None), key=lambda n: n["ratio"])
    assert view.first == -1 and view.selected == worst["id"] and worst["label"] != "<inputs>"
    assert "SUCCESS" in view.summary


def test_the_view_carries_a_static_html_copy_for_where_widgets_cannot_run():
    # Reopened without its kernel, on GitHub, nbviewer or nbconvert, the widget is gone: the answer is not.
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    data, _meta = DiffView(result)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    html = data["text/html"]
    assert "FAILED at step 0, forward" in html and "norm" in html and "<script" not in html
    assert len(html) < 20_000


def test_displayed_the_view_is_two_outputs_a_static_copy_then_the_widget(monkeypatch):
    # The copy is an output of its own, so a notebook reopened in JupyterLab without widget state
    # (trusted: Lab prefers the widget and finds no model) still shows the answer.
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append((obj, kw)))
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    view = DiffView(result)
    view._ipython_display_()
    (copy, kw1), (widget, kw2) = shown
    assert kw1["raw"] and kw2["raw"]
    assert f'data-nbd-static="{view.static_id}"' in copy["text/html"] and "FAILED" in copy["text/html"]
    assert "application/vnd.jupyter.widget-view+json" in widget and "text/html" not in widget
    assert view.static_id and view.static_id != DiffView(result).static_id
    # Where the widget cannot be drawn (untrusted, nbconvert) its text is empty, not "<DiffView object at
    # 0x...>"; the copy carries the verdict as text too (a terminal, nbconvert to text).
    assert widget["text/plain"] == "" and "FAILED at step 0" in copy["text/plain"]


def test_the_static_copy_draws_the_step_chart_without_a_script():
    from nbdiff.view.page import render_static

    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps")
    opts = [
        torch.optim.SGD(tb.parameters(), lr=0.1),
        paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters()),
    ]
    result = nbdiff.auto_diff(tb, pb, inputs("mlp"), optimizers=opts, steps=3)
    html = render_static(result, "abc")
    assert html.count("<polyline") >= 3 and "<script" not in html
    # The SVG holds no text (a sanitizer that strips it leaves nothing behind); the table says the numbers.
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert "<text" not in svg and html.count("<tr>") == 1 + 3 and "0 ◀" in html
    single = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    assert "<svg" not in render_static(single)  # one step: no chart


def _drawing(view, said):
    """A drawing's word from the front end (js/view.js), as ipywidgets receives a custom message."""
    view._handle_msg({"content": {"data": {"method": "custom", "content": {"drawing": said}}}, "buffers": []})


def _failed_result():
    return nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))


def _hide_others(n):
    for _ in range(n):
        other = DiffView(_failed_result())
        _drawing(other, "shown")
        _drawing(other, "gone")


def test_a_view_no_drawing_shows_lets_go_of_a_result_nothing_else_holds():
    # ipywidgets keeps every widget for the kernel's life, and each view held its result: a cell run
    # ten times pinned ten results and their spilled tensors' disk.
    import gc
    import weakref

    from nbdiff.notebook.widget import HIDDEN_KEPT

    view = DiffView(_failed_result())
    gone = weakref.ref(view.result)
    _drawing(view, "shown")
    _drawing(view, "shown")  # a second drawing of the same output (Lab's "new view for output")
    _drawing(view, "gone")
    assert view._held is not None  # one drawing still shows it
    _drawing(view, "gone")
    _hide_others(HIDDEN_KEPT - 1)
    gc.collect()
    assert gone() is not None  # among the last hidden: an output moved and drawn again finds it whole
    _hide_others(1)
    gc.collect()
    assert gone() is None and view.result is None
    fc2 = next(n["id"] for n in view.nodes if n["base"] == "fc2")
    _send(view, {"selected": fc2})
    assert "let go of its result" in view.detail["released"] and view.detail["node"]["base"] == "fc2"
    _drawing(view, "shown")  # drawn again: the rows are there, the panel says why it is empty
    _send(view, {"selected": view.first})
    assert view.detail["released"] and view.nodes[view.first]["base"] == "norm"


def test_a_view_drawn_again_shows_whole_a_result_the_user_still_holds():
    from nbdiff.notebook.widget import HIDDEN_KEPT

    result = _failed_result()
    view = DiffView(result)
    _drawing(view, "shown")
    _drawing(view, "gone")
    _hide_others(HIDDEN_KEPT)
    assert view._held is None and view.result is result
    fc2 = next(n["id"] for n in view.nodes if n["base"] == "fc2" and n["phase"] == "forward")
    _send(view, {"selected": fc2})  # answered from the user's result, which the view does not pin again
    assert "released" not in view.detail and view.detail["tensors"] and view._held is None
    _drawing(view, "shown")
    assert view._held is result


def test_a_view_shown_where_no_browser_can_draw_it_holds_nothing(monkeypatch):
    # IPython in a terminal, or a script: no drawing will ever ask the view anything.
    import gc
    import weakref

    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append(obj))
    view = DiffView(_failed_result())
    gone = weakref.ref(view.result)
    view._ipython_display_()
    gc.collect()
    assert gone() is None
    # Shown again, it still says the verdict (there is no result left to draw a copy from).
    view._ipython_display_()
    assert (
        "FAILED at step 0" in shown[-1]["text/plain"]
        and "FAILED at step 0" in view._repr_mimebundle_()[0]["text/plain"]
    )
