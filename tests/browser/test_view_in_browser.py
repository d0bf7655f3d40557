"""The view in a real browser: JupyterLab 4 and Notebook 7 in headless Chromium.

Render, the first divergence marked, click -> panel, stack frame -> source, replay,
filters, a 10,000-row tree, and no request leaving the machine. Timings are printed
(benchmarks/README.md quotes them), not asserted.
"""

import time
from pathlib import Path

import numpy as np
import pytest

from tests.browser.conftest import REPO
from tests.browser.jupyter import cell, open_notebook, run_cell, write_notebook

SETUP = (
    "%load_ext nbdiff\n"
    "from tests.fault_suite.models import BUILDERS, inputs\n"
    "tb, pb, x = BUILDERS['mlp']('torch'), BUILDERS['mlp']('paddle', 'eps'), inputs('mlp')"
)
VIEW = ".nbd"


NETDEF = """
import torch, paddle


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 1.01
"""


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_a_file_frame_links_into_the_ui_it_runs_in(page, jupyter_server, ui):
    (jupyter_server["root"] / "netdef.py").write_text(NETDEF)
    write_notebook(
        jupyter_server["root"] / f"link_{ui}.ipynb",
        ["%load_ext nbdiff\nimport numpy as np, netdef\nx = np.ones((2, 4), 'float32')\n"
         "tb, pb = netdef.TorchNet(), netdef.PaddleNet()\n%modeldiff tb pb x"],
    )  # fmt: skip
    open_notebook(page, jupyter_server, f"link_{ui}.ipynb", ui)
    run_cell(page, 0, timeout=120_000)
    _show_all(page.locator(VIEW))
    _select_row(page.locator(VIEW), "fc")  # called from netdef.py's forward
    page.locator(f"{VIEW} .nbd-title", has_text="fc").wait_for()
    page.locator(f"{VIEW} .nbd-frame[data-side='base']", has_text="netdef.py").first.click()
    link = page.locator(f"{VIEW} a.nbd-open")
    link.wait_for()
    # JupyterLab opens the file in a tab; Notebook 7 in its own editor, staying in Notebook 7.
    want = "/lab/tree/netdef.py" if ui == "lab" else "/edit/netdef.py"
    assert link.get_attribute("href").endswith(want), link.get_attribute("href")
    assert "at line " in link.inner_text()
    page.locator(f"{VIEW} .nbd-src-here", has_text="return self.fc(x)").wait_for()
    # The notebook cell's own frame shows the cell's source.
    page.locator(f"{VIEW} .nbd-frame", has_text="<module>").first.click()
    page.locator(f"{VIEW} .nbd-src-title", has_text="Cell In [1], line 5").wait_for()
    assert "Cell In [1], line 5" in page.locator(f"{VIEW} .nbd-stack").inner_text()
    assert "ipykernel_launcher" not in page.locator(f"{VIEW} .nbd-stack").inner_text()
    _no_widget_errors(page, jupyter_server)
    # The link opens the file with the cursor on the frame's line: in a Lab tab, or in a new
    # Notebook 7 editor tab.
    page.locator(f"{VIEW} .nbd-frame[data-side='base']", has_text="netdef.py").first.click()
    if ui == "lab":
        link.click()
        editor = page
    else:
        with page.context.expect_page() as opened:
            link.click()
        editor = opened.value
        assert "/edit/netdef.py" in editor.url
    editor.wait_for_function(f"() => ({CURSOR_LINE}) === '        return self.fc(x)'", timeout=30_000)


# The text of the line holding the cursor in the visible file editor (CodeMirror 6 keeps its view on
# the content element: cmTile since 6.39, cmView before).
CURSOR_LINE = """(() => {
    const eds = [...document.querySelectorAll('.cm-content')].filter(c => !c.closest('.jp-Notebook') && c.offsetParent);
    const t = eds.length && (eds[0].cmTile || eds[0].cmView);
    const v = t && (t.view || (t.rootView && t.rootView.view));
    return v ? v.state.doc.lineAt(v.state.selection.main.head).text : null;
})()"""


BLOCK = (
    "%load_ext nbdiff\n"
    "from tests.structure_models import attention_block\n"
    "tb, x = attention_block('torch')\n"
    "pb, _ = attention_block('paddle', wide_scale=True)"
)


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_a_code_blame_opens_on_its_evidence_and_its_lines(page, jupyter_server, ui):
    """The block's own code is blamed (between `qkv` and `proj`): the panel opens on the tensor that
    carries the local error, with both sides' statistics and pictures, by replay and under
    single-step; its first frame opens the lines between the two sublayers, in view."""
    name = f"code_{ui}.ipynb"
    write_notebook(jupyter_server["root"] / name, [BLOCK, "%modeldiff tb pb x", "%modeldiff tb pb x --single-step"])
    open_notebook(page, jupyter_server, name, ui)
    run_cell(page, 0, timeout=120_000)
    for i in (1, 2):
        run_cell(page, i, timeout=120_000)
        view = cell(page, i).locator(VIEW)
        view.locator(".nbd-row.nbd-blamed").wait_for()
        first = view.locator(".nbd-tensor").first
        first.wait_for()
        assert first.get_attribute("data-tensor") == "proj:in[0]"
        # Said as a reader says it ("proj's input"), the recorded name in the title.
        title = first.locator(".nbd-tname")
        assert title.inner_text().startswith("proj's input: "), title.inner_text()
        assert title.get_attribute("title").startswith("proj:in[0] · allowed: ")
        assert "handed `proj`" in first.inner_text() and "not on this side" not in first.inner_text()
        row_local = view.locator(".nbd-row.nbd-blamed").inner_text().split("local ")[1].rstrip(")")
        assert row_local in first.inner_text()  # the row and the panel say the same local error
        view.locator(".nbd-plots svg.nbd-hist").wait_for()
        view.locator(".nbd-plots canvas.nbd-map").wait_for()
    view = cell(page, 1).locator(VIEW)
    if ui == "lab":  # dark theme: each row's text against its tint, at least 4.5:1 (WCAG AA)
        _show_all(view)
        _theme(page, "JupyterLab Dark")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
        page.wait_for_function(
            f"(el) => ({CONTRAST})(el) > 0", arg=view.locator(".nbd-row.nbd-blamed .nbd-base").element_handle()
        )
        ratios = view.locator(".nbd-rows .nbd-row .nbd-base").evaluate_all(
            f"(els) => els.map((el) => [el.closest('.nbd-row').className, ({CONTRAST})(el)])"
        )
        worst = {}
        for cls, ratio in ratios:
            status = next(
                c for c in cls.split() if c.startswith("nbd-") and c not in ("nbd-row", "nbd-selected", "nbd-group")
            )
            worst[status] = min(worst.get(status, 99.0), ratio)
        print(f"\ndark theme, lowest contrast per row status: {worst}")
        assert {"nbd-blamed", "nbd-inherited", "nbd-ok"} <= set(worst) and min(worst.values()) >= 4.5, worst
        _theme(page, "JupyterLab Light")
    view.locator(".nbd-frame[data-side='base']").first.click()
    view.locator(".nbd-src-here", has_text="self.proj(merge(").wait_for()
    assert view.locator(".nbd-src-span", has_text="scores = ").count() == 1
    _wait_inside(page, view, ".nbd-src-here", "pre.nbd-src", "self.proj(merge(")
    _no_widget_errors(page, jupyter_server)


