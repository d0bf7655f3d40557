"""The standalone HTML report: data embedded, the view's code inline, nothing fetched."""

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def test_report_embeds_the_tree_details_and_view(tmp_path):
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    path = tmp_path / "r.html"
    text = result.to_html(str(path))
    assert path.read_text() == text
    data = json.loads(re.search(r'id="nbd-data">(.*?)</script>', text, re.S).group(1))
    nodes = data["state"]["nodes"]
    first = data["state"]["first"]
    assert nodes[first]["base"] == "norm" and data["state"]["selected"] == first
    assert str(first) in data["details"] and data["plots"][str(first)]["histogram"].startswith("data:image/png")
    assert "function render" in text and "</script>" not in data.__repr__()
    # Offline: no script, stylesheet or image is loaded from anywhere.
    assert not re.search(r'(src|href)="(https?:)?//', text)
