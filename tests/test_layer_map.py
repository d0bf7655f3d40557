"""LayerMap: explicit pairs (one-to-one and many-to-one), ignore, black/white lists, auto proposals."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 8)
        self.act = torch.nn.Tanh()
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.act(self.encoder(x)))


class PaddleNet(paddle.nn.Layer):
    """The same computation under other names."""

    def __init__(self):
        super().__init__()
        self.enc = paddle.nn.Linear(8, 8)
        self.tanh = paddle.nn.Tanh()
        self.out = paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.tanh(self.enc(x)))


class PaddleFused(paddle.nn.Layer):
    """encoder + act fused into one custom layer."""

    def __init__(self):
        super().__init__()
        self.block = Fused()
        self.out = paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.block(x))


class Fused(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.weight = self.create_parameter([8, 8])
        self.bias = self.create_parameter([8], is_bias=True)

    def forward(self, x):
        return paddle.tanh(paddle.matmul(x, self.weight) + self.bias)


def _copy_fused(base, raw):
    raw.block.weight.set_value(base.encoder.weight.detach().numpy().T)
    raw.block.bias.set_value(base.encoder.bias.detach().numpy())
    raw.out.weight.set_value(base.head.weight.detach().numpy().T)
    raw.out.bias.set_value(base.head.bias.detach().numpy())


def test_explicit_pairs_by_path_and_by_object():
    base, raw = TorchNet(), PaddleNet()
    by_path = nbdiff.LayerMap({"encoder": "enc", "head": "out"})
    assert nbdiff.auto_diff(base, raw, X, layer_map=by_path)
    by_object = nbdiff.LayerMap({base.encoder: raw.enc})
    result = nbdiff.auto_diff(base, raw, X, layer_map=by_object)
    assert result and any(p.base.path == "encoder" and p.raw.path == "enc" for p in result.events)


def test_many_to_one_pair_is_compared_at_its_boundary():
    base, raw = TorchNet(), PaddleFused()
    _copy_fused(base, raw)
    lm = nbdiff.LayerMap({("encoder", "act"): "block"})
    result = nbdiff.auto_diff(base, raw, X, layer_map=lm, auto_init=False)
    assert result, result.report()
    fused = [e for e in result.events if e.raw.path == "block" and e.base.phase.value == "forward"]
    assert fused and fused[0].base.path == "encoder+act"
    # A real difference inside the fused layer is blamed on the mapped pair.
    raw.block.bias.set_value(raw.block.bias.numpy() + 0.1)
    d = nbdiff.auto_diff(base, raw, X, layer_map=lm, auto_init=False).first_divergence
    assert d is not None and (d.base_path, d.raw_path) == ("encoder+act", "block")


def test_ignore_and_black_list_modes():
    base, raw = TorchNet(), PaddleNet()
    nbdiff.assign_weight(base, raw, inputs=X)
    raw.tanh.forward = lambda x: paddle.nn.functional.sigmoid(x)  # a bug in `tanh`
    assert nbdiff.auto_diff(base, raw, X).first_divergence.raw_path == "tanh"
    ignored = nbdiff.auto_diff(base, raw, X, layer_map=nbdiff.LayerMap(ignore=[base.act, raw.tanh]))
    assert all(e.raw.path != "tanh" for e in ignored.events)
    black = nbdiff.LayerMap(black_list=[torch.nn.Tanh, paddle.nn.Tanh], mode="self")
    result = nbdiff.auto_diff(base, raw, X, layer_map=black)
    assert all(e.raw.path != "tanh" for e in result.events)
    # With `tanh` unrecorded, the error sits between two recorded layers of the root.
    d = result.first_divergence
    assert (d.where, d.base_path, d.between) == ("between", "", ("encoder", "head")), result.report()


def test_white_list_keeps_only_the_listed_layers():
    base, raw = TorchNet(), PaddleNet()
    lm = nbdiff.LayerMap(white_list=[torch.nn.Linear, paddle.nn.Linear], mode="self")
    result = nbdiff.auto_diff(base, raw, X, layer_map=lm)
    assert result, result.report()
    assert {e.base.path for e in result.events if e.base.path} <= {"encoder", "head", "<loss>"}


def test_bad_layer_map_entries_say_what_is_wrong():
    with pytest.raises(OptionError, match="Did you mean 'encoder'"):
        nbdiff.auto_diff(TorchNet(), PaddleNet(), X, layer_map=nbdiff.LayerMap({"model.encoder": "enc"}))
    with pytest.raises(OptionError, match="mode"):
        nbdiff.LayerMap(black_list=["act"], mode="everything")


def test_auto_proposes_renamed_leaves_as_pasteable_code(capsys):
    base, raw = TorchNet(), PaddleNet()
    lm = nbdiff.LayerMap.auto(base, raw, X)
    assert lm.map == {"encoder": "enc", "act": "tanh", "head": "out"}
    printed = capsys.readouterr().out
    namespace = {"nbdiff": nbdiff}
    exec(printed, namespace)  # the printed proposal is valid code that builds the same map
    assert namespace["layer_map"].map == lm.map
    assert nbdiff.auto_diff(base, raw, X, layer_map=lm)