def test_a_step_rows_panel_summarises_the_step_and_jumps_to_its_worst_rows(page, tmp_path):
    path = _eps_report(tmp_path)
    view = _opened(page, path)
    # Which side is which is said where the columns are named (nothing said base is the reference).
    header = view.locator(".nbd-header").inner_text()
    assert "base (reference)" in header and "raw (port)" in header, header
    _select_row(view, "step 0 · backward")
    view.locator(".nbd-step-summary").wait_for()
    assert "loss: base" in view.locator(".nbd-step-summary").inner_text()
    assert view.locator(".nbd-stack-title").count() == 0  # no empty "called from" headings
    view.locator(".nbd-step-summary tr", has_text="backward").locator(".nbd-jump").first.click()
    view.locator(".nbd-title", has_text="step 0 backward").wait_for()
    assert "norm" in view.locator(".nbd-row.nbd-selected").inner_text()
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


def _eps_report(tmp_path):
    """The HTML report of the fault suite's MLP whose port has a wrong LayerNorm eps."""
    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    return Path(result.to_html(str(tmp_path / "report.html")))


def _opened(page, path):
    """The view of an HTML report, once it has drawn its blamed row."""
    page.goto(path.as_uri())
    view = page.locator(VIEW)
    view.locator(".nbd-row.nbd-blamed").wait_for()
    return view


_INSIDE = """([root, inner, text, outer]) => {
    const box = root.querySelector(outer);
    const el = [...root.querySelectorAll(inner)].find((e) => e.textContent.includes(text));
    if (!box || !el) return false;
    const a = el.getBoundingClientRect(), b = box.getBoundingClientRect();
    return a.height > 0 && b.top <= a.top && a.bottom <= b.bottom + 1;
}"""


def _wait_inside(page, view, inner, outer, text=""):
    """Wait until ``view``'s element ``inner`` (the first holding ``text``) is drawn inside its ``outer``
    box. Waited on in the page: rows and panels re-render, and an element found a moment before could
    be gone when its box was read (a clean clone's run read None)."""
    page.wait_for_function(_INSIDE, arg=[view.element_handle(), inner, text, outer])


def _show_all(view):
    """A diverging view opens on the rows with their own error: show every row, to click the others."""
    view.locator(".nbd-filter").select_option("all")


def _select_row(view, text):
    """Click a row until it is the selected one. A click can land on a row that a re-render (a chart
    click's, a panel's) is replacing, and be lost: the test waits on the selection, never on time."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    selected = view.locator(".nbd-row.nbd-selected", has_text=text).first
    for _ in range(30):
        view.locator(".nbd-row", has_text=text).first.click()
        try:
            selected.wait_for(timeout=3_000)
            return
        except PlaywrightTimeout:
            continue
    selected.wait_for()


def _dataset(page, key):
    """A timing the view keeps in its element's dataset (performance.now() in the page)."""
    return page.evaluate(f"() => (document.querySelector('[data-{_kebab(key)}]') || {{dataset: {{}}}}).dataset.{key}")


def _kebab(key):
    return "".join("-" + c.lower() if c.isupper() else c for c in key)


def _no_widget_errors(page, server):
    errors = [m for m in page.console_messages if m.startswith(("error", "pageerror"))]
    # Notebook 7.6 logs "reading 'schema'" on any notebook: only widget errors count.
    assert not [e for e in errors if "widget" in e.lower() or "nbd" in e.lower() or "anywidget" in e.lower()], errors
    off_box = [u for u in page.request_urls if not u.startswith((server["base"], "blob:", "data:"))]
    assert off_box == [], off_box


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_modeldiff_view_click_stack_and_replay(page, jupyter_server, ui):
    name = f"view_{ui}.ipynb"
    write_notebook(
        jupyter_server["root"] / name, [SETUP, "%modeldiff tb pb x", "print(_modeldiff.first_divergence.base_path)"]
    )
    open_notebook(page, jupyter_server, name, ui)
    run_cell(page, 0, timeout=120_000)
    run_cell(page, 1, timeout=120_000)

    blamed = page.locator(f"{VIEW} .nbd-row.nbd-blamed")
    blamed.wait_for(state="visible")
    assert "norm" in blamed.inner_text()
    assert "FAILED at step 0, forward" in page.locator(f"{VIEW} .nbd-summary").inner_text()
    # The static copy (an output of its own, for a reopened notebook) is there but hidden by the live view.
    assert page.locator(".nbd-static").count() == 1 and not page.locator(".nbd-static").is_visible()
    # The panel opens on the first divergence, and its plots follow.
    page.locator(f"{VIEW} .nbd-title", has_text="norm").wait_for()
    page.locator(f"{VIEW} .nbd-plots svg.nbd-hist").first.wait_for()
    page.locator(f"{VIEW} .nbd-plots canvas.nbd-map").first.wait_for()
    # Where each side built the blamed layer: the constructor line, where porting bugs usually are.
    page.locator(f"{VIEW} .nbd-frame[data-side='raw_built']").click()
    page.locator(f"{VIEW} .nbd-src-here", has_text="self.norm = ").wait_for()
    assert "eps" in page.locator(f"{VIEW} .nbd-args").inner_text()

    # The view opened on the rows with their own error (the blamed one and its ancestors): fc2, which
    # inherits norm's error, is hidden until every row is shown.
    assert page.locator(f"{VIEW} .nbd-filter").input_value() == "own"
    assert page.locator(f"{VIEW} .nbd-rows .nbd-row", has_text="fc2").count() == 0
    _show_all(page.locator(VIEW))
    # Click another row: the kernel answers with its tensors.
    row = page.locator(f"{VIEW} .nbd-row", has_text="fc2").first
    t0 = time.perf_counter()
    row.click()
    page.locator(f"{VIEW} .nbd-title", has_text="fc2").wait_for()
    click_s = time.perf_counter() - t0
    page.wait_for_function("() => document.querySelector('[data-nbd-click-ms]')")
    in_page_ms = _dataset(page, "nbdClickMs")
    assert page.locator(f"{VIEW} .nbd-tensor").count() >= 1
    page.wait_for_function("() => document.querySelector('[data-nbd-plot-ms]')")
    plot_ms = _dataset(page, "nbdPlotMs")

    # A stack frame shows the source line, with a link into JupyterLab for files.
    page.locator(f"{VIEW} .nbd-frame[data-side='base']", has_text="models.py").first.click()
    page.locator(f"{VIEW} .nbd-src-here", has_text="self.fc2").wait_for()

    # Replay: the next event becomes the selected row.
    before = page.locator(f"{VIEW} .nbd-replay-label").inner_text()
    page.locator(f"{VIEW} .nbd-btn[title='next event']").click()
    page.wait_for_function(
        "(b) => document.querySelector('.nbd-replay-label').textContent !== b", arg=before, timeout=10_000
    )
    assert page.locator(f"{VIEW} .nbd-row.nbd-selected").count() == 1

    # Status filters: rows with their own error (and their ancestors), then all again, then a name search.
    page.locator(f"{VIEW} .nbd-filter").select_option("own")
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.nbd-rows .nbd-row')].some(r => /nbd-(ok|inherited|none)/.test(r.className) && !r.classList.contains('nbd-group') && !r.textContent.includes('<root>'))"
    )
    assert page.locator(f"{VIEW} .nbd-rows .nbd-row.nbd-blamed").count() == 1
    page.locator(f"{VIEW} .nbd-filter").select_option("all")
    page.locator(f"{VIEW} .nbd-search").fill("fc1")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.nbd-rows .nbd-row')].every(r => r.classList.contains('nbd-group') || /fc1|root/.test(r.textContent))"
    )

    run_cell(page, 2)
    cell(page, 2).locator(".jp-OutputArea-output").filter(has_text="norm").wait_for()
    print(
        f"\n{ui}: view drawn in {_dataset(page, 'nbdRenderMs')} ms; click answered in {in_page_ms} ms in page "
        f"({click_s * 1000:.0f} ms seen by playwright); its plots in {plot_ms} ms"
    )
    _no_widget_errors(page, jupyter_server)


