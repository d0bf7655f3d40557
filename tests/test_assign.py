"""Every layout rule, both directions: copy, then run both layers on one input."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402

LAYERS = {
    "linear": (lambda: torch.nn.Linear(6, 5), lambda: paddle.nn.Linear(6, 5), (4, 6)),
    "conv1d": (lambda: torch.nn.Conv1d(3, 4, 3), lambda: paddle.nn.Conv1D(3, 4, 3), (2, 3, 9)),
    "conv2d": (lambda: torch.nn.Conv2d(3, 4, 3), lambda: paddle.nn.Conv2D(3, 4, 3), (2, 3, 6, 6)),
    "conv3d": (lambda: torch.nn.Conv3d(2, 3, 3), lambda: paddle.nn.Conv3D(2, 3, 3), (1, 2, 5, 5, 5)),
    "convT2d": (lambda: torch.nn.ConvTranspose2d(3, 4, 3), lambda: paddle.nn.Conv2DTranspose(3, 4, 3), (2, 3, 5, 5)),
    "bn2d": (lambda: torch.nn.BatchNorm2d(3), lambda: paddle.nn.BatchNorm2D(3), (4, 3, 5, 5)),
    "ln": (lambda: torch.nn.LayerNorm(6), lambda: paddle.nn.LayerNorm(6), (4, 6)),
    "gn": (lambda: torch.nn.GroupNorm(2, 4), lambda: paddle.nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    "in2d": (lambda: torch.nn.InstanceNorm2d(3, affine=True), lambda: paddle.nn.InstanceNorm2D(3), (2, 3, 4, 4)),
    "prelu": (lambda: torch.nn.PReLU(3), lambda: paddle.nn.PReLU(3), (2, 3, 4)),
    "lstm": (
        lambda: torch.nn.LSTM(4, 5, num_layers=2, batch_first=True, bidirectional=True),
        lambda: paddle.nn.LSTM(4, 5, num_layers=2, direction="bidirect"),
        (2, 3, 4),
    ),
    "gru": (lambda: torch.nn.GRU(4, 5, batch_first=True), lambda: paddle.nn.GRU(4, 5), (2, 3, 4)),
    "rnn": (lambda: torch.nn.RNN(4, 5, batch_first=True), lambda: paddle.nn.SimpleRNN(4, 5), (2, 3, 4)),
}


def _run(layer, x):
    out = layer(torch.tensor(x) if isinstance(layer, torch.nn.Module) else paddle.to_tensor(x))
    out = out[0] if isinstance(out, tuple) else out
    return out.detach().numpy() if isinstance(out, torch.Tensor) else out.numpy()


@pytest.mark.parametrize("direction", ["t2p", "p2t"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_rule_makes_layers_agree(name, direction):
    make_t, make_p, shape = LAYERS[name]
    t, p = make_t(), make_p()
    base, raw = (t, p) if direction == "t2p" else (p, t)
    with torch.no_grad():
        for prm in t.parameters():
            prm.uniform_(-0.5, 0.5)
    if direction == "p2t":
        for prm in p.parameters():
            prm.set_value(np.random.uniform(-0.5, 0.5, prm.shape).astype("float32"))
    x = np.random.RandomState(1).randn(*shape).astype("float32")
    nbdiff.assign_weight(base, raw, inputs=x)
    np.testing.assert_allclose(_run(raw, x), _run(base, x), rtol=1e-4, atol=1e-5)


def test_mha_packed_and_split_both_directions():
    for kdim in (None, 6):
        t = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=kdim, vdim=kdim)
        p = paddle.nn.MultiHeadAttention(8, 2, kdim=kdim, vdim=kdim)
        q = np.random.randn(2, 3, 8).astype("float32")
        kv = np.random.randn(2, 4, kdim or 8).astype("float32")
        nbdiff.assign_weight(
            t,
            p,
            inputs=(
                (torch.tensor(q), torch.tensor(kv), torch.tensor(kv)),
                (paddle.to_tensor(q), paddle.to_tensor(kv), paddle.to_tensor(kv)),
            ),
        )
        out_t = t(torch.tensor(q), torch.tensor(kv), torch.tensor(kv))[0].detach().numpy()
        np.testing.assert_allclose(
            p(paddle.to_tensor(q), paddle.to_tensor(kv), paddle.to_tensor(kv)).numpy(), out_t, atol=1e-5
        )
        t2 = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=kdim, vdim=kdim)
        nbdiff.assign_weight(
            p,
            t2,
            inputs=(
                (paddle.to_tensor(q), paddle.to_tensor(kv), paddle.to_tensor(kv)),
                (torch.tensor(q), torch.tensor(kv), torch.tensor(kv)),
            ),
        )
        np.testing.assert_allclose(
            t2(torch.tensor(q), torch.tensor(kv), torch.tensor(kv))[0].detach().numpy(), out_t, atol=1e-5
        )


def test_buffers_copied_and_wrong_shape_leaves_raw_untouched():
    t = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    t[1].running_mean.fill_(0.7)
    p = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    nbdiff.assign_weight(t, p, inputs=np.random.randn(5, 4).astype("float32"))
    np.testing.assert_allclose(p[1]._mean.numpy(), 0.7)
    bad = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    before = {n: v.numpy().copy() for n, v in bad.state_dict().items()}
    t_bad = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    t_bad[0] = torch.nn.Linear(4, 3)
    t_bad[1] = torch.nn.BatchNorm1d(3)
    with pytest.raises(nbdiff.WeightTransferError, match="bn|1|Shape"):
        wrong = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        wrong[1].running_mean = torch.zeros(5)
        nbdiff.assign_weight(wrong, bad)
    for n, v in bad.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[n])


def test_unknown_square_weight_warns_and_transposed_raises():
    class TW(torch.nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(*shape))

        def forward(self, x):
            return x @ self.w

    class PW(paddle.nn.Layer):
        def __init__(self, shape):
            super().__init__()
            self.w = self.create_parameter(list(shape))

        def forward(self, x):
            return paddle.matmul(x, self.w)

    with pytest.warns(UserWarning, match="register_weight_rule"):
        nbdiff.assign_weight(TW((3, 3)), PW((3, 3)))
    with pytest.raises(nbdiff.WeightTransferError, match="register_weight_rule"):
        nbdiff.assign_weight(TW((3, 4)), PW((4, 3)))


@pytest.mark.parametrize("direction", ["t2p", "p2t"])
def test_structure_pairing_treats_attention_as_one_unit(direction):
    # Regression: torch MHA has 2 weight-owning layers, paddle's 4 (q/k/v/out projections);
    # without inputs the structure pairing refused the pair.
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    p = paddle.nn.MultiHeadAttention(8, 2)
    base, raw = (t, p) if direction == "t2p" else (p, t)
    nbdiff.assign_weight(base, raw)
    x = np.random.RandomState(2).randn(2, 3, 8).astype("float32")
    out_t = t(*(torch.tensor(x),) * 3, need_weights=False)[0].detach().numpy()
    out_p = p(*(paddle.to_tensor(x),) * 3).numpy()
    np.testing.assert_allclose(out_p, out_t, rtol=1e-4, atol=1e-5)


def test_a_rule_needs_conversions_or_a_copy_function():
    with pytest.raises(nbdiff.OptionError, match="needs convert and inverse"):
        nbdiff.register_weight_rule(("torch", "Nothing"), ("paddle", "Nothing"), None, None)


# -- transformers' Conv1D (GPT-2): a Linear stored [in, out] ----------------------------------
def _gpt2_mlp(kind):
    """GPT-2's MLP with transformers' Conv1D, or the same with a framework Linear."""
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D
    nn = paddle.nn if kind == "paddle" else torch.nn
    gelu = paddle.nn.functional.gelu if kind == "paddle" else torch.nn.functional.gelu

    class MLP(nn.Layer if kind == "paddle" else nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "conv1d":
                self.c_fc, self.c_proj = conv1d(12, 6), conv1d(6, 12)  # Conv1D(out, in)
            else:
                self.c_fc, self.c_proj = nn.Linear(6, 12), nn.Linear(12, 6)

        def forward(self, x):
            return self.c_proj(gelu(self.c_fc(x)))

    return MLP()


@pytest.mark.parametrize(
    "base,raw", [("conv1d", "paddle"), ("paddle", "conv1d"), ("conv1d", "torch"), ("torch", "conv1d")]
)
def test_transformers_conv1d_pairs_with_linear_and_copies_in_its_layout(base, raw):
    x = np.random.RandomState(0).randn(2, 3, 6).astype("float32")
    result = nbdiff.auto_diff(_gpt2_mlp(base), _gpt2_mlp(raw), x)
    assert result, result.report()
    assert {e.base.path for e in result.events} >= {"c_fc", "c_proj"}


def test_gpt2_fused_c_attn_takes_separate_query_key_value():
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D

    class Separate(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (paddle.nn.Linear(6, 6) for _ in range(3))

        def forward(self, x):
            return self.q_proj(x).tanh() * self.k_proj(x) + self.v_proj(x)

    class GPT2Style(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = conv1d(18, 6)

        def forward(self, x):
            q, k, v = self.c_attn(x).split(6, dim=-1)
            return q.tanh() * k + v

    x = np.random.RandomState(0).randn(2, 3, 6).astype("float32")
    result = nbdiff.auto_diff(Separate(), GPT2Style(), x)
    assert result, result.report()
    assert "q_proj+k_proj+v_proj" in {e.base.path for e in result.events}


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_bfloat16_weights_copy_both_ways(direction):
    # numpy has no bfloat16: paddle's set_value used to fail with "data type 'bfloat16' not understood".
    t = torch.nn.Linear(4, 3).to(torch.bfloat16)
    p = paddle.nn.Linear(4, 3)
    p.to(dtype="bfloat16")
    base, raw = (t, p) if direction == "torch->paddle" else (p, t)
    nbdiff.assign_weight(base, raw)
    np.testing.assert_array_equal(p.weight.astype("float32").numpy(), t.weight.float().detach().numpy().T)
    np.testing.assert_array_equal(p.bias.astype("float32").numpy(), t.bias.float().detach().numpy())
    assert str(p.weight.dtype) == "paddle.bfloat16" and t.weight.dtype == torch.bfloat16


def test_inside_looks_up_ancestors_only():
    from nbdiff.weights.assign import _inside

    roots = {"enc.attn", "dec"}
    assert _inside("enc.attn.q", roots) and _inside("dec.0.fc", roots)
    assert not _inside("enc.attn", roots) and not _inside("enc.attn2.q", roots) and not _inside("encx", roots)
    assert _inside("a.b", {""}) and not _inside("", {""}) and not _inside("a", set())


def _wmap(*pairs, whole=(), rule="same framework, by name"):
    from nbdiff.weights.assign import WeightMap
    from nbdiff.weights.plan import LayerWeights

    def lw(b, r, recursive):
        return LayerWeights(b, r, "T", "T", rule, recursive, dict, dict)

    return WeightMap(tuple(lw(b, r, False) for b, r in pairs) + tuple(lw(b, r, True) for b, r in whole))


def test_a_whole_copy_covers_and_is_covered_by_its_layers_at_the_same_places():
    by_layer = _wmap(("body.0", "body.0"), ("head", "head"))
    assert by_layer.covers(_wmap(("head", "head"), whole=[("body", "body")]))
    assert by_layer.covers(_wmap(whole=[("", "")]))
    assert _wmap(whole=[("", "")]).covers(by_layer)
    assert _wmap(whole=[("enc", "encoder")]).covers(_wmap(("enc.0", "encoder.0")))


def test_a_whole_copy_is_not_covered_by_layers_paired_elsewhere():
    swapped = _wmap(("body.0", "body.2"), ("body.2", "body.0"))
    assert not swapped.covers(_wmap(whole=[("body", "body")]))
    assert not _wmap(("a", "b"), ("b", "a")).covers(_wmap(("a", "a"), ("b", "b")))
    # into raw's subtree from outside base's: the whole copy would write it differently
    assert not _wmap(("body.0", "body.0"), ("head", "body.1")).covers(_wmap(whole=[("body", "body")]))
    assert not _wmap(whole=[("enc", "encoder")]).covers(_wmap(("enc.0", "encoder.1")))
    # a registered recursive rule may rename: only same-framework copies by name are compared by place
    assert not _wmap(("body.0", "body.0")).covers(_wmap(whole=[("body", "body")], rule="torch MHA"))


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_layer_name_holding_a_plus_is_not_split(direction):
    # A ModuleDict key `lin+act` was read as a LayerMap pair of `d.lin` and `act`: a bare KeyError.
    import nbdiff

    def net(fw):
        if fw == "torch":
            body = torch.nn.ModuleDict({"lin+act": torch.nn.Linear(4, 4)})
            head = torch.nn.Linear(4, 2)

            class T(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.d, self.out = body, head

                def forward(self, x):
                    return self.out(self.d["lin+act"](x))

            return T()
        body, head = paddle.nn.LayerDict({"lin+act": paddle.nn.Linear(4, 4)}), paddle.nn.Linear(4, 2)

        class P(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.d, self.out = body, head

            def forward(self, x):
                return self.out(self.d["lin+act"](x))

        return P()

    bfw, rfw = direction.split("->")
    result = nbdiff.auto_diff(net(bfw), net(rfw), np.random.RandomState(0).randn(3, 4).astype("float32"))
    assert result, result.report()
    assert ("d.lin+act", "d.lin+act") in {(w.base_path, w.raw_path) for w in result.options["weight_map"].layers}


class _TorchScaled(torch.nn.Module):
    """A scalar parameter and a scalar buffer (an embedding scale, a temperature): 0-d tensors."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.register_buffer("temperature", torch.tensor(2.0))

    def forward(self, x):
        return self.fc(x) * self.scale / self.temperature


