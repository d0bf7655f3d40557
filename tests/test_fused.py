"""Fused layers: one raw ``qkv``/``up_gate_proj`` against several base layers, in every direction."""

import numpy as np
import pytest

import nbdiff
from nbdiff.align.fused import FusedLayout, concat_layout, group_path, per_kv_head_layout

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")


# -- layouts ---------------------------------------------------------------------------------
def test_per_kv_head_layout_interleaves_query_heads_with_their_key_and_value_head():
    # 4 query heads, 2 kv heads, head_dim 2: [q0 q1 k0 v0 | q2 q3 k1 v1]
    layout = per_kv_head_layout((8, 4, 4), 2)
    assert layout is not None
    q, k, v = np.arange(8), 100 + np.arange(4), 200 + np.arange(4)
    fused = layout.fuse([q, k, v], axis=0)
    assert fused.tolist() == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    back = layout.split(fused, axis=0)
    assert [b.tolist() for b in back] == [q.tolist(), k.tolist(), v.tolist()]


def test_per_kv_head_layout_refuses_sizes_that_do_not_fit():
    assert per_kv_head_layout((8, 4, 6), 2) is None
    assert per_kv_head_layout((8, 4, 4), 3) is None
    assert per_kv_head_layout((8, 4), 2) is None


def test_concat_layout_round_trips_along_any_axis():
    layout = concat_layout((3, 5))
    a, b = np.ones((2, 3)), np.zeros((2, 5))
    fused = layout.fuse([a, b], axis=1)
    assert isinstance(layout, FusedLayout) and fused.shape == (2, 8)
    assert [x.shape for x in layout.split(fused, axis=1)] == [(2, 3), (2, 5)]


def test_group_path_names_the_parent_once():
    assert group_path(("a.attn.q_proj", "a.attn.k_proj", "a.attn.v_proj")) == "a.attn.q_proj+k_proj+v_proj"
    assert group_path(("gate", "up")) == "gate+up"


def _linear_call(order, path, out, weights):
    from nbdiff.trace.events import Event, Kind, Phase, TensorRecord

    x = TensorRecord("in[0]", (5, 8), "float32", np.zeros((5, 8), "float32"))
    y = TensorRecord("out[0]", (5, out), "float32", np.zeros((5, out), "float32"))
    return Event(0, Phase.FORWARD, Kind.LAYER, order, path, "Linear", 0, 2, 0, True, (x,), (y,), weights=weights)


def test_a_merged_call_weighs_as_the_one_layer_that_fuses_its_members():
    # It had no weight shapes, so pairing could not tell a fused gate+up projection from a router's Linear
    # or an expert's projection of another size: an equivalent MoE pair failed its weight copy.
    from nbdiff.align.fused import FusedGroup, fuse_events

    calls = [_linear_call(1, "mlp.gate_proj", 6, ((6,), (6, 8))), _linear_call(2, "mlp.up_proj", 6, ((6,), (6, 8)))]
    group = FusedGroup("mlp.gate_proj+up_proj", ("mlp.gate_proj", "mlp.up_proj"), (0, 0), "mlp.up_gate_proj",
                       concat_layout((6, 6)), side="raw")  # fmt: skip
    (merged,) = fuse_events(calls, [group])
    assert merged.weights == ((8, 12), (12,))
    odd = [calls[0], _linear_call(2, "mlp.up_proj", 6, ((6, 9),))]  # members whose weights do not line up
    assert fuse_events(odd, [group])[0].weights == ()


# -- models: separate projections against fused ones ----------------------------------------
def _separate(nn, cat, silu):
    class Separate(nn.Module if hasattr(nn, "Module") else nn.Layer):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4)
            self.gate_proj, self.up_proj = nn.Linear(12, 6), nn.Linear(12, 6)
            self.down_proj = nn.Linear(6, 8)

        def forward(self, x):
            h = cat([self.q(x).tanh(), self.k(x) * self.v(x)])
            return self.down_proj(silu(self.gate_proj(h)) * self.up_proj(h))

    return Separate()


def _fused(nn, cat, silu, split, bug=False):
    class Fused(nn.Module if hasattr(nn, "Module") else nn.Layer):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 16)
            self.up_gate_proj = nn.Linear(12, 12)
            self.down_proj = nn.Linear(6, 8)

        def forward(self, x):
            q, k, v = split(self.qkv(x), [8, 4, 4])
            h = cat([q.tanh(), k * v])
            gate, up = split(self.up_gate_proj(h), [6, 6])
            if bug:  # the port takes the halves the other way round
                gate, up = up, gate
            return self.down_proj(silu(gate) * up)

    return Fused()


def _torch_sep():
    return _separate(torch.nn, lambda xs: torch.cat(xs, -1), torch.nn.functional.silu)


def _torch_fused(bug=False):
    return _fused(
        torch.nn, lambda xs: torch.cat(xs, -1), torch.nn.functional.silu, lambda t, s: torch.split(t, s, -1), bug
    )


