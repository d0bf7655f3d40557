"""The blame names the differing arguments; differing arguments with agreeing outputs are warnings."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402


def _net(fw, eps=1e-5, approximate=False, p=0.1):
    nn = torch.nn if fw == "torch" else paddle.nn
    base = nn.Module if fw == "torch" else nn.Layer

    class Net(base):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.norm = nn.LayerNorm(8, eps=eps) if fw == "torch" else nn.LayerNorm(8, epsilon=eps)
            self.act = nn.GELU(approximate="tanh" if approximate else "none") if fw == "torch" else nn.GELU(approximate)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            return self.drop(self.act(self.norm(self.fc(x))))

    return Net()


X = np.random.RandomState(0).randn(4, 8).astype("float32")


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
@pytest.mark.parametrize(
    "bug, path, why",
    [
        (dict(eps=1e-3), "norm", "eps: base 1e-05, raw 0.001"),
        (dict(approximate=True), "act", "approximate: base False, raw True"),
    ],
)
def test_the_blame_names_the_argument(base_fw, raw_fw, bug, path, why):
    result = nbdiff.auto_diff(_net(base_fw), _net(raw_fw, **bug), X)
    d = result.first_divergence
    assert d.base_path == path and d.why() == why, result.report()
    assert f"why          arguments differ: {why}" in result.report()
    built = result.report().split("Built at:")[1].splitlines()[1:3]
    assert all(f"self.{path} = " in open(__file__).read().splitlines()[int(b.split("line ")[1].split(",")[0]) - 1]
               for b in built), built  # fmt: skip
    from nbdiff.view.model import build_tree, node_detail, summary_line

    assert why in summary_line(result)
    tree = build_tree(result)
    assert node_detail(tree, tree.first)["arguments"][0]["name"] == why.split(":")[0]


def test_arguments_that_change_nothing_are_a_warning_not_a_failure():
    # Dropout is off while nbdiff compares: its p cannot move the outputs.
    result = nbdiff.auto_diff(_net("torch"), _net("paddle", p=0.3), X)
    assert result, result.report()
    assert any("`drop` ~ raw `drop` differ in dropout p: base 0.1, raw 0.3" in w for w in result.warnings)