def test_ten_thousand_rows(page, jupyter_server):
    name = "big.ipynb"
    write_notebook(
        jupyter_server["root"] / name,
        [
            "from tests.browser.synthetic import big_result\nr = big_result(10_000)\nimport nbdiff",
            "v = r.show(); v",
        ],
    )
    open_notebook(page, jupyter_server, name, "lab")
    run_cell(page, 0, timeout=120_000)
    t0 = time.perf_counter()
    run_cell(page, 1, wait=False)
    page.locator(f"{VIEW} .nbd-row.nbd-blamed").wait_for(state="visible")
    render_s = time.perf_counter() - t0
    # Virtualised: a handful of rows in the DOM for 10,001 in the tree.
    assert page.locator(f"{VIEW} .nbd-rows .nbd-row").count() < 120
    assert "blocks.666.fc5" in page.locator(f"{VIEW} .nbd-row.nbd-blamed").inner_text()
    _show_all(page.locator(VIEW))
    target = page.locator(f"{VIEW} .nbd-rows .nbd-row", has_text="blocks.666.fc3")
    t0 = time.perf_counter()
    target.click()
    page.locator(f"{VIEW} .nbd-title", has_text="blocks.666.fc3").wait_for()
    click_s = time.perf_counter() - t0
    page.wait_for_function("() => document.querySelector('[data-nbd-click-ms]')")
    print(
        f"\n10,001 rows: view drawn in {_dataset(page, 'nbdRenderMs')} ms in page ({render_s:.2f} s after Shift+Enter, "
        f"kernel work included); click answered in {_dataset(page, 'nbdClickMs')} ms in page "
        f"({click_s * 1000:.0f} ms seen by playwright)"
    )
    _no_widget_errors(page, jupyter_server)


def test_html_report_works_without_a_kernel(page, tmp_path):
    path = _eps_report(tmp_path)
    page.goto(path.as_uri())
    page.locator(f"{VIEW} .nbd-row.nbd-blamed", has_text="norm").wait_for()
    page.locator(f"{VIEW} .nbd-plots svg.nbd-hist").first.wait_for()
    page.locator(f"{VIEW} .nbd-plots canvas.nbd-map").first.wait_for()
    _show_all(page.locator(VIEW))
    _select_row(page.locator(VIEW), "fc2")
    page.locator(f"{VIEW} .nbd-title", has_text="fc2").wait_for()
    # Any row's pictures, drawn in the page from the embedded data (not only the first divergence's).
    assert page.locator(f"{VIEW} .nbd-plots svg.nbd-hist").count() == 1
    assert page.locator(f"{VIEW} .nbd-plots canvas.nbd-map").count() == 1
    # Wide: the tree takes the full width (the panel goes below) and more height.
    narrow = page.locator(f"{VIEW} .nbd-tree").bounding_box()
    page.locator(f"{VIEW} button[title^='wide']").click()
    page.wait_for_function(
        "([sel, w, h]) => { const r = document.querySelector(sel).getBoundingClientRect(); return r.width > 1.5 * w && r.height > h; }",
        arg=[f"{VIEW} .nbd-tree", narrow["width"], narrow["height"]],
    )  # the layout after the click, waited on in the page
    wide = page.locator(f"{VIEW} .nbd-tree").bounding_box()
    assert page.locator(f"{VIEW} .nbd-side").bounding_box()["y"] > wide["y"] + wide["height"] - 1
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]
    assert all(u.startswith(("file:", "data:")) for u in page.request_urls), page.request_urls


def test_an_update_row_shows_both_optimizers_settings(page, tmp_path):
    import paddle
    import torch

    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    opts = [
        torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01),
        paddle.optimizer.AdamW(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.1),
    ]
    result = nbdiff.auto_diff(tb, pb, inputs("mlp"), optimizers=opts, steps=2)
    path = tmp_path / "train.html"
    result.to_html(str(path))
    page.goto(path.as_uri())
    page.locator(f"{VIEW} .nbd-row.nbd-blamed").wait_for()
    page.locator(f"{VIEW} .nbd-row.nbd-blamed").click()
    differs = page.locator(f"{VIEW} .nbd-settings tr.nbd-differs")
    differs.first.wait_for()
    assert differs.count() == 1 and differs.inner_text().split() == ["weight_decay", "0.01", "0.1"]
    assert page.locator(f"{VIEW} .nbd-tname").first.inner_text().startswith("update of ")
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


