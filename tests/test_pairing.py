"""Pairing by execution order: definition order, one-sided wrappers, substitutions, leftovers."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.align.pairing import pair_forward  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.inputs import split_inputs  # noqa: E402
from nbdiff.trace.structure import forward_structure  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")


def _pairing(base, raw):
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(X, bfw, rfw)
    return pair_forward(forward_structure(bfw, base, bcall, "base"), forward_structure(rfw, raw, rcall, "raw"))


def _paths(pairing):
    return [(p.base.path, p.raw.path) for p in pairing.pairs]


class TorchMLP(torch.nn.Module):
    def __init__(self, act=torch.nn.GELU):
        super().__init__()
        self.act = act()  # defined first
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self, wrap=False):
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Sequential(paddle.nn.Linear(16, 8)) if wrap else paddle.nn.Linear(16, 8)
        self.act = paddle.nn.GELU()  # defined last

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_pairs_follow_execution_not_definition_order():
    pairing = _pairing(TorchMLP(), PaddleMLP())
    assert _paths(pairing) == [("", ""), ("fc1", "fc1"), ("act", "act"), ("fc2", "fc2")]
    assert not pairing.unmatched_base and not pairing.unmatched_raw


def test_a_wrapper_on_one_side_is_left_unpaired_not_fatal():
    pairing = _pairing(TorchMLP(), PaddleMLP(wrap=True))
    assert ("fc2", "fc2.0") in _paths(pairing)
    assert [e.path for e in pairing.unmatched_raw] == ["fc2"]


def test_a_different_class_in_the_same_place_is_paired():
    pairing = _pairing(TorchMLP(act=torch.nn.ReLU), PaddleMLP())
    assert ("act", "act") in _paths(pairing)


def test_nothing_in_common_is_reported_as_unmatched():
    conv = paddle.nn.Sequential(paddle.nn.Conv1D(1, 1, 3))
    bfw, rfw = framework_of(TorchMLP(), "b"), framework_of(conv, "r")
    b = forward_structure(bfw, TorchMLP(), split_inputs(X, bfw, rfw)[0], "base")
    r = forward_structure(rfw, conv, ((paddle.to_tensor(X.reshape(4, 1, 8)),), {}), "raw")
    pairing = pair_forward(b, r)
    assert {e.path for e in pairing.unmatched_base} >= {"fc1", "fc2"}
    assert "0" in {e.path for e in pairing.unmatched_raw}
