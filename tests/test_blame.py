"""Blame: every own error in one run (``result.findings``), in order, with and without single_step."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.structure_models import sgd, three_bugs  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")
_DIRECTIONS = [("torch", "paddle"), ("paddle", "torch")]


def _pair(bfw, rfw, bugs):
    torch.manual_seed(0)
    paddle.seed(0)
    return three_bugs(bfw), three_bugs(rfw, bugs)


def _places(result):
    return [(f.phase.value, f.where, f.raw_path, f.parameter) for f in result.findings]


@pytest.mark.parametrize("single_step", [False, True])
@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_forward_backward_and_optimizer_bugs_are_all_findings(bfw, rfw, single_step):
    base, raw = _pair(bfw, rfw, ("eps", "grad"))
    result = nbdiff.auto_diff(base, raw, X, optimizers=[sgd(base), sgd(raw, head_lr=0.2)], single_step=single_step)
    places = _places(result)
    assert ("forward", "layer", "blocks.0.ln", None) in places, result.report()
    assert ("backward", "layer", "blocks.2.act", None) in places, result.report()
    assert ("optimizer", "parameter", "head", "head.weight") in places, result.report()
    assert result.first_divergence == result.findings[0]
    assert result.findings[0].raw_path == "blocks.0.ln" and result.findings[0].why() == ("eps: base 1e-05, raw 0.001")
    # Only the three bugs: no parent blamed for what its sublayer did, no other parameter's update.
    assert {p[2] for p in places} == {"blocks.0.ln", "blocks.2.act", "head"}, result.report()
    assert "Findings: 3 findings" in result.report()


@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_one_count_of_findings_in_the_report_the_headline_the_jumps_and_the_json(bfw, rfw):
    # "4 findings in all" (headline), "Findings (3, ...)" (report), "own error k of 6" (n/p) for one run:
    # a layer seen in forward and backward is one finding of two events, the same everywhere.
    import json

    from nbdiff.view.model import build_tree, summary_line

    base, raw = _pair(bfw, rfw, ("eps", "grad"))
    result = nbdiff.auto_diff(base, raw, X, optimizers=[sgd(base), sgd(raw, head_lr=0.2)])
    counts = json.loads(result.to_json())["counts"]
    said = f"{counts['findings']} findings" + (
        f" ({counts['events']} events)" if counts["events"] != counts["findings"] else ""
    )
    assert counts["findings"] >= 3 and said in summary_line(result) and f"Findings: {said}," in result.report()
    jumps = [n for n in build_tree(result).nodes if n["event"] >= 0 and n["status"] in ("blamed", "local")]
    assert len(jumps) == counts["events"], ([(n["base"], n["phase"]) for n in jumps], counts)


@pytest.mark.parametrize("single_step", [False, True])
@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_a_second_forward_bug_is_an_own_error_not_inherited(bfw, rfw, single_step):
    base, raw = _pair(bfw, rfw, ("eps", "approximate"))
    result = nbdiff.auto_diff(base, raw, X, single_step=single_step)
    forward = [f for f in result.findings if f.phase.value == "forward"]
    assert [f.raw_path for f in forward] == ["blocks.0.ln", "blocks.1.act"], result.report()
    assert forward[1].why().startswith("approximate"), forward[1].why()
    gelu = next(d for d in result.select(0, "forward") if d.base.path == "blocks.1.act")
    assert gelu.local_ratio is not None and gelu.local_ratio > 1  # the view shows it as own ("local")


def test_the_second_own_error_is_shown_as_local_in_the_view():
    from nbdiff.view.model import build_tree

    base, raw = _pair("torch", "paddle", ("eps", "approximate"))
    tree = build_tree(nbdiff.auto_diff(base, raw, X))
    status = {(n["base"], n["phase"]): n["status"] for n in tree.nodes if n["event"] >= 0}
    assert status[("blocks.0.ln", "forward")] == "blamed"
    assert status[("blocks.1.act", "forward")] == "local"


def test_findings_survive_save_and_load(tmp_path):
    base, raw = _pair("torch", "paddle", ("eps", "grad"))
    result = nbdiff.auto_diff(base, raw, X)
    loaded = nbdiff.load(result.save(str(tmp_path / "r")))
    assert [f.describe() for f in loaded.findings] == [f.describe() for f in result.findings]
    assert [f.why() for f in loaded.findings] == [f.why() for f in result.findings]


def test_a_blame_of_a_layers_own_code_says_what_is_known():
    # why() returned "" for a code blame: say that no argument differs and how to name the call.
    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x) * 2)

    class P(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x) * 3)  # the bug, in the root's own code

    result = nbdiff.auto_diff(T(), P(), X)
    d = result.first_divergence
    assert d.where == "between" and d.why().startswith("no constructor argument differs")
    assert "api_level=True" in d.why() and "`fc1` and `fc2`" in d.why()
    assert "why          no constructor argument differs" in result.report()