def test_replay_plays_to_the_next_own_error_and_steps_by_phase(page, tmp_path):
    path = _eps_report(tmp_path)
    page.goto(path.as_uri())
    view = page.locator(VIEW)
    page.locator(f"{VIEW} .nbd-row.nbd-blamed").wait_for()
    page.locator(f"{VIEW} button[title^='first event']").click()
    page.locator(f"{VIEW} .nbd-title", has_text="<inputs>").wait_for()
    page.locator(f"{VIEW} .nbd-play").click()
    page.wait_for_function("() => document.querySelector('[data-nbd-playing=\"0\"]')", timeout=10000)
    assert "norm (LayerNorm)" in page.locator(f"{VIEW} .nbd-title").inner_text()  # stopped at the blamed layer
    page.locator(f"{VIEW} button[title^='start of the next phase']").click()
    page.locator(f"{VIEW} .nbd-replay-label", has_text="step 0 backward").wait_for()
    page.locator(f"{VIEW} button[title^='start of this phase']").click()
    page.locator(f"{VIEW} .nbd-replay-label", has_text="step 0 forward").wait_for()
    assert view.count() == 1
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


AGREE = (
    "%load_ext nbdiff\n"
    "from tests.fault_suite.models import BUILDERS, inputs\n"
    "ta, pa, xa = BUILDERS['mlp']('torch'), BUILDERS['mlp']('paddle'), inputs('mlp')"
)


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_navigation_by_keys_and_divergence_buttons(page, jupyter_server, ui):
    name = f"nav_{ui}.ipynb"
    write_notebook(jupyter_server["root"] / name, [AGREE, "%modeldiff ta pa xa", SETUP, "%modeldiff tb pb x"])
    open_notebook(page, jupyter_server, name, ui)
    for i in range(4):
        run_cell(page, i, timeout=120_000)
    agree, failed = page.locator(VIEW).nth(0), page.locator(VIEW).nth(1)

    # A view with no divergence draws every row on open (the tree is small), none left for a scroll.
    # Notebook 7 windows its cells: bring the first view on screen before reading it.
    agree.scroll_into_view_if_needed()
    agree.locator(".nbd-row", has_text="fc1").first.wait_for()
    total = agree.evaluate("el => el.querySelectorAll('.nbd-rows .nbd-row').length")
    assert total >= 13, total
    assert "backward" in agree.text_content() and agree.locator(".nbd-row.nbd-none").count() >= 1
    # Nothing of its own to compare (the backward root): a dash, and why on hover; not "not compared".
    none_err = agree.locator(".nbd-row.nbd-none .nbd-err").first
    assert none_err.text_content() == "–" and "nothing of its own" in none_err.get_attribute("title")

    # Next divergence jumps to the blamed row; keys move the selection and stay in the view.
    failed.scroll_into_view_if_needed()
    failed.locator(".nbd-row.nbd-blamed").wait_for()
    assert agree.locator(".nbd-filter").input_value() == "all"  # nothing has its own error: every row
    _show_all(failed)
    _select_row(failed, "fc2")
    # From forward fc2, the next own error is the LayerNorm's backward (every finding is reached),
    # and the previous one is the blamed forward row.
    failed.locator(".nbd-btn[title^='next divergence']").click()
    failed.locator(".nbd-row.nbd-selected.nbd-local", has_text="norm").wait_for()
    failed.locator(".nbd-btn[title^='previous divergence']").click()
    failed.locator(".nbd-row.nbd-selected.nbd-blamed").wait_for()
    # The blamed layer's own error, in words a reader says: not "local (same inputs)".
    own = failed.locator(".nbd-tensor .nbd-local").first
    own.wait_for()
    assert own.inner_text().startswith("own error (run alone on base's inputs): "), own.inner_text()
    label = failed.locator(".nbd-replay-label").inner_text()
    assert "step 0 forward" in label, label
    # Which cell is active, by its input (its output, the view's panel, changes as details arrive).
    active = "() => document.querySelector('.jp-Notebook .jp-Cell.jp-mod-active .jp-InputArea')?.innerText"
    active_cell = page.evaluate(active)
    before = failed.locator(".nbd-row.nbd-selected").inner_text()
    # Key to panel, measured in the page (the view keeps it where it keeps a click's time).
    failed.evaluate("(el) => { delete el.parentElement.dataset.nbdClickMs; }")
    page.keyboard.press("ArrowDown")
    page.wait_for_function(
        "([el, b]) => el.querySelector('.nbd-row.nbd-selected')?.innerText !== b",
        arg=[failed.element_handle(), before],
    )
    page.wait_for_function("(el) => el.parentElement.dataset.nbdClickMs", arg=failed.element_handle())
    key_ms = failed.evaluate("(el) => el.parentElement.dataset.nbdClickMs")
    print(f"\n{ui}: key to panel in {key_ms} ms in page")
    page.keyboard.press("ArrowUp")
    failed.locator(".nbd-row.nbd-selected.nbd-blamed").wait_for()
    page.keyboard.press("Enter")
    # Escape leaves the tree, "t" comes back; Tab goes on to the panel's frames, Enter opens one.
    focused = "() => document.activeElement?.className || ''"
    page.keyboard.press("Escape")
    assert "nbd-tree" not in page.evaluate(focused)
    page.keyboard.press("t")
    assert "nbd-tree" in page.evaluate(focused)
    page.keyboard.press("Tab")
    assert "nbd-frame" in page.evaluate(focused), page.evaluate(focused)
    page.keyboard.press("Enter")
    failed.locator(".nbd-src-here").wait_for()
    failed.locator(".nbd-tree").focus()
    # The notebook did not see the keys: same active cell, still in command mode (no editor opened).
    assert active_cell and page.evaluate(active) == active_cell
    assert page.locator(".jp-Notebook.jp-mod-editMode").count() == 0
    # Collapse all, and the collapsed parent of the blamed row carries a mark.
    failed.locator(".nbd-btn[title='collapse all']").click()
    failed.locator(".nbd-holds").first.wait_for()
    failed.locator(".nbd-btn[title='expand all']").click()
    failed.locator(".nbd-row.nbd-blamed").wait_for()
    # Ctrl+S with focus in the view saves the notebook (it was edited: its cells ran), and a second
    # Escape (the first leaves the tree) hands focus back to the notebook, in command mode.
    path = jupyter_server["root"] / name
    assert not _outputs_on_disk(path)  # no autosave (conftest): only a save writes them
    failed.locator(".nbd-tree").focus()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while not _outputs_on_disk(path):
        assert time.monotonic() < deadline, "Ctrl+S in the view did not save the notebook"
        page.wait_for_timeout(200)
    page.keyboard.press("Escape")
    page.keyboard.press("Escape")
    assert page.evaluate("() => !document.activeElement?.closest('.nbd')")
    assert page.evaluate("() => !!document.activeElement?.closest('.jp-Notebook')")
    assert page.locator(".jp-Notebook.jp-mod-commandMode").count() == 1
    _no_widget_errors(page, jupyter_server)


