"""Running statistics after every train-mode step, with or without optimizers; framework differences."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402

X = np.random.RandomState(0).randn(2, 3, 4, 4).astype("float32")
_DIRECTIONS = [("torch", "paddle"), ("paddle", "torch")]


def _cnn(fw, momentum_bug=False):
    """Conv, BatchNorm, ReLU, Linear; ``momentum_bug``: the other framework's momentum number copied."""
    if fw == "torch":
        m = 0.9 if momentum_bug else 0.1

        class T(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4, momentum=m)
                self.fc = torch.nn.Linear(64, 3)

            def forward(self, x):
                return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))

        return T()
    m = 0.1 if momentum_bug else 0.9

    class P(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4, momentum=m)
            self.fc = paddle.nn.Linear(64, 3)

        def forward(self, x):
            return self.fc(paddle.nn.functional.relu(self.bn(self.conv(x))).flatten(1))

    return P()


@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_a_momentum_bug_fails_without_optimizers(bfw, rfw):
    # The forward agrees (train mode normalises by the batch); only the running statistics differ.
    result = nbdiff.auto_diff(_cnn(bfw), _cnn(rfw, momentum_bug=True), X)
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.where, d.base_path) == ("state", "state", "bn"), result.report()
    assert "momentum" in d.why()


@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_paddles_biased_running_var_is_a_framework_difference_not_a_failure(bfw, rfw):
    base, raw = _cnn(bfw), _cnn(rfw)
    opts = [
        torch.optim.SGD(m.parameters(), lr=0.1)
        if fw == "torch"
        else paddle.optimizer.SGD(learning_rate=0.1, parameters=m.parameters())
        for fw, m in ((bfw, base), (rfw, raw))
    ]
    result = nbdiff.auto_diff(base, raw, X, optimizers=opts, steps=3)
    assert result, result.report()
    framework = [f for f in result.findings if f.where == "framework"]
    assert [f.step for f in framework] == [0, 1, 2], result.report()
    assert "biased" in framework[0].why() and "framework difference" in result.report()


@pytest.mark.parametrize(("bfw", "rfw"), _DIRECTIONS)
def test_framework_differences_fail_when_asked(bfw, rfw):
    result = nbdiff.auto_diff(_cnn(bfw), _cnn(rfw), X, framework_differences="fail")
    assert not result and result.first_divergence.where == "framework", result.report()


def test_a_framework_difference_is_drawn_as_such_in_the_view():
    from nbdiff.view.model import build_tree

    tree = build_tree(nbdiff.auto_diff(_cnn("torch"), _cnn("paddle"), X))
    assert {n["status"] for n in tree.nodes if n["phase"] == "state" and n["event"] >= 0} == {"framework"}


def test_framework_differences_option_is_checked():
    with pytest.raises(OptionError, match="framework_differences"):
        nbdiff.auto_diff(_cnn("torch"), _cnn("paddle"), X, framework_differences="ignore")


def test_eval_mode_compares_no_state():
    base, raw = _cnn("torch"), _cnn("paddle", momentum_bug=True)
    base.eval()
    raw.eval()
    result = nbdiff.auto_diff(base, raw, X)
    assert result and not result.select(phase="state"), result.report()


@pytest.mark.parametrize("bfw, rfw", _DIRECTIONS)
def test_statistics_of_a_batchnorm_behind_a_bug_are_inherited_not_its_own(bfw, rfw):
    # A conv with other weights feeds bn2 other values: bn2's running statistics differ because of
    # conv2, and were listed as a finding of their own after it.
    from tests.fault_suite.models import BUILDERS, inputs

    base, raw = BUILDERS["cnn"](bfw), BUILDERS["cnn"](rfw, "weight")
    base.train()
    raw.train()
    result = nbdiff.auto_diff(base, raw, inputs("cnn"))
    own = [(f.phase.value, f.base_path) for f in result.findings if f.where != "framework"]
    assert own == [("forward", "conv2"), ("backward", "conv2")]
    assert any(d.base.phase.value == "state" and d.base.path == "bn2" and not d.passed for d in result.events)