class _PaddleScaled(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)
        self.scale = paddle.create_parameter([], "float32")
        self.register_buffer("temperature", paddle.to_tensor(3.0))

    def forward(self, x):
        return self.fc(x) * self.scale / self.temperature


def _sgd(model, scale_lr=0.1):
    """SGD at 0.1, the scalar's group at ``scale_lr``."""
    groups = [{"params": list(model.fc.parameters())}, {"params": [model.scale]}]
    if isinstance(model, torch.nn.Module):
        groups[1]["lr"] = scale_lr
        return torch.optim.SGD(groups, lr=0.1)
    groups[1]["learning_rate"] = scale_lr / 0.1  # paddle's group rate scales the optimizer's
    return paddle.optimizer.SGD(0.1, parameters=groups)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_0d_parameters_and_buffers_are_copied_compared_and_restored(direction):
    # paddle's set_value went through np.ascontiguousarray, which makes a 0-d array (1,): the copy,
    # and restoring the weights after a step, crashed with paddle's own AssertionError.
    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    base, raw = (_TorchScaled(), _PaddleScaled()) if direction == "torch->paddle" else (_PaddleScaled(), _TorchScaled())
    nbdiff.assign_weight(base, raw)
    assert float(raw.temperature) == float(base.temperature) and float(raw.scale) == float(base.scale)
    assert nbdiff.auto_diff(base, raw, x, optimizers=[_sgd(base), _sgd(raw)], steps=2)
    # A wrong learning rate on the scalar alone is blamed on its update.
    result = nbdiff.auto_diff(base, raw, x, optimizers=[_sgd(base), _sgd(raw, scale_lr=0.3)], steps=1)
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.parameter) == ("optimizer", "scale"), result.report()