def _outputs_on_disk(path) -> bool:
    """Whether the notebook file holds any cell's outputs (it was saved after the cells ran)."""
    import json

    return any(c.get("outputs") for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def test_step_chart_dark_theme_and_cell_frames(page, jupyter_server):
    import json
    from pathlib import Path

    drift = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "training_drift.ipynb").read_text())
    sources = ["".join(c["source"]) for c in drift["cells"] if c["cell_type"] == "code"][:2]
    write_notebook(jupyter_server["root"] / "drift.ipynb", sources)
    open_notebook(page, jupyter_server, "drift.ipynb", "lab")
    run_cell(page, 0, timeout=120_000)
    run_cell(page, 1, timeout=120_000)
    view = page.locator(VIEW).first
    # One point per step and series; a click opens that step's group row.
    view.locator(".nbd-chart circle").first.wait_for()
    assert view.locator(".nbd-chart circle[data-phase='optimizer']").count() == 6
    view.locator(".nbd-chart circle[data-step='3'][data-phase='forward']").dispatch_event("click")  # points overlap
    view.locator(".nbd-row.nbd-selected", has_text="step 3 · forward").wait_for()
    # No row of step 3 has an error of its own (its layers replay clean on the weights base's updates
    # give): the filter of own errors would hide the step clicked, so it shows every row.
    assert view.locator(".nbd-filter").input_value() == "all"
    # Frames are named by cell, with the line of the user's loop in that cell.
    _show_all(view)
    _select_row(view, "fc1")
    view.locator(".nbd-frame", has_text="Cell In [2], line 5").first.wait_for()
    view.locator(".nbd-frame[data-side='base']", has_text="Cell In [2]").first.click()
    view.locator(".nbd-src-here", has_text="tnet(torch.tensor(x))").wait_for()
    assert view.locator(".nbd-src-line").first.inner_text().endswith("%%modeldiff tnet pnet --out drift")
    # Dark theme: the view follows JupyterLab's colours.
    _theme(page, "JupyterLab Dark")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    light = "el => getComputedStyle(el).color.match(/\\d+/g).slice(0, 3).map(Number).reduce((a, b) => a + b) > 3 * 150"
    page.wait_for_function(f"el => ({light})(el)", arg=view.locator(".nbd-summary").element_handle())
    _theme(page, "JupyterLab Light")
    _no_widget_errors(page, jupyter_server)


# WCAG contrast of an element's text against what is drawn behind it (its and its ancestors' backgrounds,
# translucent tints composed over the first opaque one).
CONTRAST = """(el) => {
    const rgba = (c) => { const v = (c.match(/[\\d.]+/g) || []).map(Number); return v.length === 3 ? [...v, 1] : v; };
    const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3]));
    const lin = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    const lum = (c) => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
    const chain = [];
    for (let p = el; p; p = p.parentElement) chain.unshift(p);
    let bg = [255, 255, 255];
    for (const p of chain) { const c = rgba(getComputedStyle(p).backgroundColor); if (c.length === 4 && c[3] > 0) bg = over(c, bg); }
    const fg = over(rgba(getComputedStyle(el).color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    return (hi + 0.05) / (lo + 0.05);
}"""


def _theme(page, name):
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel", has_text="Theme").first.click()
    page.locator(".lm-Menu-itemLabel", has_text=name).first.click()


@pytest.mark.parametrize("trusted", [False, True])
def test_a_reopened_notebook_shows_the_static_copy_alone(page, jupyter_server, tmp_path, trusted):
    """Run by nbclient (as CI or nbconvert would), saved without widget state, then opened in Lab.
    Untrusted, the view's output read `<DiffView object at 0x...>`; trusted (signed), Lab draws the
    view's output and finds no model: "Error displaying widget: model not found". The copy, with its
    step chart, is the only thing shown."""
    import nbformat
    from nbclient import NotebookClient
    from nbformat.sign import NotebookNotary

    name = f"reopened_{'trusted' if trusted else 'untrusted'}.ipynb"
    path = jupyter_server["root"] / name
    opts = (
        "import torch, paddle\n"
        "topt = torch.optim.SGD(tb.parameters(), lr=0.1)\n"
        "popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters())"
    )
    write_notebook(path, [SETUP + "\n" + opts, "%modeldiff tb pb x --steps 2 --opt topt popt"])
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    nb.metadata.pop("widgets", None)  # Lab 4 saves no widget state unless asked to
    if trusted:
        NotebookNotary().sign(nb)  # what Lab does when it saves a notebook it ran
    nbformat.write(nb, path)
    open_notebook(page, jupyter_server, name, "lab")
    static = page.locator(".nbd-static")
    static.wait_for()
    assert "FAILED at step 0, forward" in static.inner_text() and "norm" in static.inner_text()
    # The step chart, drawn without a script (trusted), and its table (any renderer).
    assert static.locator("svg polyline").count() >= (1 if trusted else 0)
    assert "updates" in static.locator("table").inner_text() and "1e" not in static.locator("table").inner_text()
    if trusted:  # Lab draws the view's output, finds no model, and says so: hidden behind the copy
        lost = cell(page, 1).locator(".jp-OutputArea-output", has_text="Error displaying widget")
        lost.wait_for(state="attached")
        assert not lost.is_visible()
    text = cell(page, 1).locator(".jp-Cell-outputArea").inner_text()
    assert "Error displaying widget" not in text and "DiffView object" not in text, text
    assert text.count("FAILED at step 0") == 1, text  # the copy's headline alone: no <DiffResult ...> line above it


def test_a_notebook_saved_and_reopened_in_the_same_lab_still_shows_the_answer(page, jupyter_server):
    # Trusted (Lab signed it when saving), so Lab renders the widget output and finds no model: the
    # static copy, an output of its own, is what shows the answer.
    write_notebook(jupyter_server["root"] / "saved.ipynb", [SETUP, "%modeldiff tb pb x"])
    open_notebook(page, jupyter_server, "saved.ipynb", "lab")
    run_cell(page, 0, timeout=120_000)
    run_cell(page, 1, timeout=120_000)
    page.locator(f"{VIEW} .nbd-row.nbd-blamed").wait_for(state="visible")
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1500)
    import json

    saved = json.loads((jupyter_server["root"] / "saved.ipynb").read_text())
    assert any("nbd-static" in "".join(o.get("data", {}).get("text/html", "")) for o in saved["cells"][1]["outputs"])
    page.reload()
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="visible")
    # The kernel still runs: Lab may restore the live view from it (then the static copy stays
    # hidden), or find no model and show the static copy. Either shows the answer; which one
    # depends on when the kernel's widget state arrives (this test once waited for the static
    # copy while the live view came back).
    shown = page.locator(f".nbd-static:visible, {VIEW} .nbd-summary:visible").first
    shown.wait_for(state="visible", timeout=30_000)
    assert "FAILED at step 0, forward" in shown.inner_text()


