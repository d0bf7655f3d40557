"""The step chart of the static copy (no script): an SVG with no text, labelled in HTML around it."""

from nbdiff.view.svg_chart import step_chart_svg

ROWS = [
    {"step": 0, "outputs": 0.1, "loss": None, "gradients": 0.2, "updates": None},
    {"step": 1, "outputs": 0.3, "loss": None, "gradients": 40.0, "updates": 2.0},
    {"step": 2, "outputs": 500.0, "loss": None, "gradients": 1e300, "updates": 3.0},
]


def test_the_static_chart_labels_its_axes_outside_the_svg():
    # The static chart had no axis labels: which steps, which scale, were said only in a line under it.
    html = step_chart_svg(ROWS, first=1)
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert "<text" not in svg  # a sanitizer stripping SVG leaves nothing behind
    top = html[html.index('class="nbd-axis-top"') : html.index("<svg")]
    bottom = html[html.index('class="nbd-axis-bottom"') :].split("</div>")[0]
    assert "1e3 (error / tolerance, log)" in top, top
    assert "1e-1 · step 0" in bottom and "step 2" in bottom, bottom


def test_fewer_than_two_steps_draw_no_chart():
    assert step_chart_svg(ROWS[:1]) == ""