def _paddle_sep():
    return _separate(paddle.nn, lambda xs: paddle.concat(xs, -1), paddle.nn.functional.silu)


def _paddle_fused(bug=False):
    return _fused(
        paddle.nn,
        lambda xs: paddle.concat(xs, -1),
        paddle.nn.functional.silu,
        lambda t, s: paddle.split(t, s, -1),
        bug,
    )


X = np.random.RandomState(0).randn(3, 5, 8).astype("float32")
PAIRS = {
    "torch->paddle": (_torch_sep, _paddle_fused),
    "paddle->torch": (_paddle_sep, _torch_fused),
    "torch->torch": (_torch_sep, _torch_fused),
}


@pytest.mark.parametrize("single_step", [False, True], ids=["default", "single_step"])
@pytest.mark.parametrize("direction", list(PAIRS))
def test_fused_raw_layers_pass_against_separate_base_layers(direction, single_step):
    make_base, make_raw = PAIRS[direction]
    result = nbdiff.auto_diff(make_base(), make_raw(), X, single_step=single_step)
    assert result, result.report()
    paths = {e.base.path for e in result.events}
    assert {"q+k+v", "gate_proj+up_proj"} <= paths


REVERSED = {
    "torch fused->paddle": (_torch_fused, _paddle_sep),
    "paddle fused->torch": (_paddle_fused, _torch_sep),
}


@pytest.mark.parametrize("single_step", [False, True], ids=["default", "single_step"])
@pytest.mark.parametrize("direction", list(REVERSED))
def test_a_fused_base_layer_pairs_with_separate_raw_layers(direction, single_step):
    # The reverse port: the reference fuses, the port keeps the projections apart.
    make_base, make_raw = REVERSED[direction]
    base, raw = make_base(), make_raw()
    result = nbdiff.auto_diff(base, raw, X, single_step=single_step)
    assert result, result.report()
    pairs = {(e.base.path, e.raw.path) for e in result.events}
    assert {("qkv", "q+k+v"), ("up_gate_proj", "gate_proj+up_proj")} <= pairs
    backward = {e.raw.path for e in result.events if e.base.phase.value == "backward"}
    assert "q+k+v" in backward


@pytest.mark.parametrize("direction", list(REVERSED))
def test_a_fused_base_layer_trains_against_separate_raw_layers_and_blames_a_decay_bug(direction):
    make_base, make_raw = REVERSED[direction]

    def opt(m, wd):
        if isinstance(m, torch.nn.Module):
            return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=wd)
        return paddle.optimizer.AdamW(learning_rate=1e-2, parameters=m.parameters(), weight_decay=wd)

    base, raw = make_base(), make_raw()
    assert nbdiff.auto_diff(base, raw, X, optimizers=[opt(base, 0.01), opt(raw, 0.01)], steps=2)
    base, raw = make_base(), make_raw()
    d = nbdiff.auto_diff(base, raw, X, optimizers=[opt(base, 0.01), opt(raw, 0.1)], steps=2).first_divergence
    assert d is not None and d.phase.value == "optimizer"


@pytest.mark.parametrize("direction", list(PAIRS))
def test_swapped_halves_of_a_fused_projection_are_blamed_on_the_code_that_splits_them(direction):
    make_base, make_raw = PAIRS[direction]
    result = nbdiff.auto_diff(make_base(), make_raw(bug=True), X)
    d = result.first_divergence
    assert d is not None and d.where == "between" and d.base_path == "", result.report()
    assert d.between == ("gate_proj+up_proj", "down_proj")


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_training_through_fused_layers_compares_updates_member_by_member(direction):
    make_base, make_raw = PAIRS[direction]
    base, raw = make_base(), make_raw()
    opts = []
    for m in (base, raw):
        if isinstance(m, torch.nn.Module):
            opts.append(torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01))
        else:
            opts.append(paddle.optimizer.AdamW(learning_rate=1e-2, parameters=m.parameters(), weight_decay=0.01))
    result = nbdiff.auto_diff(base, raw, X, optimizers=opts, steps=3)
    assert result, result.report()
    updates = [e for e in result.events if e.base.phase.value == "optimizer"]
    assert any(e.base.path == "q+k+v" for e in updates)


def test_assign_weight_writes_the_members_into_the_fused_layer():
    base, raw = _torch_sep(), _paddle_fused()
    wmap = nbdiff.assign_weight(base, raw, inputs=X)
    rules = {lw.base_path: lw.rule for lw in wmap.layers}
    assert rules["q+k+v"].startswith("fused") and rules["gate_proj+up_proj"].startswith("fused")
    want = torch.cat([base.q.weight, base.k.weight, base.v.weight]).detach().numpy().T
    np.testing.assert_array_equal(raw.qkv.weight.numpy(), want)
    want_bias = torch.cat([base.gate_proj.bias, base.up_proj.bias]).detach().numpy()
    np.testing.assert_array_equal(raw.up_gate_proj.bias.numpy(), want_bias)
    assert not wmap.warnings