def _trained_report(tmp_path, steps=3):
    """A port whose weight decay differs: every parameter's update has its own error, step after step."""
    import paddle
    import torch

    import nbdiff
    from tests.fault_suite.models import BUILDERS, inputs

    tb, pb = BUILDERS["cnn"]("torch"), BUILDERS["cnn"]("paddle")
    opts = [
        torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01),
        paddle.optimizer.AdamW(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.1),
    ]
    result = nbdiff.auto_diff(tb, pb, inputs("cnn"), optimizers=opts, steps=steps)
    path = tmp_path / "trained.html"
    result.to_html(str(path))
    return result, path


def _focused(page):
    return page.evaluate(
        "() => { const a = document.activeElement; return a ? (a.className.baseVal ?? a.className) + '|' + (a.getAttribute('title') || a.dataset.step || '') : ''; }"
    )


def test_keyboard_alone_reaches_the_chart_the_tree_a_frame_and_their_answers(page, tmp_path):
    result, path = _trained_report(tmp_path)
    view = _opened(page, path)
    # Few Tab stops: a chart point, the filter, the search, the toolbar (one stop), the slider, the tree.
    page.locator("body").click(position={"x": 1, "y": 1})
    tabs = 0
    while "nbd-tree" not in _focused(page):
        page.keyboard.press("Tab")
        tabs += 1
        assert tabs <= 8, f"{tabs} Tabs and the tree is not reached ({_focused(page)})"
    print(f"\n{tabs} Tabs from the page to the tree")
    # Escape leaves the tree; "t" comes back to it.
    page.keyboard.press("Escape")
    assert "nbd-tree" not in _focused(page)
    page.keyboard.press("t")
    assert "nbd-tree" in _focused(page)
    # The chart's points: one Tab stop, arrows move along the steps, Enter selects that step's row.
    view.locator(".nbd-point[tabindex='0']").focus()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    assert "nbd-point" in _focused(page)
    step = page.evaluate("() => document.activeElement.dataset.step")
    phase = page.evaluate("() => document.activeElement.dataset.phase")
    page.keyboard.press("Enter")
    view.locator(".nbd-row.nbd-selected.nbd-group", has_text=f"step {step} · {phase}").wait_for()
    view.locator(".nbd-step-summary").wait_for()
    # n: the next own error, and where it is among them ("k of N").
    page.keyboard.press("t")
    page.keyboard.press("n")
    own = sum(1 for f in result.findings if f.where not in ("framework", "accumulated"))
    view.locator(".nbd-jump-label", has_text=f" of {own}").wait_for()
    # A stack frame, by keyboard: Tab to it, Enter opens its source.
    view.locator(".nbd-frame").first.focus()
    # Its focus outline stays within it: it crossed the next frame's text.
    spill = page.evaluate(
        """() => { const e = document.activeElement, s = getComputedStyle(e);
                   return parseFloat(s.outlineOffset) + parseFloat(s.outlineWidth); }"""
    )
    assert spill <= 0, spill
    page.keyboard.press("Enter")
    view.locator(".nbd-src-here").wait_for()
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


def test_folding_search_and_empty_filters_say_what_they_did(page, tmp_path):
    result, path = _trained_report(tmp_path)
    view = _opened(page, path)
    count = lambda: view.locator(".nbd-rows .nbd-row").count()  # noqa: E731
    # Under the default "own error" filter, a fold folds (it did nothing).
    assert view.locator(".nbd-filter").input_value() == "own"
    group = view.locator(".nbd-row.nbd-group", has_text="step 0 · optimizer")
    before = count()
    group.locator(".nbd-twisty").click()
    page.wait_for_function("(n) => document.querySelectorAll('.nbd-rows .nbd-row').length < n", arg=before)
    # Collapse all folds the phases too: only the step and phase rows are left.
    _show_all(view)
    view.locator(".nbd-btn[title='collapse all']").click()
    groups = sum(1 for _ in {(d.base.step, d.base.phase) for d in result.events})
    page.wait_for_function(f"() => document.querySelectorAll('.nbd-rows .nbd-row').length <= {groups}")
    # Expand all keeps the selected row in view.
    view.locator(".nbd-btn[title='expand all']").click()
    _wait_inside(page, view, ".nbd-row.nbd-selected", ".nbd-scroll")
    # A search scrolls to its first match: the last step's fc update is far down the tree.
    view.locator(".nbd-scroll").evaluate("el => el.scrollTop = 0")
    view.locator(".nbd-search").fill("Linear")
    hit = view.locator(".nbd-rows .nbd-row:not(.nbd-group)", has_text="Linear").first
    hit.wait_for()
    # A filter and a search that match nothing say so, and offer every row back.
    view.locator(".nbd-search").fill("no such layer")
    view.locator(".nbd-empty", has_text='the search "no such layer"').wait_for()
    view.locator(".nbd-empty button").click()
    view.locator(".nbd-rows .nbd-row.nbd-blamed").wait_for()
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


def test_play_reaches_a_far_own_error_quickly_and_icons_are_drawn(page, tmp_path):
    _, path = _trained_report(tmp_path)
    view = _opened(page, path)
    # ⓘ and ⏵ are SVG, drawn whatever the fonts.
    assert view.locator(".nbd-play svg").count() == 1 and view.locator(".nbd-legend svg").count() == 1
    view.locator("button[title^='first event']").click()
    view.locator(".nbd-play").click()
    page.wait_for_function("() => document.querySelector('[data-nbd-playing=\"0\"]')", timeout=30_000)
    play_ms = int(_dataset(page, "nbdPlayMs"))
    print(f"\nplay: {play_ms} ms per event to the next own error")
    assert play_ms < 350  # the first own error is dozens of events away
    assert view.locator(".nbd-row.nbd-selected.nbd-blamed, .nbd-row.nbd-selected.nbd-local").count() == 1


