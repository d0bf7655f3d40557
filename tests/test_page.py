"""The standalone HTML report: data embedded, the view's code inline, nothing fetched."""

import json
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def test_report_embeds_the_tree_details_and_view(tmp_path):
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    path = tmp_path / "r.html"
    # Written to the path, which is what comes back (a cell's last line must not print megabytes).
    assert result.to_html(str(path)) == str(path)
    text = path.read_text()
    assert text == result.to_html()
    data = json.loads(re.search(r'id="nbd-data">(.*?)</script>', text, re.S).group(1))
    nodes = data["state"]["nodes"]
    first = data["state"]["first"]
    assert nodes[first]["base"] == "norm" and data["state"]["selected"] == first
    # Every row with values carries its error pictures' data, not only the first divergence.
    assert data["details"][str(first)]["picture"]["counts"]
    fc1 = next(n["id"] for n in nodes if n["base"] == "fc1" and n["phase"] == "forward")
    assert data["details"][str(fc1)]["picture"]["passed"]
    # The JSON parsed whole: a "</script>" in embedded source (this very file has one) did not end it early.
    assert "function render" in text
    # The source around each user frame is embedded, so the report reads the same on another machine.
    frame = data["details"][str(first)]["stacks"]["base"][0]
    src = data["sources"][f"{frame['file']}:{frame['line']}"]
    assert src["kind"] in ("file", "cell") and any(src["lines"])
    # Offline: no script, stylesheet or image is loaded from anywhere.
    assert not re.search(r'(src|href)="(https?:)?//', text)


def test_hostile_layer_names_cannot_break_out_of_the_data_block():
    # A layer named "<!--<script>" blanked the report: only "</" was escaped in the JSON block.
    import copy

    torch = pytest.importorskip("torch")
    base = torch.nn.Sequential()
    base.add_module("<!--<script>", torch.nn.Linear(4, 4))
    base.add_module("a&b</script>", torch.nn.Linear(4, 4))
    raw = copy.deepcopy(base)
    with torch.no_grad():
        raw[1].bias += 1
    x = np.ones((2, 4), "float32")
    text = nbdiff.auto_diff(base, raw, x).to_html()
    block = re.search(r'id="nbd-data">(.*?)</script>', text, re.S).group(1)
    assert "<" not in block and "&" not in block
    names = {n["base"] for n in json.loads(block)["state"]["nodes"]}
    assert {"<!--<script>", "a&b</script>"} <= names