def test_a_fused_layer_whose_sizes_do_not_add_up_is_not_fused():
    base = _torch_sep()
    raw = _torch_fused()
    raw.qkv = torch.nn.Linear(8, 20)  # 20 != 8 + 4 + 4
    with pytest.raises(nbdiff.NbdiffError):
        nbdiff.assign_weight(base, raw, inputs=X)


# -- paddle BatchNorm(act=...): the activation inside the layer --------------------------------
class _TorchConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.relu = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.head(self.relu(self.bn(self.conv(x))))


class _PaddleConvBNAct(paddle.nn.Layer):
    def __init__(self, act="relu", eps=1e-5):
        super().__init__()
        self.conv, self.bn = paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm(4, act=act, epsilon=eps)
        self.head = paddle.nn.Conv2D(4, 2, 1)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)))


XI = np.random.RandomState(1).randn(2, 3, 8, 8).astype("float32")


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_batchnorm_with_its_activation_pairs_with_batchnorm_then_relu(direction, train):
    base, raw = (
        (_TorchConvBN(), _PaddleConvBNAct()) if direction == "torch->paddle" else (_PaddleConvBNAct(), _TorchConvBN())
    )
    for m in (base, raw):
        m.train() if train else m.eval()
    result = nbdiff.auto_diff(base, raw, XI)
    assert result, result.report()
    side = "base" if direction == "torch->paddle" else "raw"
    assert "bn+relu" in {getattr(e, side).path for e in result.events}


def test_batchnorm_epsilon_bug_behind_its_activation_is_blamed_on_it():
    result = nbdiff.auto_diff(_TorchConvBN().eval(), _PaddleConvBNAct(eps=1e-3).eval(), XI)
    d = result.first_divergence
    assert d is not None and d.base_path == "bn+relu", result.report()


@pytest.mark.parametrize("single_step", [False, True], ids=["default", "single_step"])
def test_an_epsilon_bug_of_a_norm_applying_its_activation_is_blamed_against_norm_then_relu(single_step):
    # paddle's BatchNorm(act) as the reference, torch's norm then ReLU the port: the raw pair is a group
    # that was never run again (single-step: not measured, and the bug was missed).
    base, raw = _PaddleConvBNAct(eps=1e-3).eval(), _TorchConvBN().eval()
    result = nbdiff.auto_diff(base, raw, XI, single_step=single_step)
    d = result.first_divergence
    assert d is not None and (d.base_path, d.raw_path, d.inherited) == ("bn", "bn+relu", False), result.report()


class _TorchConvBNFunctional(torch.nn.Module):
    """The activation called as a function after the norm (torchvision's DenseNet after ``norm5``)."""

    def __init__(self, relu=True):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Conv2d(4, 2, 1)
        self.relu = relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.head(torch.relu(y) if self.relu else y)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_batchnorm_with_its_activation_pairs_with_batchnorm_then_the_activation_as_a_function(direction):
    # The two norms paired and their outputs differed by the ReLU: a false alarm on an equivalent pair.
    base, raw = _TorchConvBNFunctional().eval(), _PaddleConvBNAct().eval()
    if direction == "paddle->torch":
        base, raw = raw, base
    result = nbdiff.auto_diff(base, raw, XI)
    assert result, result.report()
    side = "base" if direction == "torch->paddle" else "raw"
    assert "bn+relu" in {getattr(e, side).path for e in result.events}


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_an_activation_left_out_after_a_norm_is_blamed_on_the_code_after_it(direction):
    # The port dropped the function call: the fused norm agrees with the norm then its activation, and the
    # code after the norm (where the function was) is blamed, not the norm.
    base, raw = _TorchConvBNFunctional(relu=False).eval(), _PaddleConvBNAct().eval()
    if direction == "paddle->torch":
        base, raw = raw, base
    d = nbdiff.auto_diff(base, raw, XI, diff_phase="forward").first_divergence
    assert d is not None and (d.where, d.base_path) == ("between", ""), d


def test_register_fused_pattern_teaches_new_names(monkeypatch):
    from nbdiff.align import fused

    monkeypatch.setattr(fused, "FUSED_PATTERNS", list(fused.FUSED_PATTERNS))

    class Sep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wa, self.wb = torch.nn.Linear(4, 3), torch.nn.Linear(4, 5)

        def forward(self, x):
            return self.wa(x).sum(-1) + self.wb(x).tanh().sum(-1)

    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wab = torch.nn.Linear(4, 8)

        def forward(self, x):
            a, b = self.wab(x).split([3, 5], -1)
            return a.sum(-1) + b.tanh().sum(-1)

    x = np.random.RandomState(0).randn(2, 4).astype("float32")
    with pytest.raises(nbdiff.NbdiffError):
        nbdiff.auto_diff(Sep(), Fused(), x)
    nbdiff.register_fused_pattern(("wa", "wb"), ("wab",))
    assert nbdiff.auto_diff(Sep(), Fused(), x)