@pytest.mark.parametrize("width", [1024, 700])
def test_a_narrow_view_keeps_names_whole_columns_aligned_and_the_panel_unclipped(page, tmp_path, width):
    """At 1024 px with JupyterLab's file browser open (about 700 px for the output), names were cut
    (`norm L…`), the panel's right columns clipped, and the raw column moved row to row."""
    path = _eps_report(tmp_path)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(path.as_uri())
    view = page.locator(VIEW)
    view.locator(".nbd-plots svg.nbd-hist").wait_for()
    _show_all(view)
    lefts = view.locator(".nbd-rows .nbd-row:not(.nbd-group) .nbd-raw").evaluate_all(
        "(els) => els.map((e) => Math.round(e.getBoundingClientRect().left))"
    )
    assert len(lefts) > 5 and len(set(lefts)) == 1, lefts
    cut = view.locator(".nbd-rows .nbd-row .nbd-base").evaluate_all(
        "(els) => els.filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent)"
    )
    assert cut == [], cut
    side = view.locator(".nbd-side").evaluate("(e) => [e.scrollWidth, e.clientWidth, e.getBoundingClientRect().right]")
    assert side[0] <= side[1] + 1 and side[2] <= width, side
    # No number breaks across lines ("1.13e-" above "4"), however narrow the panel: it scrolls instead.
    page.add_style_tag(content=".nbd-side { flex: 0 0 250px !important; width: 250px !important; }")
    broken = view.locator(".nbd-metrics td, .nbd-stats td").evaluate_all(
        """(els) => els.filter((e) => {
            const r = document.createRange(); r.selectNodeContents(e);
            return /^-?[0-9.]+(e[-+][0-9]+)?$/.test(e.textContent.trim()) && r.getClientRects().length > 1;
        }).map((e) => e.textContent)"""
    )
    assert broken == [], broken


def test_the_blamed_rows_error_is_never_cut(page, tmp_path):
    # "◀ 6.67e+4 (local 6.67e+4)" in bold was cut to "◀ 6.67e+4 (local 6.6…" by a 21ch column.
    from tests.browser.synthetic import big_result

    path = Path(big_result(60, bad=25, shift=10.0).to_html(str(tmp_path / "report.html")))
    page.set_viewport_size({"width": 1024, "height": 900})
    view = _opened(page, path)
    text = view.locator(".nbd-row.nbd-blamed .nbd-err").inner_text()
    assert "e+" in text and "local" in text, text
    cut = view.locator(".nbd-rows .nbd-row .nbd-err").evaluate_all(
        "(els) => els.filter((e) => e.scrollWidth > e.clientWidth).map((e) => e.textContent)"
    )
    assert cut == [], cut


LONG_LOOP = """%%modeldiff tb pb
import torch, paddle
topt = torch.optim.SGD(tb.parameters(), lr=0.01)
popt = paddle.optimizer.SGD(learning_rate=0.01, parameters=pb.parameters())
for i in range(10**6):
    tb(torch.tensor(x)).mean().backward(); topt.step(); topt.zero_grad()
    pb(paddle.to_tensor(x)).mean().backward(); popt.step(); popt.clear_grad()
    if i == 4:
        print("five steps done", flush=True)
"""


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_an_interrupted_loop_shows_the_steps_it_completed(page, jupyter_server, ui):
    name = f"interrupt_{ui}.ipynb"
    write_notebook(jupyter_server["root"] / name, [SETUP, LONG_LOOP])
    open_notebook(page, jupyter_server, name, ui)
    run_cell(page, 0, timeout=120_000)
    run_cell(page, 1, wait=False)
    cell(page, 1).locator(".jp-OutputArea-output", has_text="five steps done").wait_for(timeout=120_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text="Interrupt Kernel").first.click()
    view = cell(page, 1).locator(VIEW)
    view.locator(".nbd-row.nbd-blamed", has_text="norm").wait_for(timeout=120_000)
    summary = view.locator(".nbd-summary").inner_text()
    assert "FAILED at step 0, forward" in summary, summary
    assert view.locator(".nbd-chart circle").count() >= 5 * 2  # every completed step is on the chart
    # A step picked from the chart by keyboard alone.
    view.locator(".nbd-point[tabindex='0']").focus()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    step = page.evaluate("() => document.activeElement.dataset.step")
    phase = page.evaluate("() => document.activeElement.dataset.phase")
    page.keyboard.press("Enter")
    view.locator(".nbd-row.nbd-selected", has_text=f"step {step} · {phase}").wait_for()
    # What was compared is said before the view (under it, a long view hid it), and the cell still fails.
    said = cell(page, 1).locator(".jp-OutputArea-output", has_text="both models completed were compared (below")
    said.wait_for()
    assert said.bounding_box()["y"] < view.bounding_box()["y"]
    cell(page, 1).locator(".jp-OutputArea-output", has_text="KeyboardInterrupt: the cell was interrupted").wait_for()
    _no_widget_errors(page, jupyter_server)


def test_a_long_watch_opens_its_first_failing_step_and_says_what_a_summarised_step_holds(page, tmp_path):
    # 60 watched steps, the bug from step 30: clicking step 30 or 40 on the chart did nothing (only the
    # first 4 steps were kept), and nothing said why. The steps around the first failing one are kept; a
    # summarised one shows its worst errors and how to keep it; the arrows go step by step along a series.
    import torch

    import nbdiff
    from tests.test_watching import _deep, _train

    base, raw = _deep("torch", 3), _deep("torch", 3)
    late = {"on": False}  # a code path the loop reaches from step 30 on
    inner = raw[2].forward
    raw[2].forward = lambda x: inner(x) * (1.01 if late["on"] else 1.0)
    torch.manual_seed(0)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([("torch", base), ("torch", raw)], 60, before_step=lambda k: late.update(on=k >= 30))
    assert w.result.first_divergence.step == 30, w.result.report()
    path = tmp_path / "long.html"
    w.result.to_html(str(path))
    view = _opened(page, path)
    point = lambda step, series: view.locator(f".nbd-point[data-step='{step}'][data-series='{series}']")  # noqa: E731
    # The first failing step, and the two before it, open their rows.
    for step in (30, 28):
        point(step, "outputs").dispatch_event("click")
        view.locator(".nbd-row.nbd-selected.nbd-group", has_text=f"step {step} · forward").wait_for()
        view.locator(".nbd-step-summary").wait_for()
    # A summarised step: its worst errors, and how to open it.
    point(40, "gradients").dispatch_event("click")
    view.locator(".nbd-title", has_text="step 40 · summarised").wait_for()
    said = view.locator(".nbd-panel").inner_text()
    assert "keep_steps=41" in said and "gradients" in said and "model outputs" in said, said
    # Keys: → is the next step of the same series, ↓ another series at that step, Enter opens it.
    point(30, "outputs").focus()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => [document.activeElement.dataset.step, document.activeElement.dataset.series]") == [
        "31",
        "outputs",
    ]
    page.keyboard.press("ArrowDown")
    assert page.evaluate("() => [document.activeElement.dataset.step, document.activeElement.dataset.series]") == [
        "31",
        "gradients",
    ]
    page.keyboard.press("Enter")
    view.locator(".nbd-row.nbd-selected.nbd-group", has_text="step 31 · backward").wait_for()
    assert not [m for m in page.console_messages if m.startswith(("error", "pageerror"))]


