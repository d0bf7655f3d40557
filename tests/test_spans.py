"""Containers pair only as spans: blocks whose insides differ pair leaf by leaf, both directions."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.align.pairing import pair_forward  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.inputs import split_inputs  # noqa: E402
from nbdiff.trace.structure import forward_structure  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")
IMAGES = np.random.RandomState(0).randn(2, 3, 8, 8).astype("float32")


def _paths(base, raw, x=X):
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(x, bfw, rfw)
    pairing = pair_forward(forward_structure(bfw, base, bcall, "base"), forward_structure(rfw, raw, rcall, "raw"))
    return {p.base.path: p.raw.path for p in pairing.pairs}


# transformers' BERT: the attention block holds its output projection, residual and LayerNorm.
class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x + self.out(torch.tanh(self.proj(x))))


class TorchLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = TorchAttention()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.attention(x))


# paddle's encoder layer: ``self_attn`` ends at its output projection; the norm is the layer's.
class PaddleAttention(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(8, 8)
        self.out = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.out(paddle.tanh(self.proj(x)))


class PaddleLayer(paddle.nn.Layer):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.self_attn = PaddleAttention()
        self.norm1 = paddle.nn.LayerNorm(8, epsilon=eps)
        self.fc = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.norm1(x + self.self_attn(x)))


def _both(eps=1e-5):
    torch.manual_seed(0)
    paddle.seed(0)
    return TorchLayer(), PaddleLayer(eps)


@pytest.mark.parametrize("reverse", [False, True], ids=["torch base", "paddle base"])
def test_blocks_of_other_spans_pair_their_leaves_not_each_other(reverse):
    base, raw = _both()
    pairs = {
        "attention.proj": "self_attn.proj",
        "attention.out": "self_attn.out",
        "attention.norm": "norm1",
        "fc": "fc",
    }
    if reverse:
        base, raw, pairs = raw, base, {v: k for k, v in pairs.items()}
    found = _paths(base, raw)
    assert {k: found.get(k) for k in pairs} == pairs
    assert "attention" not in found and "self_attn" not in found  # both ends of the blocks differ
    assert nbdiff.auto_diff(base, raw, X), "an equivalent pair"


@pytest.mark.parametrize("reverse", [False, True], ids=["torch base", "paddle base"])
def test_a_bug_inside_blocks_of_other_spans_is_blamed_on_its_leaf(reverse):
    base, raw = _both(eps=1e-3)
    if reverse:
        base, raw = raw, base
    d = nbdiff.auto_diff(base, raw, X).first_divergence
    assert d is not None
    assert (d.phase.value, d.base_path, d.raw_path) == (
        ("forward", "norm1", "attention.norm") if reverse else ("forward", "attention.norm", "norm1")
    )


# torchvision's BasicConv2d: conv, norm and ReLU in a wrapper holding no tensors of its own.
class BasicConv2d(torch.nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(cout)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class TorchStem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = BasicConv2d(3, 4)
        self.conv2 = BasicConv2d(4, 4)

    def forward(self, x):
        return self.conv2(self.conv1(x)).mean((2, 3))


class PaddleStem(paddle.nn.Layer):
    """The same stem with bare layers, named as the wrappers were."""

    def __init__(self):
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(3, 4, 3, padding=1, bias_attr=False)
        self.bn1 = paddle.nn.BatchNorm2D(4)
        self.conv2 = paddle.nn.Conv2D(4, 4, 3, padding=1, bias_attr=False)
        self.bn2 = paddle.nn.BatchNorm2D(4)

    def forward(self, x):
        x = paddle.nn.functional.relu(self.bn1(self.conv1(x)))
        return paddle.nn.functional.relu(self.bn2(self.conv2(x))).mean((2, 3))


@pytest.mark.parametrize("reverse", [False, True], ids=["torch base", "paddle base"])
def test_a_wrapper_holding_no_tensors_never_pairs_with_a_bare_layer(reverse):
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = TorchStem(), PaddleStem()
    pairs = {"conv1.conv": "conv1", "conv1.bn": "bn1", "conv2.conv": "conv2", "conv2.bn": "bn2"}
    if reverse:
        base, raw, pairs = raw, base, {v: k for k, v in pairs.items()}
    found = _paths(base, raw, IMAGES)
    assert {k: found.get(k) for k in pairs} == pairs
    assert nbdiff.auto_diff(base, raw, IMAGES), "an equivalent pair: the weight copy must succeed"