class _TorchOutFirst(torch.nn.Module):
    """Defines its output projection before its input one."""

    def __init__(self):
        super().__init__()
        self.o_proj = torch.nn.Linear(16, 8)
        self.qkv_proj = torch.nn.Linear(8, 16)

    def forward(self, x):
        return self.o_proj(torch.relu(self.qkv_proj(x)))


class _PaddleInFirst(paddle.nn.Layer):
    """The same layers, other names (neither order nor names say which is which: their shapes do)."""

    def __init__(self, out_features=8):
        super().__init__()
        self.qkv = paddle.nn.Linear(8, 16)
        self.out = paddle.nn.Linear(16, out_features)

    def forward(self, x):
        return self.out(paddle.nn.functional.relu(self.qkv(x)))


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_copy_without_inputs_tries_the_pairing_by_shape_before_raising(direction):
    # By definition order o_proj took qkv_proj's weights and the copy raised on an equivalent pair.
    base, raw = _TorchOutFirst(), _PaddleInFirst()
    if direction == "paddle->torch":
        base, raw = raw, base
    wmap = nbdiff.assign_weight(base, raw)
    pairs = [("o_proj", "out"), ("qkv_proj", "qkv")]
    assert sorted(wmap.pairs()) == sorted(pairs if direction == "torch->paddle" else [p[::-1] for p in pairs])
    assert any("inputs=" in w for w in wmap.warnings)
    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    out = [
        m(torch.from_numpy(x)).detach().numpy() if isinstance(m, torch.nn.Module) else m(paddle.to_tensor(x)).numpy()
        for m in (base, raw)
    ]
    np.testing.assert_allclose(out[0], out[1], rtol=1e-5, atol=1e-6)