def test_the_filter_lists_only_what_some_row_is(page, tmp_path):
    # "framework difference", "explained", "unpaired" were listed in a run with no such row: choosing one
    # emptied the tree.
    view = _opened(page, _eps_report(tmp_path))
    listed = view.locator(".nbd-filter option").evaluate_all("(os) => os.map((o) => o.value)")
    assert listed[:2] == ["all", "own"] and "framework" not in listed and "unpaired" not in listed, listed
    for value in listed[2:]:
        view.locator(".nbd-filter").select_option(value)
        view.locator(".nbd-rows .nbd-row").first.wait_for()


_TWISTY_OVERLAPS = """(root) => [...root.querySelectorAll('.nbd-row .nbd-twisty')].filter((t) => t.textContent.trim()).map((t) => {
    const glyph = document.createRange(), name = document.createRange();
    glyph.selectNodeContents(t);
    name.selectNodeContents(t.nextSibling);
    const g = glyph.getBoundingClientRect(), n = name.getBoundingClientRect();
    return [t.nextSibling.textContent, g.right - n.left];
}).filter(([, over]) => over > 0.5)"""


def test_the_fold_twisty_is_drawn_before_the_name_not_over_it(page, tmp_path):
    # The row's indent (text-indent) was inherited by the twisty's inline-block: "◂root>", "blo▾ck".
    _, path = _trained_report(tmp_path)
    view = _opened(page, path)
    _show_all(view)
    view.locator(".nbd-row .nbd-twisty", has_text="▾").first.wait_for()
    assert view.evaluate(_TWISTY_OVERLAPS) == []


@pytest.mark.parametrize("width", [1024, 700])
def test_a_long_source_line_reads_whole_in_the_source_box(page, tmp_path, width):
    # A line longer than the panel was cut at its edge; its scrollbar sat at the bottom of the box, below
    # the fold. Lines wrap under their own start instead, past their number.
    import nbdiff
    from tests.browser.ports import PaddleLong, TorchLong

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    path = Path(nbdiff.auto_diff(TorchLong(), PaddleLong(), x).to_html(str(tmp_path / "report.html")))
    page.set_viewport_size({"width": width, "height": 900})
    view = _opened(page, path)
    view.locator(".nbd-row.nbd-blamed").first.click()
    view.locator(".nbd-frame", has_text="ports.py").first.click()
    view.locator(".nbd-src-here").wait_for()
    box = view.locator(".nbd-src").evaluate("(e) => [e.scrollWidth, e.clientWidth]")
    assert box[0] <= box[1] + 1, box  # nothing to scroll to: every line is in the box
    ends = view.locator(".nbd-src-line", has_text="END_OF_LINE").evaluate_all(
        """(els) => els.map((e) => { const b = e.closest('.nbd-src').getBoundingClientRect(),
                                       r = e.getBoundingClientRect(); return [r.right <= b.right + 1, e.getClientRects().length]; })"""
    )
    assert ends and all(inside for inside, _ in ends), ends
    # The numbers stay in one column, wrapped lines or not, and a wrapped line goes on past its number.
    lefts = view.locator(".nbd-src .nbd-lineno").evaluate_all(
        "(els) => els.map((e) => Math.round(e.getBoundingClientRect().left))"
    )
    assert len(set(lefts)) == 1, lefts
    wrapped = view.locator(".nbd-src-line", has_text="hidden_states_after_the_first_projection").first.evaluate(
        """(e) => { const r = document.createRange(); r.selectNodeContents(e.lastChild);
                    const rects = [...r.getClientRects()], n = e.querySelector('.nbd-lineno').getBoundingClientRect();
                    return [rects.length, Math.min(...rects.map((q) => q.left)) >= n.right - 1]; }"""
    )
    assert wrapped[0] > 1 and wrapped[1], wrapped


@pytest.mark.parametrize(
    "fill,says", [(-1e9, "equal on both sides (20 of them masked alike"), (-1e3, "cyan: 20 NaN/Inf apart")]
)
def test_the_error_map_says_what_it_leaves_out_of_its_range(page, tmp_path, fill, says):
    # -inf against -1e9 is one mask: no error, as the comparison says (the map drew every masked cell as
    # NaN/Inf). -inf against -1e3 is not: the map's range covers no finite difference, and says so.
    import nbdiff
    from tests.browser.ports import Masked

    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    result = nbdiff.auto_diff(Masked(float("-inf")), Masked(fill), x, api_level=True)
    page.goto(Path(result.to_html(str(tmp_path / "report.html"))).as_uri())
    view = page.locator(VIEW)
    _show_all(view)
    view.locator(".nbd-row", has_text="::masked_fill").first.click()
    label = view.locator(".nbd-mapbox .nbd-axis-html, .nbd-same")
    label.wait_for()
    text = label.text_content()
    assert says in text, text
    if fill == -1e3:
        assert "no finite difference" in text, text


@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_a_cell_run_again_lets_go_of_the_result_its_old_view_held(page, jupyter_server, ui):
    # ipywidgets keeps every widget for the kernel's life, and each view held its result: a %%modeldiff
    # cell run ten times pinned ten results (and their spilled tensors' disk) until the kernel died.
    from nbdiff.notebook.widget import HIDDEN_KEPT

    name = f"rerun_{ui}.ipynb"
    again = (
        "r = nbdiff.auto_diff(tb, pb, x)\n"
        "refs.append(weakref.ref(r))\n"
        "display(r.show())\n"
        "del r, _"  # the view alone holds it
    )
    check = "import gc; gc.collect(); print('alive', ''.join('1' if ref() is not None else '0' for ref in refs))"
    write_notebook(jupyter_server["root"] / name, [SETUP + "\nimport weakref, nbdiff\nrefs = []", again, check])
    open_notebook(page, jupyter_server, name, ui)
    run_cell(page, 0, timeout=120_000)
    runs = HIDDEN_KEPT + 2
    for _ in range(runs):
        run_cell(page, 1, timeout=120_000)
        cell(page, 1).locator(f"{VIEW} .nbd-row.nbd-blamed").wait_for()
    run_cell(page, 2, timeout=120_000)
    said = cell(page, 2).locator(".jp-OutputArea-output", has_text="alive").inner_text()
    # The first view's result went; the last HIDDEN_KEPT hidden ones stay for a drawing back soon.
    assert said.split()[-1] == "0" + "1" * (runs - 1), said
    view = cell(page, 1).locator(VIEW)
    _show_all(view)
    _select_row(view, "fc2")
    view.locator(".nbd-panel .nbd-title", has_text="fc2").wait_for()
    view.locator(".nbd-panel table").first.wait_for()  # the one drawn still holds its result whole
    assert view.locator(".nbd-released").count() == 0
    _no_widget_errors(page, jupyter_server)
