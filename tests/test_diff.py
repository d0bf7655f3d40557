"""auto_diff end to end: weight pairing by execution, state left as found, and every bad input."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import InputError, ModelCallError, OptionError, PairingError  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402

X = inputs("mlp")


def _no_hooks(model):
    if isinstance(model, torch.nn.Module):
        return all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    return all(not m._forward_pre_hooks and not m._forward_post_hooks for m in model.sublayers(include_self=True))


class TorchSwapped(torch.nn.Module):
    """Two same-shape Linears defined in the opposite order to their use."""

    def __init__(self):
        super().__init__()
        self.second = torch.nn.Linear(8, 8)
        self.first = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


class PaddleInOrder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.first = paddle.nn.Linear(8, 8)
        self.second = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.second(paddle.tanh(self.first(x)))


def test_definition_order_does_not_decide_the_weight_copy():
    # The structure copy pairs `second` with `first` (same shapes); the execution pairing of
    # step 0 must catch it, copy again and rerun, so the equivalent pair passes.
    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    result = nbdiff.auto_diff(TorchSwapped(), PaddleInOrder(), x)
    assert result, result.report()
    pairs = {(lw.base_path, lw.raw_path) for lw in result.options["weight_map"].layers}
    assert pairs == {("first", "first"), ("second", "second")}


@pytest.mark.parametrize("single_step", [False, True])
def test_running_statistics_are_left_as_found(single_step):
    base, raw = BUILDERS["cnn"]("torch"), BUILDERS["cnn"]("paddle")
    before = base.bn1.running_mean.detach().numpy().copy()
    result = nbdiff.auto_diff(base, raw, inputs("cnn"), single_step=single_step)
    assert result, result.report()
    np.testing.assert_array_equal(base.bn1.running_mean.detach().numpy(), before)
    np.testing.assert_array_equal(raw.bn1._mean.numpy(), before)


def test_auto_init_false_leaves_raw_weights_untouched():
    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    before = raw.fc1.weight.numpy().copy()
    result = nbdiff.auto_diff(base, raw, X, auto_init=False)
    assert not result  # independent random initialisations
    np.testing.assert_array_equal(raw.fc1.weight.numpy(), before)


def test_inputs_that_are_not_a_pair():
    with pytest.raises(InputError, match="pair"):
        nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), [X, X, X])


class Exploding(paddle.nn.Layer):
    def __init__(self, error):
        super().__init__()
        self.fc1 = paddle.nn.Linear(16, 8)
        self.error = error

    def forward(self, x):
        self.fc1(x)  # hooks are live when the error comes
        raise self.error


class TorchSmall(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc1(x)


def test_a_model_that_raises_names_the_model_and_keeps_the_users_error():
    base, raw = TorchSmall(), Exploding(ValueError("bad reshape in user code"))
    base.eval()
    with pytest.raises(ModelCallError, match="raw model") as info:
        nbdiff.auto_diff(base, raw, X)
    assert isinstance(info.value.__cause__, ValueError)
    assert _no_hooks(base) and _no_hooks(raw)
    assert not base.training and raw.training


def test_keyboard_interrupt_leaves_no_hooks_and_restores_modes():
    base, raw = TorchSmall(), Exploding(KeyboardInterrupt())
    raw.eval()
    with pytest.raises(KeyboardInterrupt):
        nbdiff.auto_diff(base, raw, X)
    assert _no_hooks(base) and _no_hooks(raw)
    assert base.training and not raw.training


def test_steps_without_optimizers():
    with pytest.raises(OptionError, match="optimizers"):
        nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), X, steps=3)


def test_unpairable_structure_names_both_sides_and_suggests_a_layer_map():
    class Convs(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.a = paddle.nn.Conv1D(1, 2, 3)
            self.b = paddle.nn.Conv1D(2, 1, 3)

        def forward(self, x):
            return self.b(self.a(x.reshape([8, 1, 16])))

    with pytest.raises(PairingError) as info:
        nbdiff.auto_diff(TorchSmall(), Convs(), X, auto_init=False)
    message = str(info.value)
    assert "`fc1` (Linear" in message and "`a` (Conv1D" in message and "LayerMap(" in message


def test_nan_outputs_are_a_divergence_with_counts():
    class NaNs(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1 = paddle.nn.Linear(16, 8)

        def forward(self, x):
            return paddle.log(self.fc1(x) - 1e9)  # log of negatives: NaN

    result = nbdiff.auto_diff(TorchSmall(), NaNs(), X)
    d = result.first_divergence
    assert d is not None and d.phase.value == "forward" and d.metrics.nan_raw > 0, result.report()


def test_different_dtypes_compare_at_the_looser_tolerance():
    base = BUILDERS["mlp"]("torch").double()
    result = nbdiff.auto_diff(base, BUILDERS["mlp"]("paddle"), (X.astype("float64"), X))
    assert result, result.report()
    assert result.events[0].tensors[0].tolerance.rtol == pytest.approx(1e-4)


@pytest.mark.parametrize("bfw,rfw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_model_with_no_sublayers(bfw, rfw):
    make = {"torch": lambda: torch.nn.Linear(16, 4), "paddle": lambda: paddle.nn.Linear(16, 4)}
    result = nbdiff.auto_diff(make[bfw](), make[rfw](), X)
    assert result, result.report()
    raw = make[rfw]()
    result = nbdiff.auto_diff(make[bfw](), raw, X, loss_fns=[None, lambda out: (out * 1.01).mean()])
    assert result.first_divergence is not None


def _residual_pair(scale_raw=None):
    """fc, then an in-place residual add (torch) or an out-of-place one (paddle), then ReLU;
    ``scale_raw`` puts an in-place scaling between fc and the add on the raw side."""

    class TB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.relu = torch.nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.fc(x)
            out.mul_(2.0)
            out += x
            return self.relu(out)

    class PB(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)
            self.relu = paddle.nn.ReLU()

        def forward(self, x):
            out = self.fc(x)
            out = out.scale_(scale_raw or 2.0)
            out = out + x
            return self.relu(out)

    return TB(), PB()


def test_inplace_residual_add_is_not_a_divergence():
    base, raw = _residual_pair()
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32"))
    assert result, result.report()
    assert not result.warnings


def test_inplace_op_between_layers_is_blamed_on_the_code_between_them():
    base, raw = _residual_pair(scale_raw=2.5)
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32"))
    d = result.first_divergence
    assert d is not None and d.where == "between" and d.base_path == "", result.report()
    assert d.between[0] == "fc"


@pytest.mark.parametrize("how", ["auto_diff", "watch"])
def test_single_step_still_sees_the_code_between_layers(how):
    # Fed base's inputs, every raw layer agrees; what raw's own code computed for `fc2`'s input did not.
    class TB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x).softmax(-1) / 8**0.5)

    class PB(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = paddle.nn.Linear(4, 8), paddle.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(paddle.nn.functional.softmax(self.fc1(x), -1) / 4**0.5)  # wrong scale

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    base, raw = TB(), PB()
    if how == "auto_diff":
        result = nbdiff.auto_diff(base, raw, x, single_step=True)
    else:
        with nbdiff.watch(base, raw, single_step=True) as w:
            base(torch.tensor(x)).sum().backward()
            raw(paddle.to_tensor(x)).sum().backward()
        result = w.result
    d = result.first_divergence
    assert d is not None and (d.where, d.base_path, d.between) == ("between", "", ("fc1", "fc2")), result.report()


def _pair_of(make_torch, make_paddle):
    torch.manual_seed(0)
    paddle.seed(0)
    return make_torch(), make_paddle()


def test_non_persistent_buffers_are_compared_not_copied():
    # Rotary inv_freq, BERT position_ids: constants computed in __init__ raised WeightTransferError.
    class TRot(torch.nn.Module):
        def __init__(self, theta=10000.0):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, 4, 2).float() / 4), persistent=False)
            self.register_buffer("original_inv_freq", self.inv_freq.clone(), persistent=False)

        def forward(self, x):
            return self.fc(x) * self.inv_freq.repeat(2)

    class PRot(paddle.nn.Layer):
        def __init__(self, theta=10000.0):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)
            inv = 1.0 / theta ** (paddle.arange(0, 4, 2).astype("float32") / 4)
            self.register_buffer("inv_freq", inv, persistable=False)

        def forward(self, x):
            return self.fc(x) * self.inv_freq.tile([2])

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    assert nbdiff.auto_diff(TRot(), PRot(), x)
    result = nbdiff.auto_diff(TRot(), PRot(theta=500000.0), x)
    assert not result and result.first_divergence.base_path == ""
    assert any("constant `inv_freq`" in w for w in result.warnings), result.warnings


def test_loss_of_layernorm_outputs_is_judged_by_the_outputs_magnitude():
    # The mean of LayerNorm outputs is ~3e-9: judged against itself, equivalent models false-alarmed.
    base, raw = _pair_of(lambda: torch.nn.LayerNorm(16), lambda: paddle.nn.LayerNorm(16))
    x = np.random.RandomState(0).randn(4, 16).astype("float32")
    result = nbdiff.auto_diff(base, raw, x)
    assert result, result.report()


def test_train_mode_batchnorm_and_tuple_outputs_are_measured_not_blamed():
    # MultiheadAttention returns a tuple in torch and a tensor in paddle; its backward replay
    # cannot pair those, and unmeasurable local error must never be blamed.
    class TB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.attn(x, x, x, need_weights=False)[0])

    class PB(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.attn = paddle.nn.MultiHeadAttention(8, 2)
            self.norm = paddle.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.attn(x, x, x))

    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    result = nbdiff.auto_diff(*_pair_of(TB, PB), x)
    assert result, result.report()


def test_a_layer_inside_an_unpaired_wrapper_hangs_under_the_nearest_paired_ancestor():
    class Wrap(paddle.nn.Layer):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    base = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4, eps=1e-5))
    raw = paddle.nn.Sequential(paddle.nn.Linear(4, 4), Wrap(paddle.nn.LayerNorm(4, epsilon=1e-3)))
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32") * 0.01)
    d = result.first_divergence
    assert d is not None and (d.base_path, d.where) == ("1", "layer"), result.report()
    norm = next(e for e in result.events if e.base.path == "1" and e.base.phase.value == "forward")
    assert norm.base.parent is not None


def test_adam_on_rounding_level_gradients_is_not_a_divergence():
    # A key bias's true gradient is exactly 0; Adam turned its rounding noise into lr-sized updates.
    base, raw = _pair_of(lambda: BUILDERS["transformer"]("torch"), lambda: BUILDERS["transformer"]("paddle"))
    topt = torch.optim.AdamW(base.parameters(), lr=1e-3)
    popt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=raw.parameters())
    result = nbdiff.auto_diff(base, raw, inputs("transformer"), optimizers=[topt, popt], steps=3)
    assert result, result.report()
    assert any(e.base.phase.value == "optimizer" for e in result.events)


def test_batchnorm_momentum_bug_is_blamed_in_the_state_phase():
    base, raw = _pair_of(lambda: torch.nn.BatchNorm1d(4), lambda: paddle.nn.BatchNorm1D(4, momentum=0.1))
    opts = [torch.optim.SGD(base.parameters(), lr=0.1), paddle.optimizer.SGD(0.1, parameters=raw.parameters())]
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(64, 4).astype("float32"), optimizers=opts)
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.where) == ("state", "state"), result.report()
    assert d.parameter == "running_mean"


def test_different_inputs_are_reported_as_inputs():
    x = np.random.RandomState(0).randn(8, 16).astype("float32")
    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    result = nbdiff.auto_diff(base, raw, (torch.from_numpy(x), paddle.to_tensor(x + 0.01)))
    d = result.first_divergence
    assert d is not None and d.where == "inputs" and d.metrics.max_abs > 0.009, result.report()
    assert "different inputs" in d.describe()


def test_first_event_producing_nan_is_reported_even_when_both_sides_agree():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 4)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(self.fc1(x))

    base, raw = Net(), Net()
    with torch.no_grad():
        base.fc1.weight[0, 0] = float("nan")
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(3, 4).astype("float32"), auto_init=True)
    d = result.first_divergence
    assert d is not None and (d.base_path, d.where) == ("fc1", "nonfinite"), result.report()


def test_a_failure_after_the_copy_puts_raw_back_as_it_was():
    # The message says the model was restored; raw still held base's weights.
    from nbdiff.errors import ModelCallError
    from tests.fault_suite.models import BUILDERS, inputs

    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    before = {k: v.numpy().copy() for k, v in raw.state_dict().items()}

    def flaky(x):
        raise RuntimeError("device lost")

    raw.fc2.forward = flaky  # after the copy by structure, the step's call fails
    with pytest.raises(ModelCallError):
        nbdiff.auto_diff(base, raw, inputs("mlp"))
    assert all(np.array_equal(before[k], v.numpy()) for k, v in raw.state_dict().items())


def test_a_loss_is_never_blamed_for_what_the_model_outputs_it_is_computed_from():
    # A layer whose replay cannot run (it refuses a second call) diverges; the loss used to take
    # the blame with its accumulated error as its "local" one.
    class Once(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.fc, self.scale, self.calls = torch.nn.Linear(4, 4), scale, 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("called twice")
            return self.fc(x) * self.scale

    class Net(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.once = Once(scale)

        def forward(self, x):
            return self.once(x)

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    result = nbdiff.auto_diff(Net(1.0), Net(1.1), x)
    d = result.first_divergence
    assert d is not None and d.base_path == "once", result.report()


def test_auto_init_false_compares_what_it_can_when_a_pair_has_no_weight_rule():
    # The user loaded the weights: a layer pair nbdiff could not copy is no reason to stop.
    class TScale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.s = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

        def forward(self, x):
            return self.fc(x) * self.s

    class PScale(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)
            self.s = self.create_parameter([1, 4])  # stored (1, 4): no rule maps (4,) onto it

        def forward(self, x):
            return self.fc(x) * self.s

    base, raw = TScale(), PScale()
    raw.fc.weight.set_value(base.fc.weight.detach().numpy().T)
    raw.fc.bias.set_value(base.fc.bias.detach().numpy())
    raw.s.set_value(base.s.detach().numpy().reshape(1, 4))
    x = X[:, :4]
    with pytest.raises(nbdiff.WeightTransferError):
        nbdiff.auto_diff(base, raw, x)
    result = nbdiff.auto_diff(base, raw, x, auto_init=False)
    assert result, result.report()
    assert any("base `<root>` and raw `<root>` are not compared" in w for w in result.warnings), result.warnings
    assert any(e.base.path == "fc" and e.base.phase.value == "backward" for e in result.events)


@pytest.mark.parametrize("bfw,rfw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_backward_bug_before_a_final_layernorm_is_blamed_with_the_default_loss(bfw, rfw):
    # Found by the fuzz: the mean of a LayerNorm's output is a constant, so with the plain mean
    # as the default loss every gradient before it was zero and the bug went unseen (SUCCESS).
    from tests.fault_suite.random_models import build
    from tests.fault_suite.random_models import inputs as spec_inputs

    spec = {"image": False, "width": 4, "layers": [("linear", 3), ("tanh_custom",), ("norm",)], "seed": 0}
    spec["reversed_side"] = None
    assert nbdiff.auto_diff(build(spec, bfw), build(spec, rfw), spec_inputs(spec))
    result = nbdiff.auto_diff(build(spec, bfw), build(spec, rfw, ("l1", "backward")), spec_inputs(spec))
    d = result.first_divergence
    assert d is not None and (d.phase.value, d.base_path, d.where) == ("backward", "l1", "layer"), result.report()


def test_a_same_framework_model_with_a_sequential_runs_step_zero_once():
    # Its Sequential pairs as one call, copied whole; the structure copy had paired the
    # Sequential's layers. Both copy the same tensors, so the step must not be run again.
    class Counted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
            self.head = torch.nn.Linear(8, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.head(self.body(x))

    base, raw = Counted(), Counted()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (base, raw)]
    assert nbdiff.auto_diff(base, raw, np.ones((2, 8), "float32"), steps=2, optimizers=opts)
    assert (base.calls, raw.calls) == (2, 2)


@pytest.mark.parametrize("bfw,rfw", [("torch", "paddle"), ("paddle", "torch")])
def test_the_users_random_generators_are_left_as_they_were(bfw, rfw):
    # auto_diff seeds each step on both sides; the user's next draw was then a seed-0 draw.
    def draws():
        return torch.rand(3).numpy().tolist(), paddle.rand([3]).numpy().tolist()

    base, raw = BUILDERS["mlp"](bfw), BUILDERS["mlp"](rfw)  # building draws too
    torch.manual_seed(123)
    paddle.seed(123)
    expected = draws()
    torch.manual_seed(123)
    paddle.seed(123)
    nbdiff.auto_diff(base, raw, X)
    assert draws() == expected