def test_a_copy_without_inputs_that_cannot_decide_says_to_pass_inputs():
    base, raw = _TorchOutFirst(), _PaddleInFirst(out_features=4)  # no pairing by shape fits
    before = raw.out.weight.numpy().copy()
    with pytest.raises(nbdiff.WeightTransferError, match="Pass `inputs=`"):
        nbdiff.assign_weight(base, raw)
    np.testing.assert_array_equal(raw.out.weight.numpy(), before)  # nothing half-copied


class _TorchSquareOutFirst(torch.nn.Module):
    """Square projections, the output one defined first: definition order copies them crosswise."""

    def __init__(self):
        super().__init__()
        self.o_proj = torch.nn.Linear(8, 8)
        self.q_proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.o_proj(torch.tanh(self.q_proj(x)))


class _PaddleSquareInFirst(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.q_proj = paddle.nn.Linear(8, 8)
        self.o_proj = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.o_proj(paddle.tanh(self.q_proj(x)))


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_copy_without_inputs_follows_names_where_definition_order_crosses_them(direction):
    # Every shape fits either way: the copy by definition order was made, silently crosswise.
    base, raw = _TorchSquareOutFirst(), _PaddleSquareInFirst()
    if direction == "paddle->torch":
        base, raw = raw, base
    assert sorted(nbdiff.assign_weight(base, raw).pairs()) == [("o_proj", "o_proj"), ("q_proj", "q_proj")]
    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    out = [
        m(torch.from_numpy(x)).detach().numpy() if isinstance(m, torch.nn.Module) else m(paddle.to_tensor(x)).numpy()
        for m in (base, raw)
    ]
    np.testing.assert_allclose(out[0], out[1], rtol=1e-5, atol=1e-6)
