"""PaDiff's calls through nbdiff.compat.padiff: both auto_diff forms, every option, env switches."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.compat.padiff import (  # noqa: E402
    LayerMap,
    add_special_init,
    assign_weight,
    auto_diff,
    create_model,
    env_options,
)
from nbdiff.errors import OptionError  # noqa: E402
from tests.seed_models import inp, simple_layer, simple_module  # noqa: E402


def _inputs():
    x = inp()
    return ({"x": paddle.to_tensor(x)}, {"y": torch.as_tensor(x)})


def test_v02_interface_example_succeeds_and_a_bug_is_blamed(capsys):
    layer, module = simple_layer(), simple_module()
    result = auto_diff(layer, module, _inputs(), auto_weights=True,
                       options={"atol": 1e-4, "rtol": 0, "compare_mode": "strict", "single_step": False})  # fmt: skip
    assert result and result == True and repr(result) == "SUCCESS"  # noqa: E712
    assert "SUCCESS" in capsys.readouterr().out
    bad = auto_diff(simple_layer("act"), simple_module(), _inputs(), auto_weights=True, options={"atol": 1e-4})
    assert bad == False and bad.first_divergence.raw_path == "act"  # noqa: E712
    assert bad.result.first_divergence.base_path == "act"


def test_develop_form_with_losses_optimizers_and_steps():
    torch_model, paddle_model = create_model(simple_module()), create_model(simple_layer())
    torch_model.auto_layer_map("base")
    paddle_model.auto_layer_map("raw")
    assert assign_weight(paddle_model, torch_model) is True
    x = inp()
    inputs = ({"y": torch.as_tensor(x)}, {"x": paddle.to_tensor(x)})
    forward = auto_diff(torch_model, paddle_model, inputs, auto_init=False, atol=0.0, rtol=1e-5, single_step=False,
                        diff_phase="forward", loss_fn=[lambda o: o.mean(), lambda o: o.mean()])  # fmt: skip
    assert forward and not forward.select(phase="backward")
    paddle_opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=paddle_model.parameters())
    torch_opt = torch.optim.SGD(torch_model.parameters(), lr=0.1)
    trained = auto_diff(torch_model, paddle_model, inputs, auto_init=False, single_step=False, diff_phase="both",
                        optimizer=[paddle_opt, torch_opt], steps=3)  # fmt: skip  # paddle first, as in the tutorial
    assert trained and trained.steps == 3
    single = auto_diff(paddle_model, torch_model, (inputs[1], inputs[0]), auto_init=False, single_step=True,
                       diff_phase="both", compare_mode="mean", loss_fns=None, optimizers=None)  # fmt: skip
    assert single


def test_unknown_options_are_named():
    with pytest.raises(OptionError, match="'tolerance'"):
        auto_diff(simple_layer(), simple_module(), _inputs(), auto_weights=True, options={"tolerance": 1})
    with pytest.raises(OptionError, match="'atoll'"):
        auto_diff(simple_module(), simple_layer(), inp(), atoll=1e-4)
    with pytest.raises(OptionError, match="'verbose'"):
        auto_diff(simple_layer(), simple_module(), _inputs(), auto_weights=True, options={}, verbose=True)


def test_assign_weight_returns_false_instead_of_raising(capsys):
    wrong = paddle.nn.Sequential(paddle.nn.Linear(3, 3))
    assert assign_weight(wrong, simple_module()) is False
    assert "assign_weight failed" in capsys.readouterr().out


def test_layer_map_in_either_direction():
    layer, module = simple_layer(), simple_module()
    lm = LayerMap()
    lm.map = {layer.linear1: module.linear1}  # raw -> base, as some PaDiff code writes it
    result = auto_diff(layer, module, _inputs(), auto_weights=True, options={}, layer_map=lm)
    assert result


def test_add_special_init_copies_through_the_users_function():
    class TorchScale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return x * self.gain

    class PaddleScale(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.alpha = self.create_parameter([4])  # another name: matching by name fails

        def forward(self, x):
            return x * self.alpha

    calls = []

    def init_scale(module, layer):
        calls.append(1)
        layer.alpha.set_value(module.gain.detach().numpy())

    add_special_init("torch", "TorchScale", "paddle", "PaddleScale", init_scale)
    x = np.ones((2, 4), "float32")
    result = auto_diff(TorchScale(), PaddleScale(), x, auto_init=True)
    assert calls and result
    with pytest.raises(OptionError, match="'jax'"):
        add_special_init("jax", "A", "paddle", "B", init_scale)


def test_environment_switches(monkeypatch):
    monkeypatch.setenv("PADIFF_API_CHECK", "ON")
    monkeypatch.setenv("PADIFF_PATH_LOG", "ON")
    layer, module = simple_layer(), simple_module()
    result = auto_diff(layer, module, _inputs(), auto_weights=True, options={})
    assert any(e.base.kind.value == "api" for e in result.events)  # the residual `+` is an API call
    monkeypatch.setenv("PADIFF_API_CHECK", "OFF")
    monkeypatch.setenv("PADIFF_SIKP_WRAP_LAYER", "TRUE")
    seq_t = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.ReLU())
    seq_p = paddle.nn.Sequential(paddle.nn.Sequential(paddle.nn.Linear(4, 4)), paddle.nn.ReLU())
    result = auto_diff(seq_t, seq_p, np.ones((2, 4), "float32"), auto_init=True)
    assert result and "0" not in {e.base.path for e in result.events}  # the parameterless wrapper
    import types

    monkeypatch.setenv("PADDLE_THIRDPARTY_API", "tests.seed_models.inp")
    assert env_options()["api_level"] is False
    from nbdiff.trace import apis

    assert any(t[2] == "inp" for t in apis.CUSTOM_TARGETS)
    apis.CUSTOM_TARGETS[:] = [t for t in apis.CUSTOM_TARGETS if t[2] != "inp"]
    monkeypatch.setenv("PADDLE_THIRDPARTY_API", "no_such_module.op")
    with pytest.raises(OptionError, match="no_such_module"):
        env_options()
    assert isinstance(types, object)
